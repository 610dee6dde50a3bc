"""A run of `mtbench compare` that fails: the comparison stops with one line, and its combined JSON holds every run
that has a result (the failed run's partial one too, marked failed), so that it names what its runs folder holds."""

import json
import os

import pytest

from conftest import CPU_ONLY, ONE_BUCKET, TINY_TRAIN, assert_refused_in_one_line, run_cli
from mtbench.errors import RunFailure
from mtbench.runner.orchestration.compare import CompareProgress, ComparePlan, failed
from mtbench.runner.orchestration.runs import plan_runs
from mtbench.runner.results.schema import schema_errors


GPT_TINY = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "16", "--steps", "3",
            "--measure-only"]


@pytest.fixture(scope="module")
def comparisons_into_one_out(tmp_path_factory, cache_dir):
    """Three comparisons into one --out, in turn: one whose run is killed before it has a result, leaving the
    comparison's weights file and no combined JSON; one whose run diverges, which replaces those files without
    --overwrite and leaves the run's partial result; and, that combined JSON removed, one that the partial result
    keeps from replacing the weights file."""
    folder = tmp_path_factory.mktemp("compare-failure")
    out, runs = folder / "c.json", folder / "c.runs"
    killed = run_cli("compare", "--matrix", "jax", *GPT_TINY, "--cache-dir", cache_dir, "--out", str(out),
                     env={**CPU_ONLY, "MTBENCH_TEST_KILL_AT": "0:1"})
    weights_left = (runs / "initial-weights.npz").exists() and not out.exists()
    # --matrix: this one run (--backends adds torch compiled beside it where torch sees a GPU)
    diverged = run_cli("compare", "--matrix", "torch", *TINY_TRAIN, *ONE_BUCKET, "--steps", "8", "--cache-dir",
                       cache_dir, "--out", str(out), env={"MTBENCH_TEST_NAN_AT_STEP": "5"})
    combined = json.loads(out.read_text()) if out.exists() else None
    out.unlink(missing_ok=True)  # a run's result is left in the folder: its weights file is no leftover
    again = run_cli("compare", "--matrix", "jax:batch-size=8", *GPT_TINY, "--cache-dir", cache_dir, "--out", str(out),
                    env=CPU_ONLY)
    return {"out": out, "runs": runs, "killed": killed, "weights_left": weights_left, "diverged": diverged,
            "combined": combined, "again": again}


