"""`mtbench compare`: one process per run, one weights file for all, the parity check, and one-line failures."""

import hashlib
import io
import json
import os
import re
import tempfile

import numpy as np
import pytest
from rich.console import Console

from conftest import (COMPARE_STEPS, CPU_ONLY, ONE_BUCKET, REPOSITORY, TINY_COMPARE, assert_refused_in_one_line,
                      device_kind, env_with, install_plugin_module, run_cli, simulated_devices)
from optimizer_exercise import float32_matmul_arithmetic, matmul_tolerance
from mtbench.figures import FIGURES_BY_KEY, run_dtype, shown_figures
from mtbench.runner.results.parity import check_parity


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_compare_shows_each_runs_training_lines_as_they_are_written(compared):
    """Off a terminal, each child's step lines reach the compare's own output beside the run's name (and stay in
    the run's log, written as it trains), with the losses its result records."""
    combined = compared["combined"]
    for number, run in enumerate(combined["runs"], start=1):
        losses = {h["step"]: h["loss"] for h in run["result"]["history"]}
        prefix = f"[{number}/2] {run['label']}: step "
        shown = [line for line in compared["stdout"].splitlines() if line.startswith(prefix)]
        assert [line.split()[3] for line in shown] == [f"{step}/{COMPARE_STEPS}" for step in (10, 20, 30)]
        assert [float(line.split()[5]) for line in shown] == pytest.approx([losses[s] for s in (10, 20, 30)], abs=6e-5)
        with open(run["log_file"]) as log:
            assert log.read().count("\nstep ") == 3


def test_compare_of_jax_and_torch_passes_the_parity_check(compared):
    combined = compared["combined"]
    parity = combined["parity"]
    assert parity["passed"] is True
    assert [(p["reference"], p["run"], p["dtype"], p["steps"]) for p in parity["pairs"]] == \
        [("jax", "torch", "float32", COMPARE_STEPS)]
    # The gate is 1 %; float32 runs of one model part by float rounding alone (under 1e-6 here).
    rtol = matmul_tolerance(1e-4, float32_matmul_arithmetic("jax"), float32_matmul_arithmetic("torch"))
    assert 0 <= parity["max_relative_difference"] < rtol
    # the difference is the runs' own, read off their histories
    jax_losses, torch_losses = ([h["loss"] for h in run["result"]["history"]] for run in combined["runs"])
    assert parity["max_relative_difference"] == pytest.approx(
        max(abs(a - b) / abs(a) for a, b in zip(jax_losses, torch_losses)), rel=1e-6)
    assert "parity torch vs jax (float32, first 30 steps)" in compared["stdout"]
    assert "within 0.1 %" in compared["stdout"]  # float32's gate
    assert [run["label"] for run in combined["runs"]] == ["jax", "torch"]
    assert combined["baseline"] == "jax"
    # compare trained the torch row eager, JAX its own step: the shared configuration names neither run's step.
    assert [run["result"]["config"]["step"] for run in combined["runs"]] == ["auto", "eager"]
    assert "step" not in combined["config"] and combined["config"]["seed"] == 0
    assert combined["speedups"]["jax"] == 1.0
    torch_result = combined["runs"][1]["result"]
    jax_result = combined["runs"][0]["result"]
    expected = torch_result["timing"]["tokens_per_s"] / jax_result["timing"]["tokens_per_s"]
    assert combined["speedups"]["torch"] == pytest.approx(expected)


def test_every_run_loaded_the_same_weights_file(compared):
    combined = compared["combined"]
    weights = combined["initial_weights"]
    assert os.path.isfile(weights["file"])
    assert sha256_of(weights["file"]) == weights["sha256"]
    for run in combined["runs"]:
        config = run["result"]["config"]
        assert config["initial_weights"] == weights["file"]
        assert config["initial_weights_sha256"] == weights["sha256"]
        with open(run["result_file"]) as f:  # the run's own file says the same as the combined JSON
            assert json.load(f)["config"]["initial_weights_sha256"] == weights["sha256"]
    first_losses = [run["result"]["history"][0]["loss"] for run in combined["runs"]]
    assert first_losses[0] == pytest.approx(first_losses[1], rel=1e-5)
    # the steps of both trained the same batches: their tokens and shapes, step by step
    jax_steps, torch_steps = ([(h["tokens"], h["shape"]) for h in run["result"]["history"]] for run in combined["runs"])
    assert len(jax_steps) == COMPARE_STEPS and jax_steps == torch_steps


