"""benchmarks/process_start.py: a run of one fresh process per backend whose output has the structure scripts read
(the last line a JSON object of the figures), the sums it makes of Python's import times, and bad settings refused
in one line. No timing is asserted."""

import os
import subprocess
import sys

import pytest

from benchmarks.process_start import package_seconds
from conftest import REPOSITORY, json_answer

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "process_start.py")


def test_each_modules_own_time_is_summed_by_its_top_level_package():
    lines = ["import time: self [us] | cumulative | imported package",
             "import time:       250 |        250 |     ml_dtypes._finfo",
             "import time:    800000 |     800250 |   ml_dtypes",
             "import time:      1000 |     801250 | keras.src",
             "import time:       500 |     801750 | keras",
             "some other line on stderr"]
    assert package_seconds(lines) == {"ml_dtypes": 0.80025, "keras": 0.0015}


@pytest.mark.slow  # a benchmark's run: two processes each import a framework and keras, 5 s of one core
def test_a_run_names_the_largest_packages_of_each_backends_start():
    proc = subprocess.run([sys.executable, SCRIPT, "--backends", "jax,torch", "--repeats", "1", "--top", "3"],
                          capture_output=True, text=True, timeout=300)
    summary = json_answer(proc)
    assert summary["repeats"] == 1 and summary["hardware"]["cpu_model"]
    assert all(summary["versions"][name] for name in ("python", "keras", "numpy", "ml_dtypes"))
    for backend, framework in (("jax", "jax"), ("torch", "torch")):
        figures = summary["backends"][backend]
        assert len(figures["largest_s"]) == 3 and framework in figures["largest_s"]
        assert sum(figures["largest_s"].values()) <= figures["imports_s"]
        assert f"{backend}: {figures['imports_s']:.2f} s of imports (median of 1); the largest:" in proc.stdout


def test_bad_settings_are_refused_with_one_line():
    for argv, message in ((["--repeats", "0"], "--repeats must be at least 1, not 0"),
                          (["--backends", "jax,nonesuch"], "--backends: no backend 'nonesuch'; installed: ")):
        proc = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr
        assert "Traceback" not in proc.stderr
