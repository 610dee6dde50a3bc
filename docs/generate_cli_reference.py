"""Write docs/cli.md, the option reference, from mtbench's click commands themselves, so it cannot drift.

    python docs/generate_cli_reference.py           # rewrite docs/cli.md
    python docs/generate_cli_reference.py --check   # exit 1 if docs/cli.md is not what the commands say

tests/test_cli_reference.py runs the check in CI. Options that several commands share word for word are listed
once, in a section of their own. The installed extras in --extra's help depend on the machine's plugins, so they
are left out here (`mtbench plugins` lists them).
"""

import inspect
import os
import re
import sys

import click

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cli.md")
INSTALLED = re.compile(r" (Installed: .*|None installed\.)$")
RUN_COMMANDS = ("train", "init-weights", "compare")
HEADER = """# Option reference

Generated from the commands' own `--help` by `python docs/generate_cli_reference.py`; do not edit by hand
(`tests/test_cli_reference.py` fails when this file and the commands differ). Why the options work as they do is
in [commands.md](commands.md).
"""


def _help_record(param, ctx):
    name, text = param.get_help_record(ctx)
    text = INSTALLED.sub(" (`mtbench plugins` lists the installed extras.)", text or "")
    return name, " ".join(text.split())


def _line(record):
    name, text = record
    return f"- `{name}`" + (f": {text}" if text else "")


def _options(command, ctx):
    return [_help_record(param, ctx) for param in command.get_params(ctx)
            if isinstance(param, click.Option) and not param.hidden and param.name != "help"]


def render(group=None):
    """docs/cli.md's text for the click group `group` (mtbench's by default)."""
    if group is None:
        from mtbench.cli import main as group
    root = click.Context(group, info_name="mtbench")
    commands = dict(group.commands)  # in the order they are defined
    contexts = {name: click.Context(command, info_name=name, parent=root) for name, command in commands.items()}
    options = {name: [record for record in _options(command, contexts[name])
                      if record[0].split()[0] not in ("--help", "--debug", "--config")]
               for name, command in commands.items()}
    # The options that make up a run's configuration, word for word the same in every command that starts a
    # run, are listed once.
    # Said from the commands themselves: a hand-kept list named one that takes no --config.
    configured = [name for name, command in commands.items()
                  if any("--config" in getattr(param, "opts", ()) for param in command.params)]
    runs = [name for name in RUN_COMMANDS if name in options]
    shared = [record for record in options[runs[0]] if all(record in options[name] for name in runs)] if runs else []
    lines = [HEADER, "```", "mtbench [--version] [--help] COMMAND", "```", "",
             " ".join(inspect.cleandoc(group.help or "").split()), "",
             "Every command takes `--help`, and `--debug` to show the traceback of a failure. "
             f"{' and '.join(f'`{name}`' for name in configured)} take `--config FILE.toml`: the flags' own names "
             "as keys (`batch-size = 64`, `extra = [\"torch-compile\"]`); flags on the command line win over it (a "
             "repeatable flag such as `--extra` replaces the file's list, with a warning).",
             ""]
    for name, command in commands.items():
        ctx = contexts[name]
        lines += [f"## `mtbench {name}`", "", "```", f"mtbench {name} " + " ".join(command.collect_usage_pieces(ctx)),
                  "```", "", " ".join(inspect.cleandoc(command.help or "").split()), ""]
        if name in runs:
            lines += [_line(record) for record in options[name] if record not in shared]
            lines.append("- and [a run's configuration](#a-runs-configuration)")
        else:
            lines += [_line(record) for record in options[name]]
        lines.append("")
    if shared:
        lines += ["## A run's configuration", "",
                  f"Taken by {', '.join(f'`mtbench {n}`' for n in runs)}; `compare` passes them to every run.", ""]
        lines += [_line(record) for record in shared]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv):
    text = render()
    if "--check" in argv:
        with open(PATH, encoding="utf-8") as f:
            if f.read() != text:
                print("docs/cli.md is out of date: run python docs/generate_cli_reference.py", file=sys.stderr)
                return 1
        return 0
    with open(PATH, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
