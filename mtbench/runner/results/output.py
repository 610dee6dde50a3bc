"""Where a command writes: checked before any work starts, so a run never ends by failing to save its figures
and never replaces what an earlier run left unless told to."""

import contextlib
import json
import os
import tempfile
import zipfile

from mtbench.errors import MtbenchError
from mtbench.runner.loop.checkpoints import RunDirectory, run_dir_for
from mtbench.runner.results.schema import read_status, resumable, sidecar_paths

SCORES_KIND = "scores .json"  # what `mtbench evaluate --out` writes


def check_result_path(path, overwrite, resuming=False, beside=(), reads=()):
    """`check_output_path` of a run's result, with the hypotheses and references a translation writes beside it."""
    check_output_path(path, overwrite, resuming, beside=(*sidecar_paths(path), *beside), reads=reads)


def check_output_path(path, overwrite, resuming=False, kind=".json", beside=(), reads=()):
    """Refuses to replace a result (or the files written `beside` it: a translation's hypotheses, a rerun's log)
    or to mix with an earlier run's checkpoints, unless told to (--overwrite), or unless resuming the run whose
    partial result it is; and, even told to, to replace a file the command `reads` (its input) by it or by what is
    written beside it. Missing directories are created when writing."""
    check_not_read(path, reads)
    for other in beside:
        check_not_read(other, reads, beside=path)
    if os.path.isdir(path):
        raise MtbenchError(f"{path}: is a directory; --out takes a {kind} file path")
    if not os.path.basename(path):  # 'results/' or '': checked here, it would fail only when the figures are written
        raise MtbenchError(f"{path!r}: names a directory, not a file; --out takes a {kind} file path")
    if not os.path.basename(path).strip():  # ' ': files named by blanks, that no listing shows
        raise MtbenchError(f"{path!r}: a name of blanks; --out takes a {kind} file path")
    if os.path.exists(path) and resuming:
        if not resumable(path):
            raise MtbenchError(f"{path}: the run already has a result with status {read_status(path) or 'unknown'}; "
                               "there is nothing to resume")
    elif os.path.exists(path) and not overwrite:
        raise MtbenchError(f"{path}: already exists; pass --overwrite to replace it")
    elif os.path.isfile(path) and not _written_as(path, kind):
        raise MtbenchError(f"{path}: is no {kind} file, as mtbench writes; --overwrite replaces only those: give "
                           f"another --out")
    for other in () if resuming or overwrite else beside:
        if os.path.exists(other):
            raise MtbenchError(f"{other}: already exists beside {path} (an earlier run's); pass --overwrite to "
                               f"replace it, or give another --out")
    if kind == ".json":
        run_dir = RunDirectory(run_dir_for(path), fresh=False)
        if not resuming and not overwrite and run_dir.checkpoints():
            raise MtbenchError(f"{run_dir.path}: holds checkpoints of an earlier run writing {path}; continue "
                               f"it with --resume {run_dir.path}, or pass --overwrite to start afresh")
        held = sorted(os.listdir(run_dir.path)) if not (resuming or overwrite) and os.path.isdir(run_dir.path) else []
        if held:
            named = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
            raise MtbenchError(f"{run_dir.path}: holds an earlier run's files ({named}), though {path} does not "
                               f"exist; pass --overwrite to write over them, or give another --out")
    check_directory_writable(path)


@contextlib.contextmanager
def holding_result_path(path):
    """The lock of the result `path` (`PATH.lock`, holding this process's id), held in the block, so that two runs
    started on one --out (two terminals, two jobs, a resume of a run still training) cannot write over each
    other's checkpoints and result: the second is refused in one line. The lock goes with the process that held it
    (a killed run's file is taken again). Where the system has no `flock` (Windows), nothing is held."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    lock_path = f"{path}.lock"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(lock_path)), exist_ok=True)
        lock = open(lock_path, "a+", encoding="utf-8")
    except OSError as error:
        raise MtbenchError(f"{lock_path}: cannot be made ({error.strerror or error}): a run holds its result's path "
                           f"there while it writes") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read().strip()
            raise MtbenchError(f"{path}: another mtbench run{f' (process {holder})' if holder else ''} is writing "
                               f"it; wait for it to end, or give another --out") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            os.remove(lock_path)  # before the lock goes: a run that starts now makes a file of its own


def _written_as(path, kind):
    """Whether the file at `path` could be one an mtbench command wrote as `kind` (a JSON object, `evaluate`'s
    scores, an .npz), or is empty: --overwrite replaces an earlier result, not a corpus, a script or weights a
    result was aimed at, nor with scores a training result or a saved model's description."""
    if os.path.getsize(path) == 0:
        return True
    if kind == ".npz":
        return zipfile.is_zipfile(path)
    try:
        with open(path, encoding="utf-8") as f:
            written = json.load(f)
    except (OSError, ValueError):
        return False
    if kind == SCORES_KIND:  # `evaluate`'s: named by the model it scored, where a result's model is an object
        return isinstance(written, dict) and isinstance(written.get("model"), str) and "backend" in written
    return isinstance(written, dict)


def check_directory_writable(path, label=None):
    """Refuses a path whose directory (or the nearest one of it that exists) cannot take a new file, before any
    work; `label` names the path in the error (default: the path)."""
    label = label or path
    existing = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise MtbenchError(f"{label}: cannot write into {existing}: it is a file, not a directory")
    if not os.access(existing, os.W_OK):
        raise MtbenchError(f"{label}: cannot write into {existing}: permission denied or read-only")
    try:  # what the permission bits do not say: a file system that refuses new files (/sys, /proc), even to root
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise MtbenchError(f"{label}: cannot write into {existing}: it takes no new file ({error.strerror or error})") \
            from None


def check_not_read(path, reads, beside=None):
    """Refuses an output `path` that is one of the files the command `reads`, --overwrite or not: it would replace
    its own input. `beside`: the --out that `path` is written beside (a hypotheses file, a run file)."""
    for source in reads:
        if source and _same_file(path, source):
            written = f"; --out {beside} writes it beside" if beside else ""
            raise MtbenchError(f"{path}: is the file this command reads ({source}){written}; give another --out")


def _same_file(path, other):
    if os.path.exists(path) and os.path.exists(other):
        return os.path.samefile(path, other)
    return os.path.realpath(path) == os.path.realpath(other)
