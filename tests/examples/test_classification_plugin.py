"""The classification plugin package (examples/mtbench-classification): a third task, from a plugin, proves the task
hook open. Installed with pip, loaded by its package name, trained and compared through mtbench's command line on
both backends: float32 losses that coincide, accuracy in the tables and no BLEU or perplexity."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import require_installed_example, REPOSITORY, run_cli
from mtbench.errors import MtbenchError
from mtbench.runner.results.schema import schema_errors

PACKAGE = "mtbench-classification"
EXAMPLE_DIR = os.path.join(REPOSITORY, "examples", "mtbench-classification")
INSTALL = "pip install -e examples/mtbench-classification"
LOADED = {"MTBENCH_LOAD_PLUGINS": PACKAGE}
STEPS, ROWS = 40, 32
# float32 on every device (on a GPU `--dtype auto` trains mixed bfloat16), held to one curve.
TINY_MLP = ["--model", "mlp-classifier", "--preset", "tiny", "--steps", str(STEPS), "--batch-size", str(ROWS),
            "--warmup-steps", "5", "--learning-rate", "3e-3", "--dtype", "float32"]
QUALITY_ROWS = ("train loss", "validation loss", "test loss", "train token accuracy", "validation token accuracy",
                "test token accuracy")


@pytest.fixture(scope="module", autouse=True)
def installed():
    """The package must be installed from this checkout (the CI script installs it); never skipped."""
    return require_installed_example(PACKAGE, "mtbench_classification", EXAMPLE_DIR, INSTALL)


def test_plugin_modules_import_no_framework_and_no_scikit_learn():
    code = ("import sys, mtbench_classification.plugin; "
            "print(sorted(m for m in ('keras', 'jax', 'torch', 'sklearn') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_plugins_lists_the_task_and_the_model_family(installed):
    proc = run_cli("plugins", "--json", env=LOADED)
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    plugin = {p["name"]: p for p in listing["plugins"]}["classification"]
    assert (plugin["package"], plugin["version"], plugin["status"], plugin["problems"]) == \
        (PACKAGE, installed.version, "loaded", [])
    assert plugin["provides"] == {"models": ["mlp-classifier"], "tasks": ["classification"]}
    assert listing["warnings"] == []


def test_the_split_is_fixed_and_the_batches_follow_the_seed():
    """In-process, without a framework: the task's data as the runner asks for it."""
    from mtbench.runner.config import TrainConfig
    from mtbench_classification.task import ClassificationTask
    task = ClassificationTask()
    config = TrainConfig(batch_size=ROWS, seed=3)
    raw = task.read(config, registry=None, progress=None)
    data = task.prepare(config, raw, None)
    splits = data.splits
    assert {split: len(examples) for split, examples in splits.items()} == {"train": 1437, "valid": 180, "test": 180}
    assert data.record["corpus"] == "digits-8x8" and "not MNIST" in data.record["origin"]
    assert data.record["tokenizer"]["classes"] == 10 and splits["train"].pixels.shape[1] == 64
    assert 0.0 <= splits["train"].pixels.min() and splits["train"].pixels.max() <= 1.0
    again = task.prepare(TrainConfig(batch_size=ROWS, seed=4), raw, None)  # another seed: the same split
    assert np.array_equal(again.splits["test"].labels, splits["test"].labels)
    assert data.fingerprint == again.fingerprint

    per_epoch = task.batches_per_epoch(data, config)
    assert per_epoch == 1437 // ROWS
    batches = task.batches(data, config)
    first_epoch = [next(batches) for _ in range(per_epoch)]
    epoch, batch = first_epoch[0]
    assert epoch == 0 and batch.source is None and len(batch.inputs) == 1
    assert batch.shape == (ROWS, 64) and batch.target_output.shape == batch.weight.shape == (ROWS, 1)
    assert batch.target_tokens == ROWS  # tokens/s counts examples
    seen = np.concatenate([b.index for _, b in first_epoch])
    assert len(set(seen.tolist())) == len(seen)  # an epoch sees an example at most once
    assert next(batches)[0] == 1
    resumed = task.batches(data, config, skip=5)
    assert np.array_equal(next(resumed)[1].index, first_epoch[5][1].index)  # a resumed run gets the same batches
    # --grad-accum 2: a step's batch is both micro-batches (the train step splits it), not two halves of one
    accumulating = TrainConfig(batch_size=ROWS, seed=3, grad_accum=2)
    assert task.batches_per_epoch(data, accumulating) == 1437 // (2 * ROWS)
    assert next(task.batches(data, accumulating))[1].shape == (2 * ROWS, 64)
    with pytest.raises(MtbenchError, match=r"^--batch-size 1000 x --grad-accum 2 is more than the 1,437 training "):
        task.prepare(TrainConfig(batch_size=1000, grad_accum=2), raw, None)


