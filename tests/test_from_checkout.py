"""mtbench runs from a source checkout that was never installed (no package metadata for mtbench: a GPU machine
with the checkout on PYTHONPATH), as `python -m mtbench`: its built-in plugins, its version and a whole training
run, the experiment-tracker start included, come from the code itself."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPOSITORY, cli_environment, python_path

# Runs `python -m mtbench ARGS` in a process where importlib.metadata knows no distribution named mtbench, as on a
# machine where the checkout is only on sys.path.
WITHOUT_METADATA = """
import importlib.metadata as metadata, runpy, sys
real_distribution, real_distributions = metadata.distribution, metadata.distributions

def distribution(name):
    if name.lower() == "mtbench":
        raise metadata.PackageNotFoundError(name)
    return real_distribution(name)

def distributions(**kwargs):
    return [d for d in real_distributions(**kwargs) if (d.metadata["Name"] or "").lower() != "mtbench"]

metadata.distribution, metadata.distributions = distribution, distributions
metadata.version = lambda name: distribution(name).version
sys.argv = ["mtbench", *sys.argv[1:]]
runpy.run_module("mtbench", run_name="__main__", alter_sys=True)
"""


def run_without_metadata(*args, cwd):
    return subprocess.run([sys.executable, "-c", WITHOUT_METADATA, *args], capture_output=True, text=True,
                          env=cli_environment({"PYTHONPATH": python_path(REPOSITORY)}), cwd=cwd, timeout=600)


def test_the_stand_in_really_hides_mtbenchs_metadata(tmp_path):
    probe = ("try:\n    metadata.version('mtbench'); print('found')\n"
             "except metadata.PackageNotFoundError:\n    print('hidden')\n")
    checked = subprocess.run([sys.executable, "-c", WITHOUT_METADATA.split("sys.argv =")[0] + probe],
                             capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert checked.stdout.strip() == "hidden", checked.stderr


@pytest.mark.slow
def test_a_checkout_lists_its_plugins_and_trains_without_package_metadata(tmp_path, cache_dir):
    plugins = run_without_metadata("plugins", cwd=tmp_path)
    assert plugins.returncode == 0, plugins.stderr
    assert "jax" in plugins.stdout and "torch" in plugins.stdout and "gpt" in plugins.stdout
    out = tmp_path / "run.json"
    proc = run_without_metadata("train", "--backend", "jax", "--model", "gpt", "--preset", "tiny", "--steps", "3",
                                "--block-size", "16", "--batch-size", "4", "--measure-only", "--cache-dir", cache_dir,
                                "--data", os.path.join(REPOSITORY, "README.md"), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from mtbench import __version__
    assert json.loads(out.read_text())["env"]["mtbench"] == __version__
