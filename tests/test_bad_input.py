"""Every bad input: one line on stderr, a non-zero exit, no traceback, nothing already written lost."""

import os

import pytest

from conftest import run_cli

GOOD_TSV = "".join(f"source sentence number {i}\tphrase cible numéro {i}\n" for i in range(60))


def write(path, data):
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as f:
        f.write(data)
    return str(path)


def cases(tmp_path):
    bad_columns = write(tmp_path / "columns.tsv", GOOD_TSV + "only one column here\n")
    bad_utf8 = write(tmp_path / "latin1.tsv", GOOD_TSV.encode() + "café\tcafé\n".encode("latin-1"))
    empty = write(tmp_path / "empty.tsv", "")
    empty_side = write(tmp_path / "empty_side.tsv", GOOD_TSV + "\tno source\n")
    small = write(tmp_path / "small.tsv", "".join(GOOD_TSV.splitlines(True)[:5]))
    good = write(tmp_path / "good.tsv", GOOD_TSV)
    existing = write(tmp_path / "existing.json", '{"keep": "me"}\n')
    return {
        "unknown backend": (["--backend", "nonesuch"], "unknown backend 'nonesuch'"),
        "missing data file": (["--data", str(tmp_path / "absent.tsv")], "absent.tsv: no such file"),
        "data is a directory": (["--data", str(tmp_path)], "is a directory"),
        "too few columns": (["--data", bad_columns], "columns.tsv:61: expected 2 tab-separated columns"),
        "invalid utf-8": (["--data", bad_utf8], "latin1.tsv:61: not valid UTF-8"),
        "empty file": (["--data", empty], "empty.tsv: the file is empty"),
        "empty sentence": (["--data", empty_side], "empty_side.tsv:61: empty source sentence"),
        "corpus too small to split": (["--data", small, "--valid-size", "5", "--test-size", "5"],
                                      "cannot be split"),
        "unknown dataset": (["--dataset", "bible-xx-yy"], "unknown dataset 'bible-xx-yy'"),
        "unknown extra": (["--data", good, "--extra", "warp-drive"], "unknown extra 'warp-drive'"),
        "batch size zero": (["--batch-size", "0"], "--batch-size must be at least 1"),
        "negative steps": (["--steps", "-3"], "--steps must be at least 1"),
        "steps and epochs": (["--steps", "3", "--epochs", "1"], "not both"),
        "unknown reporter": (["--report", "fax"], "unknown reporter 'fax'"),
        "existing result": (["--data", good, "--out", existing], "already exists; pass --overwrite"),
        "output is a directory": (["--data", good, "--out", str(tmp_path)], "is a directory"),
    }


CASE_NAMES = [
    "unknown backend", "missing data file", "data is a directory", "too few columns", "invalid utf-8",
    "empty file", "empty sentence", "corpus too small to split", "unknown dataset", "unknown extra",
    "batch size zero", "negative steps", "steps and epochs", "unknown reporter", "existing result",
    "output is a directory"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_fails_with_one_clear_line(tmp_path, cache_dir, case):
    args, expected = cases(tmp_path)[case]
    before = {p: open(p, "rb").read() for p in map(str, tmp_path.iterdir()) if os.path.isfile(p)}
    out_args = [] if "--out" in args else ["--out", str(tmp_path / "result.json")]
    proc = run_cli("train", "--preset", "tiny", "--cache-dir", cache_dir, *out_args, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    after = {p: open(p, "rb").read() for p in before if os.path.isfile(p)}
    assert after == before, "a failed run changed or removed a file that was already there"


def test_debug_shows_the_traceback(tmp_path, cache_dir):
    proc = run_cli("train", "--backend", "nonesuch", "--debug", "--cache-dir", cache_dir)
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and "unknown backend 'nonesuch'" in proc.stderr
