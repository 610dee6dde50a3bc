"""Ctrl-C during `mtbench compare`: the run under way stops after its step and writes its partial result, its log
is kept, the combined JSON holds every run that has a result (marked interrupted), and one line names them."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import TINY_TRAIN, cli_environment, exec_after
from mtbench.runner.orchestration.compare import CompareProgress, ComparePlan, interrupted
from mtbench.runner.orchestration.runs import plan_runs
from mtbench.runner.results.schema import schema_errors


def child_of(pid, word):
    """The pid of a child process of `pid` whose command line holds `word`, or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid and word.encode() in command:
            return int(entry)
    return None


def output_of(pid):
    """What process `pid` has written to its stdout so far (compare sends it to a file)."""
    try:
        with open(f"/proc/{pid}/fd/1", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def taking_ctrl_c(command):
    """A process started from a shell's background job inherits SIGINT ignored, and Python then leaves it ignored:
    the Ctrl-C below would be lost and the run would train on to its last step."""
    return exec_after(command, default_sigint=True)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the training process through /proc")
@pytest.mark.parametrize("stop, name, code", [(signal.SIGINT, "SIGINT", 130), (signal.SIGTERM, "SIGTERM", 143)])
def test_ctrl_c_keeps_the_partial_run_its_log_and_a_combined_json(tmp_path, cache_dir, stop, name, code):
    """A SIGTERM (a scheduler's, `kill`) is passed on as Ctrl-C is: it ended compare at once and left its run
    training on alone, with nothing combined."""
    out = tmp_path / "c.json"
    runs = tmp_path / "c.runs"
    proc = subprocess.Popen(taking_ctrl_c([sys.executable, "-m", "mtbench", "compare", "--matrix", "torch", *TINY_TRAIN,
                                           "--steps", "5000", "--cache-dir", cache_dir, "--out", str(out)]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_environment())
    try:
        deadline = time.monotonic() + 300
        trainer = None
        # The corpus report is printed before the model is built; training starts a few seconds later.
        while trainer is None or "test sources also in the training data" not in output_of(trainer):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the training process did not start"
            trainer = child_of(proc.pid, "train")
            time.sleep(0.2)
        # Interrupted in its steady steps, after its warm-up (a line every 10 steps), long before its last.
        while "step 30/5000" not in output_of(trainer):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the run trained no steady steps"
            time.sleep(0.2)
        assert child_of(proc.pid, "train") == trainer, "the run ended before it was interrupted"
        proc.send_signal(stop)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr
    result_file, log_file = runs / "torch-1.json", runs / "torch-1.log"
    assert stderr.strip().splitlines() == [
        f"Error: interrupted during run 'torch' (0 of 1 runs finished); its partial result {result_file}; log "
        f"{log_file}; the 1 result(s) combined in {out} (status interrupted)"]

    result = json.loads(result_file.read_text())
    assert schema_errors(result) == [] and result["status"] == "interrupted"
    assert 0 < result["timing"]["steps"] < 5000
    assert "machine_load" in result
    log = log_file.read_text()
    assert f"# exit code {code} (interrupted)" in log
    assert f"Error: interrupted: {name} received; stopped after step" in log
    combined = json.loads(out.read_text())
    assert combined["status"] == "interrupted"
    assert combined["status_reason"] == "interrupted during run 'torch' (0 of 1 runs finished)"
    [entry] = combined["runs"]
    assert entry["status"] == "interrupted" and entry["position"] == 1
    assert entry["result"] == result and entry["log_file"] == str(log_file)


def test_an_interruption_combines_the_finished_runs_with_the_partial_one(tiny_runs, tmp_path):
    """The interrupted comparison's own bookkeeping, from real results: jax finished, torch was stopped at
    step 20 and wrote its partial result."""
    specs = plan_runs("jax,torch")
    plan = ComparePlan(specs, 2, None, [], str(tmp_path / "c.json"), False, 50, 0.01)
    os.makedirs(plan.runs_dir)
    progress = CompareProgress()
    weights = tiny_runs["jax"]["result"]["config"]["initial_weights_sha256"]
    progress.weights[specs[0].shape] = {"file": "w.npz", "sha256": weights, "drawn_on": "jax"}
    progress.add(specs[0], 1, tiny_runs["jax"]["result"], plan.run_file(specs[0], 1), plan.run_file(specs[0], 1, ".log"))
    partial = json.loads(json.dumps(tiny_runs["torch"]["result"]))
    partial["status"], partial["status_reason"] = "interrupted", "SIGINT received; stopped after step 20"
    partial["history"] = partial["history"][:20]
    result_file, log_file = plan.run_file(specs[1], 1), plan.run_file(specs[1], 1, ".log")
    with open(result_file, "w") as f:
        json.dump(partial, f)
    with open(log_file, "w") as f:
        f.write("# exit code 130 (interrupted)\n")
    progress.doing, progress.log_file = "run 'torch' (repeat 1 of 2)", log_file
    progress.run = (specs[1], 1, result_file, None)

    error = interrupted(plan, progress)
    assert error.exit_code == 130
    assert str(error) == (f"interrupted during run 'torch' (repeat 1 of 2) (1 of 4 runs finished); its partial "
                          f"result {result_file}; log {log_file}; the 2 result(s) combined in {plan.out} (status "
                          f"interrupted)")
    combined = json.loads((tmp_path / "c.json").read_text())
    assert combined["status"] == "interrupted"
    assert [(run["label"], run["position"], run["status"]) for run in combined["runs"]] == \
        [("jax", 1, "completed"), ("torch", 2, "interrupted")]
    assert combined["parity"]["pairs"][0]["steps"] == 20 and combined["parity"]["passed"] is True


def test_an_interruption_before_any_run_says_nothing_was_trained(tmp_path):
    plan = ComparePlan(plan_runs("jax,torch"), 1, None, [], str(tmp_path / "c.json"), False, 50, 0.01)
    log = tmp_path / "initial-weights.log"
    log.write_text("# exit code 130 (interrupted)\n")
    progress = CompareProgress(doing="writing the initial weights", log_file=str(log))
    assert str(interrupted(plan, progress)) == (f"interrupted during writing the initial weights (0 of 2 runs "
                                                f"finished); log {log}; nothing was trained")
    assert not (tmp_path / "c.json").exists()


def test_a_run_that_completed_as_the_ctrl_c_came_is_not_called_partial(tiny_runs, tmp_path):
    specs = plan_runs("torch")
    plan = ComparePlan(specs, 1, None, [], str(tmp_path / "c.json"), False, 50, 0.01)
    os.makedirs(plan.runs_dir)
    progress = CompareProgress()
    progress.weights[specs[0].shape] = {"file": "w.npz", "drawn_on": "torch",
                                        "sha256": tiny_runs["torch"]["result"]["config"]["initial_weights_sha256"]}
    result_file = plan.run_file(specs[0], 1)
    with open(result_file, "w") as f:
        json.dump(tiny_runs["torch"]["result"], f)
    progress.doing, progress.log_file = "run 'torch'", plan.run_file(specs[0], 1, ".log")
    progress.run = (specs[0], 1, result_file, None)
    assert str(interrupted(plan, progress)).startswith(
        f"interrupted during run 'torch' (0 of 1 runs finished); its result (it had completed) {result_file}; ")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the training process through /proc")
def test_a_sigterm_before_the_rerun_trains_releases_its_result_path(compared, tmp_path):
    """A SIGTERM passed on to the rerun's training process as it prepared (the backend, the data, the model) ended
    that process at once, outside training's own handlers: its result path's lock (PATH.lock) stayed behind, and
    the process said nothing. Now it stops as a Ctrl-C there does, saying so, and takes its lock with it."""
    original = compared["combined"]["runs"][0]["result_file"]
    with open(original, "rb") as f:
        original_bytes = f.read()
    out, lock = tmp_path / "again.json", tmp_path / "again.json.lock"
    proc = subprocess.Popen([sys.executable, "-m", "mtbench", "rerun", original, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_environment())
    try:
        deadline = time.monotonic() + 300
        # The lock holds the trainer's id once taken; importing the backend alone takes longer than the wait after.
        while not (lock.exists() and lock.read_text().strip()):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the rerun's training process took no lock"
            time.sleep(0.05)
        trainer = int(lock.read_text())
        time.sleep(0.5)
        assert child_of(proc.pid, "train") == trainer and not out.exists(), "the rerun ended before it was stopped"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr
    assert sorted(os.listdir(tmp_path)) == ["again.log", "again.train.json"]  # no lock, no result
    log = (tmp_path / "again.log").read_text()
    assert "Error: SIGTERM received; no checkpoint or result was written\n# exit code 143 (interrupted)" in log
    from mtbench.runner.run_file import read_run_file
    assert read_run_file(str(tmp_path / "again.train.json")).out == str(out)  # what was written is whole
    with open(original, "rb") as f:
        assert f.read() == original_bytes
