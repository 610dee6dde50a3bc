"""Every command the README, the guides in docs/ and the examples' READMEs show takes the options it is given: each
`mtbench ...` (also as `python -m mtbench` or under torchrun) through click's own parsing of that command, each
`python benchmarks/NAME.py ...` through the script's `parse_args`. A renamed option or choice fails here, not in the
hands of a reader who copied the line. (docs/cli.md is generated from the commands themselves.) And the usage lines
at the top of each benchmark script name only options the script takes."""

import glob
import importlib
import os
import re
import shlex
import textwrap

import pytest

from command_lines import refusal, shell_words, up_to_operator
from conftest import REPOSITORY

PAGES = ["README.md", *(os.path.relpath(page, REPOSITORY) for page in
                        sorted(glob.glob(os.path.join(REPOSITORY, "docs", "*.md")))
                        + sorted(glob.glob(os.path.join(REPOSITORY, "examples", "*", "README.md"))))]
PAGES.remove(os.path.join("docs", "cli.md"))

SCRIPT = re.compile(r"benchmarks/(\w+)\.py")


def shown_lines(text):
    """Each command line of the page's shell blocks (continuation lines joined, a quotation over several lines
    kept whole, comments left out), and each code span of its prose that holds a whole command with options. (Its
    other blocks are outputs, trees and files.)"""
    for language, block in re.findall(r"```([a-z]*)\n(.*?)```", text, re.S):
        if language != "bash":
            continue
        pending = ""
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            pending = f"{pending}\n{line}" if pending else line
            try:
                shell_words(pending)
            except ValueError:  # its quotation goes on in the next line
                continue
            if not pending.lstrip().startswith("#"):
                yield pending
            pending = ""
        assert not pending, f"a quotation in a shell block does not close: {pending[:80]}"
    prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
    yield from re.findall(r"`((?:python3? -m |torchrun [^`]*?-m )?mtbench [a-z][\w-]* [^`]*--[^`]*"
                          r"|python3? benchmarks/\w+\.py[^`]*)`", prose)


def commands_of(text):
    """[(program, argv)] of a page's text: program 'mtbench COMMAND' (also `python -m mtbench`, or under torchrun)
    or a benchmark script's name (`python benchmarks/NAME.py`), argv its words up to the shell's next operator."""
    found = []
    for line in shown_lines(text):
        tokens = shell_words(line)
        for index, token in enumerate(tokens):
            script = SCRIPT.fullmatch(token)
            if script and index and tokens[index - 1] in ("python", "python3"):
                program, start = script.group(1), index + 1
            elif token == "mtbench" and index + 1 < len(tokens) and re.fullmatch(r"[a-z][\w-]*", tokens[index + 1]):
                program, start = f"mtbench {tokens[index + 1]}", index + 2
            else:
                continue
            found.append((program, up_to_operator(tokens[start:])))
    return found


def shown_commands():
    """[(page, program, argv)] of every page."""
    found = []
    for page in PAGES:
        with open(os.path.join(REPOSITORY, page), encoding="utf-8") as f:
            found += [(page, program, argv) for program, argv in commands_of(f.read())]
    return found


SHOWN = shown_commands()


def test_the_pages_show_the_commands_a_reader_copies():
    programs = {program for _, program, _ in SHOWN}
    assert {"mtbench train", "mtbench compare", "mtbench report", "overhead", "gpu_matrix"} <= programs
    assert len(SHOWN) >= 60
    assert {page for page, _, _ in SHOWN} >= {"README.md", "docs/commands.md", "docs/benchmarks.md"}


@pytest.mark.parametrize("page, program, argv", SHOWN,
                         ids=[f"{page}:{program}:{index}" for index, (page, program, _) in enumerate(SHOWN)])
def test_each_shown_command_takes_its_options(page, program, argv):
    why = refusal(program, argv)
    assert why is None, f"{page}: `{program} {shlex.join(argv)}`: {why}"


