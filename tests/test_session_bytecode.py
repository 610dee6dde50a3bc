"""The test session's processes read the checkout's modules as bytecode (conftest.bytecode_written): where
PYTHONDONTWRITEBYTECODE is set, each of them would otherwise compile from source every module of mtbench it
imports, and each pytest-xdist worker would rewrite every test module again (conftest.pytest_collection)."""

import glob
import importlib.util
import os
import subprocess
import sys

from conftest import REPOSITORY, cli_environment, json_answer


def test_every_module_a_run_imports_from_the_checkout_has_its_bytecode_beside_it():
    # What a process of the session imports before its framework: the CLI, the run and the built-in plugins.
    probe = ("import json, os, sys, mtbench.cli, mtbench.runner.training; "
             "package = os.path.dirname(mtbench.__file__) + os.sep; "
             "print(json.dumps(sorted(m.__file__ for m in list(sys.modules.values()) "
             "if (getattr(m, '__file__', None) or '').startswith(package) and m.__file__.endswith('.py'))))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=cli_environment({"PYTHONDONTWRITEBYTECODE": "1"}), cwd=REPOSITORY, timeout=120)
    sources = json_answer(proc)
    assert len(sources) > 50
    stale = [source for source in sources if not bytecode_is_current(source)]
    assert not stale, stale[:5]


def bytecode_is_current(source):
    compiled = importlib.util.cache_from_source(source)
    return os.path.exists(compiled) and os.path.getmtime(compiled) >= os.path.getmtime(source)


def test_pytest_keeps_this_module_as_it_rewrote_it_for_the_next_worker():
    kept = glob.glob(os.path.join(os.path.dirname(__file__), "__pycache__",
                                  f"{os.path.basename(__file__)[:-3]}.{sys.implementation.cache_tag}-pytest-*.pyc"))
    with open(__file__, "rb") as source:
        source_hash = importlib.util.source_hash(source.read())
    stat = os.stat(__file__)
    headers = []
    for path in kept:
        with open(path, "rb") as compiled:
            headers.append(compiled.read(16))

    def current(header):
        # PEP 552: a hash-checked pyc (pytest 9.2 on) has the source's hash after the flags, a timestamped one
        # (pytest before 9.2) the source's modification time and size.
        if header[:4] != importlib.util.MAGIC_NUMBER:
            return False
        if int.from_bytes(header[4:8], "little") & 1:
            return header[8:16] == source_hash[:8]
        return (int.from_bytes(header[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
                and int.from_bytes(header[12:16], "little") == stat.st_size & 0xFFFFFFFF)

    assert any(map(current, headers)), kept
