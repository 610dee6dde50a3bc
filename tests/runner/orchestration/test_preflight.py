"""The check a comparison asks of a child before anything trains: each run's device refusal, as the run's own
process would give it at its start, and none where that process could see other devices."""

import re

import pytest

from mtbench import MtbenchError
from mtbench.plugins.manager import registry
from mtbench.runner.config import TrainConfig
from mtbench.runner.orchestration.environments import probe_devices
from mtbench.runner.orchestration.preflight import device_refusals

FLASH_IN_FLOAT32 = "extra 'flash-attention' cannot run here: needs a GPU (or TPU) and float16/bfloat16; " \
                   "this run has"


def devices_of(plugins):
    return {name: plugins.backends[name].device_info() for name in ("jax", "torch")}


def run(label, backend, *extras, **options):
    return {"label": label, "config": TrainConfig(backend=backend, extras=extras, preset="tiny",
                                                  **options).to_dict()}


def test_each_refused_run_is_named_with_the_reason_its_own_process_gives():
    plugins = registry()
    refusals = device_refusals([run("jax", "jax", dtype="float32"),
                                run("jax+fa", "jax", "flash-attention", dtype="float32"),
                                run("torch+fa", "torch", "flash-attention", dtype="float32")], plugins,
                               devices_of(plugins))
    assert sorted(refusals) == ["jax+fa", "torch+fa"]
    assert all(reason.startswith(FLASH_IN_FLOAT32) for reason in refusals.values())
    # A backend that does not start here: its runs' own processes say why.
    assert device_refusals([run("jax+fa", "jax", "flash-attention", dtype="float32")], plugins, {"jax": None}) == {}


def test_a_run_whose_extras_set_the_frameworks_environment_is_left_to_its_own_process(monkeypatch):
    plugins = registry()
    flash = plugins.extras["flash-attention"]
    monkeypatch.setattr(type(flash), "environment", lambda self, config: {"XLA_FLAGS": "--a-flag"})
    assert device_refusals([run("jax+fa", "jax", "flash-attention", dtype="float32")], plugins,
                           devices_of(plugins)) == {}


def test_a_plugins_failing_check_is_left_to_the_runs_process(monkeypatch):
    plugins = registry()

    def broken(self, run):
        raise RuntimeError("the plugin's own bug")
    monkeypatch.setattr(type(plugins.extras["flash-attention"]), "unavailable_reason", broken)
    assert device_refusals([run("jax+fa", "jax", "flash-attention", dtype="float32")], plugins,
                           devices_of(plugins)) == {}


def test_the_probe_child_raises_the_first_refusal_before_anything_trains():
    with pytest.raises(MtbenchError, match="^" + re.escape(f"run 'jax+fa': {FLASH_IN_FLOAT32}")):
        probe_devices([run("jax", "jax", dtype="float32"), run("jax+fa", "jax", "flash-attention", dtype="float32")])
