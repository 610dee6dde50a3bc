"""The comparison as a picture: training-loss curves of every run on one chart (with the validation losses that
--eval-every measured), and steady tokens/s as bars; for a sweep (runs that differ in one size flag, the batch
size, the max length or the max tokens), tokens/s against the swept value too, one line per backend and extras.
A history (`report --history`): tokens/s over its points, the steps marked.

matplotlib is optional (`pip install 'mtbench[plot]'`) and imported only here, when a plot is asked for. The
figure is built with matplotlib's object API on the Agg canvas: no pyplot, no global state, no display needed.
"""

import io
import os
import struct

from mtbench.errors import MtbenchError
from mtbench.figures import SIZE_KEYS, run_name, run_processes, short_commit, versions_text
from mtbench.runner.config import SIZE_FIELDS
from mtbench.runner.files import write_bytes_atomic
from mtbench.runner.results.output import check_directory_writable
from mtbench.runner.results.report import (KEY_DEFAULTS, describe_configuration, environment_names,
                                           interpreter, swept_keys)

LINE_STYLES = ("-", "--", ":", "-.")


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MtbenchError("--plot needs matplotlib, which is not installed (pip install 'mtbench[plot]')") from None
    return Figure, FigureCanvasAgg


def series_label(comparison, group):
    """The run's label in the comparison (backend, extras, size, swept keys), its dtype, and its hardware where the
    runs did not all share one (each unless the label names it already)."""
    parts = [group.label, group.dtype]
    if comparison.shared_hardware() is None:
        parts.append(group.hardware)
    return " · ".join(dict.fromkeys(part for part in parts if part == group.label or part not in group.label))


def _configured(result, key):
    return result["config"].get(key, KEY_DEFAULTS.get(key))


def swept_value(result, key):
    """The value of `key` a run trained with: a size flag left unset is the preset's (config.model)."""
    value = _configured(result, key)
    if value is None and key in SIZE_KEYS:
        return (result["config"].get("model") or {}).get(SIZE_FIELDS.get(key, "encoder_layers"))
    return value


def sweep_key(comparison):
    """The one size flag or sweep key (configuration key) the runs differ in, or None where they differ in none
    or in several (d-model and heads together are no curve of one value). A swept --block-size sets --max-len
    too, and is one value."""
    results = [group.first for group in comparison.groups]
    varying = [*(key for key in SIZE_KEYS if len({_configured(result, key) for result in results}) > 1),
               *swept_keys(results)]
    return varying[0] if len(varying) == 1 else None


def sweep_series(comparison, key):
    """{series name: [(swept value, group)] sorted by value}: one series per backend, extras, processes, dtype,
    hardware and environment, in the order of `comparison.groups`; runs without a value of `key` are left out."""
    groups = comparison.groups
    paths = {interpreter(group.first) for group in groups}
    names = environment_names(path for path in paths if path) if len(paths) > 1 else {}
    hardware_shown = comparison.shared_hardware() is None
    series = {}  # (name, versions) -> points
    for group in groups:
        result, value = group.first, swept_value(group.first, key)
        if value is None:
            continue
        sizes = {k: v for k, v in result["config"].items() if k != key}
        python = [("python", names[interpreter(result)])] if interpreter(result) in names else []
        parts = [run_name(result["backend"], result["extras"], sizes, run_processes(result), python), group.dtype]
        parts += [group.hardware] if hardware_shown else []
        series.setdefault((" · ".join(parts), versions_text(result)), []).append((value, group))
    named = {}
    for (name, versions), points in series.items():  # versions only where they tell two lines apart
        twins = sum(1 for other, _ in series if other == name) > 1
        named[f"{name} · {versions}" if twins else name] = sorted(points, key=lambda point: point[0])
    return named


