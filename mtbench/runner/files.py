"""Atomic writes: a reader (or a crash) never sees half a file, and a failed write leaves the old file intact."""

import json
import os
import tempfile

from mtbench.errors import RunFailure


def write_bytes_atomic(path, data):
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    except OSError as error:
        raise RunFailure(f"{path}: cannot write: {error.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        os.unlink(tmp)
        raise RunFailure(f"{path}: cannot write: {error.strerror}") from None


def write_text_atomic(path, text):
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path, data):
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
