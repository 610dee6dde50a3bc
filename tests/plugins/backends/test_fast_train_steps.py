"""The train step each backend plugin makes (mtbench's default) is Keras's `train_on_batch` without its
overhead: the same losses step for step, and after `finalize` the same weights and optimizer state, so
evaluation sees what Keras's step would have left (tests/fast_step_probe.py: torch's in a process of its own, JAX's
in this one, keras on JAX)."""

import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import TESTS_DIR, json_answer, keras_dtype_policy_restored, keras_on_jax
from optimizer_exercise import FLOAT32, TF32, float32_matmul_arithmetic, matmul_tolerance

PROBE = os.path.join(TESTS_DIR, "fast_step_probe.py")
DEFAULT_STEPS = {"jax": "jax-jit-stateless", "torch": "torch-eager"}
# How far the fast step's weights may end from Keras's, as a fraction of how far Keras's moved. Adam turns float
# noise in near-zero gradients (a key bias's, say) into steps of the learning rate, so the weights agree to a
# fraction of their movement, not to float precision. Float32 leaves about 0.1 % (1 % allowed). TF32 matmuls
# round 10^4 times coarser, so more gradients are noise-dominated: 1.5 % on an H100 (issue 13), 3 % allowed.
WEIGHTS_DISTANCE_FRACTION = {FLOAT32: 0.01, TF32: 0.03}


@contextlib.contextmanager
def environment_kept():
    """os.environ as it was before the block, whatever the block set (the probe's `import_keras` sets KERAS_HOME, as a
    run's process does)."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        os.environ.update(before)


# JAX's probe compiles Keras's train and test functions and mtbench's step: 35 s on one core of the 2-GHz Xeon, in
# this process (keras on JAX), where a process of its own would first import JAX, keras and mtbench.
@pytest.fixture(scope="module", params=[pytest.param("jax", marks=pytest.mark.slow), "torch"])
def probe(request, cache_dir):
    if request.param == "jax":
        from fast_step_probe import probe_report
        keras_on_jax()
        with keras_dtype_policy_restored(), environment_kept():
            return "jax", json.loads(json.dumps(probe_report("jax", cache_dir)))  # as the process would print it
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["MTBENCH_LOAD_PLUGINS"] = ""
    proc = subprocess.run([sys.executable, PROBE, request.param, cache_dir], capture_output=True, text=True,
                          env=env, timeout=600)
    return request.param, json_answer(proc)


def test_fast_step_losses_equal_keras_steps(probe):
    backend, report = probe
    assert report["names"] == ["keras-train-on-batch", DEFAULT_STEPS[backend]]
    assert len(report["fast_losses"]) == 5
    rtol = matmul_tolerance(1e-5, report["matmul_arithmetic"])
    np.testing.assert_allclose(report["fast_losses"], report["keras_losses"], rtol=rtol)


def test_after_finalize_evaluation_sees_the_trained_weights(probe):
    _, report = probe
    arithmetic = report["matmul_arithmetic"]
    keras_loss, fast_loss = report["held_out_losses"]
    assert fast_loss == pytest.approx(keras_loss, rel=matmul_tolerance(1e-5, arithmetic))
    assert report["iterations"] == [5, 5]
    assert report["weights_distance"] < WEIGHTS_DISTANCE_FRACTION[arithmetic] * report["weights_moved"]
    assert report["optimizer_distance"] < matmul_tolerance(1e-4, arithmetic)


@pytest.mark.parametrize("probe", ["torch"], indirect=True)
def test_torch_leaves_bfloat16_weights_to_keras_adamw_as_jax_does(probe):
    """torch's fused kernel would update bfloat16 weights in float32; JAX's step runs Keras's AdamW, in bfloat16:
    the fused kernel ran at every float32 step of the probe and at no bfloat16 one."""
    _, report = probe
    assert report["bfloat16_update"] == ("update by Keras's optimizer.apply (bfloat16 weights, which Keras's AdamW "
                                         "updates in bfloat16 as on JAX, in its torch form: m*beta_1 + g*(1-beta_1) "
                                         "where JAX's is m + (g-m)*(1-beta_1), rounded otherwise)")
    assert report["fused_adamw_calls"] == {"float32": 5, "bfloat16": 0}


@pytest.mark.parametrize("probe", ["torch"], indirect=True)
def test_torch_fused_adamw_updates_like_keras_adamw(probe):
    _, report = probe
    assert report["fused_adamw"]["iterations"] == 3
    assert max(report["fused_adamw"]["relative_difference"].values()) < 1e-4


@pytest.mark.parametrize("probe", ["torch"], indirect=True)
def test_torch_fused_adamw_scales_losses_like_keras(probe):
    """float16's loss scaling: the scale doubles after two finite steps and halves at the overflow, which leaves
    every weight as Keras leaves it and does not count; the step after it reads the schedule at Keras's count."""
    _, report = probe
    scaled = report["loss_scaled_fused_adamw"]
    assert scaled["scales_given"] == [32768.0, 32768.0, 65536.0, 65536.0, 32768.0]
    after_overflow = scaled["after_overflow"]
    assert after_overflow["fused"] == after_overflow["keras"] == {"scale": 32768.0, "growth_count": 0,
                                                                  "iterations": 3}
    assert max(after_overflow["relative_difference"].values()) < 1e-4
    after = scaled["after_overflow_and_a_step"]
    assert after["fused"] == after["keras"] == {"scale": 32768.0, "growth_count": 1, "iterations": 4}
    # Epsilon's bias correction counts the steps attempted (the host cannot know of the skip without waiting): the
    # tensor whose gradients are of epsilon's order is left out, the others (the schedule's rate) must agree.
    assert after["relative_difference"]["clipped"] < 1e-4 and after["relative_difference"]["ordinary"] < 1e-4


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_runs_record_the_step_they_trained_with(tiny_runs, backend):
    assert tiny_runs[backend]["result"]["train_step"] == DEFAULT_STEPS[backend]
    assert f"  ran       {DEFAULT_STEPS[backend]}" in tiny_runs[backend]["stdout"]  # the summary's first figure


