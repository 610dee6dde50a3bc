"""Experiment trackers (`--report-to`) follow a run while it trains: what they are told, when, and what happens
when one fails (it is named once, left out for the rest of the run, and the run and its result go on)."""


from mtbench.figures import is_number, run_dtype, run_label, run_name
from mtbench.plugins.api import TrackedRun
from mtbench.figures import set_aside

TRACKING_WINDOW = 10  # steps per `tokens_per_s` figure: steady steps only, so compilation does not dilute it
# The result's metrics logged under another name at the end, because the name is a series streamed every step:
# the result's train_loss is the final weights' loss on a sample of the training pairs.
FINAL_NAMES = {"train_loss": "train_sample_loss", "train_accuracy": "train_sample_accuracy"}


class Trackers:
    def __init__(self, reporters, registry):
        self.active = list(reporters)
        self.registry = registry
        self.failed = []    # reporters left out after a failure
        self.failures = []  # one line each
        self._window_tokens = self._window_seconds = 0.0
        self._validated = {}  # {step: the names its validation logged}: the end's figures do not log them again

    def _call(self, reporter, method, *arguments):
        try:
            getattr(reporter, method)(*arguments)
        except Exception as error:  # a tracker's disk or server: the training and its result go on
            self.active.remove(reporter)
            self.failed.append(reporter)
            plugin = self.registry.provider.get(("reporters", reporter.name), "?")
            message = (f"tracker '{reporter.name}' of plugin '{plugin}' failed in {method}: {type(error).__name__}: "
                       f"{error}; it follows this run no further")
            self.failures.append(message)  # the command ends with it, once: no warning besides

    def start(self, run):
        for reporter in list(self.active):
            self._call(reporter, "start", run)

    def log(self, metrics, step):
        for reporter in list(self.active):
            self._call(reporter, "log", metrics, step)

    def step(self, step, loss, tokens, seconds, first_of_shape, learning_rate=None):
        """After each training step: its loss and, where known, the learning rate it trained with; every
        TRACKING_WINDOW steps the window's steady tokens/s."""
        metrics = {} if loss is None else {"train_loss": loss}  # a diverged step's loss is not a number
        if learning_rate is not None:
            metrics["learning_rate"] = learning_rate
        if not first_of_shape:
            self._window_tokens += tokens
            self._window_seconds += seconds
        if step % TRACKING_WINDOW == 0 and self._window_seconds > 0:
            metrics["tokens_per_s"] = self._window_tokens / self._window_seconds
            self._window_tokens = self._window_seconds = 0.0
        if metrics:
            self.log(metrics, step)

    def validation(self, step, scores):
        """The task's validation figures ({figure: value}) as `val_<figure>`: val_bleu and val_chrf for
        translation, val_loss, val_perplexity and val_bits_per_byte for a language model."""
        metrics = {f"val_{name}": value for name, value in scores.items() if is_number(value)}
        self._validated[step] = set(metrics)
        self.log(metrics, step)

    def finish(self, result):
        """Every number of the result's metrics (and its energy and cost), at the last step, before the reporters'
        `report` receives the whole result; but the figures a validation at that step logged: the final evaluation
        scores the same weights on the same split again, and a second point at one step is no second validation."""
        last = len(result["history"])
        validated = self._validated.get(last, set())
        final = {FINAL_NAMES.get(name, name): value for name, value in result["metrics"].items() if is_number(value)}
        final.update({name: value for name, value in summary_figures(result).items() if value is not None})
        final = {name: value for name, value in final.items() if name not in validated}
        if final:
            self.log(final, last)


def replay(reporters, result, result_path, registry):
    """Tells `reporters` a saved run as it happened: its start, every step, every validation, its end figures.
    Returns the Trackers, which know the reporters that failed."""
    trackers = Trackers(reporters, registry)
    trackers.start(saved_run(result, result_path))
    evaluations = {}
    for evaluation in (result.get("target") or {}).get("evaluations", []):
        evaluations[evaluation["step"]] = evaluation
    for h in result["history"]:
        trackers.step(h["step"], h["loss"], h["tokens"], h["seconds"], h["first_of_shape"] or set_aside(h),
                      h.get("learning_rate"))
        if h["step"] in evaluations:
            trackers.validation(h["step"], {name: value for name, value in evaluations[h["step"]].items()
                                            if name not in ("step", "training_s", "seconds")})
    trackers.finish(result)
    return trackers


def saved_run(result, result_path):
    """The TrackedRun of a saved result."""
    config, env = result["config"], result["env"]
    tags = run_tags(result["backend"], result["extras"], run_dtype(result), config.get("preset"), env["device"],
                    {"keras": env.get("keras"), "mtbench": env.get("mtbench"), **(env.get("backend_versions") or {})},
                    config.get("run_group"))
    stem = result_path[:-5] if result_path.endswith(".json") else result_path
    return TrackedRun(name=run_label(result), result_path=result_path, directory=result.get("run_dir") or f"{stem}.run",
                      logging_dir=config.get("logging_dir"), group=config.get("run_group"), config=config, tags=tags)


def run_tags(backend, extras, dtype, preset, device, versions, group):
    """What a tracker's runs are filtered by."""
    tags = {"backend": backend, "extras": ",".join(extras) or "none", "dtype": dtype, "preset": str(preset),
            "device": str(device.get("name")), "device_kind": str(device.get("kind")),
            **{name: str(version) for name, version in versions.items()}}
    if group:
        tags["group"] = group
    return tags


def summary_figures(result):
    """The run's headline figures beside its metrics: steady timing, energy and cost."""
    timing, energy, cost = result["timing"], result.get("energy") or {}, result.get("cost") or {}
    steady = energy.get("steady") or {}
    return {"step_s_median": timing.get("step_s_median"), "compile_s": timing.get("compile_s"),
            "steady_tokens_per_s": timing.get("tokens_per_s"), "mfu": (result.get("utilization") or {}).get("mfu"),
            "joules_per_1k_tokens": steady.get("joules_per_1k_tokens"), "usd": cost.get("usd")}


def tracked_run(config, plugins, run, result_path, directory):
    """What a tracker is told of the run when it starts."""
    extras, settings = [extra.name for extra in plugins.extras], config.to_dict()
    import keras

    from mtbench import __version__
    # The modules' own versions: a checkout run without installing it has no package metadata for mtbench.
    versions = {"keras": keras.__version__, "mtbench": __version__, **plugins.backend.framework_versions()}
    tags = run_tags(plugins.backend.name, extras, config.dtype, config.preset, run.device, versions, config.run_group)
    return TrackedRun(name=run_name(plugins.backend.name, extras, settings, run.processes.world_size),
                      result_path=result_path,
                      directory=directory, logging_dir=config.logging_dir, group=config.run_group, config=settings,
                      tags=tags)