@pytest.mark.slow  # two runs of two steps: 25 s
def test_a_run_starts_from_the_numbers_of_its_weights_file(compared, tmp_path):
    """The file's sha256 is recorded as it is read, and a child that drew its own weights from the seed instead
    would start from the very numbers of the compare's file (init-weights draws them from the same seed): this
    file holds other numbers, and both backends start from them, far from the compare's first loss."""
    from mtbench.runner.data.weights_file import read_weights_file, write_weights_file
    weights, _ = read_weights_file(compared["combined"]["initial_weights"]["file"])
    scaled = {name: value * 3 if name.endswith(("kernel", "embeddings")) else value for name, value in weights.items()}
    assert sum(not np.array_equal(scaled[name], weights[name]) for name in weights) > 10
    path = str(tmp_path / "scaled.npz")
    write_weights_file(path, scaled, weights.init)
    cache_dir = compared["combined"]["runs"][0]["result"]["config"]["cache_dir"]
    first_losses = {}
    for backend in ("jax", "torch"):
        out = tmp_path / f"{backend}.json"
        proc = run_cli("train", "--backend", backend, *TINY_COMPARE, "--steps", "2", "--measure-only",
                       "--initial-weights", path, "--cache-dir", cache_dir, "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        first_losses[backend] = json.loads(out.read_text())["history"][0]["loss"]
    seeds = compared["combined"]["runs"][0]["result"]["history"][0]["loss"]
    assert abs(first_losses["jax"] - seeds) > 0.01 * seeds
    assert first_losses["torch"] == pytest.approx(first_losses["jax"], rel=1e-4)


def test_each_child_trains_the_run_file_of_its_run(compared):
    """compare hands each child its configuration as a run file (`train --run-file`), not as flags: the file
    holds the run's configuration, and the result the child wrote records the same."""
    from mtbench.runner.orchestration.compare import RUN_FILE_SUFFIX
    from mtbench.runner.results.schema import result_stem
    from mtbench.runner.run_file import read_run_file
    combined = compared["combined"]
    for run in combined["runs"]:
        train_file = result_stem(run["result_file"]) + RUN_FILE_SUFFIX
        with open(run["log_file"]) as f:
            command = f.readline()
        arguments = command.split(" -m mtbench ")[1].split()
        assert arguments[:2] == ["train", "--run-file"] and arguments[3:] == ["--report", "none"]
        assert os.path.abspath(arguments[2]) == train_file
        given = read_run_file(train_file).to_dict()
        assert (given["backend"], os.path.abspath(given["out"]), given["initial_weights"], given["run_group"]) == \
            (run["label"], run["result_file"], combined["initial_weights"]["file"],
             os.path.splitext(os.path.basename(compared["path"]))[0])
        recorded = run["result"]["config"]
        assert {key: recorded[key] for key in given if key != "model"} == \
            {key: value for key, value in given.items() if key != "model"}
        assert run["result"]["dtype_chosen"] == {"asked": "float32", "dtype": "float32"}  # TINY_COMPARE's
        # The matrix's torch run is its eager step (as on a GPU, where --step auto would compile it).
        assert (given["step"], run["result"]["train_step_chosen"]["by_extra"], run["result"]["train_step"]) == \
            {"jax": ("auto", None, "jax-jit-stateless"), "torch": ("eager", None, "torch-eager")}[run["label"]]


def test_another_environments_mtbench_from_before_run_files_gets_flags():
    """Its `mtbench env --json` names no run file format (or another): its children get the options as flags."""
    from mtbench.runner.orchestration.compare import ComparePlan, reads_run_files
    from mtbench.runner.orchestration.runs import RunSpec
    from mtbench.runner.run_file import RUN_FILE_FORMAT
    specs = [RunSpec("jax"), RunSpec("jax", python="/old/bin/python"), RunSpec("jax", python="/new/bin/python"),
             RunSpec("jax", python="/later/bin/python")]
    described = {"/old/bin/python": {"backends": {}}, "/new/bin/python": {"run_file_format": RUN_FILE_FORMAT},
                 "/later/bin/python": {"run_file_format": RUN_FILE_FORMAT + 1}}
    plan = ComparePlan(specs, 1, None, [], "c.json", False, 50, 0.01, interpreters=described, options={})
    assert [reads_run_files(plan, spec) for spec in specs] == [True, False, True, False]


def test_weights_file_holds_the_numpy_draw_and_sets_every_variable(tmp_path):
    """In-process on JAX: the file written from one model, loaded into another drawn from a different seed,
    makes the two identical; a file that does not fit is refused."""
    from mtbench.keras_models.initialization import assign_weights, initial_weights
    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.runner.data.weights_file import read_weights_file, write_weights_file

    source, target = build_transformer(PRESETS["tiny"]), build_transformer(PRESETS["tiny"])
    drawn = initial_weights(source, seed=3)
    path = str(tmp_path / "w.npz")
    written_sha = write_weights_file(path, drawn)
    loaded, loaded_sha = read_weights_file(path)
    assert loaded_sha == written_sha == sha256_of(path)
    assign_weights(target, initial_weights(target, seed=4))
    assign_weights(target, loaded)
    for variable in target.weights:
        np.testing.assert_array_equal(np.asarray(variable.value), drawn[variable.path])
    del loaded[next(iter(loaded))]
    with pytest.raises(ValueError, match="do not fit the model"):
        assign_weights(target, loaded)


def test_train_refuses_a_weights_file_that_does_not_fit(tmp_path, cache_dir):
    bad = tmp_path / "bad.npz"
    np.savez(bad, **{"transformer/nonesuch/kernel": np.zeros((2, 2), np.float32)})
    proc = run_cli("train", *TINY_COMPARE, "--cache-dir", cache_dir, "--initial-weights", str(bad),
                   "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.npz: weights do not fit the model" in lines[0], proc.stderr
    assert not os.path.exists(tmp_path / "r.json")


@pytest.mark.parametrize("args, expected", [
    (["--backends", "jax,jax"], "run 'jax' is listed twice; use --repeats"),
    (["--backends", ""], "no runs to compare"),  # not the default jax,torch
    (["--repeats", "2", "--repeats-width", "5%"], "--repeats-width is an option of --repeats auto; this compare runs "
                                                  "--repeats 2"),
    (["--backends", "jax,nonesuch"], "run 'nonesuch': unknown backend 'nonesuch'"),
    (["--extra", "warp-drive"], "run 'jax+warp-drive': unknown extra 'warp-drive'"),
    (["--matrix", "jax;torch++x"], "'torch++x' is not of the form backend+extra+extra"),
    # the empty entry was skipped: the comparison ran without the run meant there
    (["--matrix", "jax;;torch"], "--matrix 'jax;;torch': an empty entry (two separators in a row, or one at an end)"),
    (["--matrix", "jax,torch;"], "an empty entry"),
    (["--backends", "jax,,torch"], "--backends 'jax,,torch': an empty entry (two commas in a row, or one at an end)"),
    (["--matrix", "jax:;torch"], "--matrix: 'jax:' is not of the form backend+extra+extra[@N][:flag=value,...]"),
    (["--matrix", "jax", "--backends", "torch"], "not both"),
    (["--baseline", "tensorflow"], "--baseline 'tensorflow' is none of the runs: jax, torch"),
    # Options that need no run are checked before the devices are asked (a child that would refuse pmap here).
    (["--matrix", "jax;jax+pmap", "--repeats", "0"], "--repeats must be at least 1"),
    (["--repeats", str(10 ** 20)], "--repeats must be at most 1,000, got 100,000,000,000,000,000,000"),
    (["--matrix", "jax;jax+pmap", "--parity-tolerance", "0"],
     "--parity-tolerance must be a positive finite number, got 0"),
    (["--matrix", "jax;jax+pmap", "--repeats", "auto", "--repeats-budget", "-1"],
     "--repeats-budget must be positive, got -1"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    # Validation options are the runs' own, checked as `train` checks them; so are their task's.
    (["--model", "gpt", "--beam", "3"], "task 'language-modelling': --beam is an option of translation"),
    (["--src-col", "2"], "task 'translation': --src-col and --tgt-col are both 2; they must differ"),
    (["--sample-prompt", "In the"], "--sample-prompt needs --eval-every N"),
    # --step plans the runs of --backends; a matrix's runs say their step by their extras.
    (["--matrix", "jax;torch", "--step", "eager"], "--matrix names each run's extras ('torch-compile' for a "
                                                   "compiled torch step); leave --step out"),
    (["--backends", "torch", "--extra", "torch-compile", "--step", "eager"],
     "--step eager contradicts --extra torch-compile"),
    # A dtype a backend refuses is refused here, before the weights file or another run is written.
    (["--backends", "jax,torch", "--dtype", "mixed_float16"],
     "run 'jax': --dtype mixed_float16: XLA on the CPU has no float16 matmul"),
    # An extra the device refuses is refused here too (asked of a child), not after the runs before it trained.
    (["--matrix", "jax;jax+pmap;torch+flash-attention"],
     "run 'jax+pmap': extra 'pmap' cannot run here: needs at least 2 devices; this run has 1"),
    (["--matrix", "torch;torch+flash-attention", "--dtype", "bfloat16"],
     "run 'torch+flash-attention': extra 'flash-attention' cannot run here: needs a GPU (or TPU); this run is on "
     "the cpu"),
])
def test_bad_compare_plans_fail_before_any_run(tmp_path, args, expected):
    # On the CPU, where the dtype refusals above hold (a GPU's XLA multiplies float16).
    proc = run_cli("compare", *args, "--out", str(tmp_path / "c.json"), env=CPU_ONLY)
    assert_refused_in_one_line(proc, expected)
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == [], "a refused plan must not start anything"


def test_an_empty_out_is_refused_not_taken_for_the_default(tmp_path):
    """`compare --out ''` wrote its comparison to mtbench-results/TIME-compare.json, where `train --out ''` is
    refused."""
    proc = run_cli("compare", "--out", "", env=CPU_ONLY, cwd=tmp_path)
    assert_refused_in_one_line(proc, "'': names a directory, not a file")
    assert list(tmp_path.iterdir()) == []


GPT_TINY = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "16", "--steps", "3",
            "--measure-only"]
TRANSLATION_TINY = ["--preset", "tiny", "--batch-size", "16", "--steps", "3", "--measure-only"]


@pytest.mark.parametrize("args, expected", [
    # What `train` refuses before it imports a framework, asked of every run of the plan: the run named last
    # would fail after the others trained.
    (["--matrix", "jax;jax+pmap;jax+data-parallel;jax+pmap:grad-accum=2", *GPT_TINY],
     "run 'jax+pmap:model=gpt,grad-accum=2': --grad-accum 2 runs with "),
    (["--matrix", "torch;torch+ddp@2;torch+fsdp@2", *TRANSLATION_TINY, "--max-tokens", "512"],
     "run 'torch+ddp@2': splits a fixed --batch-size over the processes; --max-tokens gives each length bucket"),
    # A run of several processes whose extras refuse its shape or task whatever devices its processes see.
    (["--matrix", "torch;torch+tensor-parallel@2:heads=1", *GPT_TINY],
     "run 'torch+tensor-parallel@2:model=gpt,heads=1': extra 'tensor-parallel' cannot run here: the model's 1 "
     "attention heads"),
    (["--matrix", "torch;torch+pipeline-parallel@2", *TRANSLATION_TINY],
     "run 'torch+pipeline-parallel@2': extra 'pipeline-parallel' cannot run here: splits the blocks of mtbench's "
     "language models"),
])
def test_every_runs_configuration_is_refused_before_any_run_trains(tmp_path, args, expected):
    proc = run_cli("compare", *args, "--out", str(tmp_path / "c.json"), env={**CPU_ONLY, **simulated_devices(2)})
    assert_refused_in_one_line(proc, expected)
    assert list(tmp_path.iterdir()) == [], "a refused plan must not start anything"


HALF_LR = """
from mtbench import Extra, hookimpl


class HalfLr(Extra):
    name = "half-lr"
    description = "halves the learning rate"
    backends = ("jax", "torch")

    def config_changes(self, run):
        return {"learning_rate": run.config.learning_rate / 2}


@hookimpl
def mtbench_register_extras(register):
    register(HalfLr())
"""


def test_an_extra_whose_config_changes_part_the_runs_is_named_before_any_run_trains(tmp_path):
    """The runs would train, then be refused as not comparable in a key the user never set: the extra that set it
    is named before the weights are drawn."""
    site = tmp_path / "site"
    site.mkdir()
    install_plugin_module(site, "mtbench_half_lr", "half-lr", HALF_LR)
    out = tmp_path / "out" / "c.json"
    proc = run_cli("compare", "--matrix", "jax;torch+half-lr", *GPT_TINY, "--out", str(out),
                   env={**CPU_ONLY, **env_with(site), "MTBENCH_LOAD_PLUGINS": "mtbench-half-lr"})
    assert_refused_in_one_line(proc, "run 'torch+half-lr:model=gpt': extra 'half-lr' sets learning_rate to 0.0005 "
                                     "(its config_changes), where run 'jax:model=gpt' trains with 0.001: the runs "
                                     "would not be comparable")
    assert not (tmp_path / "out").exists(), "a refused plan must not start anything"


def test_a_change_found_once_the_runs_trained_names_the_extra_that_made_it_not_all_of_the_runs(tmp_path):
    """The refusal named every extra of the run ("set by the config_changes of its extras (count-steps, half-lr)"):
    the result records which extra changed which key (`config_changed_by`), and that one is named; a result from
    before it was recorded names them all, as before."""
    from mtbench.runner.orchestration.compare import RUN_FILE_SUFFIX, changed_while_training
    from mtbench.runner.results.report import LoadedRun
    given = {"learning_rate": 0.001, "weight_decay": 0.1}

    def run(label, extras, trained, changed_by=None):
        source = tmp_path / f"{label}.json"
        (tmp_path / f"{label}{RUN_FILE_SUFFIX}").write_text(json.dumps({"config": given}))
        result = {"config": {**given, **trained, "extras": extras},
                  **({"config_changed_by": changed_by} if changed_by is not None else {})}
        return LoadedRun(result, str(source), asked_as=label)

    both = ["count-steps", "half-lr"]
    assert changed_while_training([run("jax", [], {}), run("jax+two", both, {"learning_rate": 0.0005},
                                                           {"learning_rate": "half-lr"})]) == (
        "run 'jax+two' changed learning_rate 0.001 -> 0.0005 as it trained, set by the config_changes of extra "
        "'half-lr'")
    assert changed_while_training([run("two", both, {"learning_rate": 0.0005, "weight_decay": 0.0},
                                       {"learning_rate": "half-lr", "weight_decay": "count-steps"})]) == (
        "run 'two' changed learning_rate 0.001 -> 0.0005 as it trained, set by the config_changes of extra "
        "'half-lr', and weight_decay 0.1 -> 0.0 as it trained, set by the config_changes of extra 'count-steps'")
    assert changed_while_training([run("older", both, {"learning_rate": 0.0005})]) == (
        "run 'older' changed learning_rate 0.001 -> 0.0005 as it trained, set by the config_changes of its extras "
        "(count-steps, half-lr)")


@pytest.mark.slow
def test_an_extras_change_found_only_once_the_runs_trained_is_named_with_the_refusal(tmp_path):
    """An extra that sets the framework's environment is left to its run's process (the devices it shows may not be
    those the preflight sees): the runs train, and the refusal names what the run changed as it trained."""
    site = tmp_path / "site"
    site.mkdir()
    install_plugin_module(site, "mtbench_half_lr", "half-lr", HALF_LR.replace(
        "    def config_changes", "    def environment(self, config):\n        return {'MTBENCH_HALF_LR': '1'}\n\n"
        "    def config_changes"))
    proc = run_cli("compare", "--matrix", "jax;jax+half-lr", *GPT_TINY, "--out", str(tmp_path / "c.json"),
                   env={**CPU_ONLY, **env_with(site), "MTBENCH_LOAD_PLUGINS": "mtbench-half-lr"})
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: not comparable: ") and last.endswith(
        "; run 'jax+half-lr:model=gpt' changed learning_rate 0.001 -> 0.0005 as it trained, set by the "
        "config_changes of extra 'half-lr'"), proc.stderr[-3000:]


def test_an_existing_out_is_refused_before_the_devices_are_asked(tmp_path):
    """The combined JSON's path is checked before the child that asks the devices (it imports the frameworks:
    seconds): the refusal names the file although that child would have refused the run too."""
    out = tmp_path / "c.json"
    out.write_text("{}")
    proc = run_cli("compare", "--matrix", "jax;jax+pmap", "--out", str(out), env=CPU_ONLY)
    assert_refused_in_one_line(proc, f"{out}: already exists; pass --overwrite to replace it")
    assert out.read_text() == "{}" and list(tmp_path.iterdir()) == [out]


@pytest.mark.slow
def test_a_failing_run_is_named_with_its_last_error_line(tmp_path, cache_dir, plugin_path):
    out = tmp_path / "c.json"
    proc = run_cli("compare", "--matrix", "brokenflow;jax", "--baseline", "jax", *TINY_COMPARE,
                   "--cache-dir", cache_dir, "--out", str(out),
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-brokenflow"})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: run 'brokenflow' failed: the brokenflow device is on fire (log: ")
    assert lines[0].endswith("); no result from run 'brokenflow'; no run finished: no combined JSON")
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    log = lines[0].split("(log: ", 1)[1].split("); ", 1)[0]
    with open(log) as f:
        assert "the brokenflow device is on fire" in f.read()


def test_a_run_of_several_processes_is_named_with_their_error_not_torchruns_report(tmp_path, monkeypatch):
    from mtbench.runner.orchestration.children import run_child
    log = tmp_path / "run.log"
    temporary = tmp_path / "tmp"  # this process's and the child's temporary directory
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    monkeypatch.setenv("TMPDIR", str(temporary))
    failure = run_child(["train", "--backend", "torch", "--preset", "nope", "--out", str(tmp_path / "r.json")],
                        str(log), "run 'torch+ddp@2'", processes=2)
    assert failure.startswith("run 'torch+ddp@2' failed: process ") and \
        "unknown preset 'nope' for --model transformer; choose one of tiny, small, base" in failure, failure
    assert failure.endswith(f"(log: {log})") and failure.exit_code != 0
    assert "mtbench FAILED" in log.read_text()  # torchrun's report stays in the log
    assert os.listdir(temporary) == []  # torchrun's agent left no folder behind


def test_repeats_run_round_robin_and_extras_reach_every_run():
    from mtbench.runner.orchestration.compare import ComparePlan
    from mtbench.runner.orchestration.runs import plan_runs
    specs = plan_runs("jax,torch", ("fast",))
    assert [spec.label for spec in specs] == ["jax+fast", "torch+fast"]
    plan = ComparePlan(specs, 3, None, [], "out/c.json", False, 50, 0.01)
    # Each repeat in turn forwards and backwards: a drift of the machine does not always fall on torch's runs.
    assert [(spec.label, repeat) for spec, repeat in plan.schedule()] == \
        [("jax+fast", 1), ("torch+fast", 1), ("torch+fast", 2), ("jax+fast", 2), ("jax+fast", 3), ("torch+fast", 3)]
    assert plan.run_file(specs[1], 2) == os.path.join("out/c.runs", "torch+fast-2.json")
    matrix = plan_runs(matrix="torch; torch+torch-compile+fused ;jax")
    assert [(spec.backend, spec.extras) for spec in matrix] == \
        [("torch", ()), ("torch", ("torch-compile", "fused")), ("jax", ())]


def fake_run(losses, dtype="float32"):
    return {"history": [{"step": i, "loss": loss} for i, loss in enumerate(losses, start=1)],
            "model": {"dtype_policy": dtype}, "config": {"dtype": dtype}}


def test_parity_flags_a_run_whose_losses_differ():
    losses = list(np.linspace(7.5, 5.0, 60))
    agreeing = fake_run([loss * (1 + 1e-6) for loss in losses])
    perturbed = fake_run(losses)
    perturbed["history"][29]["loss"] *= 1.03
    late = fake_run(losses)
    late["history"][55]["loss"] *= 1.5  # beyond the 50 steps the check covers
    mixed = fake_run([loss * 1.2 for loss in losses], dtype="mixed_bfloat16")
    runs = [("jax", fake_run(losses)), ("torch", agreeing), ("torch+perturbed", perturbed), ("late", late),
            ("jax-bf16", mixed)]

    report = check_parity(runs, run_dtype, steps=50, tolerance=0.01)

    by_run = {pair.run: pair for pair in report.pairs}
    assert set(by_run) == {"torch", "torch+perturbed", "late"}
    assert all(pair.reference == "jax" and pair.steps == 50 for pair in report.pairs)
    assert by_run["torch"].within_tolerance and by_run["torch"].max_relative_difference < 1e-5
    assert not by_run["torch+perturbed"].within_tolerance
    assert by_run["torch+perturbed"].max_relative_difference == pytest.approx(0.03)
    assert by_run["torch+perturbed"].at_step == 30
    assert by_run["late"].within_tolerance
    assert [pair.run for pair in report.failures] == ["torch+perturbed"]
    assert report.unchecked == [["jax-bf16", "no other mixed_bfloat16 run to compare with"]]
    assert report.to_dict()["passed"] is False
    assert any("torch+perturbed vs jax" in line and "NOT within 1 %" in line for line in report.lines())


def test_runs_that_diverged_together_are_held_only_over_the_steps_both_took():
    """Two runs whose losses are null (not finite) from one step on: the steps before it are compared, and said;
    from the first step on, nothing is, and the check passes nothing (it passed, 0 % over '1 step')."""
    losses = list(np.linspace(7.5, 5.0, 60))
    late = [fake_run(losses[:7] + [None]) for _ in range(2)]
    report = check_parity([("jax", late[0]), ("torch", late[1])], run_dtype, steps=50, tolerance=0.01)
    assert [(pair.steps, pair.within_tolerance, pair.diverged_at) for pair in report.pairs] == [(7, True, None)]
    assert report.lines()[0].startswith("parity torch vs jax (float32, first 7 steps)")
    at_once = [fake_run([None, None]) for _ in range(2)]
    report = check_parity([("jax", at_once[0]), ("torch", at_once[1])], run_dtype, steps=50, tolerance=0.01)
    assert report.pairs == [] and report.to_dict()["passed"] is None
    assert report.unchecked == [["torch", "no finite loss to compare: it and jax both diverged at step 1"]]
    # one run alone without a finite loss still fails the check
    alone = check_parity([("jax", fake_run(losses)), ("torch", at_once[1])], run_dtype, steps=50, tolerance=0.01)
    assert alone.to_dict()["passed"] is False and (alone.pairs[0].diverged_at, alone.pairs[0].steps) == (1, 0)
    later = check_parity([("jax", fake_run(losses)), ("torch", late[1])], run_dtype, steps=50, tolerance=0.01)
    assert [(pair.steps, pair.diverged_at) for pair in later.pairs] == [(7, 8)]  # the 7 steps compared, not 8


def test_a_difference_just_past_the_tolerance_is_written_apart_from_it(tmp_path):
    """1.004 % against 1 %: two significant digits wrote '1 %, NOT within 1 %', both in the line and in the failure."""
    from mtbench.errors import RunFailure
    from mtbench.runner.results.parity import require_parity
    from mtbench.runner.results.report import Comparison
    losses = list(np.linspace(7.5, 5.0, 60))
    parted = fake_run(losses)
    parted["history"][9]["loss"] *= 1.01004
    report = check_parity([("jax", fake_run(losses)), ("torch", parted)], run_dtype, steps=50, tolerance=0.01)
    assert report.lines()[0].startswith("parity torch vs jax (float32, first 50 steps): largest relative loss "
                                        "difference 1.004 % at step 10, NOT within 1 %")
    with pytest.raises(RunFailure, match=r"differs from jax by up to 1\.004 % \(more than 1 %\)"):
        require_parity(Comparison(groups=[], baseline=None, parity=report), str(tmp_path / "c.json"))


def dropout_run(losses, backend, step, extras=(), keeping=(), processes=1, grad_accum=1):
    run = fake_run(losses)
    run["model"]["dropout"] = 0.1
    run["config"]["grad_accum"] = grad_accum
    run.update(backend=backend, train_step=step, extras=list(extras), extras_keeping_draws=list(keeping),
               processes={"world_size": processes})
    return run


def test_runs_with_dropout_are_held_to_the_runs_that_draw_their_masks():
    """torch with and without remat draw the same masks (remat keeps every draw) and are held to one curve; JAX,
    a compiled torch step and a run over two processes draw masks of their own and are held to nothing, a run of
    an earlier mtbench (no `extras_keeping_draws`) not to the remat run's curve."""
    losses = list(np.linspace(7.5, 5.0, 60))
    other = [loss * 1.05 for loss in losses]
    drifting = [loss * (1.03 if step > 20 else 1.0) for step, loss in enumerate(other)]
    runs = [("jax", dropout_run(losses, "jax", "jax-jit-stateless")),
            ("torch", dropout_run(other, "torch", "torch-eager")),
            ("torch+remat", dropout_run(drifting, "torch", "torch-eager", ["remat"], ["remat"])),
            ("torch+compile", dropout_run(other, "torch", "torch-compiled", ["torch-compile"])),
            ("torch+ddp", dropout_run(other, "torch", "torch-eager", ["ddp"], processes=2)),
            # Each micro-batch draws masks of its own: not the masks of one batch of all the rows.
            ("torch:grad-accum=2", dropout_run(other, "torch", "torch-eager", grad_accum=2))]
    earlier = dropout_run(other, "torch", "torch-eager", ["remat"])
    del earlier["extras_keeping_draws"]
    report = check_parity([*runs, ("earlier", earlier)], run_dtype, steps=50, tolerance=0.01)
    assert [(pair.reference, pair.run) for pair in report.pairs] == [("torch", "torch+remat")]
    assert not report.pairs[0].within_tolerance
    assert report.pairs[0].max_relative_difference == pytest.approx(0.03) and report.pairs[0].at_step > 21
    assert sorted(name for name, _ in report.unchecked) == ["earlier", "jax", "torch", "torch+compile", "torch+ddp",
                                                           "torch:grad-accum=2"]
    # torch is held to torch+remat's curve, and said not to be held to the runs that draw other masks.
    assert dict(report.unchecked)["torch"] == (
        "it trains with dropout 0.1: held to torch+remat only, which draw its masks, not to jax, torch+compile, "
        "torch+ddp, torch:grad-accum=2, earlier, whose masks are drawn otherwise (--dropout 0 makes them checkable)")
    assert dict(report.unchecked)["jax"] == ("it trains with dropout 0.1, whose masks only runs of its backend, step, "
                                             "processes and micro-batches draw alike, and no other here does "
                                             "(--dropout 0 makes it checkable)")
    # jax against torch with dropout (`--preset base`'s default): nothing is held to anything, and nothing passed.
    alone = check_parity(runs[:2], run_dtype, steps=50, tolerance=0.01).to_dict()
    assert alone["pairs"] == [] and alone["passed"] is None and len(alone["unchecked"]) == 2
    # Repeated, each backend's repeats are held to its first, and each says it was not held to the other backend's.
    repeated = check_parity([("jax #1", runs[0][1]), ("torch #1", runs[1][1]), ("jax #2", runs[0][1]),
                             ("torch #2", runs[1][1])], run_dtype, steps=50, tolerance=0.01)
    assert [(pair.reference, pair.run) for pair in repeated.pairs] == [("jax #1", "jax #2"), ("torch #1", "torch #2")]
    assert [(name, why.split(": ")[1]) for name, why in repeated.unchecked] == [
        ("jax #1", "held to jax #2 only, which draw its masks, not to torch #1, whose masks are drawn otherwise "
                   "(--dropout 0 makes them checkable)"),
        ("torch #1", "held to torch #2 only, which draw its masks, not to jax #1, whose masks are drawn otherwise "
                     "(--dropout 0 makes them checkable)")]


def test_16_bit_runs_are_held_to_their_curves_not_to_each_steps_rounding():
    """A 16-bit run of the same arithmetic parts from its reference step by step after a dozen steps (here 2 %
    either way, alternately) and still follows the curve: held to 10-step means it passes, where a float32 run
    that did the same fails; a 16-bit run whose first ten steps sit 2 % higher fails."""
    losses = list(np.linspace(7.5, 5.0, 60))
    scattered = [loss * (1 if step < 12 else 1.02 if step % 2 else 0.98) for step, loss in enumerate(losses)]
    higher_at_first = [loss * (1.02 if step < 10 else 1.0) for step, loss in enumerate(losses)]
    bf16 = "mixed_bfloat16"
    report = check_parity([("jax", fake_run(losses, bf16)), ("torch", fake_run(scattered, bf16)),
                           ("torch+other", fake_run(higher_at_first, bf16)), ("jax-f32", fake_run(losses)),
                           ("torch-f32", fake_run(scattered))], run_dtype, steps=50, tolerance=0.01)
    by_run = {pair.run: pair for pair in report.pairs}
    assert by_run["torch"].window == 10 and by_run["torch"].within_tolerance
    assert by_run["torch"].max_relative_difference < 1e-3
    assert by_run["torch-f32"].window == 1 and not by_run["torch-f32"].within_tolerance
    assert by_run["torch-f32"].max_relative_difference == pytest.approx(0.02)
    other = by_run["torch+other"]
    assert not other.within_tolerance and other.max_relative_difference == pytest.approx(0.02) and other.at_step == 10
    assert "parity torch+other vs jax (mixed_bfloat16, first 50 steps): largest relative loss difference 2 % in " \
           "steps 1-10 (10-step means), NOT within 1 %; steps 1-5 step by step: 2 % at step 1, NOT within 0.25 %" \
           in report.lines()


def test_16_bit_runs_of_other_arithmetic_fail_in_their_first_steps_though_their_means_agree():
    """torch.compile keeping float32 between fused kernels parted from the other rows by 0.47 % at step 3 on an
    H100 and by 0.68 % in 10-step means: the first 5 steps are held step by step to a quarter of the tolerance."""
    bf16 = "mixed_bfloat16"
    losses = list(np.linspace(7.5, 5.0, 60))
    other = [loss * {1: 1.002, 2: 1.0047, 3: 1.003, 4: 1.002}.get(step, 1.0) for step, loss in enumerate(losses)]
    rounding = [loss * (1.0004 if step % 2 else 0.9996) for step, loss in enumerate(losses)]
    report = check_parity([("jax", fake_run(losses, bf16)), ("torch+compile", fake_run(other, bf16)),
                           ("torch", fake_run(rounding, bf16))], run_dtype, steps=50, tolerance=0.01)
    by_run = {pair.run: pair for pair in report.pairs}
    compiled = by_run["torch+compile"]
    assert compiled.max_relative_difference < 0.005  # its 10-step means alone pass
    assert not compiled.within_tolerance and not compiled.early_within
    assert (compiled.early_steps, compiled.early_at_step, compiled.early_tolerance) == (5, 3, 0.0025)
    assert compiled.early_max_relative_difference == pytest.approx(0.0047)
    assert by_run["torch"].within_tolerance and by_run["torch"].early_max_relative_difference == pytest.approx(4e-4)
    assert "parity torch+compile vs jax (mixed_bfloat16, first 50 steps): largest relative loss difference 0.12 % " \
           "in steps 1-10 (10-step means), within 1 %; steps 1-5 step by step: 0.47 % at step 3, NOT within " \
           "0.25 %" in report.lines()
    float32 = check_parity([("jax", fake_run(losses)), ("torch", fake_run(other))], run_dtype, tolerance=0.01)
    assert float32.pairs[0].within_tolerance and float32.pairs[0].early_max_relative_difference is None


def test_without_a_tolerance_float32_runs_are_held_to_a_tenth_of_what_16_bit_runs_are():
    """float32 runs of one computation agree within 1e-6 over 50 steps: 0.47 % at one step is other arithmetic, and
    fails at float32's default gate of 0.1 %, where 16-bit runs whose means part by 0.5 % pass 1 %. A tolerance
    given holds every pair to it, and the JSON says which gate each pair was held to."""
    losses = list(np.linspace(7.5, 5.0, 60))
    other = [loss * (1.0047 if step == 3 else 1.0) for step, loss in enumerate(losses)]
    half_percent = [loss * 1.005 for loss in losses]
    bf16 = "mixed_bfloat16"
    runs = [("jax", fake_run(losses)), ("torch", fake_run(other)), ("jax-bf16", fake_run(losses, bf16)),
            ("torch-bf16", fake_run(half_percent, bf16))]
    report = check_parity(runs, run_dtype)
    by_run = {pair.run: pair for pair in report.pairs}
    assert not by_run["torch"].within_tolerance and by_run["torch"].tolerance == 0.001
    assert by_run["torch-bf16"].tolerance == 0.01 and by_run["torch-bf16"].early_tolerance == 0.0025
    assert by_run["torch-bf16"].max_relative_difference == pytest.approx(0.005)
    assert not by_run["torch-bf16"].within_tolerance  # its first steps, 0.5 % apart, past a quarter of 1 %
    float32_line, bf16_line = (line.split(": ", 1)[1] for line in report.lines())
    assert float32_line == "largest relative loss difference 0.47 % at step 4, NOT within 0.1 %"
    assert re.fullmatch(r"largest relative loss difference 0.5 % in steps \d+-\d+ \(10-step means\), within 1 %; "
                        r"steps 1-5 step by step: 0.5 % at step 1, NOT within 0.25 %", bf16_line), bf16_line
    data = report.to_dict()
    assert data["tolerance"] is None and [pair["tolerance"] for pair in data["pairs"]] == [0.001, 0.01]
    given = check_parity(runs, run_dtype, tolerance=0.02)
    assert all(pair.within_tolerance and pair.tolerance == 0.02 for pair in given.pairs)
    assert given.to_dict()["tolerance"] == 0.02


def test_float32_runs_whose_class_names_a_16_are_held_step_by_step():
    """compare holds runs to one curve by a class that names what they share besides the dtype ('float32,
    batch-size=16' in a sweep, 'heads=16' of a size): a 16 there is no 16-bit arithmetic, and the float32 runs stay
    held step by step, where 10-step means would pass a run 2 % off every other step."""
    from mtbench.runner.results.report import parity_class
    losses = list(np.linspace(7.5, 5.0, 60))
    scattered = [loss * (1 if step < 12 else 1.02 if step % 2 else 0.98) for step, loss in enumerate(losses)]
    runs = []
    for name, curve in (("jax", losses), ("torch", scattered)):
        run = fake_run(curve)
        run["config"].update(batch_size=16, heads=16)
        runs.append((name, run))
    classes = {parity_class(run, swept=("batch_size",)) for _, run in runs}
    assert len(classes) == 1 and "16" in classes.pop()
    report = check_parity(runs, lambda result: parity_class(result, swept=("batch_size",)), steps=50,
                          tolerance=0.01)
    [pair] = report.pairs
    assert pair.window == 1 and not pair.within_tolerance
    assert pair.max_relative_difference == pytest.approx(0.02)


def test_a_comparison_that_fails_parity_ends_with_status_1():
    from mtbench.errors import RunFailure
    from mtbench.runner.results.parity import require_parity
    from mtbench.runner.results.report import Comparison

    losses = list(np.linspace(7.5, 5.0, 60))
    drifting = fake_run([loss * 1.02 for loss in losses])
    report = check_parity([("jax", fake_run(losses)), ("torch", drifting)], run_dtype)
    with pytest.raises(RunFailure, match=r"parity check failed: torch differs from jax by up to 2 % "
                                         r"\(more than 0.1 %\) over the first 50 steps; results kept in c.json"):
        require_parity(Comparison(groups=[], baseline=None, parity=report), "c.json")
    passing = check_parity([("jax", fake_run(losses)), ("torch", fake_run(losses))], run_dtype)
    require_parity(Comparison(groups=[], baseline=None, parity=passing), "c.json")
    early = check_parity([("jax", fake_run(losses, "mixed_bfloat16")),
                          ("torch", fake_run([loss * (1.004 if step == 2 else 1) for step, loss in enumerate(losses)],
                                             "mixed_bfloat16"))], run_dtype)
    with pytest.raises(RunFailure, match=r"parity check failed: torch differs from jax by 0.4 % at step 3 \(more "
                                         r"than 0.25 %, step by step over the first 5\); results kept in c.json"):
        require_parity(Comparison(groups=[], baseline=None, parity=early), "c.json")


# One compare of the tiny GPT on both backends for three tests (each had a compare of its own, about 100 CPU s
# together): it validates along the way and stops at a target (--eval-every, --target-loss, --sample-prompt), trains
# without the compile cache, and holds its runs to a parity gate that float rounding alone fails (1e-9 over the
# first 3 steps, which the runs train before the target stops them at step 4) against the second run, torch.
GATED_GPT = ["--matrix", "jax;torch", "--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "4",
             "--steps", "12", "--valid-size", "20", "--eval-every", "4", "--target-loss", "100", "--sample-prompt",
             "In the", "--sample-tokens", "8", "--dtype", "float32",  # float32 on a GPU too: the same sample on both
             "--no-compile-cache", "--parity-steps", "3", "--parity-tolerance", "1e-9", "--baseline", "torch"]


@pytest.fixture(scope="module")
def gated_gpt_compare(tmp_path_factory, cache_dir):
    """GATED_GPT's compare, which trains and validates both runs, writes its results and then fails the parity
    check, as it must (status 1), and nothing else."""
    out = tmp_path_factory.mktemp("gated") / "c.json"
    proc = run_cli("compare", *GATED_GPT, "--cache-dir", cache_dir, "--out", str(out))
    assert proc.returncode == 1 and out.exists(), proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("Error: parity check failed: "), proc.stderr[-3000:]
    combined = json.loads(out.read_text())
    return {"path": out, "proc": proc, "combined": combined,
            "labels": {run["result"]["backend"]: run["label"] for run in combined["runs"]}}


@pytest.mark.slow
def test_compare_validates_every_run_along_the_way_and_stops_each_at_the_target(gated_gpt_compare):
    """--eval-every, --target-loss and --sample-prompt reach every run: each validates on the same steps, samples
    the same continuation from the same weights, and stops at the first validation at the target; the comparison
    sets their times to the target side by side."""
    combined = gated_gpt_compare["combined"]
    runs = [json.loads(open(path).read()) for path in sorted((gated_gpt_compare["path"].parent / "c.runs").glob(
        "*-1.json"))]
    assert len(runs) == 2
    for run in runs:
        (evaluation,) = run["target"]["evaluations"]  # the target (loss 100) is met at the first validation
        assert evaluation["step"] == 4 and evaluation["sample"].startswith("In the")
        assert run["target"]["steps_to_target"] == 4 and len(run["history"]) == 4
    assert runs[0]["target"]["evaluations"][0]["sample"] == runs[1]["target"]["evaluations"][0]["sample"]
    # Side by side, each run's own times: to the target as it measured it, and without the compilation its timing
    # counted (the loop's own `compile_s`; every step it trained was before the target).
    for run in runs:
        (entry,) = [entry for entry in combined["summary"] if entry["label"].startswith(run["backend"])]
        times, reached = entry["time_to_target"], run["target"]["time_to_target_s"]
        assert times["with_compilation_s"] == pytest.approx(reached) and reached > run["timing"]["compile_s"] >= 0
        assert times["without_compilation_s"] == pytest.approx(reached - run["timing"]["compile_s"])


@pytest.mark.slow
def test_a_compare_whose_runs_part_beyond_the_tolerance_fails_and_keeps_its_results(gated_gpt_compare, tmp_path,
                                                                                   monkeypatch):
    """The parity check on a real compare: float32 runs of jax and torch part by float rounding, more than a
    tolerance of 1e-9 over the --parity-steps compared; the compare says so, exits 1, and keeps what it wrote.
    Its report and its rerun hold the runs to that gate and that baseline, as the compare did: they had held them
    to the default tolerance (passed) and to the first run."""
    out, proc, combined = gated_gpt_compare["path"], gated_gpt_compare["proc"], gated_gpt_compare["combined"]
    jax, torch = gated_gpt_compare["labels"]["jax"], gated_gpt_compare["labels"]["torch"]
    jax_losses, torch_losses = ([h["loss"] for h in run["result"]["history"][:3]] for run in combined["runs"])
    assert max(abs(a - b) / abs(a) for a, b in zip(jax_losses, torch_losses)) > 1e-9  # what the check must find
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"Error: parity check failed: {jax} differs from {torch} "
                                                           f"by ")
    assert combined["parity"]["passed"] is False and [p["steps"] for p in combined["parity"]["pairs"]] == [3]

    reported = json.loads(run_cli("report", str(out), "--format", "json").stdout)
    assert (reported["baseline"], reported["parity"]["passed"], reported["parity"]["tolerance"]) == \
        (torch, False, 1e-9)
    widened = json.loads(run_cli("report", str(out), "--parity-tolerance", "0.01", "--format", "json").stdout)
    assert widened["parity"]["passed"] is True  # the command line's tolerance wins

    # The rerun's gate, on reruns that trained what the originals did (that a rerun trains again is
    # test_rerun_trains_a_result_again_and_names_every_difference's).
    from mtbench.errors import RunFailure
    from mtbench.runner.orchestration import rerun as rerun_module
    originals = {run["result"]["backend"]: run["result"] for run in combined["runs"]}
    monkeypatch.setattr(rerun_module, "run_again", lambda rerun, console: originals[rerun.config.backend])
    again = tmp_path / "again.json"
    with pytest.raises(RunFailure, match=f"^parity check failed: {re.escape(jax)} differs from {re.escape(torch)} by "):
        rerun_module.rerun_results(str(out), str(again), False, Console(file=io.StringIO()))
    rerun = json.loads(again.read_text())
    assert (rerun["baseline"], rerun["parity"]["passed"], rerun["parity"]["tolerance"]) == (torch, False, 1e-9)
    assert [p["steps"] for p in rerun["parity"]["pairs"]] == [3]


