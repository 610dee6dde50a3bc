"""The example plugin package (examples/mtbench-example) as its users meet it: installed with pip, loaded by its
package name, run through mtbench's command line in a fresh process. It is also the pattern for testing a plugin
package of your own (docs/plugins.md, "Testing a plugin")."""

import json
import os
import subprocess
import sys

import pytest

from conftest import require_installed_example, ONE_BUCKET, REPOSITORY, TINY_TRAIN, run_cli
from mtbench.figures import FIGURES, run_label

PACKAGE = "mtbench-example"
EXAMPLE_DIR = os.path.join(REPOSITORY, "examples", "mtbench-example")
INSTALL = "pip install --no-deps -e examples/mtbench-example"
LOADED = {"MTBENCH_LOAD_PLUGINS": PACKAGE}
TSV_ENV, LOG_ENV = "MTBENCH_EXAMPLE_TSV", "MTBENCH_EXAMPLE_LOG"
STEPS = 4
MISSING_TSV = "Error: dataset 'example-tsv': set MTBENCH_EXAMPLE_TSV to a TSV file of source<TAB>target lines"


@pytest.fixture(scope="module", autouse=True)
def installed():
    """The example must be installed from this checkout (the CI script installs it); never skipped."""
    return require_installed_example(PACKAGE, "mtbench_example", EXAMPLE_DIR, INSTALL)


@pytest.fixture(scope="module")
def corpus_tsv(cache_dir, tmp_path_factory):
    """A TSV of 3,500 pairs of the built-in corpus, not its first ones (what a run of the built-in corpus under
    TINY_TRAIN's --max-pairs 4000 reads): the example dataset's input."""
    from mtbench.plugins.datasets.bible_dataset import BibleDataset
    from mtbench.runner.data.corpus import load_dataset_pairs
    pairs = load_dataset_pairs(BibleDataset("en", "fr"), cache_dir, progress=lambda done, total: None)[1000:4500]
    path = tmp_path_factory.mktemp("example") / "pairs.tsv"
    path.write_text("".join(f"{source}\t{target}\n" for source, target in pairs), encoding="utf-8")
    return str(path)


def read_log(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def jax_run(cache_dir, corpus_tsv, tmp_path_factory):
    """A tiny jax run that uses all four things of the example: its dataset, extra, reporter and callback."""
    folder = tmp_path_factory.mktemp("jax-run")
    out, log = str(folder / "r.json"), str(folder / "log.jsonl")
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", str(STEPS),
                   "--cache-dir", cache_dir, "--out", out, "--dataset", "example-tsv", "--extra", "loss-log",
                   "--report", "example-jsonl", "--report", "table",
                   env={**LOADED, TSV_ENV: corpus_tsv, LOG_ENV: log})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"proc": proc, "result": read_json(out), "log": read_log(log), "out": out}


