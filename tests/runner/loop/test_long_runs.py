"""Long runs that end badly and the work they keep: a SIGKILL and --resume, Ctrl-C and SIGTERM, a diverging
loss, and stopping at a target quality. Each runs the CLI in a subprocess on the tiny preset, as users do."""

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from conftest import ONE_BUCKET, TINY_TRAIN, env_with, run_cli, run_joined_probes
from mtbench.runner.results.schema import schema_errors
from mtbench.runner.loop.signals import Stopped, stop_at_once, stop_requests

CHECKPOINTED = [*TINY_TRAIN, "--checkpoint-every", "10"]


def start(*args):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["MTBENCH_LOAD_PLUGINS"] = ""
    return subprocess.Popen([sys.executable, "-m", "mtbench", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def signal_after_first_checkpoint(proc, run_dir, signum, timeout=300):
    """Sends `signum` as soon as the first checkpoint exists, while training goes on."""
    deadline = time.monotonic() + timeout
    while not os.path.isdir(os.path.join(run_dir, "checkpoint-000010")):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=timeout)
    return stdout, stderr


def read(path):
    with open(path) as f:
        return json.load(f)


def losses(result):
    return np.array([h["loss"] for h in result["history"]])


def checkpoint_steps(run_dir):
    return sorted(int(name.split("-")[1]) for name in os.listdir(run_dir) if name.startswith("checkpoint-"))


@pytest.mark.slow
def test_killed_run_resumes_to_the_losses_of_an_uninterrupted_run(tmp_path, cache_dir, tiny_runs):
    out, run_dir = str(tmp_path / "killed.json"), str(tmp_path / "killed.run")
    proc = start("--backend", "jax", *CHECKPOINTED, "--cache-dir", cache_dir, "--out", out)
    signal_after_first_checkpoint(proc, run_dir, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL and not os.path.exists(out)
    saved = checkpoint_steps(run_dir)
    assert saved and saved[-1] < 60

    resumed = run_cli("train", "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {run_dir} after step {saved[-1]}" in resumed.stdout
    result = read(out)
    assert schema_errors(result) == [] and result["status"] == "completed"
    assert result["timing"]["resumed_at_steps"] == [saved[-1] + 1]
    uninterrupted = tiny_runs["jax"]["result"]
    assert [h["shape"] for h in result["history"]] == [h["shape"] for h in uninterrupted["history"]]
    np.testing.assert_allclose(losses(result), losses(uninterrupted), rtol=0, atol=1e-4)
    assert result["metrics"]["val_loss"] == pytest.approx(uninterrupted["metrics"]["val_loss"], abs=1e-4)


def assert_interrupted(proc, stdout, stderr, out, run_dir, signal_name, exit_code):
    assert proc.returncode == exit_code, stderr[-3000:]
    result = read(out)
    step = result["timing"]["steps"]
    again = " (Ctrl-C again stops at once, without them)" if signal_name == "SIGINT" else ""
    assert (f"{signal_name} received: stopping after step {step}, writing a checkpoint and the partial "
            f"result{again}") in stdout.splitlines()
    assert stderr.strip() == (f"Error: interrupted: {signal_name} received; stopped after step {step}; partial "
                              f"result in {out}, checkpoint {run_dir}/checkpoint-{step:06d}; continue with: "
                              f"mtbench train --resume {run_dir}")
    assert schema_errors(result) == []
    assert result["status"] == "interrupted" and 10 <= step < 60
    assert [h["step"] for h in result["history"]] == list(range(1, step + 1))
    assert result["metrics"]["train_loss_last_steps"] > 0
    assert result["metrics"]["val_loss"] is None and result["metrics"]["bleu"] is None
    assert result["hypotheses_file"] is None
    assert result["checkpoint"] == f"{run_dir}/checkpoint-{step:06d}" and os.path.isdir(result["checkpoint"])
    return result


def test_ctrl_c_finishes_the_step_and_keeps_a_checkpoint_and_partial_result(tmp_path, cache_dir):
    out, run_dir = str(tmp_path / "sigint.json"), str(tmp_path / "sigint.run")
    proc = start("--backend", "jax", *CHECKPOINTED, *ONE_BUCKET, "--cache-dir", cache_dir, "--out", out)
    stdout, stderr = signal_after_first_checkpoint(proc, run_dir, signal.SIGINT)
    assert_interrupted(proc, stdout, stderr, out, run_dir, "SIGINT", 130)


def test_signals_are_recorded_once_and_a_second_ctrl_c_stops_at_once():
    previous = signal.getsignal(signal.SIGINT)
    with stop_requests() as requests:
        signal.raise_signal(signal.SIGTERM)
        assert requests.requested and requests.name == "SIGTERM" and requests.exit_code == 143
        with pytest.raises(KeyboardInterrupt) as stopped:
            signal.raise_signal(signal.SIGINT)
        assert str(stopped.value) == "SIGTERM received, then SIGINT: stopped at once"
        assert stopped.value.exit_code == 130
    assert signal.getsignal(signal.SIGINT) is previous


@pytest.mark.parametrize("handlers", [stop_requests, stop_at_once])
def test_a_ctrl_c_while_the_handlers_change_leaves_none_of_them_behind(handlers):
    """`signal.signal` runs the handlers of signals already come before it changes one: a Ctrl-C landing as one
    handler was put back raised out of putting back the other, which stayed installed for the rest of the process
    (every later SIGTERM recorded and dropped). Here the Ctrl-C lands at each change in turn."""
    import _signal
    import _thread
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for landing in range(1, 5):  # the two handlers installed, then the two put back
        changes = []

        def ctrl_c_at_a_change(frame, event, arg):
            if event == "c_call" and arg is _signal.signal:
                changes.append(arg)
                if len(changes) == landing:
                    _thread.interrupt_main(signal.SIGINT)  # a Ctrl-C, taken at the next instruction that checks

        sys.setprofile(ctrl_c_at_a_change)
        try:
            with handlers():
                pass
        except (KeyboardInterrupt, Stopped):
            pass  # where it lands, the one the handler then in place raises
        finally:
            sys.setprofile(None)
        assert {signum: signal.getsignal(signum) for signum in previous} == previous, landing


# Work after a signal that is sent again from a thread: it stops within milliseconds, or once a new thread gets the
# CPU on a loaded machine (10 million appends, 0.6 s, once ran to their end under the full suite); never this late.
LATER_WORK_S = 60


def work_until_stopped(went_on, seconds=LATER_WORK_S):
    """Appends to `went_on` for `seconds`, unless stopped before."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        went_on.append(len(went_on))


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_inside_a_callback_stops_once_the_callback_has_returned():
    """A SIGTERM taken inside a garbage collector's callback (JAX frees device buffers in one) or a `__del__`: a
    Stopped raised there was printed with a traceback and dropped ("Exception ignored in ..."), the callback's own
    work cut short, and the evaluation went on to its end. The callback now finishes, and the work after it stops."""
    callback_work, went_on = [], []

    def frees_buffers(phase, info):
        if phase == "start" and not callback_work:
            signal.raise_signal(signal.SIGTERM)  # the handler runs at the next instruction, inside the callback
            callback_work.extend(range(100_000))
    try:
        with pytest.raises(Stopped) as stopped:
            with stop_at_once():
                gc.callbacks.append(frees_buffers)  # inside: a collection before the handler would end pytest
                gc.collect()
                work_until_stopped(went_on)
    finally:
        if frees_buffers in gc.callbacks:
            gc.callbacks.remove(frees_buffers)
    # Not deferred: the stop came inside the work after the callback, not at the block's end a minute later.
    assert len(callback_work) == 100_000
    assert not stopped.value.deferred and stopped.value.exit_code == 143

    class DropsWhatItRaises:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)
            self.taken = True

    previous, went_on = signal.getsignal(signal.SIGTERM), []
    with pytest.raises(Stopped) as stopped:
        with stop_at_once():
            DropsWhatItRaises()
            work_until_stopped(went_on)
    assert not stopped.value.deferred and signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_python_swallows_where_it_cannot_be_told_is_sent_again_and_stops_the_work_after_it(capfd,
                                                                                                 monkeypatch):
    """A weak reference's callback swallows what is raised in it, as a `__del__` does, but nothing on the stack says
    so (JAX frees arrays in such callbacks, which a collection of earlier work may run at any moment): the Stopped is
    dropped there, not printed, and sent again, to stop the work after the callback. Where the block ends before it
    comes, the block's end stops, saying it came late."""
    class Referent:
        pass

    def callback(reference):
        signal.raise_signal(signal.SIGTERM)
        went_on.append("callback")  # cut short: the Stopped is raised before it
    previous, went_on, referent = signal.getsignal(signal.SIGTERM), [], Referent()
    reference = weakref.ref(referent, callback)
    with pytest.raises(Stopped) as stopped:
        with stop_at_once():
            del referent
            work_until_stopped(went_on)
    assert "callback" not in went_on and reference() is None
    assert not stopped.value.deferred and stopped.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is previous
    assert "Exception ignored" not in capfd.readouterr().err

    monkeypatch.setattr("mtbench.runner.loop.signals.RESEND_DELAY_S", LATER_WORK_S)  # the block ends first
    went_on, referent = [], Referent()
    reference = weakref.ref(referent, callback)
    with pytest.raises(Stopped) as stopped:
        with stop_at_once():
            del referent
            went_on.append("block")
    assert went_on == ["block"] and stopped.value.deferred and stopped.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is previous and "Exception ignored" not in capfd.readouterr().err
    with pytest.raises(Stopped) as at_once:  # where nothing swallows it, at once
        with stop_at_once():
            signal.raise_signal(signal.SIGTERM)
            went_on.append("after")
    assert went_on == ["block"] and not at_once.value.deferred


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_stop_sent_again_before_the_unraisable_hook_returns_is_sent_once_more(capfd, monkeypatch):
    """The thread that sends a swallowed stop again may send it before the hook that started it returns (a busy
    machine, 1 ms later): Python drops what its unraisable hook raises, so the stop is sent again from there too,
    not lost while the work it should stop runs on."""
    class SendsAtOnceTheFirstTime(threading.Thread):
        sent = []

        def start(self):
            if self.sent:
                return super().start()
            self.sent.append(True)
            self.run()  # still inside the hook

    monkeypatch.setattr("mtbench.runner.loop.signals.threading.Thread", SendsAtOnceTheFirstTime)

    class Referent:
        pass

    went_on, referent = [], Referent()
    reference = weakref.ref(referent, lambda reference: signal.raise_signal(signal.SIGTERM))
    with pytest.raises(Stopped) as stopped:
        with stop_at_once():
            del referent
            work_until_stopped(went_on)
    assert SendsAtOnceTheFirstTime.sent and reference() is None
    assert not stopped.value.deferred and "Exception ignored" not in capfd.readouterr().err


@pytest.mark.slow
def test_sigterm_then_resume_replaces_the_partial_result_with_the_uninterrupted_figures(tmp_path, cache_dir,
                                                                                         tiny_runs):
    out, run_dir = str(tmp_path / "sigterm.json"), str(tmp_path / "sigterm.run")
    # eager, as the tiny run it is held to (on a GPU `--step auto` would compile)
    proc = start("--backend", "torch", "--step", "eager", *CHECKPOINTED, "--cache-dir", cache_dir, "--out", out)
    stdout, stderr = signal_after_first_checkpoint(proc, run_dir, signal.SIGTERM)
    partial = assert_interrupted(proc, stdout, stderr, out, run_dir, "SIGTERM", 143)

    resumed = run_cli("train", "--resume", run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    result = read(out)
    assert result["status"] == "completed" and result["backend"] == "torch"
    assert result["history"][:partial["timing"]["steps"]] == partial["history"]
    np.testing.assert_allclose(losses(result), losses(tiny_runs["torch"]["result"]), rtol=0, atol=1e-4)
    again = run_cli("train", "--resume", run_dir)
    assert again.returncode == 2
    assert "the run already has a result with status completed; there is nothing to resume" in again.stderr


def test_nan_loss_stops_the_run_as_diverged_and_keeps_the_partial_result(tmp_path, cache_dir):
    out, run_dir = str(tmp_path / "nan.json"), str(tmp_path / "nan.run")
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", "20", "--checkpoint-every", "3",
                   "--cache-dir", cache_dir, "--out", out, env={"MTBENCH_TEST_NAN_AT_STEP": "5"})
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"Error: training diverged: the loss is nan at step 5; partial result in {out}, "
                                   f"checkpoint {run_dir}/checkpoint-000003; continue with: mtbench train "
                                   f"--resume {run_dir}")
    result = read(out)
    assert schema_errors(result) == []
    assert result["status"] == "diverged" and result["status_reason"] == "the loss is nan at step 5"
    assert [h["loss"] is None for h in result["history"]] == [False] * 4 + [True]
    assert result["timing"]["steps"] == 5 and result["metrics"]["test_loss"] is None
    assert checkpoint_steps(run_dir) == [3]


@pytest.fixture(scope="module")
def moved_run(tmp_path_factory, cache_dir):
    """Run A stops (a NaN at step 5) and is moved, its result and RESULT.run together; run B stops (a NaN at step 4)
    at A's old path. A is resumed, then B, whose saved model's place a file has taken (the test of that stopped a
    run of its own: 8 CPU s more)."""
    folder = tmp_path_factory.mktemp("moved")
    (folder / "moved").mkdir()
    old, moved = folder / "p.json", folder / "moved" / "p.json"
    flags = [*TINY_TRAIN, *ONE_BUCKET, "--steps", "8", "--checkpoint-every", "3", "--cache-dir", cache_dir]
    first = run_cli("train", "--backend", "jax", *flags, "--out", str(old), env={"MTBENCH_TEST_NAN_AT_STEP": "5"})
    assert first.returncode == 1, first.stderr[-3000:]
    old.rename(moved)
    (folder / "p.run").rename(folder / "moved" / "p.run")
    second = run_cli("train", "--backend", "jax", *flags, "--seed", "7", "--out", str(old),
                     env={"MTBENCH_TEST_NAN_AT_STEP": "4"})
    assert second.returncode == 1, second.stderr[-3000:]
    seen = {"old": old, "moved": moved, "resumed": run_cli("train", "--resume", str(folder / "moved" / "p.run"))}
    seen.update(result=read(moved), at_old_path=read(old), checkpoints_at_old_path=checkpoint_steps(folder / "p.run"))
    (folder / "p.run" / "model").write_text("not a saved model")
    seen["unsaved"] = {"run_dir": folder / "p.run", "resumed": run_cli("train", "--resume", str(folder / "p.run")),
                       "result": read(old)}
    return seen


@pytest.mark.slow
def test_a_moved_run_resumes_into_the_result_beside_it_not_over_the_run_now_at_its_old_path(moved_run):
    """Run A stops (a NaN at step 5) and is moved, its result and RESULT.run together; run B stops at A's old path.
    Resuming A completes the result beside it: the run file's path, which it wrote to before, held B's."""
    resumed = moved_run["resumed"]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert moved_run["result"]["status"] == "completed" and moved_run["result"]["timing"]["steps"] == 8
    at_old_path = moved_run["at_old_path"]
    assert (at_old_path["status"], at_old_path["config"]["seed"], at_old_path["timing"]["steps"]) == ("diverged", 7, 4)
    assert moved_run["checkpoints_at_old_path"] == [3]  # B's checkpoint, still there to resume from


@pytest.mark.slow
def test_a_trained_model_that_cannot_be_saved_loses_none_of_the_runs_figures(moved_run):
    """The saved model's place is taken (here a file where its folder goes; on a full disk, the write fails): the
    run ends with the error, and its result is written, evaluation included, saying the model was not saved. The
    run is moved_run's B, resumed from its checkpoint after step 3."""
    out, run_dir = moved_run["old"], moved_run["unsaved"]["run_dir"]
    resumed, result = moved_run["unsaved"]["resumed"], moved_run["unsaved"]["result"]
    assert resumed.returncode == 1 and "Traceback" not in resumed.stderr
    last = resumed.stderr.strip().splitlines()[-1]
    assert last.startswith(f"Error: {run_dir / 'model'}: cannot save the trained model: ") and \
        last.endswith(f"; the run's figures are in {out}")
    assert schema_errors(result) == [] and result["status"] == "completed" and result["timing"]["steps"] == 8
    assert result["metrics"]["test_loss"] is not None and result["model"]["saved"] is None
    assert result["model"]["save_failed"] == last[len("Error: "):last.index("; the run's figures")]


def test_a_plugin_that_fails_while_training_ends_the_run_as_failed_with_its_partial_result(
        tmp_path, cache_dir, plugin_path):
    """A plugin's Keras callback raises at step 5: the run keeps the steps it trained and their checkpoint in a
    partial result (status `failed`, the plugin named), and its trackers get their `report`, as after a divergence,
    rather than a run left open."""
    out, run_dir, calls = str(tmp_path / "failed.json"), str(tmp_path / "failed.run"), tmp_path / "calls.txt"
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", "20", "--checkpoint-every", "3",
                   "--timing-window", "2", "--report-to", "calls-file", "--cache-dir", cache_dir, "--out", out,
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-thirdparty",
                        "MTBENCH_TEST_CALLBACK_FAILS_AT": "5", "MTBENCH_TEST_CALLS_FILE": str(calls)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    reason = ("after step 5, Keras callback FailsAt of plugin 'thirdparty' failed in on_train_batch_end: KeyError: "
              "'lost the mesh'")
    assert proc.stderr.strip().splitlines()[-1] == (
        f"Error: training failed {reason}; partial result in {out}, checkpoint {run_dir}/checkpoint-000003; "
        f"continue with: mtbench train --resume {run_dir}")
    result = read(out)
    assert schema_errors(result) == []
    assert (result["status"], result["status_reason"]) == ("failed", reason)
    # The callback saw step 5 where the window of steps 5 and 6 ended: the steps recorded before it are kept.
    assert [entry["step"] for entry in result["history"]] == [1, 2, 3, 4, 5] and result["timing"]["steps"] == 5
    assert result["metrics"]["test_loss"] is None
    assert checkpoint_steps(run_dir) == [3]
    lines = calls.read_text().splitlines()
    assert lines[0] == "start" and lines[-1] == "report complete=False status=failed"


@pytest.fixture(scope="module")
def stopped_torch_run(tmp_path_factory, cache_dir):
    """A torch run on a pairs file of its own, stopped by a NaN at step 6 with steps 1-5 trained and a checkpoint
    after step 3 ('fresh', its partial result), then resumed three times: with its run file saying it trained on
    another device and torch version ('devices': refused), with a line added to its data since ('data': refused),
    and as it was ('resumed', 'result'). The three tests that read it stopped a run each (20 CPU s more); between
    the resumes the run file and the data get their very bytes back."""
    from mtbench.plugins.datasets.bible_dataset import BibleDataset
    from mtbench.runner.data.corpus import load_dataset_pairs
    folder = tmp_path_factory.mktemp("stopped-torch")
    pairs = load_dataset_pairs(BibleDataset("en", "fr"), cache_dir, progress=lambda done, total: None)[:2000]
    data = folder / "pairs.tsv"
    data.write_text("".join(f"{s}\t{t}\n" for s, t in pairs))
    out, run_dir = str(folder / "stopped.json"), str(folder / "stopped.run")
    stopped = run_cli("train", "--backend", "torch", "--step", "eager", "--data", str(data), "--preset", "tiny",
                      "--steps", "8", "--batch-size", "32", *ONE_BUCKET, "--valid-size", "100", "--test-size", "100",
                      "--dtype", "float32", "--checkpoint-every", "3", "--cache-dir", cache_dir, "--out", out,
                      env={"MTBENCH_TEST_NAN_AT_STEP": "6"})
    assert stopped.returncode == 1 and checkpoint_steps(run_dir) == [3], stopped.stderr[-3000:]
    seen = {"out": out, "run_dir": run_dir, "fresh": read(out)}

    run_file = os.path.join(run_dir, "run.json")
    with open(run_file, "rb") as f:
        as_written = f.read()
    recorded, env = json.loads(as_written), seen["fresh"]["env"]
    moved = json.loads(as_written)
    other_device = f"{env['device']['name']}, another one"  # not this machine's, an H100 machine's included
    moved["ran_on"]["device"]["name"] = other_device
    moved["ran_on"]["versions"]["torch"] = "2.5.1"
    # another version may tokenize the same data otherwise: the versions are named, not the data
    moved["data_fingerprint"] = "spm-500-another-version"
    with open(run_file, "w") as f:
        json.dump(moved, f)
    seen["devices"] = {"recorded": recorded, "moved": moved, "other_device": other_device,
                       "proc": run_cli("train", "--resume", run_dir), "result": read(out),
                       "checkpoints": checkpoint_steps(run_dir), "run_file": read(run_file)}
    with open(run_file, "wb") as f:
        f.write(as_written)

    text = data.read_bytes()
    with open(data, "a") as f:
        f.write("A sentence added later.\tUne phrase ajoutée plus tard.\n")
    seen["data"] = {"proc": run_cli("train", "--resume", run_dir), "status": read(out)["status"]}
    data.write_bytes(text)

    seen["resumed"] = run_cli("train", "--resume", run_dir)
    seen["result"] = read(out)
    return seen


@pytest.mark.slow
def test_a_resumed_torch_run_updates_with_the_fused_adamw_of_a_fresh_one(stopped_torch_run):
    """The NaN at step 6 stops the run with steps 1-5 trained and a checkpoint after step 3; the resumed run's
    steps 4 and 5 are then those updates again, from the restored optimizer."""
    resumed, fresh, result = (stopped_torch_run[key] for key in ("resumed", "fresh", "result"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert result["timing"]["resumed_at_steps"] == [4]
    # Keras's `optimizer.apply` made 289 tensors from host data a step on the tiny preset; the fused AdamW none.
    assert fresh["host_syncs_per_step"] == result["host_syncs_per_step"] == 0
    assert fresh["train_step_detail"] == result["train_step_detail"] == ""
    np.testing.assert_allclose(losses(result)[:5].astype(float), losses(fresh)[:5].astype(float), rtol=1e-5)


# One length bucket: one train program and fewer decoding programs to compile (the test reads no bucket).
TARGET_RUN = [*TINY_TRAIN, *ONE_BUCKET, "--steps", "200", "--warmup-steps", "20", "--learning-rate", "3e-3"]


@pytest.mark.slow
def test_training_stops_when_validation_bleu_reaches_the_target(tmp_path, cache_dir):
    out = str(tmp_path / "target.json")
    proc = run_cli("train", "--backend", "jax", *TARGET_RUN, "--eval-every", "25", "--target-bleu", "0.05",
                   "--cache-dir", cache_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = read(out)
    target, timing = result["target"], result["timing"]
    evaluations = target["evaluations"]
    assert target["outcome"] == "reached" and result["status"] == "completed"
    assert [e["step"] for e in evaluations] == list(range(25, timing["steps"] + 1, 25))
    assert evaluations[-1]["bleu"] >= 0.05 > max(e["bleu"] for e in evaluations[:-1])
    assert target["steps_to_target"] == timing["steps"] < 200
    assert target["time_to_target_s"] == evaluations[-1]["training_s"] <= timing["train_s"]
    assert target["evaluation_s"] == pytest.approx(sum(e["seconds"] for e in evaluations))
    assert timing["validation_s"] >= target["evaluation_s"]
    assert result["status_reason"].startswith(f"validation BLEU {evaluations[-1]['bleu']:.2f} reached the target")
    assert result["metrics"]["bleu"] is not None
    assert "time to validation" in proc.stdout and f"reached at step {timing['steps']}" in proc.stdout


@pytest.mark.slow
def test_a_target_not_reached_is_a_result_too(tmp_path, cache_dir):
    out = str(tmp_path / "missed.json")
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", "20", "--eval-every", "10",
                   "--target-bleu", "50", "--cache-dir", cache_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = read(out)
    assert result["status"] == "completed" and result["timing"]["steps"] == 20
    assert result["target"]["outcome"] == "not reached"
    assert result["target"]["steps_to_target"] is None and result["target"]["time_to_target_s"] is None
    assert [e["step"] for e in result["target"]["evaluations"]] == [10, 20]
    assert "time to validation" in proc.stdout and "not reached" in proc.stdout


@pytest.mark.slow
def test_resume_refuses_training_data_that_changed_since(stopped_torch_run):
    resumed, run_dir = stopped_torch_run["data"]["proc"], stopped_torch_run["run_dir"]
    assert resumed.returncode == 2
    assert f"Error: {run_dir}: the training data, or the tokens made of it, differ from the run's" in resumed.stderr
    assert stopped_torch_run["data"]["status"] == "diverged"


@pytest.mark.slow
def test_resume_refuses_other_devices_or_versions_and_keeps_the_run(stopped_torch_run):
    """The run file records the devices and versions the result names; a resume where either differs is refused
    in one line (its earlier steps' times would count beside these in one result), the run left as it was."""
    seen, run_dir = stopped_torch_run["devices"], stopped_torch_run["run_dir"]
    recorded, env = seen["recorded"], stopped_torch_run["fresh"]["env"]
    assert recorded["ran_on"]["device"] == {key: env["device"][key] for key in ("kind", "name", "count")}
    assert recorded["ran_on"]["versions"] == {**env["backend_versions"], "keras": env["keras"],
                                              "mtbench": env["mtbench"]}
    resumed = seen["proc"]
    assert resumed.returncode == 2
    lines = resumed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {run_dir}: the run trained on other devices or versions ("), \
        resumed.stderr
    assert f"device name: {seen['other_device']} before, {env['device']['name']} now" in lines[0]
    assert f"torch: 2.5.1 before, {env['backend_versions']['torch']} now" in lines[0]
    assert seen["result"] == stopped_torch_run["fresh"] and seen["checkpoints"] == [3] and \
        seen["run_file"] == seen["moved"]


@pytest.mark.slow
@pytest.mark.parametrize("signum, exit_code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_after_training_keeps_the_trainings_figures_and_an_earlier_result_is_not_lost(
        tmp_path, cache_dir, signum, exit_code):
    """Stopped in the evaluation after training, a run wrote nothing: Ctrl-C ended in a bare 'interrupted', SIGTERM
    in no word at all, and under --overwrite the earlier result was already removed. Then its trained weights were
    lost with the process (a scheduler's SIGTERM at the end of a long run): they are kept in a checkpoint, and
    --resume evaluates them."""
    out = tmp_path / "late.json"
    out.write_text('{"an": "earlier result"}\n')
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    proc = subprocess.Popen([sys.executable, "-m", "mtbench", "train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET,
                             "--steps", "6", "--test-size", "600", "--cache-dir", cache_dir, "--out", str(out),
                             "--overwrite"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "MTBENCH_LOAD_PLUGINS": "", "PYTHONUNBUFFERED": "1"})
    try:
        for line in proc.stdout:  # off a terminal, each phase after training is a line as it starts
            if line.startswith("after training: evaluate"):
                proc.send_signal(signum)
                break
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == exit_code, stderr[-3000:]
    name = signal.Signals(signum).name
    run_dir = str(tmp_path / "late.run")
    checkpoint = os.path.join(run_dir, "checkpoint-000006")
    skipped = (f"{name} received after training: no evaluation, translation or saved model; the trained weights are "
               f"in {checkpoint} (mtbench train --resume {run_dir} evaluates them)")
    assert stderr.strip().splitlines() == [f"Error: interrupted: {skipped}; the training's figures are in {out}"]
    result = read(out)
    assert schema_errors(result) == [] and result["status"] == "completed"
    assert [h["step"] for h in result["history"]] == list(range(1, 7)) and result["timing"]["tokens_per_s"] > 0
    assert result["metrics"]["bleu"] is None and result["model"].get("saved") is None
    assert result["metrics"]["skipped"] == skipped and result["metrics"]["unevaluated_checkpoint"] == checkpoint
    assert checkpoint_steps(run_dir) == [6]
    if signum == signal.SIGTERM:
        resumed = run_cli("train", "--resume", run_dir, env={"MTBENCH_LOAD_PLUGINS": ""})
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        evaluated = read(out)
        assert evaluated["status"] == "completed" and "skipped" not in evaluated["metrics"]
        assert evaluated["metrics"]["bleu"] is not None and evaluated["model"]["saved"]
        assert [h["step"] for h in evaluated["history"]] == list(range(1, 7))
        assert [h["loss"] for h in evaluated["history"]] == [h["loss"] for h in result["history"]]


def test_a_signal_to_one_process_of_several_after_training_lets_every_process_finish_the_evaluation():
    """One process of several that left the evaluation at once would keep the others waiting in its collectives
    (the run hung until its timeout, then lost its result): each finishes it, then all stop alike, the process
    that received no signal as if it had received SIGTERM."""
    first, second = run_joined_probes("evaluation_signal_probe.py")
    for process, (name, code) in ((first, ("SIGTERM", 143)), (second, ("SIGINT", 130))):
        assert process["halves"] == [2.0, 4.0] and process["metrics"] == {"test_loss": 1.5}
        assert (process["stopped"], process["exit_code"]) == (name, code)
        assert process["said"] == f"{name} received after training, once every process had finished the evaluation"