@pytest.mark.slow
def test_no_compile_cache_reaches_every_run_of_a_compare(gated_gpt_compare, tmp_path):
    """`compare --no-compile-cache`: every run compiles from scratch and keeps nothing, so neither side's compile
    time is a warm cache's beside the other's cold one (compare refused the option: only `train` had it). A
    --config file's `no-compile-cache` key says the same."""
    for run in gated_gpt_compare["combined"]["runs"]:
        assert run["result"]["config"]["compile_cache"] is False
        cache = run["result"]["timing"]["compile_cache"]
        assert (cache["state"], cache["dir"], cache["reason"], cache["entries_after"]) == \
            ("off", None, "--no-compile-cache", None), run["label"]
    config = tmp_path / "cold.toml"
    config.write_text('no-compile-cache = true\nmatrix = "jax;jax"\n')
    # the key is read (an unknown key would be refused first); the plan's own refusal follows
    assert_refused_in_one_line(run_cli("compare", "--config", str(config), "--out", str(tmp_path / "d.json")),
                               "run 'jax' is listed twice")


@pytest.mark.slow
def test_a_runs_files_are_named_without_what_windows_and_artifact_uploads_refuse(tmp_path):
    """`jax:model=gpt-1.json` could not be uploaded as a GitHub Actions artifact (`:`) nor copied to Windows."""
    from mtbench.runner.orchestration.compare import ComparePlan
    from mtbench.runner.orchestration.runs import plan_runs
    specs = plan_runs(matrix="jax:d-model=32,heads=4;torch+ddp@2:batch-size=8")
    plan = ComparePlan(specs, 1, None, [], str(tmp_path / "c.json"), False, 50, 0.01)
    assert [os.path.basename(plan.run_file(spec, 2, ".log")) for spec in specs] == [
        "jax_d-model=32,heads=4-2.log", "torch+ddp@2_batch-size=8-2.log"]


