"""`pytest --cpu-costs FILE` (tests/cpu_costs.py): a test's CPU seconds, its own and its processes', one JSON line
a test, from every xdist worker into one file."""

import json
import os
import subprocess
import sys

from conftest import TESTS_DIR, python_path

# A test that spends about 0.6 CPU s in a process it starts, and one that spends nothing, in a session of their own.
SESSION_TESTS = """
import subprocess, sys

def test_busy_child():
    burn = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)

def test_idle():
    pass
"""


def test_each_test_writes_the_cpu_seconds_of_the_processes_it_waited_for(tmp_path):
    (tmp_path / "conftest.py").write_text("from cpu_costs import pytest_addoption, pytest_runtest_protocol\n")
    (tmp_path / "test_costs.py").write_text(SESSION_TESTS)
    out = tmp_path / "costs.jsonl"
    env = {**os.environ, "PYTHONPATH": python_path(TESTS_DIR)}
    for workers in (["-p", "no:xdist"], ["-n", "2"]):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
                               "--rootdir", str(tmp_path), "--cpu-costs", str(out), str(tmp_path)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    alone, by_workers = records[:2], records[2:]
    assert [r["test"] for r in alone] == ["test_costs.py::test_busy_child", "test_costs.py::test_idle"]
    assert {r["worker"] for r in alone} == {"main"}
    assert sorted(r["test"] for r in by_workers) == [r["test"] for r in alone]
    assert {r["worker"] for r in by_workers} <= {"gw0", "gw1"}
    for record in records:
        if record["test"].endswith("busy_child"):  # the child's 0.6 s, within the test's own time
            assert 0.5 <= record["children_s"] <= record["wall_s"], record
        else:
            assert record["children_s"] < 0.1, record
