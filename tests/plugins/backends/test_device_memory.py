"""Device memory read alike on both backends: the largest device's peak, as torch reads its one device (a JAX run
over several local devices summed them, growing with the devices a run spans)."""

from types import SimpleNamespace

import jax
import keras

from mtbench.plugins.backends.jax_backend import JaxBackend


def device(peak, index=0):
    return SimpleNamespace(memory_stats=lambda: {"peak_bytes_in_use": peak, "bytes_in_use": peak // 2},
                           device_kind="NVIDIA H100 80GB HBM3", id=index)


def test_jax_reports_the_largest_local_devices_peak(monkeypatch):
    monkeypatch.setattr(jax, "local_devices", lambda: [device(100 * 2 ** 20), device(300 * 2 ** 20)])
    assert JaxBackend().peak_device_bytes() == 300 * 2 ** 20
    monkeypatch.setattr(jax, "local_devices", lambda: [SimpleNamespace(memory_stats=lambda: None)])
    assert JaxBackend().peak_device_bytes() is None  # a CPU reports none


def test_a_run_without_a_distribution_lists_every_device_it_computed_on(monkeypatch):
    """pmap's step computes on every local device and sets no Keras distribution: each device that held bytes is
    listed (only the first was), while a machine's GPUs that a one-device run never used are left out."""
    monkeypatch.setattr(keras.distribution, "distribution", lambda: None)
    monkeypatch.setattr(jax, "local_devices", lambda: [device(300 * 2 ** 20, 0), device(200 * 2 ** 20, 1),
                                                       device(0, 2), device(0, 3)])
    assert [(d["index"], d["peak_bytes"], d["in_use_bytes"]) for d in JaxBackend().device_memory()] == \
        [(0, 300 * 2 ** 20, 150 * 2 ** 20), (1, 200 * 2 ** 20, 100 * 2 ** 20)]
    monkeypatch.setattr(jax, "local_devices", lambda: [device(0, 0), device(0, 1)])
    assert [d["index"] for d in JaxBackend().device_memory()] == [0]  # nothing allocated yet: the first still