# Two sweeps written to one sweep.json, the second with --overwrite: a size sweep, then a batch sweep from a --config
# file over it. Three tests read them: each sweep's, and the overwrite's, whose earlier comparison is the size sweep
# (it had two compares of its own, 37 CPU s).
BATCH_SWEEP = ('preset = "tiny"\nmax-pairs = 4000\nvalid-size = 100\ntest-size = 100\nmax-len = 32\nsteps = 6\n'
               'measure-only = true\ndtype = "float32"\n')  # float32 on a GPU too


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, cache_dir):
    """{'size': the size sweep's combined JSON and TensorBoard folder, 'batch': the batch sweep's combined JSON,
    output, path and other environment's interpreter, 'before' and 'after': the names in the runs folder before the
    batch sweep (a user's notes.txt is put there then) and after it}."""
    folder = tmp_path_factory.mktemp("sweeps")
    out, logs, runs = folder / "sweep.json", folder / "tb", folder / "sweep.runs"
    # --measure-only: nothing here reads the evaluation, which would evaluate and translate with each of the runs.
    size = run_cli("compare", "--matrix", "jax:d-model=32,heads=4;torch:d-model=32,heads=4;jax", *TINY_COMPARE,
                   *ONE_BUCKET, "--steps", "6", "--measure-only", "--cache-dir", cache_dir, "--out", str(out),
                   "--report-to", "tensorboard", "--logging-dir", str(logs), "--price-per-hour", "2")
    assert size.returncode == 0, size.stderr[-3000:]
    swept = {"size": {"combined": json.loads(out.read_text()), "logs": logs}, "before": sorted(os.listdir(runs))}
    (runs / "notes.txt").write_text("mine")
    python = other_environment(folder / "venv-b")
    config = folder / "sweep.toml"
    config.write_text(f'matrix = ["jax:batch-size=16", "torch:batch-size=16,python={python}", "jax:batch-size=32"]\n'
                      + BATCH_SWEEP)
    batch = run_cli("compare", "--config", str(config), "--steps", "8", "--cache-dir", cache_dir, "--out", str(out),
                    "--overwrite")
    assert batch.returncode == 0, batch.stderr[-3000:]
    swept["batch"] = {"combined": json.loads(out.read_text()), "stdout": batch.stdout, "out": out, "python": python}
    swept["after"] = sorted(os.listdir(runs))
    return swept


