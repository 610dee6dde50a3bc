"""Atomic writes: a reader (or a crash) never sees half a file, and a failed write leaves the old file intact.
Every file and folder mtbench writes gets the permissions the umask gives (tempfile makes them private)."""

import hashlib
import json
import os
import tempfile

from mtbench.errors import MtbenchError, RunFailure


def current_umask():
    """This process's umask: read from /proc where Linux shows it, else set and put back at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode(directory=False):
    """The mode open() and os.makedirs give a new file (or folder) under the umask: what tempfile's private 0600
    and 0700 are set to, so that colleagues and CI jobs running as other users read results as they read any
    other file of the user's."""
    return (0o777 if directory else 0o666) & ~current_umask()


def make_temporary_folder(prefix, parent):
    """tempfile.mkdtemp in `parent`, with the umask's permissions instead of 0700."""
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    os.chmod(path, umask_mode(directory=True))
    return path


def write_bytes_atomic(path, data, replace=True):
    """Writes `data` to `path` whole or not at all. `replace=False`: only if no file is there yet, the first of
    several processes racing to write it winning; returns whether this one wrote it."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    except OSError as error:
        raise RunFailure(f"{path}: cannot write: {error.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), umask_mode())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return _put_in_place(tmp, path, replace)
    except OSError as error:
        raise RunFailure(f"{path}: cannot write: {error.strerror}") from None
    finally:  # linked, not placed, failed, or a second Ctrl-C: no temporary file stays
        if os.path.exists(tmp):
            os.unlink(tmp)


def _put_in_place(tmp, path, replace):
    """Moves the written file `tmp` to `path`; with `replace=False` only where no file is there yet: a hard link
    (which fails on a name taken) or, on a file system without them, a look first. Returns whether it did."""
    if replace:
        os.replace(tmp, path)
        return True
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links
        if os.path.exists(path):
            return False
        os.replace(tmp, path)
    return True


def write_text_atomic(path, text, replace=True):
    return write_bytes_atomic(path, text.encode("utf-8"), replace)


def write_json_atomic(path, data, replace=True):
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n", replace)


CHECKSUM_SUFFIX = ".sha256"


def write_cache_file(path, data):
    """Writes `data` (bytes) to the cache file `path`, with its sha256 beside it (`read_cache_file`)."""
    write_bytes_atomic(path, data)
    write_bytes_atomic(path + CHECKSUM_SUFFIX, hashlib.sha256(data).hexdigest().encode())


def read_cache_file(path):
    """The bytes of the cache file at `path` where they are those `write_cache_file` wrote (their sha256 beside
    them), else None, to be made again: a copy cut short (a full disk, a killed copy) may still read as a shorter
    file of the same kind, and would pass for what was asked for."""
    try:
        with open(path, "rb") as kept, open(path + CHECKSUM_SUFFIX, "rb") as checksum:
            data, expected = kept.read(), checksum.read().decode(errors="replace").strip()
    except OSError:  # none kept, or one kept before its checksum was
        return None
    return data if hashlib.sha256(data).hexdigest() == expected else None


def read_json(path, what):
    """The JSON file at `path`; a missing, unreadable or malformed file is one line naming the file and `what` was
    expected there ("a result JSON")."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise MtbenchError(f"{path}: no such file; expected {what}") from None
    except IsADirectoryError:
        raise MtbenchError(f"{path}: is a directory, expected {what}") from None
    except UnicodeDecodeError:
        raise MtbenchError(f"{path}: not valid UTF-8; expected {what}") from None
    except json.JSONDecodeError as error:
        raise MtbenchError(f"{path}:{error.lineno}: not valid JSON ({error.msg}); expected {what}") from None
    except OSError as error:
        raise MtbenchError(f"{path}: cannot read: {error.strerror}; expected {what}") from None
