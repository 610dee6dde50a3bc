"""benchmarks/torch_compile.py end to end on the tiny preset (--quick): it runs, compiles both models without
graph breaks, and its last line is the JSON summary scripts read. (Two to three minutes on 2 cores, most of it
compiling; the small preset's figures are in the README.)"""

import os
import subprocess
import sys

import pytest

from benchmarks.torch_compile import parse_args
from conftest import REPOSITORY, json_answer

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "torch_compile.py")


@pytest.mark.slow
def test_quick_run_reports_compile_times_breaks_and_ratios(cache_dir):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(MTBENCH_LOAD_PLUGINS="")
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--preset", "tiny", "--cache-dir", cache_dir],
                          capture_output=True, text=True, env=env, timeout=600)
    summary = json_answer(proc)
    assert summary["graph_breaks_mtbench"] == summary["graph_breaks_native"] == 0
    assert summary["compile_s_mtbench"] > 0 and summary["compile_s_native"] > 0
    assert summary["compiled_over_eager"] > 0 and summary["native_compiled_over_eager"] > 0
    contestants = summary["run"]["contestants"]
    assert sorted(contestants) == ["mtbench compiled", "mtbench eager", "native compiled", "native eager"]
    assert all(c["steps"] == 4 for c in contestants.values())
    assert "mtbench compiled / eager" in proc.stdout


def test_bad_settings_are_refused_with_one_line():
    for argv, message in ((["--rounds", "0"], "--rounds must be at least 1, not 0"),
                          (["--warmup", "-1"], "--warmup must be 0 or more, not -1")):
        proc = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.strip().endswith(message), proc.stderr


def test_quick_run_shrinks_the_measurement():
    quick, full = parse_args(["--quick", "--cache-dir", "x"]), parse_args(["--cache-dir", "x"])
    assert quick.rounds * quick.steps_per_round < full.rounds * full.steps_per_round
    assert quick.batch_size < full.batch_size
