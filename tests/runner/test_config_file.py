"""`--config FILE` on train and compare: a TOML file of the flags' own names sets the command's defaults, and the
flags given on the command line win over it (the bad files are in tests/test_cli_bad_input.py)."""

import click
import pytest

from conftest import run_cli


def test_the_file_sets_defaults_and_the_command_line_wins(tmp_path):
    from mtbench.cli import compare, train
    path = tmp_path / "run.toml"
    path.write_text('preset = "tiny"\nbatch-size = 16\nsteps = 6\nextra = ["torch-compile"]\nmeasure-only = true\n'
                    'learning-rate = 2e-3\nmatrix = ["jax:batch-size=16", "torch"]\n'
                    'backends = ["jax", "torch"]\n')
    given = compare.make_context("compare", ["--config", str(path), "--steps", "9"]).params
    assert (given["preset"], given["batch_size"], given["steps"], given["extras"], given["measure_only"],
            given["learning_rate"]) == ("tiny", 16, 9, ("torch-compile",), True, 2e-3)
    assert given["matrix"] == "jax:batch-size=16;torch" and given["backends"] == "jax,torch"
    path.write_text('preset = "tiny"\nbatch-size = 16\nno-save-model = true\nextra = "fast"\n')
    given = train.make_context("train", ["--config", str(path), "--batch-size", "8", "--extra", "slow"]).params
    assert (given["preset"], given["batch_size"], given["save_model"], given["extras"]) == ("tiny", 8, False,
                                                                                            ("slow",))
    with pytest.raises(click.UsageError, match="unknown key 'matrix'"):  # train has no --matrix
        path.write_text('matrix = "jax"\n')
        train.make_context("train", ["--config", str(path)])


def test_a_number_for_an_option_that_reads_text_is_read_as_the_command_line_gives_it(tmp_path):
    """`repeats = 2` (--repeats takes a count or `auto`) was refused as not a string."""
    from mtbench.cli import compare
    path = tmp_path / "numbers.toml"
    path.write_text('repeats = 2\nrepeats-width = 5\n')  # 5 %, as --repeats-width 5
    given = compare.make_context("compare", ["--config", str(path)]).params
    assert (given["repeats"], given["repeats_width"]) == ("2", "5")
    path.write_text("matrix = [1, 2]\n")
    with pytest.raises(click.UsageError, match=r"matrix must be a string or a list of strings, got a list \[1, 2\]$"):
        compare.make_context("compare", ["--config", str(path)])


def test_compare_reads_its_runs_from_the_file(tmp_path):
    """The file's matrix reaches compare: an entry listed twice is refused before anything starts."""
    path = tmp_path / "twice.toml"
    path.write_text('matrix = ["jax", "jax"]\npreset = "tiny"\n')
    proc = run_cli("compare", "--config", str(path), "--out", str(tmp_path / "c.json"))
    assert proc.returncode == 2 and proc.stderr.strip() == "Error: run 'jax' is listed twice; use --repeats to run " \
                                                           "it again", proc.stderr
    proc = run_cli("train", "--config", str(path))
    assert proc.returncode == 2 and proc.stderr.strip().startswith(f"Error: --config {path}: unknown key 'matrix'")


def test_one_half_of_a_pair_on_the_command_line_replaces_the_files_other_half(tmp_path):
    """`steps` in the file and `--epochs` on the command line: the run takes --epochs, as any flag given wins over
    the file, where the file's steps would have made the two a contradiction."""
    from mtbench.cli import _command_line_wins, train
    path = tmp_path / "run.toml"
    path.write_text('preset = "tiny"\nsteps = 4\nblock-size = 32\n')
    halves = lambda options: (options["steps"], options["epochs"], options["block_size"], options["max_len"])
    with train.make_context("train", ["--config", str(path), "--epochs", "0.5", "--max-len", "64"]) as ctx:
        assert halves(_command_line_wins(dict(ctx.params))) == (None, 0.5, None, 64)
    with train.make_context("train", ["--config", str(path)]) as ctx:
        assert halves(_command_line_wins(dict(ctx.params))) == (4, None, 32, None)
    with train.make_context("train", ["--config", str(path), "--steps", "3", "--epochs", "0.5"]) as ctx:
        assert halves(_command_line_wins(dict(ctx.params)))[:2] == (3, 0.5)  # both given: TrainConfig refuses them


def test_a_list_the_command_line_replaces_is_said(tmp_path, capsys):
    """`extra = ["remat"]` in the file and `--extra loss-log` given: the run takes the command line's list alone,
    as any flag wins, and says that the file's remat does not run (it was dropped without a word)."""
    from mtbench.cli import _command_line_wins, train
    path = tmp_path / "run.toml"
    path.write_text('preset = "tiny"\nextra = ["remat"]\n')
    with train.make_context("train", ["--config", str(path), "--extra", "loss-log"]) as ctx:
        assert _command_line_wins(dict(ctx.params))["extras"] == ("loss-log",)
    assert capsys.readouterr().err == "Warning: --extra on the command line replaces --config's extra = ['remat']\n"
    with train.make_context("train", ["--config", str(path)]) as ctx:
        assert _command_line_wins(dict(ctx.params))["extras"] == ("remat",)
    assert capsys.readouterr().err == ""
    # The later processes of a run of several take the same list without saying it again.
    with train.make_context("train", ["--config", str(path), "--extra", "loss-log"]) as ctx:
        assert _command_line_wins(dict(ctx.params), warn=False)["extras"] == ("loss-log",)
    assert capsys.readouterr().err == ""
