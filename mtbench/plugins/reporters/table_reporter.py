"""The terminal reporters of one run: `summary`, `train`'s default, the figures a person reads first in a few
lines; `table`, every figure of the run in one rich table (`mtbench report RESULT --report table`)."""

import os

from rich.table import Table
from rich.text import Text

from mtbench import Reporter, hookimpl
from mtbench.figures import (FIGURES_BY_KEY, attention_text, batch_text, compile_cache_text, cores_text, figure_text,
                             host_syncs_text, loss_scaling_text, matmul_precision_text, peak_measurement_text,
                             profile_operations_text, profile_text, run_dtype, run_label, run_processes, run_warnings,
                             scored_sentences_text, size_label, split_scored_text, train_step_text, versions_text)


def _joined(result, *keys, unit=""):
    texts = [figure_text(result, key) for key in keys]
    return " / ".join(text if text == "n/a" else text + unit for text in texts)


def _seconds(seconds):
    return "n/a" if seconds is None else f"{seconds:,.3f} s"


def _mfu(result):
    text = figure_text(result, "mfu")
    utilization = result["utilization"]
    if text == "n/a":
        reason = (utilization or {}).get("mfu_reason")  # absent from results before it was recorded
        return f"n/a ({reason})" if reason else text
    text = f"{text} % of {_peak_text(utilization)} ({utilization['peak_source']}"
    measured = peak_measurement_text(utilization.get("peak_measured_at"), utilization.get("peak_load_average"),
                                     utilization.get("peak_cpus"), utilization.get("peak_threads"),
                                     utilization.get("peak_other_processes_percent"))
    if measured:
        text += f"; {measured}"
    elif utilization["peak_source"].startswith("measured"):  # cached before measurements kept their time
        text += "; when and under what load not recorded: `mtbench env --calibrate` measures it again"
    return text + ")"


def _mfu_short(result):
    """'54.0 % of 0.16 TFLOP/s', or why there is no MFU: the peak's source is in the table."""
    utilization = result["utilization"] or {}
    text = figure_text(result, "mfu")
    if text == "n/a":
        return f"n/a ({utilization['mfu_reason']})" if utilization.get("mfu_reason") else text
    return f"{text} % of {_peak_text(utilization)}"


def _peak_text(utilization):
    """'989.40 TFLOP/s', or '8 x 989.40 TFLOP/s' where MFU divides by the peak of several devices (machines, on
    CPUs); results before `peak_devices` was recorded say one."""
    devices = utilization.get("peak_devices") or 1
    return f"{f'{devices} x ' if devices > 1 else ''}{utilization['peak_flops_per_s'] / 1e12:,.2f} TFLOP/s"


def _compile(result):
    timing = result["timing"]
    count = timing["shapes_compiled"]
    seconds = (f"{figure_text(result, 'compile_s')} s" if timing["compile_s"] is not None else
               f"n/a (no steady step to take from the first {timing['first_steps_s']:.2f} s)")
    estimated = timing.get("compile_estimated_shapes")  # absent from earlier results
    estimate = (f" ({estimated} with no steady step of {'its' if estimated == 1 else 'their'} own, whose step time "
                f"is scaled from the others' time per padded token)" if estimated else "")
    return (f"{seconds} over {count} shape{'' if count == 1 else 's'}{estimate}, compile cache "
            f"{compile_cache_text(result)}")


def _steady_step(result):
    """'23.2 ms / 25.1 ms (windows of up to 10 steps)': each steady step counts its timing window's mean, so the
    median and p90 are of those means, not of single steps (`timing_window` is absent from earlier results)."""
    window = result["timing"].get("timing_window")
    text = _joined(result, "step_s_median", "step_s_p90", unit=" ms")
    if window == 1:
        return f"{text} (each step timed alone)"
    return f"{text} (windows of up to {window} steps)" if window else text


def _host_and_device_peaks(result):
    """'2,310 MiB / 17,502 MiB (host: 412 MiB of it in 2 child processes such as torch.compile's compile
    workers)'."""
    text = _joined(result, "peak_host_bytes", "peak_device_bytes", unit=" MiB")
    memory = result["memory"]
    children = memory.get("host_child_processes")  # absent from results before 2026-12-05
    if children:
        text += (f" (host: {memory['host_bytes_children'] / 2 ** 20:,.0f} MiB of it in {children} child "
                 f"process{'es' * (children != 1)} such as torch.compile's compile workers)")
    return text


