"""`mtbench compare`: one process per run, one weights file for all, the parity check, and one-line failures."""

import hashlib
import json
import os

import numpy as np
import pytest

from conftest import COMPARE_STEPS, ONE_BUCKET, TINY_COMPARE, env_with, run_cli
from mtbench import run_dtype
from mtbench.runner.results.parity import check_parity


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_compare_of_jax_and_torch_passes_the_parity_check(compared):
    combined = compared["combined"]
    parity = combined["parity"]
    assert parity["passed"] is True
    assert [(p["reference"], p["run"], p["dtype"], p["steps"]) for p in parity["pairs"]] == \
        [("jax", "torch", "float32", COMPARE_STEPS)]
    assert 0 <= parity["max_relative_difference"] < 0.01
    assert "parity torch vs jax (float32, first 30 steps)" in compared["stdout"]
    assert "within 1 %" in compared["stdout"]
    assert [run["label"] for run in combined["runs"]] == ["jax", "torch"]
    assert combined["baseline"] == "jax"
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
    (["--backends", "jax,nonesuch"], "run 'nonesuch': unknown backend 'nonesuch'"),
    (["--extra", "warp-drive"], "run 'jax+warp-drive': unknown extra 'warp-drive'"),
    (["--matrix", "jax;torch++x"], "'torch++x' is not of the form backend+extra+extra"),
    (["--matrix", "jax", "--backends", "torch"], "not both"),
    (["--baseline", "tensorflow"], "--baseline 'tensorflow' is none of the runs: jax, torch"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
])
def test_bad_compare_plans_fail_before_any_run(tmp_path, args, expected):
    proc = run_cli("compare", *args, "--out", str(tmp_path / "c.json"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == [], "a refused plan must not start anything"


def test_a_failing_run_is_named_with_its_last_error_line(tmp_path, cache_dir, plugin_path):
    out = tmp_path / "c.json"
    proc = run_cli("compare", "--matrix", "brokenflow;jax", "--baseline", "jax", *TINY_COMPARE,
                   "--cache-dir", cache_dir, "--out", str(out),
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-brokenflow"})
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: run 'brokenflow' failed: the brokenflow device is on fire (log: ")
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    log = lines[0].rsplit("(log: ", 1)[1].rstrip(")")
    with open(log) as f:
        assert "the brokenflow device is on fire" in f.read()


def test_repeats_run_round_robin_and_extras_reach_every_run():
    from mtbench.runner.results.compare import ComparePlan, plan_runs
    specs = plan_runs("jax,torch", ("fast",))
    assert [spec.label for spec in specs] == ["jax+fast", "torch+fast"]
    plan = ComparePlan(specs, 2, None, [], "out/c.json", False, 50, 0.01)
    assert [(spec.label, repeat) for spec, repeat in plan.schedule()] == \
        [("jax+fast", 1), ("torch+fast", 1), ("jax+fast", 2), ("torch+fast", 2)]
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


def test_a_comparison_that_fails_parity_ends_with_status_1():
    from mtbench.errors import RunFailure
    from mtbench.runner.results.compare import require_parity
    from mtbench.runner.results.report import Comparison

    losses = list(np.linspace(7.5, 5.0, 60))
    drifting = fake_run([loss * 1.02 for loss in losses])
    report = check_parity([("jax", fake_run(losses)), ("torch", drifting)], run_dtype)
    with pytest.raises(RunFailure, match=r"parity check failed: torch differs from jax by up to 2 % "
                                         r"\(more than 1 %\) over the first 50 steps; results kept in c.json"):
        require_parity(Comparison(groups=[], baseline=None, parity=report), "c.json")
    passing = check_parity([("jax", fake_run(losses)), ("torch", fake_run(losses))], run_dtype)
    require_parity(Comparison(groups=[], baseline=None, parity=passing), "c.json")


def test_a_size_sweep_is_one_command_with_its_runs_grouped_in_the_trackers(tmp_path, cache_dir):
    """Two model sizes, each on both backends: one weights file per size, parity within a size, labels that
    name the size, the energy and cost lines, and every run's TensorBoard events under the comparison's group."""
    out, logs = tmp_path / "sweep.json", tmp_path / "tb"
    proc = run_cli("compare", "--matrix", "jax:d-model=32,heads=4;torch:d-model=32,heads=4;jax", *TINY_COMPARE,
                   *ONE_BUCKET, "--steps", "6", "--cache-dir", cache_dir, "--out", str(out), "--report-to", "tensorboard",
                   "--logging-dir", str(logs), "--price-per-hour", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    combined = json.loads(out.read_text())
    assert [run["label"] for run in combined["runs"]] == ["jax:d-model=32,heads=4", "torch:d-model=32,heads=4", "jax"]
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


CPU = {"kind": "cpu", "name": "Intel(R) Xeon(R) Processor", "count": 1}
H100 = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 1}


def test_on_cuda_compare_trains_torch_eager_and_compiled():
    from mtbench.runner.results.compare import plan_runs
    labels = lambda specs: [spec.label for spec in specs]
    assert labels(plan_runs("jax,torch", devices={"jax": H100, "torch": H100})) == \
        ["jax", "torch", "torch+torch-compile"]
    assert labels(plan_runs("jax,torch", devices={"jax": CPU, "torch": CPU})) == ["jax", "torch"]
    # The user's own runs are left as named: extras for every run, or a matrix.
    assert labels(plan_runs("jax,torch", ["flash-attention"], devices={"torch": H100})) == \
        ["jax+flash-attention", "torch+flash-attention"]
    assert labels(plan_runs(matrix="jax;torch", devices={"torch": H100})) == ["jax", "torch"]


def test_runs_that_would_see_different_hardware_are_refused_before_training():
    from mtbench.errors import MtbenchError
    from mtbench.runner.results.compare import check_same_hardware, plan_runs
    specs = plan_runs("jax,torch")
    check_same_hardware(specs, {"jax": H100, "torch": H100})
    check_same_hardware(specs, {"jax": CPU, "torch": CPU})
    with pytest.raises(MtbenchError) as error:
        check_same_hardware(specs, {"jax": CPU, "torch": H100})
    assert str(error.value) == (
        "the runs would train on different hardware: jax sees cpu (Intel(R) Xeon(R) Processor), torch sees gpu "
        "(NVIDIA H100 80GB HBM3); jax sees only the CPU on a machine with an accelerator: install its accelerator "
        "build (JAX: pip install 'mtbench[jax-cuda]')")
    a100 = {"kind": "gpu", "name": "NVIDIA A100-SXM4-80GB", "count": 1}
    with pytest.raises(MtbenchError, match="jax sees gpu \\(NVIDIA A100-SXM4-80GB\\), torch sees gpu"):
        check_same_hardware(specs, {"jax": a100, "torch": H100})


def test_the_device_probe_asks_a_child_process():
    """The orchestrator imports no framework (one would hold GPU memory while the runs train): the devices come
    from `mtbench env --json` in a child."""
    import subprocess
    import sys as system
    code = ("import json, sys; from mtbench.runner.results.compare import probe_devices; devices = probe_devices(); "
            "print(json.dumps({'devices': devices, 'imported': [m for m in ('jax', 'torch', 'keras') "
            "if m in sys.modules]}))")
    proc = subprocess.run([system.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["imported"] == []
    assert report["devices"]["jax"]["kind"] == report["devices"]["torch"]["kind"] == "cpu"
