"""The default reporter: every figure of a run in one rich table."""

from rich.table import Table

from mtbench.plugins.api import Reporter
from mtbench.plugins.hookspecs import hookimpl


def _bytes(n):
    return "n/a (not reported)" if n is None else f"{n / 2**20:,.0f} MiB"


def _seconds(s):
    return "n/a" if s is None else f"{s:,.3f} s"


def result_rows(result):
    """(section, figure, value) rows of a result: shared by every table-shaped reporter."""
    t, m, mem, env = result["timing"], result["metrics"], result["memory"], result["env"]
    cfg = result["config"]
    device = env["device"]
    return [
        ("run", "backend", result["backend"] + "".join(f" +{e}" for e in result["extras"])),
        ("run", "status", result["status"]),
        ("run", "device", f"{device.get('kind')}: {device.get('name')}, {result['devices_used']} of "
                          f"{device.get('count')} used"),
        ("run", "versions", f"keras {env['keras']}, jax {env['jax']}, torch {env['torch']}"),
        ("run", "corpus / preset", f"{result['data']['corpus']} / {cfg['preset']} "
                                   f"({result['model']['parameters']:,} parameters), {cfg['dtype']}"),
        ("run", "steps x batch", f"{t['steps']} x {cfg['batch_size']}"),
        ("run", "train step", result.get("train_step", "n/a")),
        ("timing", "compile (first step of each shape)", f"{_seconds(t['compile_s'])} over {t['shapes_compiled']} shapes"),
        ("timing", "steady step median / p90", f"{_seconds(t['step_s_median'])} / {_seconds(t['step_s_p90'])}"),
        ("timing", "tokens/s (target, steady)", "n/a" if t["tokens_per_s"] is None else f"{t['tokens_per_s']:,.0f}"),
        ("timing", "train / total wall time", f"{_seconds(t['train_s'])} / {_seconds(t['total_s'])}"),
        ("memory", "peak host / device", f"{_bytes(mem['peak_host_bytes'])} / {_bytes(mem['peak_device_bytes'])}"),
        ("quality", "loss train / val / test", f"{m['train_loss']:.3f} / {m['val_loss']:.3f} / {m['test_loss']:.3f}"),
        ("quality", "token accuracy val / test", f"{m['val_accuracy']:.3f} / {m['test_accuracy']:.3f}"),
        ("quality", "BLEU / chrF (test)", f"{m['bleu']:.2f} / {m['chrf']:.2f}"),
        ("quality", "BLEU signature", m["bleu_signature"]),
    ]


class TableReporter(Reporter):
    name = "table"
    description = "every figure of the run in a terminal table"

    def report(self, result, console):
        table = Table(title=f"mtbench train: {result['backend']}", show_lines=False)
        for column in ("", "figure", "value"):
            table.add_column(column)
        for section, figure, value in result_rows(result):
            table.add_row(section, figure, value)
        console.print(table)


@hookimpl
def mtbench_register_reporters(register):
    register(TableReporter())