@pytest.mark.slow
def test_a_diverged_run_ends_the_comparison_with_its_partial_result_combined(comparisons_into_one_out):
    out, proc = comparisons_into_one_out["out"], comparisons_into_one_out["diverged"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    runs = comparisons_into_one_out["runs"]
    result_file, log_file = runs / "torch-1.json", runs / "torch-1.log"
    assert proc.stderr.strip().splitlines() == [
        f"Error: run 'torch' failed: training diverged: the loss is nan at step 5; partial result in {result_file} "
        f"(log: {log_file}); the 1 result(s) combined in {out} (status failed)"]
    combined = comparisons_into_one_out["combined"]
    assert combined["status"] == "failed"
    assert combined["status_reason"].startswith("run 'torch' failed: training diverged: the loss is nan at step 5")
    assert combined["status_reason"].endswith("(0 of 1 runs finished)")
    [entry] = combined["runs"]
    assert (entry["label"], entry["status"], entry["result_file"]) == ("torch", "diverged", str(result_file))
    assert schema_errors(entry["result"]) == [] and entry["result"]["timing"]["steps"] == 5


def test_a_failure_combines_the_finished_runs_with_the_failed_ones_partial_result(tiny_runs, tmp_path):
    specs = plan_runs("jax,torch")
    plan = ComparePlan(specs, 1, None, [], str(tmp_path / "c.json"), False, 50, 0.01)
    os.makedirs(plan.runs_dir)
    progress = CompareProgress()
    progress.weights[specs[0].shape] = {"file": "w.npz", "drawn_on": "jax",
                                        "sha256": tiny_runs["jax"]["result"]["config"]["initial_weights_sha256"]}
    progress.add(specs[0], 1, tiny_runs["jax"]["result"], plan.run_file(specs[0], 1), plan.run_file(specs[0], 1, ".log"))
    partial = json.loads(json.dumps(tiny_runs["torch"]["result"]))
    partial["status"], partial["status_reason"] = "diverged", "the loss is nan at step 12"
    partial["history"] = partial["history"][:12]
    result_file = plan.run_file(specs[1], 1)
    with open(result_file, "w") as f:
        json.dump(partial, f)
    progress.doing, progress.log_file = "run 'torch'", plan.run_file(specs[1], 1, ".log")
    progress.failed_run = (specs[1], 1, result_file, None)

    error = failed(plan, progress, RunFailure(f"run 'torch' failed: training diverged; partial result in "
                                              f"{result_file} (log: L)"))
    assert isinstance(error, RunFailure) and error.exit_code == 1
    assert str(error) == (f"run 'torch' failed: training diverged; partial result in {result_file} (log: L); the 2 "
                          f"result(s) combined in {plan.out} (status failed)")
    combined = json.loads((tmp_path / "c.json").read_text())
    assert (combined["status"], combined["status_reason"]) == \
        ("failed", f"run 'torch' failed: training diverged; partial result in {result_file} (log: L) (1 of 2 runs "
                   f"finished)")
    assert [(run["label"], run["position"], run["status"]) for run in combined["runs"]] == \
        [("jax", 1, "completed"), ("torch", 2, "diverged")]
    assert combined["parity"]["pairs"][0]["steps"] == 12


def test_a_failure_before_any_run_finished_says_the_comparison_before_is_left(tmp_path):
    """Under --overwrite the first run failed without a result: the earlier comparison's file is not replaced by an
    empty one, and the line says that its runs' files are no longer all its own."""
    plan = ComparePlan(plan_runs("jax,torch"), 1, None, [], str(tmp_path / "c.json"), True, 50, 0.01)
    (tmp_path / "c.json").write_text('{"kind": "mtbench-compare", "runs": []}\n')
    progress = CompareProgress(doing="run 'jax'", log_file=str(tmp_path / "jax.log"))
    progress.weights[plan.specs[0].shape] = {"file": "w.npz", "drawn_on": "jax", "sha256": "0" * 64}
    progress.failed_run = (plan.specs[0], 1, plan.run_file(plan.specs[0], 1), None)
    error = failed(plan, progress, RunFailure("run 'jax' failed: out of memory (log: L)"))
    assert str(error) == (f"run 'jax' failed: out of memory (log: L); no result from run 'jax'; no run finished: no "
                          f"combined JSON: {plan.out} is still the comparison before, whose files in {plan.runs_dir} "
                          f"this one began to replace")
    assert (tmp_path / "c.json").read_text() == '{"kind": "mtbench-compare", "runs": []}\n'


@pytest.mark.slow
def test_a_comparison_that_failed_before_any_result_leaves_nothing_the_next_one_refuses(comparisons_into_one_out):
    """Its weights file (and logs, run files) are the comparison's own, never asked for: the next comparison into
    the same --out replaces them without --overwrite; once a run has a result, even a partial one, they stay
    protected."""
    killed, runs = comparisons_into_one_out["killed"], comparisons_into_one_out["runs"]
    assert killed.returncode == 1 and "no run finished: no combined JSON" in killed.stderr, killed.stderr[-3000:]
    assert comparisons_into_one_out["weights_left"]
    # The next one trained (and failed in its run, `test_a_diverged_run_...`) where it would have been refused.
    diverged = comparisons_into_one_out["diverged"]
    assert diverged.returncode == 1 and "training diverged" in diverged.stderr, diverged.stderr[-3000:]
    assert comparisons_into_one_out["combined"]["runs"][0]["status"] == "diverged"
    assert_refused_in_one_line(comparisons_into_one_out["again"],
                               f"{runs / 'initial-weights.npz'}: already exists; pass --overwrite")
