"""docs/commands.md's table of extras is what the built-in extras say, and the pairs it keeps apart are the pairs a
run refuses together."""

import re

import pytest

from conftest import (
    assert_refused_in_one_line,
    assert_the_check_fails_on_an_edit_by_hand,
    load_docs_script,
    run_cli,
)
from mtbench import MtbenchError


def load_generator():
    return load_docs_script("generate_extras_table.py")


def written_rows():
    """{extra: (backends, the extras it cannot run beside)} of the table as docs/commands.md holds it."""
    generator = load_generator()
    with open(generator.PATH, encoding="utf-8") as f:
        block = f.read().split(generator.BEGIN, 1)[1].split(generator.END, 1)[0]
    rows = {}
    for line in block.strip().splitlines()[2:]:
        name, backends, beside = (cell.strip() for cell in line.strip("|").split("|")[:3])
        rows[name.strip("`")] = (backends.split(", "), re.findall(r"`([\w-]+)`", beside))
    return rows


def test_the_extras_table_is_generated_from_the_extras():
    assert load_generator().main(["--check"]) == 0, (
        "docs/commands.md's extras table differs from the extras: run python docs/generate_extras_table.py")


def test_the_table_names_the_known_conflicts_both_ways():
    rows = written_rows()
    assert list(rows)[:2] == ["flash-attention", "torch-compile"] and "remat" in rows
    assert rows["torch-compile"] == (["torch"], [])
    assert {"ddp", "fsdp", "pipeline-parallel"} <= set(rows["tensor-parallel"][1])
    # ddp declares no conflict itself: the extras that declare one with it are listed on its row too.
    assert set(rows["ddp"][1]) == {"fsdp", "tensor-parallel", "pipeline-parallel"}
    assert "flash-attention" in rows["tpu"][1] and "tpu" in rows["flash-attention"][1]


def test_every_pair_the_table_keeps_apart_is_refused_together_and_every_other_pair_runs_together():
    from mtbench.plugins.manager import registry
    from mtbench.runner.setup import resolve_extras
    plugins, rows = registry(), written_rows()
    pairs = [(name, other, backend) for name, (backends, _) in rows.items() for other, (others, _) in rows.items()
             if other != name for backend in sorted(set(backends) & set(others))]
    assert len(pairs) > 40
    for name, other, backend_name in pairs:
        backend = plugins.lookup("backends", backend_name)
        if other in rows[name][1]:
            with pytest.raises(MtbenchError, match="cannot run together"):
                resolve_extras([name, other], backend, plugins)
        else:
            assert [extra.name for extra in resolve_extras([name, other], backend, plugins)] == [name, other]


def test_a_run_given_two_extras_kept_apart_is_refused_in_one_line():
    proc = run_cli("train", "--backend", "torch", "--extra", "ddp", "--extra", "tensor-parallel", "--steps", "1")
    assert_refused_in_one_line(proc, "cannot run together with 'ddp'")


def test_the_check_fails_on_a_table_edited_by_hand(tmp_path, monkeypatch):
    assert_the_check_fails_on_an_edit_by_hand(load_generator(), "| `ddp` | torch | `fsdp`, ", "| `ddp` | torch | ", tmp_path, monkeypatch)
