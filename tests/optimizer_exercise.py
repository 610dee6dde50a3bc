"""An exercise for optimizers that claim to update as mtbench's Keras AdamW does: a few steps of gradients chosen
so that clipping and epsilon's placement both decide the outcome. Shared by the baseline tests (in-process) and
tests/fast_step_probe.py (one process per backend)."""

import numpy as np

from mtbench.runner.config import TrainConfig

TOTAL_STEPS = 4  # the schedule's length: one warm-up step, then cosine decay


def optimizer_exercise():
    """Initial values and three steps of gradients: one tensor's gradient norm far above the clipping norm (clipped
    alone), one with gradients of epsilon's order (where epsilon's placement decides the update), one ordinary."""
    rng = np.random.default_rng(7)
    shapes = {"clipped": (4, 3), "tiny": (5,), "ordinary": (2, 2)}
    scales = {"clipped": 5.0, "tiny": 3e-9, "ordinary": 0.1}
    initial = {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    grads = [{name: (scales[name] * rng.normal(size=shape)).astype(np.float32) for name, shape in shapes.items()}
             for _ in range(3)]
    return initial, grads


def mtbench_optimizer():
    """A fresh optimizer exactly as mtbench's `compile_model` builds it (keras must be imported)."""
    import keras

    from mtbench.runner.setup import compile_model
    probe = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    compile_model(keras, probe, TrainConfig(warmup_steps=1, learning_rate=1e-2), TOTAL_STEPS, {})
    return probe.optimizer


def keras_variables(initial):
    import keras
    return {name: keras.Variable(value, name=name) for name, value in initial.items()}


def keras_optimizer_result(initial, grads):
    """What Keras's own `apply` makes of the exercise, and the optimizer (for its settings)."""
    from keras import ops
    optimizer = mtbench_optimizer()
    variables = keras_variables(initial)
    for step_grads in grads:
        optimizer.apply([ops.convert_to_tensor(step_grads[name]) for name in variables], list(variables.values()))
    return {name: ops.convert_to_numpy(v.value) for name, v in variables.items()}, optimizer


def assert_updates_like_keras(initial, got, expected):
    for name in initial:
        moved = expected[name] - initial[name]
        assert np.abs(moved).max() > 1e-3, "the exercise must move every tensor"
        np.testing.assert_allclose(got[name] - initial[name], moved, rtol=1e-4, atol=1e-7, err_msg=name)
