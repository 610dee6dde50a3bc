"""A result beside its rerun (`mtbench rerun`'s table), as the command line's console prints it."""

import io
import json

from mtbench.cli import output_console
from mtbench.runner.results.side_by_side import side_by_side, side_by_side_table


def test_the_table_shows_every_value_as_typed_and_its_headings_without_markup(tiny_runs, tmp_path):
    """The console reads no markup, so that a value's '[red]' is shown: the section headings are bold by a style,
    not by '[bold]' tags, which it would print."""
    original = tiny_runs["jax"]["result"]
    rerun = json.loads(json.dumps(original))
    rerun["config"]["data_file"] = str(tmp_path / "corp[red].tsv")
    console = output_console(file=io.StringIO(), width=200, record=True)
    console.print(side_by_side_table(side_by_side(original, rerun), "mtbench rerun: jax"))
    text = console.export_text()
    assert "[bold]" not in text
    headings = [line.split("│")[1].strip() for line in text.splitlines() if line.count("│") == 5]
    assert {"versions, hardware, environment", "configuration and what ran", "figures"} <= set(headings)
    assert f"{tmp_path / 'corp[red].tsv'}" in text


def test_an_original_that_stopped_early_or_read_other_data_and_a_late_parting_are_named(tiny_runs):
    """A rerun of an interrupted original, or of one whose data file changed since, read 'configuration and what
    ran: the same'; and the loss curves were held over their first 50 steps only, whatever was asked."""
    original = json.loads(json.dumps(tiny_runs["jax"]["result"]))
    rerun = json.loads(json.dumps(original))
    assert side_by_side(original, rerun)["configuration"] == []
    original["data_fingerprint"], rerun["data_fingerprint"] = "spm-1000-aaaa", "spm-1000-bbbb"
    partial = dict(original, status="interrupted", history=original["history"][:30])
    assert side_by_side(partial, rerun)["configuration"] == [
        ["status", "interrupted after step 30", "completed"],
        ["training data (fingerprint)", "spm-1000-aaaa", "spm-1000-bbbb"]]
    steps = len(rerun["history"])
    assert steps > 50
    for entry in rerun["history"][50:]:  # the curves part after step 50
        entry["loss"] *= 1.2
    assert side_by_side(original, rerun)["parity"]["passed"] is True
    held = side_by_side(original, rerun, parity_steps=steps)["parity"]
    assert held["passed"] is False and held["steps"] == steps
