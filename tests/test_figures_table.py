"""docs/results.md's table of figures is what `mtbench.FIGURES` says, and names every column of a real CSV report."""

import csv
import io

import pytest

from conftest import assert_the_check_fails_on_an_edit_by_hand, load_docs_script, run_cli


def load_generator():
    return load_docs_script("generate_figures_table.py")


def test_the_figures_table_is_generated_from_figures():
    generator = load_generator()
    with open(generator.PATH, encoding="utf-8") as f:
        written = f.read()
    assert generator.main(["--check"]) == 0, ("docs/results.md's figures table differs from mtbench.figures.FIGURES: "
                                              "run python docs/generate_figures_table.py")
    assert generator.rewrite(written) == written


def test_the_check_fails_on_a_table_edited_by_hand(tmp_path, monkeypatch):
    assert_the_check_fails_on_an_edit_by_hand(load_generator(), "| `compile_s`, ", "| `compile_seconds`, ", tmp_path, monkeypatch)


def test_every_figure_column_of_a_csv_report_is_in_the_table(compared):
    """The columns `mtbench report --format csv` writes for figures, read from a real comparison's CSV."""
    proc = run_cli("report", compared["path"], "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    header = next(csv.reader(io.StringIO(proc.stdout)))
    table = load_generator().render()
    # The figures' columns are those between the run's identity (which ends with its warnings) and the speed-up.
    figures = header[header.index("warnings") + 1:header.index("speedup")]
    assert figures and "tokens_per_s_min" in figures
    missing = [column for column in figures if f"`{column}`" not in table]
    assert not missing, f"CSV columns the table does not name: {missing}"


def test_a_scale_without_a_known_unit_is_refused():
    generator = load_generator()
    from mtbench.figures import Figure
    with pytest.raises(ValueError, match="no unit is known for the scale 0.001"):
        generator.raw_unit(Figure("x_ks", "x (ks)", "timing", lambda result: None, display_scale=0.001))
