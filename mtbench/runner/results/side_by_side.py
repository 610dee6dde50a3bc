"""A result beside its rerun (`mtbench rerun`): every difference in versions, hardware, configuration and what
ran, every figure with its ratio, and whether the two loss curves agree."""

from rich.table import Table
from rich.text import Text

from mtbench.figures import RUN_CHOICES, hardware, last_step, run_dtype, run_processes, shown_figures
from mtbench.runner.results.parity import PARITY_STEPS, check_parity
from mtbench.runner.results.report import ASKED_KEYS, BOOKKEEPING_KEYS, KEY_DEFAULTS, differing


def _flat(value, prefix=""):
    """{dotted key: value} of nested dicts."""
    if isinstance(value, dict):
        flat = {}
        for key, item in value.items():
            flat.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def environment_differences(original, rerun):
    """[(what, original, rerun)]: every version, hardware and environment entry that differs."""
    rows = differing(_flat(original["env"]), _flat(rerun["env"]))
    if hardware(original) != hardware(rerun):
        rows.insert(0, ("hardware", hardware(original), hardware(rerun)))
    return rows


def run_differences(original, rerun):
    """[(what, original, rerun)]: every configuration key that differs (where the files went aside), and what ran
    (backend, extras, processes, dtype, train step, attention, ...)."""
    rows = [(f"config.{key}", before, after) for key, before, after in
            differing(original["config"], rerun["config"], (*BOOKKEEPING_KEYS, *ASKED_KEYS), KEY_DEFAULTS)]
    ran = [("backend", lambda r: r["backend"]), ("extras", lambda r: list(r["extras"])),
           ("processes", run_processes), ("dtype", run_dtype), *((title, text) for _, title, text in RUN_CHOICES)]
    rows += [(title, read(original), read(rerun)) for title, read in ran if read(original) != read(rerun)]
    data = [result.get("data_fingerprint") for result in (original, rerun)]
    if None not in data and data[0] != data[1]:  # the same options, other files at their paths
        rows.append(("training data (fingerprint)", *data))
    if _status(original) != _status(rerun):  # an interrupted or diverged original: its figures stop early
        rows.insert(0, ("status", _status(original), _status(rerun)))
    return rows


def _status(result):
    """'completed', or 'interrupted after step 70' of a run that stopped early."""
    status = result.get("status", "completed")
    if status == "completed":
        return status
    return f"{status} after step {last_step(result) or 0:,}"


def figure_rows(original, rerun):
    """[(figure title, original text, rerun text, rerun / original)] for every figure."""
    rows = []
    for figure in shown_figures([original, rerun]):
        before, after = figure.value(original), figure.value(rerun)
        if before is None and after is None:
            ratio = ""
        elif before == after:
            ratio = "same"
        elif before and after is not None:
            ratio = f"{after / before:.3f}x"
        else:
            ratio = "n/a"
        rows.append((figure.title, figure.text(before), figure.text(after), ratio))
    return rows


def side_by_side(original, rerun, parity_steps=PARITY_STEPS):
    """Everything that differs between a result and its rerun: {'environment', 'configuration', 'figures',
    'parity'} (the JSON form; `side_by_side_table` shows it), the loss curves held over `parity_steps`."""
    parity = check_parity([("original", original), ("rerun", rerun)], run_dtype, steps=parity_steps)
    return {
        "environment": [list(row) for row in environment_differences(original, rerun)],
        "configuration": [list(row) for row in run_differences(original, rerun)],
        "figures": [{"figure": title, "original": before, "rerun": after, "ratio": ratio}
                    for title, before, after, ratio in figure_rows(original, rerun)],
        "parity": parity.to_dict(),
        "parity_lines": parity.lines(),
    }


def _text(value):
    return "(absent)" if value is None else str(value)


def side_by_side_table(differences, title):
    """The side-by-side as a rich table; its section headings are bold by a style, not markup, which mtbench's
    console leaves as typed (a value's '[red]' is text)."""
    table = Table(title=title)
    for column, justify in (("", "left"), ("original", "right"), ("rerun", "right"), ("rerun / original", "right")):
        table.add_column(column, justify=justify)
    for section, key in (("versions, hardware, environment", "environment"), ("configuration and what ran",
                                                                           "configuration")):
        rows = differences[key]
        table.add_row(Text(section, style="bold"), "", "", "" if rows else "the same", end_section=not rows)
        for index, (what, before, after) in enumerate(rows):
            table.add_row(what, _text(before), _text(after), "differs", end_section=index == len(rows) - 1)
    table.add_row(Text("figures", style="bold"), "", "", "")
    for row in differences["figures"]:
        table.add_row(row["figure"], row["original"], row["rerun"], row["ratio"])
    return table
