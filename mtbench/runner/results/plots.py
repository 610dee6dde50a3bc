"""The comparison as a picture: training-loss curves of every run on one chart, and steady tokens/s as bars.

matplotlib is optional (`pip install 'mtbench[plot]'`) and imported only here, when a plot is asked for. The
figure is built with matplotlib's object API on the Agg canvas: no pyplot, no global state, no display needed.
"""

import io

from mtbench.errors import MtbenchError
from mtbench.plugins.api import run_label
from mtbench.runner.files import write_bytes_atomic
from mtbench.runner.results.report import describe_configuration

LINE_STYLES = ("-", "--", ":", "-.")


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise MtbenchError("--plot needs matplotlib, which is not installed (pip install 'mtbench[plot]')") from None
    return Figure, FigureCanvasAgg


def series_label(comparison, group):
    """Backend, extras and dtype of a run, and its hardware where the runs did not all share one."""
    parts = [run_label(group.first), group.dtype]
    if comparison.shared_hardware() is None:
        parts.append(group.hardware)
    return " · ".join(parts)


def comparison_figure(comparison):
    """Returns the matplotlib Figure: axes[0] the loss curves (first repeat of each run, one line each, in the
    order of `comparison.groups`), axes[1] the tokens/s bars (median, min–max as error bars)."""
    Figure, FigureCanvasAgg = _matplotlib()
    figure = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    loss_axes, speed_axes = figure.subplots(1, 2)
    labels = [series_label(comparison, group) for group in comparison.groups]

    colours = []
    for index, (group, label) in enumerate(zip(comparison.groups, labels)):
        history = group.first["history"]
        # Runs in parity lie on top of each other: distinct dashes and widths keep every curve visible.
        (line,) = loss_axes.plot([entry["step"] for entry in history], [entry["loss"] for entry in history],
                                 label=label, linestyle=LINE_STYLES[index % len(LINE_STYLES)],
                                 linewidth=max(2.4 - 0.5 * index, 1.0))
        colours.append(line.get_color())
    loss_axes.set(xlabel="step", ylabel="training loss (mean over real target tokens)",
                  title="Training loss")
    loss_axes.legend()

    stats = [group.stat("tokens_per_s") for group in comparison.groups]
    heights = [stat.median if stat.median is not None else float("nan") for stat in stats]
    below = [stat.median - stat.low if stat.median is not None else 0.0 for stat in stats]
    above = [stat.high - stat.median if stat.median is not None else 0.0 for stat in stats]
    repeated = any(len(group.runs) > 1 for group in comparison.groups)
    speed_axes.bar(range(len(labels)), heights, yerr=[below, above] if repeated else None, capsize=4,
                   tick_label=[label.replace(" · ", "\n") for label in labels], color=colours)
    speed_axes.set(ylabel="target tokens/s (steady steps)",
                   title="Throughput" + (" (median, min–max of repeats)" if repeated else ""))

    where = comparison.shared_hardware()
    figure.suptitle("mtbench: " + describe_configuration(comparison.config) + (f"\non {where}" if where else ""),
                    fontsize=10)
    return figure


def save_figure(figure, path):
    """Writes the figure as a PNG, atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    write_bytes_atomic(path, buffer.getvalue())