def test_a_page_whose_command_drifted_fails_the_check():
    """The check itself, on a page of each kind of line: a renamed option, a choice mtbench does not offer, a
    command it does not have and a script's unknown option are refused; the same lines as mtbench takes them, and
    an option only named in the prose, are not."""
    page = textwrap.dedent("""\
        ```bash
        mtbench train --backend jax --presets tiny && mtbench report out.json
        python -m mtbench compare --dtype float64 \\
            --steps 5
        mtbench trian --steps 5
        ```
        Then `python benchmarks/overhead.py --model gpt --baseline bestest`, or `mtbench train --backend`.
        ```text
        mtbench against the world
        ```
        """)
    found = commands_of(page)
    assert [(program, argv) for program, argv in found] == [
        ("mtbench train", ["--backend", "jax", "--presets", "tiny"]), ("mtbench report", ["out.json"]),
        ("mtbench compare", ["--dtype", "float64", "--steps", "5"]), ("mtbench trian", ["--steps", "5"]),
        ("overhead", ["--model", "gpt", "--baseline", "bestest"]), ("mtbench train", ["--backend"])]
    assert [refusal(program, argv) is not None for program, argv in found] == [True, False, True, True, True, False]
    assert refusal("mtbench train", ["--backend", "jax", "--preset", "tiny"]) is None
    assert refusal("overhead", ["--model", "gpt", "--baseline", "best"]) is None


def synopses(docstring, script):
    """Each usage line a script's docstring shows for itself, its continuation lines (indented further) joined."""
    lines, found = docstring.splitlines(), []
    for index, line in enumerate(lines):
        if f"benchmarks/{script}.py" in line and line.lstrip().startswith("python"):
            indent, whole = len(line) - len(line.lstrip()), [line]
            for following in lines[index + 1:]:
                if not following.strip() or len(following) - len(following.lstrip()) <= indent:
                    break
                whole.append(following)
            found.append(" ".join(part.strip().rstrip("\\") for part in whole))
    return found


def options_taken(script):
    """The options a benchmark script's `parse_args` takes, as its --help lists them."""
    import contextlib
    import io
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
        importlib.import_module(f"benchmarks.{script}").parse_args(["--help"])
    return set(re.findall(r"(?<![\w-])--[a-z][\w-]*", shown.getvalue()))


SCRIPTS = sorted(os.path.basename(path)[:-3] for path in glob.glob(os.path.join(REPOSITORY, "benchmarks", "*.py"))
                 if "python benchmarks/" in open(path, encoding="utf-8").read(2000))


def test_the_scripts_show_their_usage():
    assert len(SCRIPTS) >= 12 and {"overhead", "gpu_matrix", "aa_count", "host_overhead"} <= set(SCRIPTS)


def unknown_options(script, usage):
    """The options a usage line of `script` names that it does not take; after a lone `--`, those the `mtbench
    compare` it runs does not take."""
    from mtbench.cli import main
    own, _, passed_on = usage.partition(" -- ")
    compare = {opt for param in main.commands["compare"].params for opt in getattr(param, "opts", ())}
    named = re.compile(r"(?<![\w-])--[a-z][\w-]*")
    return (set(named.findall(own)) - options_taken(script)) | (set(named.findall(passed_on)) - compare)


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_scripts_usage_names_only_options_it_takes(script):
    """The usage lines at the top of a benchmark script (what a reader of the file sees first) name options its
    `parse_args` takes."""
    usages = synopses(importlib.import_module(f"benchmarks.{script}").__doc__, script)
    assert usages, f"benchmarks/{script}.py shows no usage line"
    for usage in usages:
        assert not unknown_options(script, usage), f"benchmarks/{script}.py: {usage}"


def test_a_usage_line_that_drifted_fails_the_check():
    docstring = """Overhead.

        python benchmarks/overhead.py [--quick] [--model gpt]
                                      [--backend jax]
        python benchmarks/aa_count.py --count 2 -- --backends jax --presets tiny
    """
    assert synopses(docstring, "overhead") == ["python benchmarks/overhead.py [--quick] [--model gpt] [--backend jax]"]
    assert unknown_options("overhead", synopses(docstring, "overhead")[0]) == {"--backend"}  # it takes --backends
    assert unknown_options("aa_count", synopses(docstring, "aa_count")[0]) == {"--presets"}
