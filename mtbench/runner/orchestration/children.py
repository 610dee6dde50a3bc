"""Child processes: `python -m mtbench ...` started alone or under torchrun, its output kept in a log file as it
runs, a Ctrl-C passed on to it, and its failure told in one line."""

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading

from mtbench.runner.launch import LAUNCH_DIR_VARIABLE
from mtbench.runner.orchestration.child_log import LogFollower

# torchrun's own report of a failed process follows the processes' lines: its elastic agent's log line, its
# traceback and a banner of '=' lines. Before them, its notice about OMP_NUM_THREADS between lines of '*'.
LAUNCHER_REPORT = re.compile(r"torch[./]distributed[./]elastic")
LAUNCHER_NOTICE = re.compile(r"^(\*+|Setting OMP_NUM_THREADS .*)$")
LAUNCHER_EXIT_CODE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def last_error_line(stderr, returncode):
    """The line that says why a child failed: its last `Error: ` line (mtbench's one-line errors), else its last
    line. Of processes under torchrun, their own lines, not torchrun's report after them."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    report = next((i for i, line in enumerate(lines) if LAUNCHER_REPORT.search(line)), None)
    if report is not None:
        lines = [line for line in lines[:report] if not LAUNCHER_NOTICE.match(line)]
        failed = LAUNCHER_EXIT_CODE.search(stderr)
        if failed and not lines:
            rank, code = failed.groups()
            if int(code) >= 0:
                return f"the process of rank {rank} exited with code {code}, no error message"
            return f"the process of rank {rank} was killed by signal {-int(code)}, no error message"
    errors = [line for line in lines if line.startswith("Error: ")]
    if errors:
        return errors[-1].removeprefix("Error: ")
    if lines:
        return lines[-1]
    if returncode < 0:
        return f"killed by signal {-returncode}, no error message"
    return f"exited with code {returncode}, no error message"


def launcher_command(processes, python=None, launcher_dir=None):
    """How a child of `processes` processes is started: `python -m mtbench` (this interpreter, or `python`), or
    torchrun (its module, so the interpreter's own) with one process per device on this machine, its agent's
    files in `launcher_dir` (without one, torchrun leaves a `torchelastic_*` folder in the temporary directory
    for every run)."""
    python = python or sys.executable
    if processes == 1:
        return [python]
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
            *([f"--log-dir={launcher_dir}"] if launcher_dir else [])]


def run_child(arguments, log_file, name, processes=1, python=None, show=None):
    """Runs `python -m mtbench ARGUMENTS` in fresh processes (several under torchrun) with their stdout written
    into `log_file` as they run, their stderr after it. Returns None, or for a failure one line that names the run
    and quotes its last line on stderr. `show(line)`, when given, receives each training line as it is written
    (`child_log.LogFollower`). A Ctrl-C or SIGTERM while it runs is passed on to it (`wait_passing_interrupts`);
    once it has stopped and its log is complete, `Interrupted` (a KeyboardInterrupt) is raised here."""
    # Output goes to files, not pipes: nothing is lost when the wait is interrupted.
    os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
    with open(log_file, "w", encoding="utf-8") as log, \
            tempfile.TemporaryFile("w+", encoding="utf-8") as err, \
            (tempfile.TemporaryDirectory(prefix="mtbench-torchrun-") if processes > 1
             else contextlib.nullcontext()) as launcher_dir:
        command = [*launcher_command(processes, python, launcher_dir), "-m", "mtbench", *arguments]
        log.write(f"$ {shlex.join(command)}\n--- stdout\n")
        log.flush()
        # The processes' own directory: JAX's leave the port of their coordination service there, not in torchrun's
        # store, which only torch reads (importing torch into each JAX process: 1 s and 175 MiB of its memory).
        env = {**os.environ, LAUNCH_DIR_VARIABLE: launcher_dir} if launcher_dir else None
        process = subprocess.Popen(command, stdout=log, stderr=err, stdin=subprocess.DEVNULL, text=True,
                                   start_new_session=True, env=env)
        with LogFollower(log_file, log.tell(), show) if show else contextlib.nullcontext():
            interrupted = wait_passing_interrupts(process)
        err.seek(0)
        stderr = err.read()
        log.seek(0, os.SEEK_END)
        log.write(f"--- stderr\n{stderr}# exit code {process.returncode}"
                  f"{' (interrupted)' if interrupted else ''}\n")
    if interrupted:
        raise Interrupted(interrupted)
    if process.returncode != 0:
        return ChildFailure(f"{name} failed: {last_error_line(stderr, process.returncode)} "
                            f"(log: {log_file})", process.returncode)
    return None


class Interrupted(KeyboardInterrupt):
    """A child stopped by the signal this process received and passed on: `exit_code`, the signal's (130, 143)."""

    def __init__(self, exit_code):
        super().__init__()
        self.exit_code = exit_code


def wait_passing_interrupts(process):
    """Waits for `process`, started in a session of its own so that a terminal's Ctrl-C reaches only this one:
    each Ctrl-C here is passed on to it once. The first lets a training run finish its step and write a partial
    result, a second stops it at once, a third kills it. A SIGTERM (a scheduler's, `kill`) is passed on as it
    came, where it would otherwise end this process at once and leave the child training on alone. Returns the
    exit code of the first signal that interrupted it (130, 143), or None."""
    interrupts, first = 0, []

    def terminate(signum, frame):
        first.append(128 + signum)
        process.send_signal(signal.SIGTERM)

    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminate) if in_main_thread else None
    try:
        while True:
            try:
                process.wait()
                return first[0] if first else None
            except KeyboardInterrupt:
                interrupts += 1
                first.append(128 + signal.SIGINT)
                if interrupts < 3:
                    process.send_signal(signal.SIGINT)
                else:
                    process.kill()
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


class ChildFailure(str):
    """The one line naming a failed child process, and its exit code."""

    def __new__(cls, text, exit_code):
        line = super().__new__(cls, text)
        line.exit_code = exit_code
        return line
