"""A backend plugin's mistakes, each named with the backend and its plugin in one line, as an extra's and a task's
are: a method that raises, or answers other than the kind mtbench reads of it (docs/plugins.md, "Backend"). Its
refusals (MtbenchError) keep their own words, and a task that calls the backend's `compile_inference` does not take
the blame for it."""

import json
import textwrap

import pytest

from conftest import ONE_BUCKET, TINY_TRAIN, env_with, install_plugin_module, run_cli

# mtbench's JAX backend under another name, BACKEND_BAD choosing the method that fails and how.
FAULTY_BACKEND = textwrap.dedent('''
    import os

    from mtbench import hookimpl
    from mtbench.plugins.backends.jax_backend import JaxBackend

    BAD = os.environ.get("BACKEND_BAD", "")


    class FaultyJax(JaxBackend):
        name = "faulty-jax"
        description = "JAX, with one mistake chosen by BACKEND_BAD"

        def missing_framework(self):
            if BAD == "missing_framework_raises":
                raise RuntimeError("cannot tell")
            return super().missing_framework()

        def prepare_process(self, config):
            if BAD == "prepare_process_list":
                return [("XLA_FLAGS", "")]
            return super().prepare_process(config)

        def device_info(self):
            if BAD == "device_info_text":
                return "cpu"
            return super().device_info()

        def framework_versions(self):
            if BAD == "framework_versions_raises":
                raise KeyError("jaxlib")
            return super().framework_versions()

        def unsupported_dtype_reason(self, dtype, device):
            if BAD == "dtype_reason_number":
                return 0
            return super().unsupported_dtype_reason(dtype, device)

        def make_train_step(self, run, model):
            if BAD == "train_step_number":
                return 42
            return super().make_train_step(run, model)

        def compile_inference(self, fn, model):
            if BAD == "compile_inference_raises":
                raise RuntimeError("no inference today")
            return super().compile_inference(fn, model)


    @hookimpl
    def mtbench_register_backends(register):
        register(FaultyJax())
''')

NAMED = "backend 'faulty-jax' of plugin 'faultyjax' failed: "


@pytest.fixture(scope="module")
def faulty_plugin(tmp_path_factory):
    site = tmp_path_factory.mktemp("faulty-site")
    install_plugin_module(site, "mtbench_faultyjax", "faultyjax", FAULTY_BACKEND)
    return str(site)


def train(plugin, cache_dir, out, bad, *arguments):
    # 6 steps, as test_plugin_failures.py's and test_manager.py's jax runs: the control's train step, JAX's under
    # another name, is a program the session compiles once.
    return run_cli("train", "--backend", "faulty-jax", *TINY_TRAIN, *ONE_BUCKET, "--steps", "6", "--cache-dir",
                   cache_dir, "--out", str(out), *arguments,
                   env={**env_with(plugin), "MTBENCH_LOAD_PLUGINS": "mtbench_faultyjax", "BACKEND_BAD": bad})


@pytest.mark.parametrize("bad, said", [
    ("missing_framework_raises", "RuntimeError: cannot tell"),
    ("prepare_process_list", "TypeError: prepare_process returned a list, not a dict"),
    ("device_info_text", "TypeError: device_info returned a str, not a dict"),
    ("framework_versions_raises", "KeyError: 'jaxlib'"),
    ("dtype_reason_number", "TypeError: unsupported_dtype_reason returned a int, not a str or None"),
    ("train_step_number", "TypeError: make_train_step returned a int, not a mtbench.TrainStep or None"),
])
def test_a_backend_that_fails_before_training_is_named_with_its_plugin_in_one_line(faulty_plugin, cache_dir,
                                                                                      tmp_path, bad, said):
    out = tmp_path / "r.json"
    proc = train(faulty_plugin, cache_dir, out, bad)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and lines[-1].startswith(f"Error: {NAMED}{said}"), proc.stderr[-3000:]
    assert not out.exists()  # nothing trained, so nothing to keep


def test_a_backends_failing_compile_inference_is_the_backends_not_the_tasks(faulty_plugin, cache_dir, tmp_path):
    """Translation's evaluator compiles its decoder as it is made, before training."""
    out = tmp_path / "r.json"
    proc = train(faulty_plugin, cache_dir, out, "compile_inference_raises")
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith(f"Error: {NAMED}RuntimeError: no inference today"), proc.stderr[-3000:]


def test_a_backend_that_works_trains_under_its_own_name(faulty_plugin, cache_dir, tmp_path):
    """The control: the same plugin with no mistake chosen trains, so the failures above are the mistakes'."""
    out = tmp_path / "r.json"
    proc = train(faulty_plugin, cache_dir, out, "", "--measure-only")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["backend"] == "faulty-jax" and result["status"] == "completed"
