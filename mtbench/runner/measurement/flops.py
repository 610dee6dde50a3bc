"""The arithmetic MFU is counted in, and the FLOPs of a step: the model family counts them
(`ModelFamily.training_flops`; the built-in families with `mtbench.keras_models.flops`) over the padded batch, the
work the device does, and over the real tokens alone, the useful work that tokens/s counts and that published MFU
figures divide."""

import numpy as np


def compute_dtype(dtype_policy):
    """The dtype the matmuls run in under a Keras dtype policy name."""
    return dtype_policy.replace("mixed_", "")


class StepFlops:
    """FLOPs of a training step, from `count(rows, source_length, target_length)`: the family's count over `rows`
    sequences of those lengths (None where it counts none). Each count is asked once. `pad`: the source's padding
    id, which tells a source's real tokens (its targets' are weighted)."""

    def __init__(self, count, pad=None):
        self._count, self._counted, self.pad = count, {}, pad

    def _flops(self, rows, source_length, target_length):
        key = (int(rows), int(source_length), int(target_length))
        if key not in self._counted:
            self._counted[key] = self._count(*key)
        return self._counted[key]

    def padded(self, shape):
        """FLOPs over the padded batch of `shape` (rows, length): both sides one length bucket."""
        rows, length = shape
        return self._flops(rows, length, length)

    def real_tokens(self, batch):
        """FLOPs over the real tokens of `batch` (a `Batch`): each row counted as its real source tokens (those
        that are no padding) and its real target tokens (weighted 1) alone, the padding and filler rows left
        out. A model without a source (a language model) counts the target's length for both."""
        targets = np.count_nonzero(batch.weight, axis=1)
        sources = targets if batch.source is None or self.pad is None else \
            np.count_nonzero(batch.source != self.pad, axis=1)
        pairs, rows = np.unique(np.stack([sources, targets], axis=1), axis=0, return_counts=True)
        counts = [self._flops(count, source, target) for (source, target), count in zip(pairs, rows) if target]
        return None if any(flops is None for flops in counts) else float(sum(counts))