def _draw_sweep(axes, comparison, key):
    flag = key.replace("_", "-")
    series = sweep_series(comparison, key)
    swept = sorted({value for points in series.values() for value, _ in points}, key=str)
    # A sweep of names (--init, --dtype, --pipeline-schedule) is drawn at evenly spaced places, one a name.
    named = any(isinstance(value, str) for value in swept)
    place = {value: index for index, value in enumerate(swept)} if named else {value: value for value in swept}
    values = set()
    for index, (name, points) in enumerate(series.items()):
        xs = [place[value] for value, _ in points]
        stats = [group.stat("tokens_per_s") for _, group in points]
        ys = [stat.median if stat.median is not None else float("nan") for stat in stats]
        repeated = any(len(group.runs) > 1 for _, group in points)
        errors = [[y - stat.low if stat.median is not None else 0.0 for y, stat in zip(ys, stats)],
                  [stat.high - y if stat.median is not None else 0.0 for y, stat in zip(ys, stats)]]
        (line,) = axes.plot(xs, ys, label=name, marker="o", linestyle=LINE_STYLES[index % len(LINE_STYLES)])
        if repeated:
            axes.errorbar(xs, ys, yerr=errors, fmt="none", ecolor=line.get_color(), capsize=4)
        values.update(xs)
    if not named and values and min(values) > 0 and max(values) >= 4 * min(values):
        axes.set_xscale("log", base=2)
    axes.set_xticks([place[value] for value in swept],
                    labels=[str(value) if named else f"{value:g}" for value in swept])
    axes.minorticks_off()
    axes.set(xlabel=f"--{flag}", ylabel="target tokens/s (steady steps)", title=f"Throughput against --{flag}")
    axes.legend()


def validation_losses(result):
    """[(step, loss)] of the run's validations during training (`--eval-every`: `target.evaluations`) that measured a
    loss (a language model's, a classifier's; translation validates by BLEU and chrF alone); empty without any."""
    evaluations = (result.get("target") or {}).get("evaluations") or ()
    return [(evaluation["step"], evaluation["loss"]) for evaluation in evaluations
            if evaluation.get("loss") is not None]


