"""The arithmetic MFU is counted in, and the FLOPs of a step: the model family counts them
(`ModelFamily.training_flops`; the built-in families with `mtbench.keras_models.flops`) over the padded batch, the
work the device does, and over the real tokens alone, the useful work that tokens/s counts and that published MFU
figures divide."""

import numpy as np


def compute_dtype(dtype_policy):
    """The dtype the matmuls run in under a Keras dtype policy name."""
    return dtype_policy.replace("mixed_", "")


class StepFlops:
    """FLOPs of a training step, from `count(rows, length)`: the family's count over `rows` sequences of `length`
    tokens (None where it counts none). Each count is asked once."""

    def __init__(self, count):
        self._count, self._counted = count, {}

    def _flops(self, rows, length):
        key = (int(rows), int(length))
        if key not in self._counted:
            self._counted[key] = self._count(*key)
        return self._counted[key]

    def padded(self, shape):
        """FLOPs over the padded batch of `shape` (rows, length)."""
        return self._flops(*shape)

    def real_tokens(self, weight):
        """FLOPs over the real tokens of a batch of token weights `weight` (rows, length; 1 on real tokens): each
        row counted as a sequence of its real tokens alone, the padding and filler rows left out."""
        lengths, rows = np.unique(np.count_nonzero(weight, axis=1), return_counts=True)
        counts = [self._flops(count, length) for length, count in zip(lengths, rows) if length]
        return None if any(flops is None for flops in counts) else float(sum(counts))
