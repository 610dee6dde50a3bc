"""The backend-neutral initial-weights file: an uncompressed `.npz` with one float array per Keras variable path
(and, in one drawn by mtbench, the name of how: `INIT_ENTRY`).

`mtbench compare` writes one such file and every run loads it, so runs on different frameworks verifiably start
from the same numbers: each result records the sha256 of the bytes it loaded. Only numpy touches the file.
"""

import hashlib
import io
import zipfile

import numpy as np

from mtbench.errors import MtbenchError
from mtbench.keras_models.initialization import INIT_SCHEMES
from mtbench.runner.data.formats import check_readable
from mtbench.runner.files import write_bytes_atomic


# The entry that names how the weights were drawn (`--init`'s scheme, or PRETRAINED): no variable's path.
INIT_ENTRY = "mtbench.init"
PRETRAINED = "pretrained"   # what a file of a pretrained family's checkpoint names


class Weights(dict):
    """{variable path: array} of a weights file, and how they were drawn (`init`: a scheme of --init,
    PRETRAINED, or None where the file does not say: a trained model's)."""
    init = None


def drawn_scheme(init):
    """The `--init` scheme a file's `init` names, as a run's configuration records it: None for a checkpoint's
    (PRETRAINED), a file that names none, or a scheme this version does not draw."""
    return init if init in INIT_SCHEMES else None


def write_weights_file(path, weights, init=None):
    """Writes {variable path: array} atomically, with `init` (how they were drawn) where given; returns the sha256
    of the bytes written."""
    buffer = io.BytesIO()
    np.savez(buffer, **weights, **({INIT_ENTRY: np.array(init)} if init else {}))
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
            weights = Weights({name: archive[name] for name in archive.files})
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):  # an empty file: EOFError
        raise MtbenchError(f"{path}: not an .npz file of arrays") from None
    if INIT_ENTRY in weights:
        weights.init = str(weights.pop(INIT_ENTRY))
    if not weights:
        raise MtbenchError(f"{path}: holds no arrays")
    return weights, hashlib.sha256(data).hexdigest()
