"""The language-model baselines of benchmarks/ (native_gpt_torch.py, native_gpt_flax.py) train the same model as
mtbench's `--model gpt`: from mtbench's initial weights, on the language-modelling task's byte-level batches, with
the same optimizer, their losses are mtbench's Keras step's losses for several steps, in float32.

In-process (keras on JAX), as tests/benchmarks/test_native_baselines.py: both baselines against one run of Keras's
own step, each held to the tolerance of the arithmetic its matmuls use."""

import numpy as np
import pytest

from conftest import keras_gpt_run, needs_flax
from optimizer_exercise import float32_matmul_arithmetic, matmul_tolerance

# Keras's step and both baselines built and trained on the tiny GPT (about 25 s in all on 2 cores).
pytestmark = pytest.mark.slow

STEPS = 4


@pytest.fixture(scope="module")
def keras_run(cache_dir):
    return keras_gpt_run(cache_dir, STEPS, initial_losses=True)


def test_the_workload_is_the_language_modelling_tasks_byte_batches(keras_run):
    workload = keras_run["workload"]
    assert workload.vocab_size == 256 and workload.model_shape.decoder_layers == 2
    assert len(workload.batches) == STEPS
    for batch in workload.batches:
        assert batch.source is None and batch.shape == (8, 32)
        np.testing.assert_array_equal(batch.target_input[:, 1:], batch.target_output[:, :-1])  # the next tokens
    # Every step moved the weights: the first step's loss is the initial weights', each later one parts from theirs.
    losses, initial = keras_run["losses"], keras_run["initial_losses"]
    assert losses[0] == pytest.approx(initial[0], rel=1e-5)
    assert all(abs(losses[1:] / initial[1:] - 1) > 1e-4), (losses, initial)


def native_losses(keras_run, native):
    """The native step's losses on the workload's batches, from Keras's initial weights; and the step."""
    workload = keras_run["workload"]
    step = native.train_step_from_keras_weights(workload.model_shape, keras_run["weights"], keras_run["settings"])
    convert = native.batch_arrays if hasattr(native, "batch_arrays") else native.batch_tensors
    losses = [float(step(*convert(b))["loss"]) for b in workload.batches]
    return np.array(losses), step


@needs_flax
def test_flax_gpt_step_losses_equal_the_keras_steps(keras_run):
    from benchmarks import native_gpt_flax
    losses, step = native_losses(keras_run, native_gpt_flax)
    np.testing.assert_allclose(losses, keras_run["losses"], rtol=matmul_tolerance(1e-4, float32_matmul_arithmetic("jax")))
    weights = step.weights_by_keras_path(list(keras_run["weights"]))
    assert {path: value.shape for path, value in weights.items()} == {
        path: value.shape for path, value in keras_run["weights"].items()}


def test_torch_gpt_step_losses_equal_the_keras_steps(keras_run):
    from benchmarks import native_gpt_torch
    losses, step = native_losses(keras_run, native_gpt_torch)
    rtol = matmul_tolerance(1e-4, float32_matmul_arithmetic("jax"), float32_matmul_arithmetic("torch"))
    np.testing.assert_allclose(losses, keras_run["losses"], rtol=rtol)
    assert set(step.model.state_dict()) == {native_gpt_torch.native_torch.torch_name(path)[0]
                                            for path in keras_run["weights"]}  # every parameter loaded by path
