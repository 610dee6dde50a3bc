"""Train steps and the batches they take.

mtbench calls a train step once per batch as `step(batch.inputs, batch.target_output, batch.weight)`: numpy arrays
(int32 token ids, rows x bucket length; float32 weights, 1 on the tokens the loss counts and 0 on padding).
`batch.inputs` is `(source, target_input)` for an encoder-decoder (translation) and `(input_ids,)` for a
decoder-only model (language modelling), whose batches have no source. The step returns the batch's loss and token accuracy computed before its update; the loss is the
mean cross-entropy over real target tokens (padding weighs nothing). A step need not wait for its work: the
loop times steps in windows (`--timing-window`) and reads the losses only at a window's edges, after calling
`block()` on the step and synchronising the device, so a step that returns the framework's scalars lets the host
queue the next steps while the device works. `finalize` is called before evaluation, checkpoints and the end of
training.
"""

from dataclasses import dataclass

import numpy as np


@dataclass
class Batch:
    """One batch of the run: every array has `rows` rows (the batch size; filler rows are all padding) and one
    length, the batch's length bucket (a language model's block)."""
    source: np.ndarray        # (rows, length) int32; None for a decoder-only model's batch
    target_input: np.ndarray  # BOS + target, padded
    target_output: np.ndarray # target + EOS, padded
    weight: np.ndarray        # 1.0 on real target tokens, 0.0 on padding (float32)
    index: np.ndarray         # example index of each row, -1 for filler rows

    @property
    def inputs(self):
        """What the model is called on: (source, target_input), or (target_input,) without a source."""
        return (self.target_input,) if self.source is None else (self.source, self.target_input)

    @property
    def target_tokens(self):
        """The tokens the loss counts (and tokens/s)."""
        return int(self.weight.sum())

    @property
    def shape(self):
        return tuple(self.target_input.shape)

    def shard(self, index, count):
        """The rows process `index` of `count` trains on: the index-th of `count` equal slices (mtbench makes
        the batch size a multiple of the process count). The global batch is the batch one process would take."""
        if count == 1:
            return self
        rows = self.shape[0] // count
        part = slice(index * rows, (index + 1) * rows)
        source = None if self.source is None else self.source[part]
        return Batch(source, self.target_input[part], self.target_output[part], self.weight[part],
                     self.index[part])


def uneven_split_reason(config, parts, kind):
    """Why the run's batches cannot be split into `parts` equal slices, one per device or process (`kind`:
    'devices', 'processes'), or None."""
    if config.max_tokens is not None:
        return (f"splits a fixed --batch-size over the {kind}; --max-tokens gives each length bucket its own "
                f"number of rows")
    if config.batch_size % parts:
        return f"the batch size {config.batch_size} does not split evenly over {parts} {kind}"
    return None


class TrainStep:
    """One optimisation step on a batch. `finalize` writes any state the step keeps outside the model (replicated
    parameters, optimizer slots) back into the Keras variables, so that evaluation sees the trained weights.
    `block` waits for the step's queued work where the backend's `synchronize` cannot see it (state the step
    keeps outside the Keras variables)."""
    name = ""  # recorded in the result as `train_step`
    # Whether the step trains through Keras's compiled train function, so that `model.compile`'s options
    # (`Extra.compile_options`) apply to training.
    uses_compile_options = False
    # How many calls of each batch shape warm the step up (compile, record a CUDA graph): timed alone and counted
    # in compile time, never in the steady figures.
    warmup_calls = 1

    def __call__(self, x, y, sample_weight):
        """`x` is the batch's `inputs` ((source, target_input), or (input_ids,)), `y` target_output, `sample_weight` the token weights of one `Batch`.
        Returns {'loss': ..., 'accuracy': ...} of the batch, computed before the update (numbers, or scalars
        of the framework that `float()` reads; reading them is left to the loop, which does it at a window's
        edge so the device is not stalled every step)."""
        raise NotImplementedError

    def block(self):
        """Returns once every step called so far has finished on the device (beyond the Keras variables, which
        the backend's `synchronize` waits for)."""

    def description(self):
        """How the step ran, in a few words shown beside its `name` in every table (a compiler's mode, whether
        CUDA graphs ran, shapes that fell back to eager); '' when the name says it all. Called after training."""
        return ""

    def numerics(self):
        """How the step computes what the two backends' steps may compute differently, each in a few words and shown
        beside the figures of every table: {'layer_norm': each layer norm's statistics, 'optimizer_update': what
        carries out the update, 'rounding_16_bit': where its 16-bit intermediates are rounded}. A key left out is
        shown 'not recorded'. Called after training."""
        return {}

    def finalize(self):
        pass


class KerasTrainStep(TrainStep):
    """Keras's own compiled train step (`model.train_on_batch`). Subclass it, or hold a step and call it, to
    wrap a step."""
    name = "keras-train-on-batch"
    uses_compile_options = True

    def __init__(self, model):
        self.model = model

    def __call__(self, x, y, sample_weight):
        return self.model.train_on_batch(x, y, sample_weight=sample_weight, return_dict=True)


class WrappingStep(TrainStep):
    """A step that wraps another (the one `Extra.make_train_step` receives): it calls it, passes `finalize` on,
    and trains through Keras's compiled function exactly when the wrapped step does. Override `__call__`, call
    `self.inner(x, y, sample_weight)` inside, and set `name` (by default the inner step's name)."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name

    @property
    def uses_compile_options(self):
        return self.inner.uses_compile_options

    @property
    def warmup_calls(self):
        return self.inner.warmup_calls

    def __call__(self, x, y, sample_weight):
        return self.inner(x, y, sample_weight)

    def block(self):
        self.inner.block()

    def description(self):
        return self.inner.description()

    def numerics(self):
        return self.inner.numerics()

    def finalize(self):
        self.inner.finalize()