def comparison_figure(comparison):
    """Returns the matplotlib Figure: axes[0] the loss curves (first repeat of each run, one line each, in the
    order of `comparison.groups`, and the validation losses of each as points on a line of their own), axes[1]
    the tokens/s bars (median, min–max as error bars), and for a sweep (`sweep_key`) axes[2], tokens/s against the
    swept value, one line per `sweep_series`."""
    Figure, FigureCanvasAgg = _matplotlib()
    swept = sweep_key(comparison)
    figure = Figure(figsize=(18 if swept else 12, 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 3 if swept else 2)
    loss_axes, speed_axes = axes[:2]
    if swept:
        _draw_sweep(axes[2], comparison, swept)
    labels = [series_label(comparison, group) for group in comparison.groups]

    colours, validated_any = [], False
    for index, (group, label) in enumerate(zip(comparison.groups, labels)):
        history = group.first["history"]
        # Runs in parity lie on top of each other: distinct dashes and widths keep every curve visible.
        (line,) = loss_axes.plot([entry["step"] for entry in history], [entry["loss"] for entry in history],
                                 label=label, linestyle=LINE_STYLES[index % len(LINE_STYLES)],
                                 linewidth=max(2.4 - 0.5 * index, 1.0))
        colours.append(line.get_color())
        validated = validation_losses(group.first)
        if validated:  # --eval-every's, as nanoGPT plots its val loss beside the train loss
            loss_axes.plot(*zip(*validated), label=f"{label} · validation", color=line.get_color(), marker="o",
                           linestyle=LINE_STYLES[index % len(LINE_STYLES)], linewidth=1.0)
            validated_any = True
    loss_axes.set(xlabel="step", ylabel="loss (mean over real target tokens)",
                  title="Training and validation loss" if validated_any else "Training loss")
    loss_axes.legend()

    stats = [group.stat("tokens_per_s") for group in comparison.groups]
    heights = [stat.median if stat.median is not None else float("nan") for stat in stats]
    below = [stat.median - stat.low if stat.median is not None else 0.0 for stat in stats]
    above = [stat.high - stat.median if stat.median is not None else 0.0 for stat in stats]
    repeated = any(len(group.runs) > 1 for group in comparison.groups)
    speed_axes.bar(range(len(labels)), heights, yerr=[below, above] if repeated else None, capsize=4,
                   tick_label=[label.replace(" · ", "\n").replace(":", "\n").replace(",", "\n") for label in labels], color=colours)
    if len(labels) > 4:  # a sweep's labels are long: smaller, so that neighbours do not overlap
        speed_axes.tick_params(axis="x", labelsize=7)
    speed_axes.set(ylabel="target tokens/s (steady steps)",
                   title="Throughput" + (" (median, min–max of repeats)" if repeated else ""))

    where = comparison.shared_hardware()
    figure.suptitle("mtbench: " + describe_configuration(comparison) + (f"\non {where}" if where else ""),
                    fontsize=10)
    return figure


STEP_COLOURS = {"slower": "tab:red", "faster": "tab:green"}


def history_figure(history):
    """Returns the matplotlib Figure of a history (`history.build_history`): tokens/s of each point with its 95 %
    interval as error bars, in date order, and a vertical line before each step (dashed where the last point
    alone shows it: unconfirmed), coloured by its direction."""
    Figure, FigureCanvasAgg = _matplotlib()
    points = history.points
    figure = Figure(figsize=(max(6.0, 0.9 * len(points) + 2), 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    xs = list(range(len(points)))
    nan = float("nan")
    ys = [point.interval[0] if point.interval else nan for point in points]
    bounded = [point.interval if point.interval and point.interval[1] is not None else None for point in points]
    errors = [[y - bound[1] if bound else 0.0 for y, bound in zip(ys, bounded)],
              [bound[2] - y if bound else 0.0 for y, bound in zip(ys, bounded)]]
    axes.errorbar(xs, ys, yerr=errors, marker="o", capsize=4)
    for x, point in zip(xs, points):
        if point.mark:
            axes.axvline(x - 0.5, color=STEP_COLOURS.get(point.change.call, "tab:gray"),
                         linestyle="-" if point.mark == "step" else "--", label=point.mark_text())
    if history.steps():
        axes.legend()
    labels = [f"{point.name}\n{point.date:%Y-%m-%d}\n{short_commit(point.commit) if point.commit else ''}"
              for point in points]
    axes.set_xticks(xs, labels=labels, fontsize=7)
    axes.set(ylabel="target tokens/s (steady steps, 95 % interval)",
             title=f"History of {history.label} on {history.hardware}")
    return figure


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The PNG text chunk that marks a plot as mtbench's: only such a PNG is drawn over, never one someone else made.
PLOT_MARK = ("Software", "mtbench report --plot")


def png_text(path):
    """{keyword: text} of the tEXt chunks a PNG holds before its image data, where matplotlib writes them, or None
    for a file that is no PNG; read with the standard library, so that checking a path imports no matplotlib."""
    texts = {}
    with open(path, "rb") as f:
        if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
            return None
        while len(header := f.read(8)) == 8:
            length, kind = struct.unpack(">I4s", header)
            if kind in (b"IDAT", b"IEND"):
                break
            data = f.read(length)
            f.seek(4, os.SEEK_CUR)  # the chunk's CRC
            if kind == b"tEXt" and b"\0" in data:
                keyword, text = data.split(b"\0", 1)
                texts[keyword.decode("latin-1")] = text.decode("latin-1")
    return texts


def check_plot_path(path):
    """Refuses a --plot path that holds a file mtbench did not draw (a result JSON, someone's picture): drawing the
    plot again over an earlier plot (`PLOT_MARK`) is the usual case; anything else would be lost. A path that does
    not end in .png would hold a PNG its name says is something else."""
    if not path.strip():
        raise MtbenchError("--plot '': give the path of the PNG to draw")
    if not path.lower().endswith(".png"):
        raise MtbenchError(f"--plot {path}: draws a PNG; give a path ending in .png")
    check_directory_writable(path, label=f"--plot {path}")
    try:
        texts = png_text(path)
    except FileNotFoundError:
        return
    except OSError as error:
        raise MtbenchError(f"--plot {path}: cannot be read ({error.strerror})") from None
    if texts is None:
        raise MtbenchError(f"--plot {path}: already holds a file that is not a PNG; give another path (it is kept)")
    keyword, mark = PLOT_MARK
    if texts.get(keyword) != mark:
        raise MtbenchError(f"--plot {path}: already holds a PNG that mtbench did not draw; give another path (it is "
                           f"kept)")


def save_figure(figure, path):
    """Writes the figure as a PNG marked as mtbench's (`PLOT_MARK`), atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, metadata=dict([PLOT_MARK]))
    write_bytes_atomic(path, buffer.getvalue())
