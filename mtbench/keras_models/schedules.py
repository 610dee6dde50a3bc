"""The learning-rate schedule mtbench trains with, written with keras.ops so that every backend computes it alike."""

import math

import keras
import numpy as np
from keras import ops


class WarmupCosineDecay(keras.optimizers.schedules.CosineDecay):
    """Keras's `CosineDecay` with linear warm-up, the same numbers, its two pieces chosen by `ops.where` where
    Keras branches with `ops.cond`. Under JAX a `cond` becomes an XLA conditional, whose predicate a GPU copies to
    the host, waiting for the device, before it runs a branch; Keras's AdamW reads its schedule once for every
    variable it decays, so a GPT-2-small step held about 150 of them (on an H100 they cost no more than the
    noise of one run: 60.1 ms a step with them, 62.0 without). Both pieces are a few scalar operations, and the
    warm-up piece is finite whenever it is chosen."""

    def __call__(self, step):
        if self.warmup_target is None:
            return super().__call__(step)
        initial = ops.convert_to_tensor(self.initial_learning_rate)
        dtype = initial.dtype
        decay_steps = ops.cast(self.decay_steps, dtype)
        warmup_target = ops.cast(self.warmup_target, dtype)
        warmup_steps = ops.cast(self.warmup_steps, dtype)
        step = ops.minimum(ops.cast(step, dtype), decay_steps + warmup_steps)
        # max(.., 1): the warm-up piece is computed even when it is not chosen (no warm-up at all).
        warming = self._warmup_function(step, ops.maximum(warmup_steps, 1.0), warmup_target, initial)
        decaying = self._decay_function(step - warmup_steps, decay_steps, warmup_target, dtype)
        return ops.where(step < warmup_steps, warming, decaying)


def schedule_of_recipe(recipe):
    """The `WarmupCosineDecay` of an optimizer recipe (`mtbench.runner.loop.recipe.optimizer_recipe`): from 0 up to
    its learning rate over its warm-up steps, then down to `alpha` of it over its decay steps."""
    return WarmupCosineDecay(initial_learning_rate=0.0, warmup_target=recipe["learning_rate"],
                             warmup_steps=recipe["warmup_steps"], decay_steps=recipe["decay_steps"],
                             alpha=recipe["alpha"])


def cosine_decay(schedule, iteration):
    """`keras.optimizers.schedules.CosineDecay`'s `__call__` (and `WarmupCosineDecay`'s) at `iteration`, operation
    for operation in float32 (numpy scalars, no tensors): for the host, where Keras's backend operations would cost
    a dozen tensors and a read of the device (torch's fused AdamW step, the training log's learning rate)."""
    f32 = np.float32
    initial = f32(schedule.initial_learning_rate)
    decay_steps = f32(schedule.decay_steps)
    step = f32(iteration)

    def decayed(step, decay_from):
        completed = step / decay_steps
        cosine = f32(0.5) * (f32(1.0) + np.cos(f32(math.pi) * completed))
        return decay_from * (f32(1 - schedule.alpha) * cosine + f32(schedule.alpha))

    if schedule.warmup_target is None:
        return decayed(min(step, decay_steps), initial)
    target, warmup_steps = f32(schedule.warmup_target), f32(schedule.warmup_steps)
    step = min(step, decay_steps + warmup_steps)
    if step < warmup_steps:
        return (target - initial) * (step / warmup_steps) + initial
    return decayed(step - warmup_steps, target)
