"""The backend-neutral initial-weights file: an uncompressed `.npz` with one float array per Keras variable path.

`mtbench compare` writes one such file and every run loads it, so runs on different frameworks verifiably start
from the same numbers: each result records the sha256 of the bytes it loaded. Only numpy touches the file.
"""

import hashlib
import io
import zipfile

import numpy as np

from mtbench.errors import MtbenchError
from mtbench.runner.data.formats import check_readable
from mtbench.runner.files import write_bytes_atomic


def write_weights_file(path, weights):
    """Writes {variable path: array} atomically; returns the sha256 of the bytes written."""
    buffer = io.BytesIO()
    np.savez(buffer, **weights)
    data = buffer.getvalue()
    write_bytes_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def read_weights_file(path):
    """Returns ({variable path: array}, sha256 of the file). The hash is of exactly the bytes parsed, so a
    result that records it says which numbers the run started from."""
    check_readable(path, expected="an .npz file for --initial-weights")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise MtbenchError(f"{path}: cannot read: {error.strerror}") from None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as archive:
            weights = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile):
        raise MtbenchError(f"{path}: not an .npz file of arrays") from None
    if not weights:
        raise MtbenchError(f"{path}: holds no arrays")
    return weights, hashlib.sha256(data).hexdigest()
