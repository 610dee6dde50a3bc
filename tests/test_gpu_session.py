"""The next lent GPU's one call, .ci/gpu-session.sh, checked where there is no GPU: every mtbench command and
benchmark script it runs takes the options it is given, and what it reads back from their results is what mtbench
writes. A GPU is lent to few sessions; a renamed option or key would otherwise be found only there, its minutes
spent."""

import importlib
import os
import re
import shlex

import pytest

from command_lines import refusal, shell_words, up_to_operator
from conftest import REPOSITORY

SCRIPT = os.path.join(REPOSITORY, ".ci", "gpu-session.sh")
# The script's shell values, as the GPU machine gives them.
VALUES = {"policy": "full", "seconds": "330", "out": "/tmp/gpu-session"}


def script_text():
    with open(SCRIPT, encoding="utf-8") as f:
        return re.sub(r"\\\n\s*", " ", f.read())  # each command on one line


def invocations():
    """[(program, argv)] of every `python3 -m mtbench ...` ('mtbench') and `python3 benchmarks/NAME.py ...` ('NAME')
    the script runs, its shell values filled in and its redirections left out."""
    found = []
    for line in script_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        for program, rest in re.findall(r"python3 (-m mtbench|benchmarks/\w+\.py) ([^\n]*)", line):
            rest = re.sub(r"\$\(\([^)]*\)\)", "100", rest)
            rest = re.sub(r"\$\{?(\w+)\}?", lambda value: VALUES[value.group(1)], rest)
            found.append(("mtbench" if program == "-m mtbench" else os.path.basename(program)[:-3],
                          up_to_operator(shell_words(rest))))
    return found


def test_the_script_runs_the_commands_it_means_to():
    programs = [program for program, _ in invocations()]
    assert programs.count("mtbench") >= 4 and programs.count("gpu_matrix") == 1
    assert {argv[0] for program, argv in invocations() if program == "mtbench"} == {"train", "compare"}


@pytest.mark.parametrize("program, argv", invocations(), ids=lambda value: value if isinstance(value, str) else None)
def test_each_command_takes_the_options_it_is_given(program, argv):
    if program == "mtbench":  # click's own parsing of the command: a bad option or value is refused
        program, argv = f"mtbench {argv[0]}", argv[1:]
    why = refusal(program, argv)  # a benchmark script: its `parse_args`, argparse's exit a refusal
    assert why is None, f"`{program} {shlex.join(argv)}`: {why}"


def keys_of(value):
    """Every key of the dictionaries in `value`, however deep."""
    if isinstance(value, dict):
        return set(value).union(*map(keys_of, value.values()))
    if isinstance(value, list):
        return set().union(*map(keys_of, value))
    return set()


def test_what_it_reads_back_is_what_mtbench_writes(tiny_runs, compared):
    text = script_text()
    read = set(re.findall(r"\[\s*'(\w+)'\s*\]", text))
    assert {"train_step_chosen", "step_s_median", "loss_scaling", "host_syncs_per_step"} <= read
    written = keys_of(tiny_runs["torch"]["result"]) | keys_of(compared["combined"])
    assert read - written == set(), "keys the script reads that no result holds"
    for module, name in re.findall(r"from (mtbench[\w.]*) import (\w+)", text):
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
    for sourced in re.findall(r"^\. (\S+)", text, re.M):
        assert sourced.startswith(".gpukit/") or os.path.exists(os.path.join(REPOSITORY, sourced)), sourced
