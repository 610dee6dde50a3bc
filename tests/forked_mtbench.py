"""`python -m mtbench` in processes forked from one Python that has started and imported what every such process
imports before it reads anything of its command: numpy, click, rich, and mtbench's modules but its command line,
none of which reads the environment, the path or the arguments as it loads. Each command's process, in its own
environment (PYTHONPATH's folders on its path), working directory and arguments, imports the command line, which
loads the plugins (`_extras_help`), and runs it as -m does; its exit status and what it wrote to its stdout and
stderr are the caller's, and Python's exit is its own. A process started afresh spends 0.5 CPU s starting and
importing; a forked one a tenth of that.

Only for commands that end before keras is imported (`report`, which never imports it, and the refusals of the
others): keras and the frameworks read the environment as they load, and the forking Python has not loaded them,
so a forked command that imports keras would still be right, but would save nothing. One that does is refused
(`ForkingMtbench.run`), so that a test that forks a run which trains says so at once."""

import atexit
import itertools
import json
import os
import subprocess
import sys

_FORKING_MTBENCH = r"""
import atexit, gc, importlib, json, os, runpy, select, signal, sys
import click, importlib.metadata, rich.console, rich.table, zipfile
from mtbench.plugins import manager
for module in (*manager.BUILTIN_PLUGINS, "mtbench.runner.results.report", "mtbench.runner.tasks.language_modelling",
               "mtbench.runner.tasks.translation", "mtbench.runner.training"):
    importlib.import_module(module)
assert "mtbench.cli" not in sys.modules and manager._loaded is None  # the plugins are each command's own
assert "keras" not in sys.modules
started_with = os.environ.get("PYTHONPATH", "").split(os.pathsep)
gc.freeze()  # what is here stays: a command's collections and exit leave its memory unread, uncopied


def say_if_keras_was_imported(path):
    if "keras" in sys.modules:
        open(path, "w").close()


for line in sys.stdin:
    case = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.environ.clear()
        os.environ.update(case["env"])
        os.chdir(case["cwd"])
        added = [folder for folder in case["env"].get("PYTHONPATH", "").split(os.pathsep)
                 if folder and folder not in started_with]
        sys.path[:1] = [os.getcwd(), *added]  # as -m starts: the working directory, then PYTHONPATH's folders
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, case["stdout"], os.O_WRONLY | os.O_CREAT),
                                (2, case["stderr"], os.O_WRONLY | os.O_CREAT)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(os.devnull)  # not the requests this Python read ahead
        sys.argv = ["-m", *case["args"]]
        atexit.register(say_if_keras_was_imported, case["keras_imported"])
        runpy.run_module("mtbench", run_name="__main__", alter_sys=True)
        sys.exit(0)
    ended = os.pidfd_open(pid)
    if not select.select([ended], [], [], case["timeout"])[0]:
        os.kill(pid, signal.SIGKILL)
        print("timeout", flush=True)
    os.close(ended)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class ForkingMtbench:
    """One forking Python (`_FORKING_MTBENCH`), started at its first command, whose commands write their output
    to files in `outputs`."""

    def __init__(self, outputs, environment):
        self.outputs, self.environment = outputs, environment
        self.server, self.numbers = None, itertools.count()

    def run(self, *args, env, cwd=None, timeout=600):
        """`python -m mtbench ARGS` in `env` (the whole environment) and `cwd` (default: this process's working
        directory), forked: the CompletedProcess, or subprocess.TimeoutExpired past `timeout` seconds."""
        if self.server is None:
            self.server = subprocess.Popen([sys.executable, "-c", _FORKING_MTBENCH], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, text=True, env=self.environment)
        number = next(self.numbers)
        stdout, stderr, keras_imported = (os.path.join(self.outputs, f"{number}.{name}")
                                          for name in ("stdout", "stderr", "keras"))
        self.server.stdin.write(json.dumps({"args": args, "env": env, "cwd": os.path.abspath(cwd or os.getcwd()),
                                            "stdout": stdout, "stderr": stderr, "keras_imported": keras_imported,
                                            "timeout": timeout}) + "\n")
        self.server.stdin.flush()
        answer = self.server.stdout.readline()
        assert answer, "the forking Python ended"
        if answer == "timeout\n":
            self.server.stdout.readline()
            raise subprocess.TimeoutExpired(["mtbench", *args], timeout)
        with open(stdout, encoding="utf-8") as out, open(stderr, encoding="utf-8") as err:
            proc = subprocess.CompletedProcess(["mtbench", *args], int(answer), out.read(), err.read())
        for path in (stdout, stderr):
            os.remove(path)
        assert not os.path.exists(keras_imported), (
            f"`mtbench {' '.join(map(str, args))}` imported keras in a forked process: run it in a fresh one")
        return proc

    def close(self):
        if self.server is not None:
            self.server.stdin.close()
            self.server.wait(timeout=60)
            self.server = None


_shared = {}


def shared_forking_mtbench(outputs, environment):
    """This process's ForkingMtbench, made at the first call (`outputs` and `environment` then are its own), and
    ended as the process ends."""
    if "forking" not in _shared:
        os.makedirs(outputs, exist_ok=True)
        _shared["forking"] = ForkingMtbench(outputs, environment)
        atexit.register(_shared["forking"].close)
    return _shared["forking"]
