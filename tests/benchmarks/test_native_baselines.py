"""The native baselines of benchmarks/ train the same model as mtbench: from mtbench's initial weights, on a real
batch sequence from mtbench's pipeline, with the same optimizer, their losses are mtbench's Keras step's losses.
A few losses hardly show the optimizer's details (clipping rarely triggers in three steps, epsilon only matters
where gradients are tiny), so each baseline's optimizer is also checked against Keras's on gradients made to
exercise them.

In-process (keras on JAX): the torch baseline needs no Keras, so both baselines are checked against one run of
Keras's own step. Each baseline trains where mtbench would, on the GPU where there is one; the losses are held to
the tolerance of the arithmetic their matmuls use there."""

import os

import numpy as np
import pytest

from benchmarks.workload import OptimizerSettings, build_keras_model, drawn_weights, prepare_workload
from conftest import needs_flax
from mtbench import KerasTrainStep
from mtbench.runner.config import TrainConfig
from optimizer_exercise import (assert_updates_like_keras, float32_matmul_arithmetic, keras_optimizer_result,
                                matmul_tolerance, optimizer_exercise)

# The benchmarks' hand-written baselines, built and trained beside Keras's (30 s in all): the full suite's.
pytestmark = pytest.mark.slow

STEPS = 3


@pytest.fixture(scope="module")
def keras_run(cache_dir):
    """mtbench's Keras step on the tiny preset for a few real batches, without warm-up so that every step moves
    the weights."""
    import keras

    config = TrainConfig(preset="tiny", max_pairs=4000, valid_size=100, test_size=100, max_len=48, batch_size=32,
                         warmup_steps=0, cache_dir=cache_dir)
    workload = prepare_workload(config, STEPS)
    model = build_keras_model(keras, workload, total_steps=STEPS)
    weights = drawn_weights(model, config)  # what build_keras_model started the model from
    settings = OptimizerSettings.of_keras_optimizer(model.optimizer)
    step = KerasTrainStep(model)
    losses = [float(step((b.source, b.target_input), b.target_output, b.weight)["loss"]) for b in workload.batches]
    return {"workload": workload, "weights": weights, "settings": settings, "losses": np.array(losses)}


def test_optimizer_settings_are_read_from_the_compiled_keras_optimizer(keras_run):
    settings = keras_run["settings"]
    assert (settings.warmup_steps, settings.decay_steps) == (0, STEPS)
    assert (settings.beta_2, settings.epsilon, settings.clipnorm, settings.weight_decay) == (0.98, 1e-9, 1.0, 0.01)


@needs_flax
def test_flax_step_losses_equal_the_keras_steps(keras_run):
    from benchmarks import native_flax
    workload = keras_run["workload"]
    step = native_flax.train_step_from_keras_weights(workload.model_shape, keras_run["weights"], keras_run["settings"])
    losses = [float(step(*native_flax.batch_arrays(b))["loss"]) for b in workload.batches]
    rtol = matmul_tolerance(1e-4, float32_matmul_arithmetic("jax"))  # Keras and Flax: both JAX
    np.testing.assert_allclose(losses, keras_run["losses"], rtol=rtol)


def test_torch_step_losses_equal_the_keras_steps(keras_run):
    from benchmarks import native_torch
    workload = keras_run["workload"]
    step = native_torch.train_step_from_keras_weights(workload.model_shape, keras_run["weights"], keras_run["settings"])
    losses = [float(step(*native_torch.batch_tensors(b, step.device))["loss"]) for b in workload.batches]
    rtol = matmul_tolerance(1e-4, float32_matmul_arithmetic("jax"), float32_matmul_arithmetic("torch"))
    np.testing.assert_allclose(losses, keras_run["losses"], rtol=rtol)


def test_torch_step_keeps_model_optimizer_and_batches_where_keras_torch_would(keras_run):
    """Keras-torch puts its variables on CUDA when there is one: a baseline left on the CPU would make the
    overhead ratio compare a GPU with a CPU. Mixed bfloat16, so the device's autocast runs too."""
    import torch

    from benchmarks import native_torch
    device = native_torch.default_device()
    if torch.cuda.is_available() and "KERAS_TORCH_DEVICE" not in os.environ:
        assert device.type == "cuda"
    workload = keras_run["workload"]
    step = native_torch.train_step_from_keras_weights(workload.model_shape, keras_run["weights"],
                                                      keras_run["settings"], mixed_bfloat16=True)
    batch = native_torch.batch_tensors(workload.batches[0], step.device)
    assert np.isfinite(float(step(*batch)["loss"]))
    step.block()
    moments = [state[key] for state in step.optimizer.optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    assert {t.device.type for t in [*step.model.parameters(), *moments, *batch]} == {device.type}
    weights = step.weights_by_keras_path(list(keras_run["weights"]))
    assert all(isinstance(value, np.ndarray) for value in weights.values())


@needs_flax
def test_flax_step_trains_on_jaxs_default_device(keras_run):
    import jax

    from benchmarks import native_flax
    workload = keras_run["workload"]
    step = native_flax.train_step_from_keras_weights(workload.model_shape, keras_run["weights"],
                                                     keras_run["settings"])
    step(*native_flax.batch_arrays(workload.batches[0]))
    step.block()
    assert step.devices == {jax.devices()[0]}


def torch_optimizer_result(initial, grads, settings):
    import torch

    from benchmarks.native_torch import AdamWLikeKeras, default_device
    device = default_device()  # where the baseline trains, and so whose AdamW kernel it uses
    parameters = {name: torch.nn.Parameter(torch.from_numpy(value.copy()).to(device))
                  for name, value in initial.items()}
    optimizer = AdamWLikeKeras(parameters.values(), settings)
    for step_grads in grads:
        for name, parameter in parameters.items():
            parameter.grad = torch.from_numpy(step_grads[name].copy()).to(device)
        optimizer.step()
    return {name: p.detach().cpu().numpy() for name, p in parameters.items()}


def flax_optimizer_result(initial, grads, settings):
    import optax

    from benchmarks.native_flax import make_optimizer
    optimizer = make_optimizer(settings)
    params = dict(initial)
    state = optimizer.init(params)
    for step_grads in grads:
        updates, state = optimizer.update(step_grads, state, params)
        params = optax.apply_updates(params, updates)
    return {name: np.asarray(value) for name, value in params.items()}


@pytest.mark.parametrize("native", [torch_optimizer_result, pytest.param(flax_optimizer_result, marks=needs_flax)],
                         ids=["torch", "flax"])
def test_native_optimizer_updates_like_keras(native):
    initial, grads = optimizer_exercise()
    expected, optimizer = keras_optimizer_result(initial, grads)
    assert_updates_like_keras(initial, native(initial, grads, OptimizerSettings.of_keras_optimizer(optimizer)), expected)


def test_the_schedule_starts_at_zero_and_ends_at_alpha():
    """Keras's warm-up starts from 0 at the first update and its cosine ends at alpha times the peak."""
    from benchmarks.native_torch import learning_rate_factor
    settings = OptimizerSettings(learning_rate=1e-3, warmup_steps=4, decay_steps=10, alpha=0.1, weight_decay=0.01,
                                 beta_1=0.9, beta_2=0.98, epsilon=1e-9, clipnorm=1.0)
    factor = learning_rate_factor(settings)
    assert [factor(s) for s in (0, 2, 4)] == [0.0, 0.5, 1.0]
    assert factor(9) == pytest.approx(0.55)
    assert factor(14) == factor(100) == pytest.approx(0.1)
