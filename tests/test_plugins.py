"""Plugins: built-ins and third-party ones (installed here as a real distribution with entry points)."""

import json
import os
import textwrap

import pytest

from conftest import TINY_TRAIN, run_cli

THIRD_PARTY = textwrap.dedent('''
    from mtbench import Backend, Extra, Reporter, hookimpl
    from mtbench.plugins.api import KerasTrainStep

    class CountingStep(KerasTrainStep):
        def __init__(self, model, state):
            super().__init__(model)
            self.state = state

        def __call__(self, x, y, sample_weight):
            self.state["steps_seen"] += 1
            return super().__call__(x, y, sample_weight)

    class CountSteps(Extra):
        name = "count-steps"
        description = "counts the train steps it wraps"
        backends = ("jax", "torch")

        def make_train_step(self, run, model):
            run.extras_state[self.name] = {"steps_seen": 0}
            return CountingStep(model, run.extras_state[self.name])

        def record(self, run):
            return run.extras_state[self.name]

    class NotInstalledBackend(Backend):
        name = "fakeflow"
        keras_backend = "jax"
        framework_modules = ("fakeflow_is_not_installed",)

    class OneLineReporter(Reporter):
        name = "oneline"
        description = "one line per run"

        def report(self, result, console):
            print(f"ONELINE backend={result['backend']} steps={result['timing']['steps']} "
                  f"bleu={result['metrics']['bleu']:.2f}")

    @hookimpl
    def mtbench_register_backends(register):
        register(NotInstalledBackend())

    @hookimpl
    def mtbench_register_reporters(register):
        register(OneLineReporter())

    @hookimpl
    def mtbench_register_extras(register):
        register(CountSteps())
''')


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """A directory holding two installed distributions: a working plugin and one that fails to import."""
    site = tmp_path_factory.mktemp("site")
    (site / "mtbench_thirdparty.py").write_text(THIRD_PARTY)
    (site / "mtbench_broken.py").write_text("raise ImportError('this plugin is broken on purpose')\n")
    for dist, module, version in (("mtbench_thirdparty", "mtbench_thirdparty", "0.3.0"),
                                  ("mtbench_broken", "mtbench_broken", "0.0.1")):
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[mtbench]\n{dist.split('_', 1)[1]} = {module}\n")
    return str(site)


def env_with(plugin_path):
    return {"PYTHONPATH": plugin_path + os.pathsep + os.environ.get("PYTHONPATH", "")}


def plugins_json(env):
    proc = run_cli("plugins", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_builtin_plugins_are_listed_with_their_hooks():
    listing = plugins_json({})
    by_name = {p["name"]: p for p in listing["plugins"]}
    assert by_name["jax_backend"]["provides"] == {"backends": ["jax"]}
    assert by_name["torch_backend"]["hooks"] == ["mtbench_register_backends"]
    assert by_name["bible_dataset"]["provides"]["datasets"] == ["bible-en-de", "bible-en-es", "bible-en-fr"]
    assert by_name["table_reporter"]["provides"] == {"reporters": ["table"]}
    assert all(p["builtin"] for p in listing["plugins"])


def test_third_party_plugin_loads_from_entry_points(plugin_path):
    listing = plugins_json({**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "thirdparty,broken"})
    by_name = {p["name"]: p for p in listing["plugins"]}
    assert by_name["thirdparty"]["version"] == "0.3.0"
    assert not by_name["thirdparty"]["builtin"]
    assert by_name["thirdparty"]["provides"] == {"backends": ["fakeflow"], "extras": ["count-steps"],
                                                 "reporters": ["oneline"]}
    assert sorted(by_name["thirdparty"]["hooks"]) == ["mtbench_register_backends", "mtbench_register_extras",
                                                      "mtbench_register_reporters"]
    extras = {(row["extra"], row["backend"]): row["available"] for row in listing["extras"]}
    assert extras[("count-steps", "jax")] and extras[("count-steps", "torch")]
    assert "broken" not in by_name
    assert any("plugin 'broken' failed to load" in w and "broken on purpose" in w for w in listing["warnings"])


def test_environment_variable_limits_third_party_plugins(plugin_path):
    unset = plugins_json({**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": None})
    assert "thirdparty" in {p["name"] for p in unset["plugins"]}
    assert any("plugin 'broken'" in w for w in unset["warnings"])
    names = {p["name"] for p in plugins_json({**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": ""})["plugins"]}
    assert "thirdparty" not in names and "jax_backend" in names
    names = {p["name"] for p in plugins_json({**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "thirdparty"})["plugins"]}
    assert "thirdparty" in names and "broken" not in names


def test_backend_whose_framework_is_missing_fails_clearly(plugin_path, cache_dir):
    proc = run_cli("train", "--backend", "fakeflow", "--cache-dir", cache_dir,
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "thirdparty"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("Error: backend 'fakeflow' needs fakeflow_is_not_installed, which is not "
                                   "installed (pip install 'mtbench[fakeflow]')")


def test_third_party_extra_and_reporter_run_and_broken_plugin_only_warns(plugin_path, cache_dir, tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, "--steps", "3", "--cache-dir", cache_dir,
                   "--out", str(out), "--report", "oneline", "--report", "table", "--extra", "count-steps",
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "thirdparty,broken"})
    assert proc.returncode == 0, proc.stderr
    assert "ONELINE backend=jax steps=3 bleu=" in proc.stdout
    assert "Warning: plugin 'broken' failed to load" in proc.stderr
    result = json.loads(out.read_text())
    assert result["extras"] == ["count-steps"]
    assert result["extras_record"] == {"count-steps": {"steps_seen": 3}}
