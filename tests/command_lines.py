"""Command lines as a page or a script shows them, checked against what mtbench and its benchmark scripts take:
shared by the checks of the documentation's commands and of the next GPU session's script."""

import importlib
import os
import re
import shlex
import unittest.mock

import click

# A file an example names (a config file, a trained model's directory), which the reader has and this test has not.
AN_EXAMPLES_FILE = re.compile(r"no such file|does not exist", re.IGNORECASE)


OPERATORS = set("();<>|&")


def shell_words(line):
    """The words and operators of a shell line, quotes removed (ValueError: a quotation that does not close)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def up_to_operator(words):
    """`words` up to the shell's first operator or redirection: one command's arguments."""
    return next((words[:at] for at, word in enumerate(words) if set(word) <= OPERATORS), words)


def without_a_named_option(command, argv):
    """`argv` less a last option that takes a value and is given none: a span that names an option (`mtbench train
    --backend`) rather than using it."""
    if argv and argv[-1].startswith("--"):
        named = next((param for param in command.params if argv[-1] in getattr(param, "opts", ())), None)
        if named is not None and not getattr(named, "is_flag", False) and not getattr(named, "count", False):
            return argv[:-1]
    return argv


def refusal(program, argv):
    """Why `program` refuses `argv`, or None."""
    if program.startswith("mtbench "):
        from mtbench.cli import main
        name = program.split()[1]
        if name not in main.commands:
            return f"`mtbench {name}` is no command"
        command = main.commands[name]
        try:
            with command.make_context(name, without_a_named_option(command, list(argv))):
                return None
        except click.ClickException as refused:  # an unknown option, a bad choice or value
            message = refused.format_message()
            return None if AN_EXAMPLES_FILE.search(message) else message
    script = importlib.import_module(f"benchmarks.{program}")
    if not hasattr(script, "parse_args"):
        return f"benchmarks/{program}.py parses its options in no `parse_args`"
    try:
        with unittest.mock.patch.dict(os.environ):  # a script may set its framework's variables as it parses
            script.parse_args(argv)
    except SystemExit as refused:  # argparse's way of refusing, its line on stderr
        return f"benchmarks/{program}.py exits with {refused.code}"
    return None
