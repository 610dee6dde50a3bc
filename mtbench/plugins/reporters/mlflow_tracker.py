"""`--report-to mlflow`: the run as an MLflow run, its metrics streamed while it trains.

The tracking server is MLFLOW_TRACKING_URI when set; otherwise an embedded SQLite file beside the results
(`mlflow.db` in --logging-dir, or in the result's folder), which `mlflow ui --backend-store-uri sqlite:///...`
opens. Parameters are the whole configuration; tags name the backend, extras, dtype, device, versions and the
comparison's group, so runs filter by them in the UI. The result JSON, hypotheses, references and a plot of the
loss curve are the run's artifacts. A partial result ends the run as FAILED (diverged) or KILLED (interrupted)."""

import json
import os
import tempfile
import time

from mtbench import Reporter, hookimpl
from mtbench.figures import run_label

EXPERIMENT = "mtbench"
BATCH = 200  # metrics buffered before one write to the store


class MlflowTracker(Reporter):
    name = "mlflow"
    description = "experiment tracker: an MLflow run (MLFLOW_TRACKING_URI, else a local SQLite store)"
    needs = ("mlflow",)
    install_hint = "pip install 'mtbench[mlflow]'"

    def __init__(self):
        self.client = self.run_id = None
        self.pending = []

    def start(self, run):
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag
        # The result's folder, not the run directory: one store for every run written there (a compare's runs), as
        # MLflow's UI compares the runs of one store.
        directory = os.path.abspath(run.logging_dir or os.path.dirname(os.path.abspath(run.result_path)))
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.join(directory, 'mlflow.db')}"
        os.makedirs(directory, exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        if experiment is None:
            # Artifacts beside the store rather than in ./mlruns of whatever folder the run started in.
            experiment_id = self.client.create_experiment(
                EXPERIMENT, artifact_location=None if os.environ.get("MLFLOW_TRACKING_URI")
                else "file://" + os.path.join(directory, "mlartifacts"))
        else:
            experiment_id = experiment.experiment_id
        tags = {f"mtbench.{name}": value for name, value in run.tags.items()}
        self.run_id = self.client.create_run(experiment_id, run_name=run.name, tags=tags).info.run_id
        params = [Param(key, json.dumps(value) if isinstance(value, (dict, list)) else str(value))
                  for key, value in flatten(run.config).items()]
        for first in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=params[first:first + 100])
        self.client.log_batch(self.run_id, tags=[RunTag("mtbench.result", os.path.abspath(run.result_path))])

    def log(self, metrics, step):
        from mlflow.entities import Metric
        timestamp = now_ms()
        self.pending += [Metric(name, float(value), timestamp, step) for name, value in metrics.items()]
        if len(self.pending) >= BATCH:
            self._flush()

    def _flush(self):
        if self.pending:
            self.client.log_batch(self.run_id, metrics=self.pending)
            self.pending = []

    def report(self, result, console, complete):
        self._flush()
        for key in ("hypotheses_file", "references_file"):
            if result.get(key):
                self.client.log_artifact(self.run_id, result[key])
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, os.path.basename(result["config"]["out"]))
            with open(path, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=2)
            self.client.log_artifact(self.run_id, path)
            self.client.log_artifact(self.run_id, loss_plot(result, os.path.join(folder, "loss.png")))
        status = "FINISHED" if complete else ("KILLED" if result["status"] == "interrupted" else "FAILED")
        self.client.set_terminated(self.run_id, status)
        self.client = None


def flatten(config, prefix=""):
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def now_ms():
    return int(time.time() * 1000)


def loss_plot(result, path):
    """The training loss of every step, as a PNG (matplotlib comes with mlflow)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [h["step"] for h in result["history"] if h["loss"] is not None]
    losses = [h["loss"] for h in result["history"] if h["loss"] is not None]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(steps, losses)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.set_title(run_label(result))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


@hookimpl
def mtbench_register_reporters(register):
    register(MlflowTracker())
