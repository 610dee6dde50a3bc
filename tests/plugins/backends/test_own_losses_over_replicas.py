"""A model's own losses (`add_loss`, weight penalties: `model.losses`) count once in a step split over replicas, as
in one device's step of the whole batch: torch's step under DistributedDataParallel over two gloo processes (whole
batches and two micro-batches, which once counted them once per replica), JAX's pmap over two simulated devices
(which once left them out). One process per backend (tests/own_losses_probe.py), on the CPU."""

import os
import subprocess
import sys

import pytest

from conftest import TESTS_DIR, json_answer

PROBE = os.path.join(TESTS_DIR, "own_losses_probe.py")


def probe(backend, scratch):
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")}
    env["MTBENCH_LOAD_PLUGINS"] = ""
    proc = subprocess.run([sys.executable, PROBE, backend, str(scratch)], capture_output=True, text=True, env=env,
                          timeout=600)
    return json_answer(proc)


@pytest.mark.slow  # two spawned torch processes: 21 s on the 2-GHz Xeon
def test_torch_replicas_count_the_models_own_losses_once(tmp_path):
    figures = probe("torch", tmp_path)
    for way in ("ddp micro-batches 1", "ddp micro-batches 2"):
        got = figures[way]
        assert got["penalty"] > 1.0  # large beside the cross-entropy's gradient: counting it twice is visible
        assert got["loss"] == pytest.approx(got["one device loss"], rel=1e-5), way
        assert got["largest gradient difference"] < 1e-4 * got["largest gradient"], way


def test_pmap_adds_the_models_own_losses_once(tmp_path):
    got = probe("jax", tmp_path)["pmap"]
    assert got["devices"] == 2
    assert got["penalty"] > 1.0
    assert got["loss"] == pytest.approx(got["one device loss"], rel=1e-5)
    assert got["largest weight difference"] < 1e-3 * got["largest update"]