@pytest.fixture(scope="module")
def compared(cache_dir, tmp_path_factory):
    """One `mtbench compare` of the classifier on jax and torch from one weights file. (Repeats, their order and
    their runs held to the first: `test_repeats_run_round_robin_and_extras_reach_every_run` and the repeated
    compare of test_verdicts_runs.py, whatever the task.)"""
    out = str(tmp_path_factory.mktemp("classification-compare") / "compare.json")
    proc = run_cli("compare", "--matrix", "jax;torch", *TINY_MLP, "--cache-dir", cache_dir,
                   "--out", out, env={**LOADED, "COLUMNS": "250"})  # wide: each row's title on one line
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return {"combined": json.load(f), "stdout": proc.stdout}


@pytest.mark.slow  # about 25 s: a weights file and two training processes
def test_both_backends_train_one_float32_loss_curve_and_pass_the_parity_check(compared):
    combined = compared["combined"]
    jax, torch = "jax:model=mlp-classifier", "torch:model=mlp-classifier"
    assert [run["label"] for run in combined["runs"]] == [jax, torch]
    assert [entry["repeats"] for entry in combined["summary"]] == [1, 1]
    assert [(pair["reference"], pair["run"]) for pair in combined["parity"]["pairs"]] == [(jax, torch)]
    assert combined["parity"]["passed"] is True
    curves = [[h["loss"] for h in run["result"]["history"]] for run in combined["runs"]]
    assert all(len(curve) == STEPS for curve in curves)
    for curve in curves[1:]:  # the same numpy weights and batches: float32 rounding apart, one curve
        assert max(abs(a - b) / a for a, b in zip(curves[0], curve)) < 1e-4
    assert curves[0][-1] < curves[0][0] - 0.3  # it learned
    jax_metrics, torch_metrics = (combined["runs"][i]["result"]["metrics"] for i in (0, 1))
    for key in ("train_loss", "val_loss", "test_loss", "train_accuracy", "val_accuracy", "test_accuracy"):
        assert torch_metrics[key] == pytest.approx(jax_metrics[key], rel=1e-4), key
    assert jax_metrics["test_accuracy"] > 0.5 and (jax_metrics["val_examples"], jax_metrics["test_examples"]) == \
        (180, 180)


@pytest.mark.slow
def test_the_results_are_the_tasks_and_conform_to_the_schema(compared):
    for run in compared["combined"]["runs"]:
        result = run["result"]
        assert schema_errors(result) == []
        assert (result["config"]["task"], result["data"]["corpus"], result["status"]) == \
            ("classification", "digits-8x8", "completed")
        assert not any(key.startswith(("bleu", "chrf")) or "perplexity" in key for key in result["metrics"])
        assert "hypotheses_file" not in result
        model = result["model"]
        assert (model["family"], model["features"], model["hidden"], model["layers"], model["classes"]) == \
            ("mlp-classifier", 64, 64, 1, 10)
        assert model["attention"] == {}
        assert result["utilization"]["model_flops_per_s"] > 0  # the family counts its training FLOPs
        steady = [h for h in result["history"] if not h["first_of_shape"]]
        assert steady and all(h["tokens"] == ROWS and h["shape"] == [ROWS, 64] for h in steady)


@pytest.mark.slow
def test_the_table_shows_accuracy_and_no_bleu_or_perplexity(compared):
    stdout = compared["stdout"]
    lines = stdout.splitlines()
    for row in QUALITY_ROWS:
        assert any(line.lstrip("│┃ ").startswith(row) for line in lines), row
    for absent in ("BLEU", "chrF", "perplexity", "bits per"):
        assert absent not in stdout, absent
    assert "configuration: digits-8x8, preset tiny, 40 steps x batch 32, seed 0" in " ".join(stdout.split())
    assert "parity torch:model=mlp-classifier vs jax:model=mlp-classifier" in " ".join(stdout.split())


@pytest.mark.parametrize("arguments, expected", [
    (["--heads", "4"], "Error: model 'mlp-classifier': --heads: the mlp-classifier has no attention and one stack; "
                       "it takes --d-model (hidden units), --layers (hidden layers) and --dropout"),
    (["--beam", "4"], "Error: task 'classification': --beam is not an option of classification; the "
                      "'mlp-classifier' model family is a classifier"),
    (["--dataset", "wmt14-en-de"], "Error: task 'classification': --dataset wmt14-en-de: the classification task "
                                   "reads digits-8x8, not a translation corpus"),
    (["--batch-size", "2000"], "Error: task 'classification': --batch-size 2000 is more than the 1,437 training "
                               "examples of digits-8x8"),
], ids=["heads", "beam", "dataset", "batch-size"])
def test_a_bad_option_is_refused_in_one_line(arguments, expected, cache_dir, tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("train", *TINY_MLP, *arguments, "--cache-dir", cache_dir, "--out", str(out), env=LOADED)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [expected], proc.stderr
    assert not out.exists()