def _machine_load(result):
    load = result.get("machine_load")
    if not load:
        return "not recorded"
    averages = [(load.get(moment) or {}).get("load_average") for moment in ("before_training", "after_training")]
    clocks = [(load.get(moment) or {}).get("cpu_mhz") for moment in ("before_training", "after_training")]
    text = f"load average {' -> '.join('n/a' if a is None else f'{a[0]:g}' for a in averages)} on {load['cores']} cores"
    if load.get("other_processes_percent") is not None:
        text += f", other processes {load['other_processes_percent']:.0f} % of the CPUs"
    if load.get("steal_percent") is not None:
        text += f", steal {load['steal_percent']:g} %"
    if load.get("gpu_other_processes"):
        text += f", other GPU processes: {len(load['gpu_other_processes'])}"
    if any(clocks):
        text += f", CPU clock {' -> '.join('n/a' if c is None else f'{c:,.0f}' for c in clocks)} MHz"
    return text


def result_rows(result):
    """(section, figure, value) rows of a result: shared by every table-shaped reporter. The figures and their
    formats come from `mtbench.FIGURES`, the one definition every output uses."""
    t, env, cfg = result["timing"], result["env"], result["config"]
    device = env["device"]
    return [
        ("run", "backend", run_label(result).replace("+", " +")),
        ("run", "status", result["status"] + (f": {result['status_reason']}" if result.get("status_reason") else "")),
        ("run", "device", f"{device.get('kind')}: {device.get('name')}, {result['devices_used']} of "
                          f"{device.get('count')} used"),
        ("run", "versions", versions_text(result)),
        ("run", "corpus / preset", f"{result['data']['corpus']} / {_model_text(result)}, {run_dtype(result)}"),
        ("run", "steps x batch", f"{t['steps']} x {batch_text(cfg)}"),
        ("run", "train step", train_step_text(result)),
        ("run", "host waits per step", host_syncs_text(result)),
        ("run", "attention", attention_text(result)),
        ("run", "float32 matmuls", matmul_precision_text(result)),
        ("run", "cores and threads", cores_text(result)),
        ("run", "machine load (training start -> end)", _machine_load(result)),
        ("run", "warnings", "\n".join(run_warnings(result)) or "none"),
        ("timing", "compile (first step of each shape)", _compile(result)),
        ("timing", "steady step median / p90 (window means)", _steady_step(result)),
        ("timing", "tokens/s (target, steady)", figure_text(result, "tokens_per_s")),
        *_real_token_mfu_rows(result),
        ("timing", "MFU (padded): model FLOP/s / peak", _mfu(result)),
        ("timing", "train / total wall time", _joined(result, "train_s", "total_s", unit=" s")),
        *[("timing", "profile (--profile)", text) for text in [profile_text(result)] if text],
        *[("timing", "profiled steps' time", text) for text in [profile_operations_text(result)] if text],
        ("memory", "peak host / device (run)", _host_and_device_peaks(result)),
        ("memory", "peak training, per device", _training_memory(result)),
        ("energy", "steady steps: J / 1k tokens, power", _energy(result.get("energy"))),
        ("cost", "run / to target quality", _cost(result)),
    ] + _quality_rows(result) + _target_rows(result.get("target")) + _best_rows(result.get("target"))


def _real_token_mfu(result):
    """MFU over the real tokens ('29.7 %'), where padding makes it differ from the padded figure; else None (a
    language model has no padding)."""
    real, padded = figure_text(result, "mfu_real_tokens"), figure_text(result, "mfu")
    if real == padded:
        return None
    return real if real == "n/a" else f"{real} %"


def _real_token_mfu_rows(result):
    real = _real_token_mfu(result)
    return [] if real is None else [("timing", "MFU (real tokens): their FLOP/s / peak", real)]


# The task's figures, by the metrics its result holds: translation's BLEU, a language model's perplexity.
TRANSLATION_ROWS = ("bleu", "chrf", "bleu_signature", "chrf_signature", "test_sentences_scored", "decoding")
LANGUAGE_MODEL_ROWS = tuple(f"{split}_{name}" for split in ("train", "val", "test")
                            for name in ("perplexity", "bits_per_byte", "tokens_evaluated", "bytes_evaluated"))
SHOWN_ELSEWHERE = ("train_loss", "val_loss", "test_loss", "val_accuracy", "test_accuracy", "train_accuracy",
                   "train_loss_last_steps", "skipped", "quality_warning")


