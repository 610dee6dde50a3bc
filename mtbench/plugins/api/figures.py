"""The figures of a result, defined once: where each is read from, what it is called and how it is shown.

Every output (the single-run table, the comparison table, markdown, CSV, JSON and the plot) takes its figures
from here, so they cannot disagree about what a figure is.
"""

from dataclasses import dataclass
from typing import Callable

MIB = 2 ** 20


@dataclass(frozen=True)
class Figure:
    key: str                  # the name in CSV and JSON outputs, which carry the raw value
    title: str                # the name in tables, with the unit shown
    section: str
    read: Callable            # result dict -> number or None
    display_scale: float = 1.0  # shown value = raw value x display_scale
    decimals: int = 3
    is_timing: bool = False   # varies between repeats of the same run: shown as median and min-max

    def value(self, result):
        return self.read(result)

    def text(self, value):
        """The value as tables show it; 'n/a' where the run has no such figure (device memory on a CPU)."""
        if value is None:
            return "n/a"
        return f"{value * self.display_scale:,.{self.decimals}f}"


def _timing(key):
    return lambda result: result["timing"][key]


def _memory(key):
    return lambda result: result["memory"][key]


def _section(result, *keys):
    """A figure inside an optional section (energy, cost: absent from results of earlier versions)."""
    value = result
    for key in keys:
        value = (value or {}).get(key)
    return value


def _metric(key):
    return lambda result: result["metrics"][key]


FIGURES = (
    Figure("compile_s", "compile (s)", "timing", _timing("compile_s"), decimals=2, is_timing=True),
    Figure("step_s_median", "steady step, median (ms)", "timing", _timing("step_s_median"), 1000, 1, True),
    Figure("step_s_p90", "steady step, p90 (ms)", "timing", _timing("step_s_p90"), 1000, 1, True),
    Figure("tokens_per_s", "tokens/s (target, steady)", "timing", _timing("tokens_per_s"), decimals=0,
           is_timing=True),
    Figure("train_s", "train time (s)", "timing", _timing("train_s"), decimals=1, is_timing=True),
    Figure("total_s", "total time (s)", "timing", _timing("total_s"), decimals=1, is_timing=True),
    Figure("translate_s", "test translation (s)", "timing",
           lambda result: result["timing"].get("phases_s", {}).get("translate"), decimals=1, is_timing=True),
    Figure("mfu", "MFU (%)", "timing", lambda result: (result.get("utilization") or {}).get("mfu"), 100, 1, True),
    Figure("joules_per_1k_tokens", "energy, steady (J / 1k tokens)", "energy",
           lambda result: _section(result, "energy", "steady", "joules_per_1k_tokens"), decimals=1, is_timing=True),
    Figure("usd", "cost of the run (USD)", "cost", lambda result: _section(result, "cost", "usd"), decimals=4,
           is_timing=True),
    Figure("usd_to_target", "cost to target BLEU (USD)", "cost",
           lambda result: _section(result, "cost", "usd_to_target"), decimals=4, is_timing=True),
    Figure("peak_host_bytes", "peak host memory (MiB)", "memory", _memory("peak_host_bytes"), 1 / MIB, 0),
    Figure("peak_training_device_bytes", "peak training memory, per device (MiB)", "memory",
           lambda result: training_peak_bytes(result), 1 / MIB, 0),
    Figure("peak_device_bytes", "peak device memory, whole run (MiB)", "memory", _memory("peak_device_bytes"),
           1 / MIB, 0),
    Figure("train_loss", "train loss", "quality", _metric("train_loss")),
    Figure("val_loss", "validation loss", "quality", _metric("val_loss")),
    Figure("test_loss", "test loss", "quality", _metric("test_loss")),
    Figure("val_accuracy", "validation token accuracy", "quality", _metric("val_accuracy")),
    Figure("test_accuracy", "test token accuracy", "quality", _metric("test_accuracy")),
    Figure("bleu", "BLEU (test)", "quality", _metric("bleu"), decimals=2),
    Figure("chrf", "chrF (test)", "quality", _metric("chrf"), decimals=2),
)
FIGURES_BY_KEY = {figure.key: figure for figure in FIGURES}