def test_only_the_loss_compile_model_sets_is_computed_natively():
    import keras

    from mtbench.plugins.backends.compiled_loss import is_token_mean_cross_entropy
    loss = keras.losses.SparseCategoricalCrossentropy
    assert is_token_mean_cross_entropy(loss(from_logits=True, reduction="mean_with_sample_weight"))
    assert not is_token_mean_cross_entropy(loss(from_logits=False, reduction="mean_with_sample_weight"))
    assert not is_token_mean_cross_entropy(loss(from_logits=True))  # a mean over rows, not over weighted tokens
    assert not is_token_mean_cross_entropy(loss(from_logits=True, reduction="mean_with_sample_weight",
                                                ignore_class=0))
    assert not is_token_mean_cross_entropy(keras.losses.MeanSquaredError())


@pytest.mark.slow  # 26 s on one core of the 2-GHz Xeon
def test_jax_step_computes_any_other_compiled_loss_through_keras():
    """In-process (keras on JAX): with a loss the step does not recognise, it still matches train_on_batch."""
    import keras

    from mtbench.keras_models.initialization import assign_weights, initial_weights
    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench import KerasTrainStep
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    rng = np.random.default_rng(0)
    source, target = (rng.integers(4, 1000, size=(4, 16)).astype(np.int32) for _ in range(2))
    weight = np.ones((4, 16), np.float32)

    def losses(make_step):
        model = build_transformer(PRESETS["tiny"])
        assign_weights(model, initial_weights(model, 0))
        model.compile(optimizer=keras.optimizers.AdamW(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        step = make_step(model)
        return [float(step((source, target), target, weight)["loss"]) for _ in range(3)]

    rtol = matmul_tolerance(1e-5, float32_matmul_arithmetic("jax"))
    np.testing.assert_allclose(losses(JitTrainStep), losses(KerasTrainStep), rtol=rtol)