def _quality_rows(result):
    metrics = result["metrics"]
    rows = [("quality", "loss train / val / test", _joined(result, "train_loss", "val_loss", "test_loss"))]
    if "val_accuracy" in metrics:
        rows.append(("quality", "token accuracy train / val / test",
                     _joined(result, "train_accuracy", "val_accuracy", "test_accuracy")))
    if "val_perplexity" in metrics:
        rows += [("quality", "perplexity val / test", _joined(result, "val_perplexity", "test_perplexity")),
                 ("quality", "bits per byte val / test", _joined(result, "val_bits_per_byte", "test_bits_per_byte")),
                 ("quality", "tokens (bytes) evaluated val / test", _evaluated(metrics))]
        scored = _test_split_scored(result)
        if scored:
            rows.append(("quality", *scored))
    if "bleu" in metrics:
        rows += [("quality", "BLEU / chrF (test)", _joined(result, "bleu", "chrf")),
                 ("quality", "test sentences scored", scored_sentences_text(result) or "n/a"),
                 ("quality", "BLEU signature", metrics["bleu_signature"] or "n/a"),
                 ("quality", "test decoding", _decoding(result))]
    before = (result.get("model") or {}).get("before_training")
    if before:  # a pretrained model's starting point, which fine-tuning is measured against
        figures = {name: FIGURES_BY_KEY.get(f"{before.get('split', 'test')}_{name}") for name in before}
        scores = ", ".join(f"{name.replace('_', ' ')} {figures[name].text(value) if figures[name] else f'{value:,.4g}'}"
                           for name, value in before.items() if isinstance(value, float))
        rows.append(("quality", f"before training ({before.get('split', 'test')})", scores))
    # A plugin's task: its other figures as they are.
    rows += [("quality", name.replace("_", " "), "n/a" if value is None else f"{value:,.4g}"
              if isinstance(value, (int, float)) else str(value))
             for name, value in metrics.items()
             if name not in (*SHOWN_ELSEWHERE, *TRANSLATION_ROWS, *LANGUAGE_MODEL_ROWS)]
    return rows


def _evaluated(metrics):
    counts = [(metrics.get(f"{split}_tokens_evaluated"), metrics.get(f"{split}_bytes_evaluated"))
              for split in ("val", "test")]
    return " / ".join("n/a" if tokens is None else f"{tokens:,}" + ("" if text_bytes is None else f" ({text_bytes:,})")
                      for tokens, text_bytes in counts)


def _test_split_scored(result):
    """('test bytes scored', '512 of 201,451 (0.25 %); tokens 128 of 50,362 (0.25 %)'): how much of its test split
    a language model's test figures cover (--test-size blocks from its start), as 'test sentences scored' says of
    translation's; ('test tokens scored', ...) where the split's bytes are not known (token files); None where the
    split was not scored."""
    text = split_scored_text(result)
    if text is None:
        return None
    unit_scored, _, shares = text.partition(": ")
    return f"test {unit_scored}", shares


def _training_memory(result):
    training = (result.get("memory") or {}).get("training") or {}
    if not training.get("per_device"):
        return f"n/a ({training['reason']})" if training.get("reason") else "n/a"
    peaks = " / ".join(f"{device['peak_bytes'] / 2 ** 20:,.0f}" for device in training["per_device"])
    return f"{peaks} MiB (since {training['peak_since']})"


def _model_text(result):
    """'small (d-model=128; 1,234 parameters)', or for a pretrained model, whose size is its checkpoint's and not
    the preset's, 'small (checkpoint gpt2-medium: 354,823,168 parameters)'."""
    config, model = result["config"], result["model"]
    parameters = f"{model['parameters']:,} parameters"
    if model.get("path"):
        return f"{config['preset']} (checkpoint {os.path.basename(os.path.normpath(model['path']))}: {parameters})"
    size = size_label(config)
    return f"{config['preset']} ({size + '; ' if size else ''}{parameters})"


def _energy(energy):
    if not energy:  # a result of an earlier version
        return "n/a"
    if energy["source"] is None:
        return f"n/a: {energy['reason']}"
    steady = energy["steady"]
    if steady["joules_per_1k_tokens"] is None:
        return f"n/a: no steady step ({energy['source']})"
    scope = (energy.get("counts") or "").split(" (")[0]  # results before 2026-12-02 did not say
    return (f"{steady['joules_per_1k_tokens']:,.2f} J, {steady['avg_watts']:,.0f} W "
            f"({energy['source']}{', ' + scope if scope else ''})")


def _cost(result):
    cost = result.get("cost") or {}
    if cost.get("price_per_hour") is None:
        return "n/a" + (f": {cost['reason']}" if cost.get("reason") else "")
    return (f"{figure_text(result, 'usd')} / {figure_text(result, 'usd_to_target')} USD at "
            f"{cost['price_per_hour']:g} USD/h")


def _decoding(result):
    name = result["metrics"].get("decoding") or "n/a"
    seconds = figure_text(result, "translate_s")
    return name if seconds == "n/a" else f"{name}, {seconds} s"


