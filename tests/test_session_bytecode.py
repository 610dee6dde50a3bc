"""The test session's processes read the checkout's modules as bytecode (conftest.bytecode_written): where
PYTHONDONTWRITEBYTECODE is set, each of them would otherwise compile from source every module of mtbench it
imports."""

import importlib.util
import json
import os
import subprocess
import sys

from conftest import REPOSITORY, cli_environment


def test_every_module_a_run_imports_from_the_checkout_has_its_bytecode_beside_it():
    # What a process of the session imports before its framework: the CLI, the run and the built-in plugins.
    probe = ("import json, os, sys, mtbench.cli, mtbench.runner.training; "
             "package = os.path.dirname(mtbench.__file__) + os.sep; "
             "print(json.dumps(sorted(m.__file__ for m in list(sys.modules.values()) "
             "if (getattr(m, '__file__', None) or '').startswith(package) and m.__file__.endswith('.py'))))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=cli_environment({"PYTHONDONTWRITEBYTECODE": "1"}), cwd=REPOSITORY, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sources = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(sources) > 50
    stale = [source for source in sources if not bytecode_is_current(source)]
    assert not stale, stale[:5]


def bytecode_is_current(source):
    compiled = importlib.util.cache_from_source(source)
    return os.path.exists(compiled) and os.path.getmtime(compiled) >= os.path.getmtime(source)
