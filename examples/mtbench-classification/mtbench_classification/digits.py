"""The data set `digits-8x8`: scikit-learn's `load_digits`, 1,797 handwritten digits of 8x8 pixels (intensities
0-16) with their labels 0-9, read from the file the scikit-learn wheel ships (nothing is downloaded). It is the
test part of the UCI "Optical Recognition of Handwritten Digits" data set: not MNIST (28x28 pixels, 70,000 images).

A fixed shuffle splits it into training, validation and test, the same for every --seed; the seed orders the
training batches. Each example is one row of a `Batch`: its 64 pixels (scaled to 0-1) are the model's input, its
label the single "token" the loss counts."""

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from mtbench import Batch, MtbenchError, Tokenizer

NAME = "digits-8x8"
DESCRIPTION = ("scikit-learn's load_digits: the UCI optical recognition of handwritten digits (test part), 1,797 "
               "images of 8x8 pixels with intensities 0-16, digits 0-9, shipped inside the scikit-learn wheel; not "
               "MNIST")
SPLIT_SEED = 0            # the shuffle behind the split: fixed, so every --seed is scored on the same test images
HELD_OUT_FRACTION = 0.1   # of the images, for validation and again for test
SAVED_NAME = "pixels.json"


@dataclass
class Examples:
    """A split: pixels (n, features) float32 in [0, 1] and labels (n,) int32."""
    pixels: np.ndarray
    labels: np.ndarray

    def __len__(self):
        return len(self.labels)


@dataclass
class Digits:
    """The raw data set, as read."""
    name: str
    origin: str
    images: np.ndarray  # (n, 64) intensities 0-16
    labels: np.ndarray  # (n,) 0-9


def read_digits():
    try:
        import sklearn
        from sklearn.datasets import load_digits
    except ImportError:
        raise MtbenchError(f"the {NAME} data set comes with scikit-learn, which is not installed: "
                           f"pip install scikit-learn") from None
    digits = load_digits()
    return Digits(NAME, f"{DESCRIPTION} (scikit-learn {sklearn.__version__})", digits.data, digits.target)


def split_indices(count):
    """{split: indices} of a fixed shuffle: test and validation HELD_OUT_FRACTION each, the rest training."""
    order = np.random.default_rng(SPLIT_SEED).permutation(count)
    held_out = round(count * HELD_OUT_FRACTION)
    return {"train": order[2 * held_out:], "valid": order[held_out:2 * held_out], "test": order[:held_out]}


class PixelEncoding(Tokenizer):
    """What stands in for a tokenizer: an image's pixels scaled from 0-16 to 0-1 in, one of the classes out.
    `vocab_size` is the number of classes (what sizes the model's output layer), `features` its input."""
    kind = "pixels-8x8"
    features = 64
    scale = 16.0

    def __init__(self, classes=10):
        self.vocab_size = classes
        self.fingerprint = f"{self.kind}/{self.scale:g}-classes-{classes}"

    def encode(self, images, labels):
        return Examples((np.asarray(images, np.float64) / self.scale).astype(np.float32),
                        np.asarray(labels, np.int32))

    def describe(self):
        return {"type": self.kind, "features": self.features, "scale": f"pixel / {self.scale:g}",
                "classes": self.vocab_size, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint}

    def save(self, directory):
        with open(os.path.join(directory, SAVED_NAME), "w", encoding="utf-8") as f:
            json.dump({"type": self.kind, "classes": self.vocab_size}, f)


def load_encoding(directory):
    with open(os.path.join(directory, SAVED_NAME), encoding="utf-8") as f:
        return PixelEncoding(json.load(f)["classes"])


def fingerprint(encoding, train):
    digest = hashlib.sha256(train.pixels.tobytes() + train.labels.tobytes()).hexdigest()[:16]
    return f"{encoding.fingerprint}-{len(train)}-{digest}"


def batch_of(examples, index, rows):
    """The examples at `index` as a `Batch` of `rows` rows: inputs (rows, features), one label and weight per
    row; filler rows (past `index`) weigh nothing."""
    pixels = np.zeros((rows, examples.pixels.shape[1]), np.float32)
    labels = np.zeros((rows, 1), np.int32)
    weight = np.zeros((rows, 1), np.float32)
    rows_index = np.full((rows,), -1, np.int64)
    taken = len(index)
    pixels[:taken] = examples.pixels[index]
    labels[:taken, 0] = examples.labels[index]
    weight[:taken] = 1.0
    rows_index[:taken] = index
    return Batch(None, pixels, labels, weight, rows_index)


def batches_per_epoch(examples, rows):
    return len(examples) // rows


def training_batches(examples, rows, seed, skip=0):
    """Endless (epoch, batch): each epoch a permutation of the training split drawn from the seed, cut into full
    batches of `rows` (the remainder waits for a later epoch's order); the same on every backend. `skip` passes
    over the first batches (a resumed run)."""
    rng = np.random.default_rng(seed)
    per_epoch = batches_per_epoch(examples, rows)
    drawn, epoch = 0, 0
    while True:
        order = rng.permutation(len(examples))
        for first in range(0, per_epoch * rows, rows):
            if drawn >= skip:
                yield epoch, batch_of(examples, order[first:first + rows], rows)
            drawn += 1
        epoch += 1


def evaluation_batches(examples, rows, limit=None):
    """The first `limit` examples (all when None) in order, `rows` to a batch; the last is filled up."""
    count = len(examples) if limit is None else min(limit, len(examples))
    for first in range(0, count, rows):
        yield batch_of(examples, np.arange(first, min(first + rows, count)), rows)