def _target_rows(target):
    if not target or target.get("target", target.get("target_bleu")) is None:
        return []
    metric = target.get("metric", "bleu")
    name = "BLEU" if metric == "bleu" else metric
    if target["outcome"] == "reached":
        value = (f"reached at step {target['steps_to_target']} after {_seconds(target['time_to_target_s'])} "
                 f"of training")
    else:
        value = "not reached"
    return [("quality", f"time to validation {name} {target.get('target', target.get('target_bleu')):g}", value),
            ("timing", "validation during training", _seconds(target["evaluation_s"]))]


def _best_rows(target):
    """The best validation along the way, and where its model was kept (`--eval-every`)."""
    best = (target or {}).get("best")
    if not best:
        return []
    metric = target["metric"]
    kept = f", kept in {best['saved']}" if best.get("saved") else ""
    name = "BLEU" if metric == "bleu" else metric
    value = f"{best[metric]:.4f}" if metric == "loss" else f"{best[metric]:.4g}"  # a loss as the step lines give it
    return [("quality", f"best validation {name}", f"{value} at step {best['step']}{kept}")]


class TableReporter(Reporter):
    name = "table"
    description = "every figure of the run in a terminal table"

    def report(self, result, console, complete):
        title = f"mtbench train: {run_label(result)}" + ("" if complete else f" ({result['status']}, partial)")
        table = Table(title=Text(title), show_lines=False)
        for column in ("", "figure"):
            table.add_column(column)
        table.add_column("value", overflow="fold")  # a signature or a path is one long word: folded, never cut
        for section, figure, value in result_rows(result):
            table.add_row(*map(Text, (section, figure, value)))  # plain text: a path "corp[red].tsv" is no markup
        console.print(table)


# Rows of the table the summary leaves to it.
DETAILED_QUALITY_ROWS = ("token accuracy train / val / test", "tokens (bytes) evaluated val / test", "test sentences scored",
                         "test bytes scored", "test tokens scored", "BLEU signature", "test decoding")


def _devices_text(result):
    """'1 of 8' (devices used of those the process sees); over several processes, which each see their own share
    of the machine, '2 devices over 2 processes'."""
    processes, used = run_processes(result), result["devices_used"]
    if processes > 1:
        return f"{used} devices over {processes} processes"
    return f"{used} of {result['env']['device'].get('count')}"


def summary_lines(result):
    """The few lines `train` ends with: what ran, its speed, the task's quality, memory and warnings."""
    config, timing = result["config"], result["timing"]
    status = result["status"] + (f" ({result['status_reason']})" if result.get("status_reason") else "")
    device = result["env"]["device"]
    speed = (f"{_joined(result, 'step_s_median', unit=' ms')} a step, median of window means (p90 "
             f"{_joined(result, 'step_s_p90', unit=' ms')}), "
             f"{figure_text(result, 'tokens_per_s')} tokens/s, MFU {_mfu_short(result)}")
    real = _real_token_mfu(result)
    if real is not None:
        speed += f", {real} on real tokens"
    target = result.get("target")
    quality = "; ".join(f"{figure} {value}" for _, figure, value in
                        _quality_rows(result) + _target_rows(target)[:1] + _best_rows(target)
                        if figure not in DETAILED_QUALITY_ROWS)
    if result["metrics"].get("skipped"):
        quality = result["metrics"]["skipped"]
    lines = [
        f"{run_label(result)} {status}: {_model_text(result)}, "
        f"{run_dtype(result)}, {timing['steps']} step{'s' * (timing['steps'] != 1)} x {batch_text(config)}, on "
        f"{device.get('kind')} {device.get('name')} ({_devices_text(result)})",
        f"  ran       {train_step_text(result)} step; attention {attention_text(result)}; float32 matmuls "
        f"{matmul_precision_text(result)}" + "".join(f"; {text}" for text in [loss_scaling_text(result)] if text),
        f"  speed     {speed}",
        f"  compile   {_compile(result)}",
        f"  quality   {quality}",
        f"  memory    peak host / device {_host_and_device_peaks(result)}; "
        f"training per device {_training_memory(result)}",
        f"  warnings  {'; '.join(run_warnings(result)) or 'none'}",
        *[f"  profile   {text}" for text in [profile_text(result), profile_operations_text(result)] if text],
        f"  every figure: mtbench report {config.get('out') or 'RESULT'} --report table",
    ]
    return lines


class SummaryReporter(Reporter):
    name = "summary"
    description = "the figures read first (speed, quality, memory, warnings) in a few lines; train's default"

    def report(self, result, console, complete):
        for line in summary_lines(result):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


@hookimpl
def mtbench_register_reporters(register):
    register(SummaryReporter())
    register(TableReporter())
