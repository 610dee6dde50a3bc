"""`--report-to wandb`: the run as a Weights & Biases run, streamed while it trains.

Offline unless the user configured otherwise (WANDB_MODE): the run's files go to RESULT.run/wandb (or
--logging-dir), and `wandb sync` uploads them later. The configuration is the run's config; its tags name the
backend, extras and dtype; a comparison's runs share its name as their group. The result's metrics end up in
the run's summary under their own names."""

import os

from mtbench import Reporter, hookimpl

PROJECT = "mtbench"


class WandbTracker(Reporter):
    name = "wandb"
    description = "experiment tracker: a Weights & Biases run, offline unless WANDB_MODE says otherwise"
    needs = ("wandb",)
    install_hint = "pip install 'mtbench[wandb]'"

    def __init__(self):
        self.run = None

    def start(self, run):
        import wandb
        directory = os.path.abspath(run.logging_dir or run.directory)
        os.makedirs(directory, exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT), name=run.name, group=run.group, dir=directory,
            mode=os.environ.get("WANDB_MODE", "offline"), config=run.config,
            tags=[f"{key}:{value}"[:64] for key, value in run.tags.items()], reinit="create_new")

    def log(self, metrics, step):
        self.run.log(dict(metrics), step=step)

    def report(self, result, console, complete):
        for name, value in result["metrics"].items():
            if value is not None:
                self.run.summary[name] = value
        self.run.summary["status"] = result["status"]
        self.run.finish(exit_code=0 if complete else 1)
        self.run = None


@hookimpl
def mtbench_register_reporters(register):
    register(WandbTracker())
