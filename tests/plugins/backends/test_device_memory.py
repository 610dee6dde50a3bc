"""Device memory read alike on both backends: the largest device's peak, as torch reads its one device (a JAX run
over several local devices summed them, growing with the devices a run spans)."""

from types import SimpleNamespace

import jax

from mtbench.plugins.backends.jax_backend import JaxBackend


def device(peak):
    return SimpleNamespace(memory_stats=lambda: {"peak_bytes_in_use": peak, "bytes_in_use": peak // 2})


def test_jax_reports_the_largest_local_devices_peak(monkeypatch):
    monkeypatch.setattr(jax, "local_devices", lambda: [device(100 * 2 ** 20), device(300 * 2 ** 20)])
    assert JaxBackend().peak_device_bytes() == 300 * 2 ** 20
    monkeypatch.setattr(jax, "local_devices", lambda: [SimpleNamespace(memory_stats=lambda: None)])
    assert JaxBackend().peak_device_bytes() is None  # a CPU reports none
