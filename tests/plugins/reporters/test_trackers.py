"""Experiment trackers (`--report-to`), read back with each library's own reader: what was streamed while the run
trained equals the result's history, and a tracker that fails does not stop the run or lose its result."""

import importlib.util
import json

import numpy as np
import pytest

from conftest import GPU_MACHINE, ONE_BUCKET, TINY_TRAIN, env_with, run_cli


def needs(*libraries):
    """Skips, saying why, on a GPU machine set up without the trackers' libraries (the offline GPU kit carries
    none): they come with the test extra, which `.ci/run` installs; elsewhere a missing one fails the test."""
    missing = [name for name in libraries if importlib.util.find_spec(name) is None]
    return pytest.mark.skipif(GPU_MACHINE and bool(missing),
                              reason=f"needs {', '.join(missing)} (pip install -e '.[test]')")


def reads_the_tracked_run(test):
    """A test of the shared run (`tracked`), which follows all three trackers: it needs their libraries, and is
    slow, their imports taking 11 s of one core, past what the day-to-day tier's 5 minutes hold."""
    return pytest.mark.slow(needs("tensorboard", "mlflow", "wandb")(test))


STEPS = 12
TRACKED = [*TINY_TRAIN, *ONE_BUCKET, "--steps", str(STEPS), "--eval-every", "6"]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, cache_dir, plugin_path):
    """One tiny run followed by all three built-in trackers and the plugin guide's CSV tracker, priced."""
    folder = tmp_path_factory.mktemp("tracked")
    out = folder / "run.json"
    proc = run_cli("train", "--backend", "jax", *TRACKED, "--cache-dir", cache_dir, "--out", str(out),
                   "--report-to", "tensorboard,mlflow,wandb,csv-tracker", "--price-per-hour", "3.6",
                   env={"MLFLOW_TRACKING_URI": None, "WANDB_MODE": None, "WANDB_DIR": None, **env_with(plugin_path),
                        "MTBENCH_LOAD_PLUGINS": "mtbench-csvtracker"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"folder": folder, "result": json.loads(out.read_text()), "stdout": proc.stdout, "stderr": proc.stderr}


def history_losses(result):
    return [h["loss"] for h in result["history"]]


@reads_the_tracked_run
def test_tensorboard_events_hold_the_streamed_figures(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    result = tracked["result"]
    events = EventAccumulator(str(tracked["folder"] / "run.run" / "tensorboard"))
    events.Reload()
    losses = events.Scalars("train_loss")
    assert [e.step for e in losses] == list(range(1, STEPS + 1))
    # TensorBoard keeps float32: the streamed values are the history's, rounded to float32.
    assert [e.value for e in losses] == [float(np.float32(loss)) for loss in history_losses(result)]
    assert [e.step for e in events.Scalars("tokens_per_s")] == [10]
    # The default 100-step warm-up cut to the run's 12 steps less one: Keras's ramp from 0, step s updating at
    # (s - 1) / 11 of the peak, the last step at the peak.
    peak, warmup = result["config"]["learning_rate"], STEPS - 1
    assert result["config"]["warmup_steps"] > STEPS
    rates = [peak * (step - 1) / warmup for step in range(1, STEPS + 1)]
    assert [h["step"] for h in result["history"]] == [e.step for e in events.Scalars("learning_rate")] == \
        list(range(1, STEPS + 1))
    assert [h["learning_rate"] for h in result["history"]] == pytest.approx(rates, rel=1e-6, abs=1e-12)
    assert [e.value for e in events.Scalars("learning_rate")] == pytest.approx(rates, rel=1e-6, abs=1e-12)
    bleu = events.Scalars("val_bleu")
    assert [(e.step, e.value) for e in bleu] == [(ev["step"], pytest.approx(ev["bleu"], rel=1e-6))
                                                 for ev in result["target"]["evaluations"]]
    assert events.Scalars("test_loss")[0].value == pytest.approx(result["metrics"]["test_loss"], rel=1e-6)
    assert events.Scalars("train_sample_loss")[0].value == pytest.approx(result["metrics"]["train_loss"], rel=1e-6)
    config = json.loads((tracked["folder"] / "run.run" / "tensorboard" / "config.json").read_text())
    assert config["tags"]["backend"] == "jax" and config["config"]["steps"] == STEPS


@reads_the_tracked_run
def test_the_plugin_guides_csv_tracker_as_written_holds_the_streamed_losses(tracked):
    """docs/plugins.md's tracker, copied as a reader copies it: a plugin that loads and follows the run."""
    rows = [line.split(",") for line in (tracked["folder"] / "run.run" / "figures.csv").read_text().splitlines()]
    losses = [float(value) for step, name, value in rows if name == "train_loss"]
    np.testing.assert_allclose(losses, history_losses(tracked["result"]), rtol=1e-6)


@reads_the_tracked_run
def test_mlflow_run_holds_params_tags_metrics_and_artifacts(tracked):
    from mlflow import MlflowClient
    result = tracked["result"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tracked['folder'] / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("mtbench").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "jax"
    assert run.data.tags["mtbench.backend"] == "jax" and run.data.tags["mtbench.dtype"] == "float32"
    assert run.data.params["steps"] == str(STEPS) and run.data.params["model.d_model"] == "64"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert sorted((m.step, m.value) for m in history) == list(enumerate(history_losses(result), start=1))
    assert run.data.metrics["bleu"] == pytest.approx(result["metrics"]["bleu"])
    assert run.data.metrics["usd"] == pytest.approx(result["cost"]["usd"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"run.json", "run.hyp.txt", "run.ref.txt", "loss.png"} <= artifacts


@reads_the_tracked_run
def test_wandb_offline_run_holds_the_streamed_figures(tracked):
    from wandb_reader import offline_history
    result = tracked["result"]
    [run_dir] = (tracked["folder"] / "run.run" / "wandb").glob("offline-run-*")
    history, summary, config = offline_history(run_dir)
    assert [(row["_step"], row["train_loss"]) for row in history if "train_loss" in row] == \
        list(enumerate(history_losses(result), start=1))
    assert summary["test_loss"] == pytest.approx(result["metrics"]["test_loss"])
    assert config["backend"] == "jax"


@reads_the_tracked_run
def test_the_result_records_energy_and_cost(tracked):
    result = tracked["result"]
    assert result["cost"]["price_per_hour"] == 3.6 and result["cost"]["currency"] == "USD"
    assert result["cost"]["usd"] == pytest.approx(3.6 * result["timing"]["total_s"] / 3600)
    assert result["cost"]["usd_to_target"] is None  # no target was set
    energy = result["energy"]
    if energy["source"] is None:  # this machine shows no counter: the reason, never a figure
        assert energy["reason"] and set(energy) == {"source", "reason"}
    else:
        assert energy["steady"]["joules"] > 0 and energy["run"]["joules"] >= energy["steady"]["joules"]


@needs("tensorboard")
def test_a_failing_tracker_is_reported_and_the_run_and_its_result_go_on(tmp_path, cache_dir):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the tracker wants a folder\n")
    out = tmp_path / "run.json"
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", "3", "--cache-dir", cache_dir,
                   "--out", str(out), "--report-to", "tensorboard", "--logging-dir", str(blocker / "tb"))
    assert proc.returncode == 3
    # Said once, as the command's last line: the run and its result went on without the tracker.
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: tracker 'tensorboard' of plugin 'tensorboard_tracker' failed in start: ")
    assert last.endswith("it follows this run no further")
    assert proc.stderr.count("failed in start") == 1
    assert "Traceback" not in proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "completed" and len(result["history"]) == 3
    assert "jax completed:" in proc.stdout  # the other reporters still ran (the summary)


def test_a_missing_tracker_library_names_the_extra_to_install(monkeypatch):
    import importlib.util
    from mtbench.errors import MtbenchError
    from mtbench.plugins.manager import Registry
    from mtbench.plugins.reporters.tensorboard_tracker import TensorBoardTracker
    from mtbench.runner.setup import resolve_reporters
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    registry = Registry(reporters={"tensorboard": TensorBoardTracker()})
    with pytest.raises(MtbenchError, match=r"^reporter 'tensorboard': tensorboard is not installed "
                                           r"\(pip install 'mtbench\[tensorboard\]'\)$"):
        resolve_reporters(["tensorboard"], registry)


@needs("tensorboard")
def test_tensorboard_logs_each_validation_once_and_the_learning_rate_of_every_step(tiny_runs, tmp_path):
    """The final evaluation's validation figures were logged at the last step beside that step's --eval-every
    validation of the same weights (a language model's loss, perplexity and bits per byte): two points at one step;
    and no learning rate was logged. Each validation is one point, and each step the rate its history records."""
    import io

    from rich.console import Console
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mtbench.keras_models.schedules import cosine_decay, schedule_of_recipe
    from mtbench.plugins.manager import Registry
    from mtbench.plugins.reporters.tensorboard_tracker import TensorBoardTracker
    from mtbench.runner.results.reporting import run_reporters
    result = json.loads(json.dumps(tiny_runs["jax"]["result"]))
    last = len(result["history"])
    # --eval-every validations as a language model records them, the last one at the last step (of the final weights,
    # which the final evaluation scores again on the same split)
    validations = {last // 2: result["metrics"]["val_loss"] + 0.5, last: result["metrics"]["val_loss"]}
    result["target"] = {"metric": "loss", "split": "valid", "target": None, "eval_every": last // 2, "evaluations": [
        {"step": step, "loss": loss, "training_s": step * 0.1, "seconds": 0.1} for step, loss in validations.items()]}
    # each step's rate as the training loop reads it (`TrainingLoop.learning_rate`), recorded beside its loss
    schedule = schedule_of_recipe(result["compile_options"]["optimizer_recipe"])
    for entry in result["history"]:
        entry["learning_rate"] = float(cosine_decay(schedule, entry["step"] - 1))
    result["run_dir"] = None  # the events go beside this copy, not into the shared run's folder
    path = tmp_path / "run.json"
    path.write_text(json.dumps(result))
    tracker = TensorBoardTracker()
    assert run_reporters([tracker], Registry(reporters={"tensorboard": tracker}), result,
                         Console(file=io.StringIO()), str(path)) == []
    events = EventAccumulator(str(tmp_path / "run.run" / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("val_loss")] == [
        (step, pytest.approx(loss, rel=1e-6)) for step, loss in validations.items()]
    rates = events.Scalars("learning_rate")
    assert [(e.step, e.value) for e in rates] == [(entry["step"], float(np.float32(entry["learning_rate"])))
                                                  for entry in result["history"]]
    assert rates[-1].value > rates[0].value == 0  # warmed up from 0
    # every figure is one point a step: the final ones where no validation gave them
    for tag in events.Tags()["scalars"]:
        steps = [e.step for e in events.Scalars(tag)]
        assert len(steps) == len(set(steps)), (tag, steps)
    assert [e.step for e in events.Scalars("val_accuracy")] == [last]


def test_a_replayed_compare_run_is_tracked_beside_its_own_result_also_under_a_regression_gate(tiny_runs, tmp_path,
                                                                                                 plugin_path):
    """`report C.json --report TRACKER` kept each run's tracker files in a folder named 'C.json (jax, repeat 1).run'
    beside C.json, another than the run's own result file gives; with --baseline OLD.json it handed nothing to the
    trackers, without a word."""
    from mtbench.runner.results.report import COMPARE_KIND
    old = tiny_runs["jax"]
    result = {**old["result"], "created": "2026-12-07T09:00:00+00:00", "run_dir": None}  # another run than OLD
    own = tmp_path / "c.runs" / "jax-1.json"
    own.parent.mkdir()
    own.write_text(json.dumps(result))
    compared = tmp_path / "c.json"
    compared.write_text(json.dumps({"kind": COMPARE_KIND, "runs": [
        {"label": "jax", "repeat": 1, "result_file": str(own), "result": result}]}))
    env = {**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-csvtracker"}
    for args in ([], ["--baseline", old["path"]]):
        proc = run_cli("report", str(compared), *args, "--report", "csv-tracker", env=env)
        assert proc.returncode == 0, proc.stderr
        figures = tmp_path / "c.runs" / "jax-1.run" / "figures.csv"
        losses = [float(value) for step, name, value in (line.split(",") for line in figures.read_text().splitlines())
                  if name == "train_loss"]
        np.testing.assert_allclose(losses, history_losses(result), rtol=1e-6)
        figures.unlink()
        assert sorted(path.name for path in tmp_path.iterdir()) == ["c.json", "c.runs"], args