def training_peak_bytes(result):
    """The largest device's peak memory while training (`memory.training`), None where none was reported."""
    per_device = _section(result, "memory", "training", "per_device")
    return max(device["peak_bytes"] for device in per_device) if per_device else None


def train_step_text(result):
    """The train step that ran, with how it ran ('torch-compiled (mode reduce-overhead, CUDA graphs: ...)')."""
    detail = result.get("train_step_detail")
    return f"{result['train_step']} ({detail})" if detail else result["train_step"]


def attention_text(result):
    """The attention implementation each kind of attention ran: one name when both kinds ran the same."""
    attention = result["model"].get("attention") or {}
    causal, masked = attention.get("causal"), attention.get("masked")
    if causal is None:
        return "not recorded"
    return causal if causal == masked else f"causal {causal}, masked {masked}"


MATMUL_PRECISION_NAMES = {"highest": "highest (IEEE float32)", "high": "high (TF32 where the device has it)"}


def matmul_precision_text(result):
    """The arithmetic of float32 matmuls the run asked both frameworks for (results before it was set: not
    recorded, and XLA then ran TF32 on GPUs that have it where torch did not)."""
    precision = result["config"].get("matmul_precision")
    return MATMUL_PRECISION_NAMES.get(precision, "not recorded")


def compile_cache_text(result):
    """Whether the run's compilation came from the persistent cache ('cold', 'warm (12 hits)', 'off'), by the
    run's own lookups where the backend counts them, else by whether the cache held programs as it started."""
    cache = _section(result, "timing", "compile_cache")
    if not cache:
        return "none (nothing compiled ahead)"
    if cache["state"] == "off":
        return "off"
    programs = cache.get("programs")
    if programs is None:
        return f"{cache['state']} (held {cache['entries_before']} programs as the run started)"
    return f"{programs} ({cache['hits']} hits, {cache['misses']} misses)"


# What ran, beside the figures of every run: what changes the arithmetic or the kind of work.
# (key in JSON and CSV, title in tables, the text of a result)
RUN_CHOICES = (
    ("train_step", "train step", train_step_text),
    ("attention", "attention", attention_text),
    ("matmul_precision", "float32 matmuls", matmul_precision_text),
    ("compile_cache", "compile cache", compile_cache_text),
)


def figure_text(result, key):
    figure = FIGURES_BY_KEY[key]
    return figure.text(figure.value(result))


# The size flags a run may set over its preset, in the order labels list them (configuration keys; the flag is
# the key with dashes).
SIZE_KEYS = ("layers", "encoder_layers", "decoder_layers", "d_model", "heads", "ff_dim", "dropout")


def size_label(sizes):
    """'d-model=128,layers=2' of {configuration key: value}, in SIZE_KEYS order; '' when nothing is set."""
    return ",".join(f"{key.replace('_', '-')}={sizes[key]:g}" for key in SIZE_KEYS if sizes.get(key) is not None)


def run_name(backend, extras, sizes, processes=1):
    """'backend+extra+extra', '@N' for a run of N processes, then ':flag=value,...' for the size flags set in
    `sizes` (a configuration)."""
    label, size = "+".join([backend, *extras]), size_label(sizes)
    if processes > 1:
        label += f"@{processes}"
    return f"{label}:{size}" if size else label


def run_processes(result):
    """How many processes trained the run (results from before several processes existed: one)."""
    return (result.get("processes") or {}).get("world_size", 1)


def run_label(result):
    """The name of a result's run in every output, and how `--matrix` and `--baseline` name it (`run_name`)."""
    return run_name(result["backend"], result["extras"], result["config"], run_processes(result))


def run_dtype(result):
    """The dtype policy the model really ran with (an extra may set one), else the one asked for."""
    return result["model"].get("dtype_policy") or result["config"]["dtype"]


def hardware(result):
    env = result["env"]
    device = env["device"]
    if device.get("kind") == "cpu":
        return f"{device.get('name')}, {env.get('cpu_count')} cores"
    return f"{device.get('count')}x {device.get('name')}"
