"""Plugins: built-ins and third-party ones (installed here as a real distribution with entry points)."""

import json

import pytest

from conftest import TINY_TRAIN, env_with, run_cli

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


def test_third_party_extra_and_reporter_run_and_broken_plugin_only_warns(plugin_path, cache_dir, tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", "jax", *TINY_TRAIN, "--steps", "3", "--cache-dir", cache_dir,
                   "--out", str(out), "--report", "oneline", "--report", "table", "--extra", "count-steps", "--beam", "2",
                   env={**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "thirdparty,broken,flaky"})
    assert proc.returncode == 0, proc.stderr
    assert "ONELINE backend=jax steps=3 bleu=" in proc.stdout
    assert "Warning: plugin 'broken' failed to load" in proc.stderr
    assert ("Warning: plugin 'flaky' failed in mtbench_keras_callbacks and was left out: "
            "RuntimeError('flaky callbacks on purpose')") in proc.stderr
    result = json.loads(out.read_text())
    assert result["extras"] == ["count-steps"]
    assert result["extras_record"] == {"count-steps": {"steps_seen": 3}}
    assert result["config"]["beam"] == 2 and result["metrics"]["decoding"] == "beam 2, length penalty 0.6"
    assert "beam 2, length penalty 0.6" in proc.stdout  # the table's decoding row


def test_failing_reporter_is_named_with_its_plugin():
    from mtbench import Reporter
    from mtbench.cli import _report
    from mtbench.errors import RunFailure
    from mtbench.plugins import Registry

    class Exploding(Reporter):
        name = "boom"

        def report(self, result, console):
            raise ValueError("no ink")

    registry = Registry(reporters={"boom": Exploding()}, provider={("reporters", "boom"): "inkjet"})
    with pytest.raises(RunFailure, match=r"reporter 'boom' of plugin 'inkjet' failed: ValueError\('no ink'\); "
                                         r"the result is in r.json"):
        _report(registry, "boom", {"config": {"out": "r.json"}}, console=None)