@pytest.mark.slow  # 22 s: three runs of two sizes
def test_a_size_sweep_is_one_command_with_its_runs_grouped_in_the_trackers(sweeps):
    """Two model sizes, each on both backends: one weights file per size, parity within a size, labels that
    name the size, the energy and cost lines, and every run's TensorBoard events under the comparison's group."""
    combined, logs = sweeps["size"]["combined"], sweeps["size"]["logs"]
    assert [run["label"] for run in combined["runs"]] == ["jax:d-model=32,heads=4", "torch:d-model=32,heads=4", "jax"]
    assert [os.path.basename(run["result_file"]) for run in combined["runs"]] == [
        "jax_d-model=32,heads=4-1.json", "torch_d-model=32,heads=4-1.json", "jax-1.json"]
    by_size = combined["initial_weights_by_size"]
    assert set(by_size) == {"d-model=32,heads=4", ""} and by_size[""]["sha256"] != by_size["d-model=32,heads=4"]["sha256"]
    small, _, preset = [run["result"] for run in combined["runs"]]
    assert small["config"]["model"]["d_model"] == 32 and small["config"]["d_model"] == 32
    assert small["config"]["parameters"] == small["model"]["parameters"] < preset["config"]["parameters"]
    assert [(p["reference"], p["run"], p["dtype"]) for p in combined["parity"]["pairs"]] == \
        [("jax:d-model=32,heads=4", "torch:d-model=32,heads=4", "float32, d-model=32,heads=4")]
    assert ["jax", "no other float32 run to compare with"] in combined["parity"]["unchecked"]
    figures = {entry["label"]: entry["figures"] for entry in combined["summary"]}
    assert figures["jax"]["usd"]["median"] == pytest.approx(preset["cost"]["usd"])
    assert "joules_per_1k_tokens" in figures["jax"]  # null here where the machine shows no energy counter
    for run in combined["runs"]:
        assert run["result"]["cost"]["usd"] == pytest.approx(2 * run["result"]["timing"]["total_s"] / 3600)
        assert run["result"]["config"]["run_group"] == "sweep"
        stem = os.path.basename(run["result_file"])[:-5]
        assert (logs / "sweep" / stem / "config.json").is_file(), os.listdir(logs / "sweep")


