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


def test_a_plugins_failing_check_is_named_before_anything_trains(monkeypatch):
    """The run's own process would fail in the same check, after the weights were drawn and the runs before it
    trained."""
    plugins = registry()

    def broken(self, run):
        raise RuntimeError("the plugin's own bug")
    monkeypatch.setattr(type(plugins.extras["flash-attention"]), "unavailable_reason", broken)
    refusals = device_refusals([run("jax", "jax", dtype="float32"),
                                run("jax+fa", "jax", "flash-attention", dtype="float32")], plugins, devices_of(plugins))
    assert list(refusals) == ["jax+fa"]
    assert refusals["jax+fa"].startswith("extra 'flash-attention' of plugin ")
    assert refusals["jax+fa"].endswith("failed: RuntimeError: the plugin's own bug")


def several(label, backend, processes, *extras, **options):
    return {**run(label, backend, *extras, **options), "processes": processes}


def test_a_run_of_several_processes_is_refused_where_its_extras_refuse_it_whatever_devices_they_see():
    plugins = registry()
    devices = {"jax": {"kind": "cpu", "name": "cpu", "count": 1}, "torch": {"kind": "cpu", "name": "cpu", "count": 1}}
    refusals = device_refusals([
        several("tp-one-head", "torch", 2, "tensor-parallel", model_name="gpt", heads=1),
        several("pp-translation", "torch", 2, "pipeline-parallel"),
        several("pp-gpt", "torch", 2, "pipeline-parallel", model_name="gpt"),
        several("tp", "torch", 2, "tensor-parallel", model_name="gpt"),
        several("ddp", "torch", 2, "ddp"),
        # Each process sees one device here; together they have the two JAX's data-parallel needs.
        several("jax-dp", "jax", 2, "data-parallel"),
    ], plugins, devices)
    assert sorted(refusals) == ["pp-translation", "tp-one-head"]
    assert "the model's 1 attention heads" in refusals["tp-one-head"]
    assert "not 'transformer'" in refusals["pp-translation"]


def test_the_probe_child_raises_the_first_refusal_before_anything_trains():
    with pytest.raises(MtbenchError, match="^" + re.escape(f"run 'jax+fa': {FLASH_IN_FLOAT32}")):
        probe_devices([run("jax", "jax", dtype="float32"), run("jax+fa", "jax", "flash-attention", dtype="float32")])