def test_plugin_modules_import_no_framework():
    code = ("import sys, mtbench_example.plugin; "
            "print(sorted(m for m in ('keras', 'jax', 'torch') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_plugins_lists_the_package_loaded_with_what_it_provides(installed):
    proc = run_cli("plugins", "--json", env=LOADED)
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    example = {p["name"]: p for p in listing["plugins"]}["example"]
    assert (example["package"], example["version"], example["status"], example["builtin"], example["problems"]) == \
        (PACKAGE, installed.version, "loaded", False, [])
    assert example["provides"] == {"extras": ["loss-log"], "datasets": ["example-tsv"],
                                   "reporters": ["example-jsonl"]}
    assert example["hooks"] == ["mtbench_keras_callbacks", "mtbench_register_datasets", "mtbench_register_extras",
                                "mtbench_register_reporters"]
    assert {row["backend"]: row["available"] for row in listing["extras"] if row["extra"] == "loss-log"} == \
        {"jax": True, "torch": True}
    assert listing["warnings"] == []


def test_left_out_by_mtbench_load_plugins_its_names_are_explained(tmp_path):
    proc = run_cli("train", "--extra", "loss-log", "--out", str(tmp_path / "r.json"), env={"MTBENCH_LOAD_PLUGINS": ""})
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("Error: unknown extra 'loss-log'")
    left_out = error.partition("MTBENCH_LOAD_PLUGINS left out the plugin package(s) ")[2]
    assert left_out.endswith(", which might provide it")
    assert PACKAGE in left_out.removesuffix(", which might provide it").split(", ")  # with any others installed


def test_the_extra_wraps_the_backends_fast_step_and_records_what_went_through_it(jax_run):
    result = jax_run["result"]
    history = result["history"]
    assert result["status"] == "completed" and len(history) == STEPS
    assert result["extras"] == ["loss-log"]
    assert result["train_step"] == "jax-jit-stateless+loss-log"
    assert result["extras_record"]["loss-log"] == {
        "wrapped_step": "jax-jit-stateless", "steps": STEPS, "losses": [h["loss"] for h in history],
        "finalize_calls": 1,  # passed through at the end of training, before evaluation reads the weights
    }
    assert result["compile_options"]["applies_to"] == \
        "evaluation only (training runs the 'jax-jit-stateless+loss-log' step)"
    assert "mtbench train: jax+loss-log" in jax_run["proc"].stdout  # the table reporter beside the example's


def test_the_dataset_trains(jax_run, corpus_tsv):
    data = jax_run["result"]["data"]
    assert data["corpus"] == "example-tsv"
    assert data["origin"] == "the TSV file named by MTBENCH_EXAMPLE_TSV (source TAB target per line)"
    assert data["read"]["train"] == 3500 and data["pairs"]["test"] == 100  # the file's pairs, every one read
    assert jax_run["result"]["metrics"]["bleu"] is not None


def test_the_result_names_the_package_and_version_of_the_plugin_that_ran(jax_run):
    """A plugin upgraded between a run and its rerun showed nowhere: the result names the installed package (as
    its pyproject.toml declares it) of each plugin whose dataset, extra or reporter the run used."""
    import tomllib
    with open(os.path.join(EXAMPLE_DIR, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    (plugin,) = project["entry-points"]["mtbench"]
    assert jax_run["result"]["env"]["plugins"] == {plugin: f"{project['name']} {project['version']}"}


def test_the_callback_saw_every_step(jax_run):
    callback, _ = jax_run["log"]
    history = jax_run["result"]["history"]
    assert callback == {"kind": "callback", "backend": "jax", "out": jax_run["out"], "train_begin_calls": 1,
                        "batches": STEPS, "steps": list(range(1, STEPS + 1)),
                        "losses": [h["loss"] for h in history]}
    assert jax_run["result"]["keras_callbacks"] == [{"plugin": "example", "callback": "BatchCounter"}]


def test_the_reporter_writes_the_result_it_was_given(jax_run):
    assert [line["kind"] for line in jax_run["log"]] == ["callback", "result"]  # training ends before reports
    line, result = jax_run["log"][1], jax_run["result"]
    assert line["result"] == result  # the dict the reporter was given is the result file
    assert (line["complete"], line["status"], line["run"], line["dtype"], line["train_step"]) == \
        (True, "completed", "jax+loss-log", "float32", "jax-jit-stateless+loss-log")
    assert line["figures"] == {figure.key: figure.value(result) for figure in FIGURES}
    # The figures are the result's own values, read here from its fields rather than through FIGURES.
    timing, figures = result["timing"], line["figures"]
    assert (figures["tokens_per_s"], figures["step_s_median"], figures["compile_s"]) == (
        timing["tokens_per_s"], timing["step_s_median"], timing["compile_s"])
    assert figures["peak_host_bytes"] == result["memory"]["peak_host_bytes"] > 0
    assert (figures["test_loss"], figures["bleu"]) == (result["metrics"]["test_loss"], result["metrics"]["bleu"])
    assert figures["val_perplexity"] is None  # a translation run has no language model's figures


def test_a_partial_result_reaches_the_reporter_as_incomplete(cache_dir, corpus_tsv, tmp_path):
    out, log = str(tmp_path / "r.json"), str(tmp_path / "log.jsonl")
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", str(STEPS),
                   "--cache-dir", cache_dir, "--out", out, "--dataset", "example-tsv", "--extra", "loss-log",
                   "--report", "example-jsonl",
                   env={**LOADED, TSV_ENV: corpus_tsv, LOG_ENV: log, "MTBENCH_TEST_NAN_AT_STEP": "3"})
    assert proc.returncode == 1 and "training diverged" in proc.stderr
    result = read_json(out)
    callback, line = read_log(log)
    assert result["status"] == "diverged" and [h["step"] for h in result["history"]] == [1, 2, 3]
    losses = [h["loss"] for h in result["history"]]
    assert losses[2] is None  # JSON has no NaN: the diverged step's loss is null
    assert result["extras_record"]["loss-log"]["losses"] == losses == callback["losses"]
    # once, at the end of training, as in a run that completes: a diverged run calls it no more often
    assert result["extras_record"]["loss-log"]["finalize_calls"] == 1
    assert (line["complete"], line["status"], line["result"]) == (False, "diverged", result)
    assert line["figures"]["bleu"] is None


def test_the_datasets_user_errors_are_one_line_with_exit_code_2(cache_dir, tmp_path):
    missing = run_cli("train", "--dataset", "example-tsv", "--cache-dir", cache_dir, "--out", str(tmp_path / "a.json"),
                      env={**LOADED, TSV_ENV: None})
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [MISSING_TSV]
    bad = tmp_path / "bad.tsv"
    bad.write_text("Hello.\tBonjour.\nno tab here\n", encoding="utf-8")
    malformed = run_cli("train", "--dataset", "example-tsv", "--cache-dir", cache_dir,
                        "--out", str(tmp_path / "b.json"), env={**LOADED, TSV_ENV: str(bad)})
    assert malformed.returncode == 2
    assert malformed.stderr.strip().splitlines() == [
        f"Error: dataset 'example-tsv': {bad}, line 2: no tab between the source and the target"]


@pytest.mark.slow
def test_a_compiled_step_that_mtbench_adds_goes_inside_the_wrapper_of_an_extra_that_wraps_any_step(cache_dir, tmp_path):
    """loss-log declares that it wraps whatever step it is given (`Extra.wraps_step`): torch-compile, added by
    --step compiled (as --step auto adds it on a CUDA GPU), is placed before it, and loss-log wraps the compiled
    step and sees every step's loss. Without a log file the reporter prints the result's summary on the console,
    and the callback, which writes to that file, joins no run. (The losses loss-log keeps of torch's eager step:
    this run's of its compiled one, and `test_a_step_that_reads_its_loss_on_the_host_is_counted_a_host_wait_a_step`
    [torch], whose extra wraps the eager step.)"""
    out = str(tmp_path / "r.json")
    # TINY_TRAIN's model and buckets, as test_extras compiles them into the session's cache: its compiled programs
    # are this run's too (loss-log wraps the step outside them); nothing here reads the evaluation.
    proc = run_cli("train", "--backend", "torch", *TINY_TRAIN, "--steps", str(STEPS), "--measure-only",
                   "--cache-dir", cache_dir, "--out", out, "--extra", "loss-log", "--step", "compiled",
                   "--report", "example-jsonl", env={**LOADED, LOG_ENV: None})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = read_json(out)
    assert result["extras"] == result["config"]["extras"] == ["torch-compile", "loss-log"]
    assert result["train_step"] == "torch-compiled+loss-log"
    record = result["extras_record"]["loss-log"]
    assert (record["wrapped_step"], record["steps"]) == ("torch-compiled", STEPS)
    assert record["losses"] == [h["loss"] for h in result["history"]]
    assert result["extras_record"]["torch-compile"]["graphs_compiled"] >= 1
    printed = [json.loads(text) for text in proc.stdout.splitlines() if text.startswith('{"kind": "result"')]
    assert len(printed) == 1 and "result" not in printed[0]  # the console gets the summary only
    assert (printed[0]["complete"], printed[0]["run"]) == (True, run_label(result))
    assert printed[0]["figures"] == {figure.key: figure.value(result) for figure in FIGURES}
    assert result["keras_callbacks"] == []


def test_torch_compile_given_after_a_wrapping_extra_is_refused_rather_than_dropping_its_wrapper(cache_dir, tmp_path):
    """torch-compile builds its own step from the model: given after loss-log, it would have replaced loss-log's
    wrapper and trained without it. The order the user gave is kept, and the run stops in one line before
    training, naming the order that works."""
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", "torch", *TINY_TRAIN, *ONE_BUCKET, "--steps", "2", "--cache-dir", cache_dir,
                   "--out", str(out), "--extra", "loss-log", "--extra", "torch-compile", env={**LOADED, LOG_ENV: None})
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("Warning: ")]
    assert lines == ["Error: extra 'torch-compile': compiles mtbench's torch step, not the 'torch-eager+loss-log' "
                     "step of extra 'loss-log' of plugin 'example': give --extra torch-compile before that extra, "
                     "whose step then wraps the compiled one, or train eager (--step eager, without --extra "
                     "torch-compile)"], proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