@pytest.mark.slow
def test_overwrite_replaces_the_earlier_comparisons_runs_and_keeps_what_a_user_put_there(sweeps):
    """A comparison written with --overwrite over another (here the size sweep) left that one's results, logs and
    run files in NAME.runs/ beside its own, for `report NAME.runs/*.json` or a history to pick up."""
    assert any(name.startswith("jax_d-model=32,heads=4-1") for name in sweeps["before"])
    assert "notes.txt" in sweeps["after"]
    stems = [os.path.basename(run["result_file"])[:-len(".json")] for run in sweeps["batch"]["combined"]["runs"]]
    assert {"initial-weights.npz", *(f"{stem}.json" for stem in stems)} <= set(sweeps["after"])
    # Nothing else: none of the size sweep's runs' files, nor its second size's weights file.
    assert [name for name in sweeps["after"] if name != "notes.txt" and not name.startswith("initial-weights.")
            and not any(name.startswith(f"{stem}.") for stem in stems)] == []
    assert all("batch-size=" in run["label"] for run in sweeps["batch"]["combined"]["runs"])  # the JSON replaced


def test_the_device_probe_asks_a_child_process():
    """The orchestrator imports no framework (one would hold GPU memory while the runs train): the devices come
    from a child, which also tells the refusals of the runs it is handed (`preflight.py`)."""
    import subprocess
    import sys as system
    code = ("import json, sys; from mtbench.runner.orchestration.environments import probe_devices; "
            "devices = probe_devices(); "
            "print(json.dumps({'devices': devices, 'imported': [m for m in ('jax', 'torch', 'keras') "
            "if m in sys.modules]}))")
    proc = subprocess.run([system.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["imported"] == []
    assert {backend: report["devices"][backend]["kind"] for backend in ("jax", "torch")} == {
        "jax": device_kind("jax"), "torch": device_kind("torch")}


# ---- sweeps beyond size, other environments, rerun --------------------------------------------------------------

def environment_name(python):
    """The label name of the environment an interpreter path lies in (venv/bin/python -> venv)."""
    return os.path.basename(os.path.dirname(os.path.dirname(python)))


def other_environment(directory):
    """A virtual environment of its own, seeing this one's packages: its interpreter has a path of its own, as
    another environment's would (its runs record it), on the same versions (no download here)."""
    import site
    import subprocess
    import sys as system
    subprocess.run([system.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    version = f"python{system.version_info.major}.{system.version_info.minor}"
    packages = directory / "lib" / version / "site-packages"
    lines = [f"import site; site.addsitedir({path!r})" for path in site.getsitepackages()]
    (packages / "parent-environment.pth").write_text("\n".join(lines) + f"\n{REPOSITORY}\n")
    return str(directory / "bin" / "python")


def test_matrix_entries_sweep_batch_size_and_length_and_name_other_environments(tmp_path):
    import sys as system
    from mtbench.runner.orchestration.compare import ComparePlan
    from mtbench.runner.orchestration.runs import plan_runs
    specs = plan_runs(matrix="jax:batch-size=16;torch:batch-size=16;jax:batch-size=256,max-len=64,max-tokens=4096")
    assert [spec.label for spec in specs] == ["jax:batch-size=16", "torch:batch-size=16",
                                              "jax:batch-size=256,max-len=64,max-tokens=4096"]
    assert specs[2].size_arguments() == ["--batch-size", "256", "--max-len", "64", "--max-tokens", "4096"]
    plan = ComparePlan(specs, 1, None, [], str(tmp_path / "c.json"), False, 50, 0.01)
    # the weights follow the model's shape: the max length sizes the position embeddings, the batch does not
    assert [os.path.basename(plan.weights_file(spec)) for spec in plan.sizes()] == \
        ["initial-weights.npz", "initial-weights-max-len=64.npz"]
    assert plan.sizes()[0] is specs[0]  # a shape's first run draws its weights, with its own flags (not torch's)

    old = str(tmp_path / "venv-old" / "bin" / "python")
    runs = plan_runs(matrix=f"torch;torch:python={old}")
    this = environment_name(system.executable)
    assert [spec.label for spec in runs] == [f"torch:python={this}", "torch:python=venv-old"]
    assert [(spec.interpreter, spec.foreign) for spec in runs] == [(system.executable, False), (old, True)]
    twins = plan_runs(matrix=f"jax:python={tmp_path}/a/venv/bin/python;jax:python={tmp_path}/b/venv/bin/python")
    assert [spec.label for spec in twins] == ["jax:python=a-venv", "jax:python=b-venv"]
    assert plan_runs(matrix=f"jax:python={system.executable}")[0].label == "jax"  # this interpreter is no other


@pytest.mark.parametrize("matrix, expected", [
    ("jax:batch-size=many", "--matrix: batch-size=many in 'jax:batch-size=many' is not a number of the flag's kind"),
    ("jax:width=3", "'width=3' in 'jax:width=3' is not flag=value with a size or sweep flag (layers, "),
    ("jax:batch_size=8,batch-size=16", "--matrix: batch-size is given twice in 'jax:batch_size=8,batch-size=16'; "
                                       "give each flag of a run once"),
    ("jax;jax:python=/nonexistent/venv/bin/python",
     "run 'jax:python=venv': python=/nonexistent/venv/bin/python: no such file"),
])
def test_bad_matrix_keys_fail_before_any_run(tmp_path, matrix, expected):
    proc = run_cli("compare", "--matrix", matrix, "--out", str(tmp_path / "c.json"))
    assert_refused_in_one_line(proc, expected)
    assert list(tmp_path.iterdir()) == []


def test_an_interpreter_that_cannot_run_mtbench_is_refused(tmp_path):
    from mtbench.errors import MtbenchError
    from mtbench.runner.orchestration.environments import check_interpreters
    from mtbench.runner.orchestration.runs import plan_runs
    (tmp_path / "plain.txt").write_text("not a program\n")
    broken = tmp_path / "broken" / "bin" / "python"
    broken.parent.mkdir(parents=True)
    broken.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'mtbench'\" >&2\nexit 1\n")
    broken.chmod(0o755)
    for path, expected in ((tmp_path, "not an executable file"), (tmp_path / "plain.txt", "not an executable file"),
                           (broken, "cannot import mtbench (ModuleNotFoundError: No module named 'mtbench'); "
                                    "install mtbench into that environment")):
        with pytest.raises(MtbenchError) as error:
            check_interpreters(plan_runs(matrix=f"jax;torch:python={path}"))
        assert str(error.value).startswith("run 'torch:python=") and f"python={path}: {expected}" in str(error.value)


@pytest.mark.slow
def test_a_batch_sweep_from_a_config_file_with_a_run_in_another_environment(sweeps):
    """Three runs from a --config file (flags on the command line win): batch 16 on both backends, torch's under
    another environment's interpreter, and batch 32. One weights file serves them all (same shape); parity
    compares only the runs that train the same batches; the run under the other interpreter records it; the plot
    draws tokens/s against the batch size."""
    import sys as system
    from mtbench.runner.results.plots import comparison_figure
    from mtbench.runner.results.report import build_comparison, load_runs
    combined, python, out = sweeps["batch"]["combined"], sweeps["batch"]["python"], sweeps["batch"]["out"]
    this = environment_name(system.executable)
    labels = [f"jax:batch-size=16,python={this}", "torch:batch-size=16,python=venv-b",
              f"jax:batch-size=32,python={this}"]
    assert [run["label"] for run in combined["runs"]] == labels
    assert [entry["label"] for entry in combined["summary"]] == labels  # the report names them alike
    assert list(combined["initial_weights_by_size"]) == [""]
    results = [run["result"] for run in combined["runs"]]
    assert [(r["config"]["batch_size"], r["config"]["steps"], r["config"]["max_len"], r["config"]["measure_only"])
            for r in results] == [(16, 8, 32, True), (16, 8, 32, True), (32, 8, 32, True)]
    assert len({r["config"]["initial_weights_sha256"] for r in results}) == 1
    assert [r["env"]["python_executable"] for r in results] == [system.executable, python, system.executable]
    assert [run["python"] for run in combined["runs"]] == [system.executable, python, system.executable]
    assert results[1]["env"]["backend_versions"]["torch"]  # the child recorded its own environment
    assert [(p["reference"], p["run"], p["dtype"]) for p in combined["parity"]["pairs"]] == \
        [(labels[0], labels[1], "float32, batch-size=16")]
    assert combined["parity"]["pairs"][0]["within_tolerance"]
    assert [labels[2], "no other float32, batch-size=32 run to compare with"] in combined["parity"]["unchecked"]
    assert "batch per run" in sweeps["batch"]["stdout"]

    comparison = build_comparison(load_runs([str(out)]))
    sweep_axes = comparison_figure(comparison).axes[2]
    assert sweep_axes.get_xlabel() == "--batch-size"
    lines = {line.get_label(): line for line in sweep_axes.get_lines()}
    assert set(lines) == {f"jax:python={this} · float32", "torch:python=venv-b · float32"}
    jax_line = lines[f"jax:python={this} · float32"]
    assert list(jax_line.get_xdata()) == [16, 32]
    assert list(jax_line.get_ydata()) == [results[0]["timing"]["tokens_per_s"], results[2]["timing"]["tokens_per_s"]]


def test_rerun_gives_train_back_the_configuration(compared, tmp_path):
    """The run file `rerun` gives a child `train` holds the original's configuration key by key, a key no flag
    sets included (no training); a key this mtbench does not know is refused."""
    from mtbench.errors import MtbenchError
    from mtbench.runner.orchestration.rerun import NOT_REPEATED, RECORDED_KEYS, plan_reruns
    from mtbench.runner.run_file import read_run_file, write_run_file
    result = json.loads(json.dumps(compared["combined"]["runs"][1]["result"]))
    result["config"]["weight_decay"] = 0.1  # no flag sets it
    (tmp_path / "changed.json").write_text(json.dumps(result))
    [rerun], _, _ = plan_reruns(str(tmp_path / "changed.json"), str(tmp_path / "again.json"), False)
    write_run_file(str(tmp_path / "run.json"), rerun.config)
    given = read_run_file(str(tmp_path / "run.json")).to_dict()
    assert given["backend"] == "torch" and given["extras"] == result["extras"]
    assert given["out"] == str(tmp_path / "again.json") and given["initial_weights"] == result["config"]["initial_weights"]
    repeated = [key for key in result["config"] if key not in (*NOT_REPEATED, *RECORDED_KEYS, "model")]
    assert {"steps", "batch_size", "max_len", "max_pairs", "seed", "preset", "cache_dir", "weight_decay"} <= set(repeated)
    for key in repeated:
        assert given[key] == result["config"][key], key
    result["config"]["warp_factor"] = 9
    (tmp_path / "unknown.json").write_text(json.dumps(result))
    with pytest.raises(MtbenchError, match="unknown.json: its configuration cannot be read: unknown configuration "
                                           "keys warp_factor"):
        plan_reruns(str(tmp_path / "unknown.json"), str(tmp_path / "again.json"), True)


def test_rerun_starts_from_the_weights_file_only_while_it_is_unchanged(compared, tmp_path):
    from mtbench.runner.orchestration.rerun import starting_weights
    weights = compared["combined"]["initial_weights"]
    copy = tmp_path / "w.npz"
    copy.write_bytes(open(weights["file"], "rb").read())
    config = {"initial_weights": str(copy), "initial_weights_sha256": weights["sha256"], "seed": 0}
    assert starting_weights(config) == (str(copy), None)
    copy.write_bytes(copy.read_bytes() + b"\0")
    path, note = starting_weights(config)
    assert path is None and note.startswith(f"the weights file {copy} has changed (sha256 ")
    assert note.endswith("the rerun draws its weights from --seed 0 instead")
    copy.unlink()
    assert starting_weights(config) == (None, f"the weights file {copy} is gone: the rerun draws its weights "
                                              f"from --seed 0 instead")
    assert starting_weights({"seed": 0}) == (None, None)  # drawn from the seed, as the original
    # The original moved with its weights (a compare JSON with its .runs folder): the same bytes, found beside it.
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "w.npz").write_bytes(open(weights["file"], "rb").read())
    assert starting_weights(config, near=(str(tmp_path / "elsewhere"), str(moved))) == (str(moved / "w.npz"), None)
    (moved / "w.npz").write_bytes(b"other bytes")
    assert starting_weights(config, near=(str(moved),))[0] is None


def test_rerun_of_a_compare_json_plans_each_of_its_runs(compared, tmp_path):
    from mtbench.runner.orchestration.rerun import plan_reruns
    reruns, out, single = plan_reruns(compared["path"], str(tmp_path / "again.json"), False)
    assert not single and out == str(tmp_path / "again.json")
    assert [(rerun.label, rerun.out) for rerun in reruns] == \
        [("jax", str(tmp_path / "again.runs" / "jax-1.json")), ("torch", str(tmp_path / "again.runs" / "torch-1.json"))]
    assert {rerun.weights for rerun in reruns} == {compared["combined"]["initial_weights"]["file"]}
    assert [(rerun.config.backend, rerun.config.out) for rerun in reruns] == [(rerun.label, rerun.out) for rerun in reruns]


@pytest.mark.slow
def test_a_rerun_of_a_compare_json_stopped_early_combines_the_reruns_that_finished(compared, tmp_path, monkeypatch):
    """A SIGTERM passed on to the second rerun (or its failure) ended `rerun` with the first rerun's result on disk
    and no combined JSON: now they are combined, marked as `compare` marks what it kept."""
    from mtbench.errors import RunFailure, RunInterrupted
    from mtbench.runner.orchestration import rerun as rerun_module
    from mtbench.runner.orchestration.children import Interrupted
    out = tmp_path / "again.json"
    first = compared["combined"]["runs"][0]["result"]
    for stop, error, status, code in ((Interrupted(143), RunInterrupted, "interrupted", 143),
                                      (RunFailure("the rerun of torch exited with code 1"), RunFailure, "failed", None)):
        calls = []

        def run_again(rerun, console, stop=stop):
            calls.append(rerun.label)
            if len(calls) == 2:
                raise stop
            return first

        monkeypatch.setattr(rerun_module, "run_again", run_again)
        with pytest.raises(error) as raised:
            rerun_module.rerun_results(compared["path"], str(out), True, Console(file=io.StringIO()))
        why = ("interrupted during" if status == "interrupted" else "failed in") + " the rerun of 'torch'"
        kept = f"the 1 finished rerun(s) combined in {out} (status {status})"
        assert str(raised.value) == (f"{why}; {kept}" if status == "interrupted" else
                                     f"the rerun of torch exited with code 1; {kept}")
        assert getattr(raised.value, "exit_code", None) == code or status == "failed"
        combined = json.loads(out.read_text())
        assert (combined["status"], combined["status_reason"]) == (status, f"{why} (1 of 2 runs finished)")
        assert [run["label"] for run in combined["runs"]] == ["jax"] and combined["runs"][0]["result"] == first
        out.unlink()


@pytest.mark.slow
def test_rerun_of_an_upgrade_comparison_runs_each_run_under_its_interpreter(compared, tmp_path, monkeypatch):
    """A comparison of environments (python=PATH) is trained again under each run's own interpreter: here a
    wrapper that answers `mtbench env --json` with a run file format, records any other arguments and stops. One
    whose mtbench reads no run files is refused in one line before anything trains."""
    import sys as system

    from mtbench.errors import MtbenchError, RunFailure
    from mtbench.runner.orchestration import rerun as rerun_module
    from mtbench.runner.orchestration.rerun import plan_reruns, run_again
    from mtbench.runner.run_file import RUN_FILE_FORMAT
    # The first run's interpreter, this one, answers each of the three plans alike: its `mtbench env --json` (a
    # process that imports the frameworks, 3 CPU s) is asked once; the wrapper's, which changes, every time.
    probe, answers = rerun_module.probe_environment, {}

    def asked_once_of_this_interpreter(python, context):
        if python != system.executable:
            return probe(python, context)
        if python not in answers:
            answers[python] = probe(python, context)
        return answers[python]

    monkeypatch.setattr(rerun_module, "probe_environment", asked_once_of_this_interpreter)
    record = tmp_path / "ran.txt"
    wrapper = tmp_path / "venv-old" / "bin" / "python"
    wrapper.parent.mkdir(parents=True)

    def answer_env_with(description):
        wrapper.write_text(f'#!/bin/sh\nif [ "$3" = env ]; then echo \'{json.dumps(description)}\'; exit 0; fi\n'
                           f'echo "$@" > {record}\nexit 5\n')
        wrapper.chmod(0o755)

    upgrade = json.loads(json.dumps(compared["combined"]))
    upgrade["runs"][1]["python"] = str(wrapper)
    (tmp_path / "upgrade.json").write_text(json.dumps(upgrade))
    backend = upgrade["runs"][1]["result"]["backend"]
    answer_env_with({"backends": {}, "run_file_format": RUN_FILE_FORMAT})  # its backend is not installed there
    with pytest.raises(MtbenchError, match=f"run '{backend}:python=venv-old': unknown backend '{backend}' in "
                                           f"{wrapper}"):
        plan_reruns(str(tmp_path / "upgrade.json"), str(tmp_path / "again.json"), False)
    answer_env_with({"backends": {backend: {"available": True}}, "run_file_format": RUN_FILE_FORMAT})
    reruns, _, _ = plan_reruns(str(tmp_path / "upgrade.json"), str(tmp_path / "again.json"), False)
    with pytest.raises(RunFailure, match="exited with code 5"):
        run_again(reruns[1], Console(file=io.StringIO()))
    assert record.read_text().startswith(f"-m mtbench train --run-file {reruns[1].train_file} ")
    answer_env_with({"backends": {}})  # an mtbench from before run files
    with pytest.raises(MtbenchError, match=f"the mtbench of {wrapper} reads no run files of format "):
        plan_reruns(str(tmp_path / "upgrade.json"), str(tmp_path / "again2.json"), False)


@pytest.mark.slow
def test_bad_rerun_inputs_fail_with_one_line(compared, tmp_path):
    existing = tmp_path / "existing.json"
    existing.write_text('{"keep": "me"}\n')
    source = compared["combined"]["runs"][0]["result_file"]
    changed = json.loads(json.dumps(compared["combined"]["runs"][0]["result"]))
    changed["config"]["warp_factor"] = 9  # a later version's key
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    plugged = json.loads(json.dumps(compared["combined"]["runs"][0]["result"]))
    plugged["extras"] = plugged["config"]["extras"] = ["warp-drive"]  # a plugin's extra, not installed here
    (tmp_path / "plugged.json").write_text(json.dumps(plugged))
    (tmp_path / "plugged.train.json").write_text(json.dumps(plugged))
    refused = json.loads(json.dumps(compared["combined"]))  # a comparison whose second run this device refuses
    refused_run = refused["runs"][1]["result"]
    refused_run["extras"] = refused_run["config"]["extras"] = [*refused_run["extras"], "flash-attention"]
    (tmp_path / "refused.json").write_text(json.dumps(refused))
    (tmp_path / "logged.log").write_text("an earlier run's log\n")  # a rerun writes its log there, unasked
    moved = json.loads(json.dumps(compared["combined"]["runs"][0]["result"]))
    moved["config"]["data_file"] = str(tmp_path / "moved-away.tsv")  # its process failed with exit 1, not 2
    (tmp_path / "moved.json").write_text(json.dumps(moved))
    for args, expected in (([str(tmp_path / "absent.json")], "absent.json: no such file"),
                           ([source, "--out", str(tmp_path / "logged.json")],
                            "logged.log: already exists beside"),
                           ([str(existing)], "existing.json: not an mtbench result"),
                           ([source, "--out", str(existing)], "existing.json: already exists; pass --overwrite"),
                           # the original a rerun is compared with, never written over, even told to
                           ([str(tmp_path / "plugged.json"), "--out", str(tmp_path / "plugged.json"), "--overwrite"],
                            "plugged.json: is the file this command reads"),
                           # nor by the run file written beside --out (it replaced a result named NAME.train.json)
                           ([str(tmp_path / "plugged.train.json"), "--out", str(tmp_path / "plugged.json"),
                             "--overwrite"], "plugged.train.json: is the file this command reads"),
                           # as train refuses it (it trained into the default path)
                           ([source, "--out", ""], "'': names a directory, not a file"),
                           ([str(tmp_path / "changed.json"), "--out", str(tmp_path / "again.json")],
                            "changed.json: its configuration cannot be read: unknown configuration keys warp_factor"),
                           ([str(tmp_path / "plugged.json"), "--out", str(tmp_path / "again.json")],
                            f"plugged.json: run '{plugged['backend']}+warp-drive': unknown extra 'warp-drive'; "
                            f"available: "),
                           ([str(tmp_path / "moved.json"), "--out", str(tmp_path / "again.json")],
                            f"moved.json: its data file {tmp_path / 'moved-away.tsv'} is gone (no such file or "
                            f"folder)"),
                           ([str(tmp_path / "refused.json"), "--out", str(tmp_path / "again.json")],
                            f"refused.json: run '{refused_run['backend']}+flash-attention': extra 'flash-attention' "
                            f"cannot run here: needs a GPU (or TPU) and float16/bfloat16")):
        proc = run_cli("rerun", *args)
        assert_refused_in_one_line(proc, expected)
    assert existing.read_text() == '{"keep": "me"}\n'
    assert (tmp_path / "logged.log").read_text() == "an earlier run's log\n"
    assert sorted(os.listdir(tmp_path)) == ["changed.json", "existing.json", "logged.log", "moved.json",
                                            "plugged.json", "plugged.train.json", "refused.json"]
    assert json.loads((tmp_path / "plugged.train.json").read_text()) == plugged


@pytest.mark.slow  # two processes, 15 s
def test_a_result_names_its_files_wherever_it_is_read_from_and_reruns_from_another_folder(tmp_path, cache_dir):
    """A run given its corpus by a relative path records the file itself (as its checkpoint's path): the result
    reruns from another folder, as a shared result must."""
    from mtbench.plugins.datasets.bible_dataset import BibleDataset
    pairs = BibleDataset("en", "fr").read_pairs(lambda *_: None)
    (tmp_path / "book.txt").write_text("\n".join(source for _, (source, _) in zip(range(1500), pairs)) + "\n",
                                       encoding="utf-8")
    # --measure-only (the rerun keeps it): the paths are checked, not the evaluation, which would compile its own
    # programs in both runs.
    proc = run_cli("train", "--backend", "jax", "--model", "gpt", "--preset", "tiny", "--block-size", "32",
                   "--batch-size", "8", "--steps", "4", "--checkpoint-every", "2", "--valid-size", "10",
                   "--test-size", "10", "--measure-only", "--data", "book.txt", "--cache-dir", cache_dir,
                   "--out", "r/x.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "r" / "x.json").read_text())
    assert result["config"]["data_file"] == str(tmp_path / "book.txt")
    assert result["checkpoint"] == str(tmp_path / "r" / "x.run" / "checkpoint-000004")
    (tmp_path / "elsewhere").mkdir()
    proc = run_cli("rerun", os.path.join("..", "r", "x.json"), "--out", "again.json", cwd=tmp_path / "elsewhere")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "elsewhere" / "again.json").read_text())["config"]["data_file"] == str(
        tmp_path / "book.txt")


def test_rerun_trains_a_result_again_and_names_every_difference(compared, tmp_path):
    original = compared["combined"]["runs"][0]
    out = tmp_path / "again.json"
    proc = run_cli("rerun", original["result_file"], "--out", str(out), env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads(out.read_text())
    before = original["result"]
    assert again["config"]["initial_weights_sha256"] == before["config"]["initial_weights_sha256"]
    assert again["config"]["initial_weights"] == before["config"]["initial_weights"]
    assert [h["loss"] for h in again["history"]] == pytest.approx([h["loss"] for h in before["history"]], rel=1e-5)
    text = proc.stdout
    assert f"jax: starts from {before['config']['initial_weights']}, the original's weights file" in text
    assert "mtbench rerun: jax" in text and "rerun / original" in text
    for figure in shown_figures([before]):  # the figures of its task: a translation run has no perplexity
        assert figure.title in text, figure.title
    tokens = FIGURES_BY_KEY["tokens_per_s"]
    ratio = again["timing"]["tokens_per_s"] / before["timing"]["tokens_per_s"]
    assert re.search(rf"{re.escape(tokens.title)}.*{tokens.text(before['timing']['tokens_per_s'])} +│ +"
                     rf"{tokens.text(again['timing']['tokens_per_s'])} +│ +{ratio:.3f}x", text), text
    assert "losses of the rerun against the original (float32, first 30 steps)" in text and "within 0.1 %" in text
    assert f"result: {out}" in text
    # the original and its rerun report together: the same run twice
    both = json.loads(run_cli("report", original["result_file"], str(out), "--format", "json").stdout)
    assert [(entry["label"], entry["repeats"]) for entry in both["summary"]] == [("jax", 2)]


def test_runs_that_trained_with_different_mtbench_code_are_warned_of(compared, tmp_path):
    """A checkout edited while a comparison ran gave its runs different commits (`2f34ac26cf19` beside
    `2f34ac26cf19-dirty`), and compare said nothing: the runs' mtbench is told on the console as the run that
    differs finishes, and is a warning of every run in the combined JSON (whose ranking then does not hold)."""
    from mtbench.runner.orchestration.compare import (ComparePlan, CompareProgress, warn_of_software,
                                                      write_combined)
    from mtbench.runner.orchestration.runs import plan_runs
    original = compared["combined"]
    plan = ComparePlan(plan_runs(matrix="jax;torch"), 1, None, [], str(tmp_path / "c.json"), False,
                       original["parity"]["steps"], None)
    progress = CompareProgress(weights={(): original["initial_weights"]})
    console = Console(file=io.StringIO(), width=1000)
    commit = "2f34ac26cf19" + "0" * 28
    for spec, run, tree in zip(plan.specs, original["runs"], (commit, commit + "-dirty")):
        result = json.loads(json.dumps(run["result"]))
        result["env"]["mtbench_git_commit"] = tree
        progress.add(spec, 1, result, run["result_file"], run["log_file"])
        warn_of_software(console, progress)
    version = original["runs"][0]["result"]["env"]["mtbench"]
    expected = (f"the runs trained with different mtbench code (jax: mtbench {version} (git 2f34ac26cf19); torch: "
                f"mtbench {version} (git 2f34ac26cf19-dirty)): the checkout changed while the comparison ran")
    said = console.file.getvalue().splitlines()
    assert len(said) == 1 and said[0].startswith(f"Warning: {expected}"), said
    _, combined = write_combined(plan, progress)
    for entry in combined["summary"]:
        assert any(warning.startswith(expected) for warning in entry["warnings"]), entry["warnings"]
    assert not combined["ranking"]["reliable"]
    # one mtbench throughout: no warning
    progress = CompareProgress(weights={(): original["initial_weights"]})
    for spec, run in zip(plan.specs, original["runs"]):
        progress.add(spec, 1, run["result"], run["result_file"], run["log_file"])
    _, combined = write_combined(plan, progress)
    assert not any("mtbench code" in warning for entry in combined["summary"] for warning in entry["warnings"])


def test_a_run_file_records_what_the_model_family_completes_of_its_configuration(tmp_path):
    """`--model gpt --preset char` on a text reads it by its characters (`GPTFamily.check` sets the tokenizer): the
    run file recorded none, which a configuration of before that change reads as bytes, so every run built a
    256-row model that refused the 65-row weights drawn for the comparison."""
    from types import SimpleNamespace

    from mtbench.plugins.manager import registry
    from mtbench.runner.orchestration.compare import run_configuration
    from mtbench.runner.orchestration.runs import parse_run_spec
    from mtbench.runner.run_file import read_run_file, write_run_file
    text = tmp_path / "book.txt"
    text.write_text("It was the best of times, it was the worst of times.\n" * 40)
    plan = SimpleNamespace(options={"model_name": "gpt", "preset": "char", "data_file": str(text)}, group="g",
                           overwrite=False)
    for spec in map(parse_run_spec, ("jax", "torch:batch-size=4")):
        path = tmp_path / f"{spec.backend}.run.json"
        write_run_file(path, run_configuration(plan, spec, {"file": str(tmp_path / "w.npz"), "init": "gpt2"},
                                               str(tmp_path / "r.json"), registry()))
        assert read_run_file(path).tokenizer == "char"
