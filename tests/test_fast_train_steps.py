"""The train step each backend plugin makes (mtbench's default) is Keras's `train_on_batch` without its
overhead: the same losses step for step, and after `finalize` the same weights and optimizer state, so
evaluation sees what Keras's step would have left. One process per backend (tests/fast_step_probe.py)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fast_step_probe.py")
DEFAULT_STEPS = {"jax": "jax-jit-stateless", "torch": "torch-eager"}


@pytest.fixture(scope="module", params=["jax", "torch"])
def probe(request, cache_dir):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["MTBENCH_LOAD_PLUGINS"] = ""
    proc = subprocess.run([sys.executable, PROBE, request.param, cache_dir], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return request.param, json.loads(proc.stdout.strip().splitlines()[-1])


def test_fast_step_losses_equal_keras_steps(probe):
    backend, report = probe
    assert report["names"] == ["keras-train-on-batch", DEFAULT_STEPS[backend]]
    assert len(report["fast_losses"]) == 5
    np.testing.assert_allclose(report["fast_losses"], report["keras_losses"], rtol=1e-5)


def test_after_finalize_evaluation_sees_the_trained_weights(probe):
    _, report = probe
    keras_loss, fast_loss = report["held_out_losses"]
    assert fast_loss == pytest.approx(keras_loss, rel=1e-5)
    assert report["iterations"] == [5, 5]
    # Adam turns float noise in near-zero gradients (a key bias's, say) into steps of the learning rate, so the
    # weights agree to a fraction of how far they moved, not to float precision.
    assert report["weights_distance"] < 0.01 * report["weights_moved"]
    assert report["optimizer_distance"] < 1e-4


@pytest.mark.parametrize("probe", ["torch"], indirect=True)
def test_torch_fused_adamw_updates_like_keras_adamw(probe):
    _, report = probe
    assert report["fused_adamw"]["iterations"] == 3
    assert max(report["fused_adamw"]["relative_difference"].values()) < 1e-4


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_runs_record_the_step_they_trained_with(tiny_runs, backend):
    assert tiny_runs[backend]["result"]["train_step"] == DEFAULT_STEPS[backend]
    assert "train step" in tiny_runs[backend]["stdout"]
