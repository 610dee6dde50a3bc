"""Setting a run up the same way on both backends: the float32 matmul arithmetic each framework is told and what
it reports back, a backend that cannot set it, the devices a process computes on (what energy counts), the
float16 trained on torch with loss scaling and no host wait, and keras imported without the integrations mtbench never uses."""

import csv
import importlib.util
import io
import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import cli_environment, run_cli
from mtbench import Backend, Launch, MtbenchError, ProcessGroup
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import (KERAS_OPTIONAL_IMPORTS, check_profiling, compile_model, local_devices,
                                  modules_hidden, set_matmul_precision)


@pytest.fixture
def torch_precision():
    import torch
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield torch
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]


def test_torch_is_told_tf32_only_for_high_and_reports_what_it_set(torch_precision):
    from mtbench.plugins.backends.torch_backend import TorchBackend
    torch = torch_precision
    highest = set_matmul_precision(TorchBackend(), "highest")
    assert highest["requested"] == "highest"
    # Read back from torch, including cuDNN's own TF32 switch, which torch leaves on by default.
    assert highest["reported"]["torch.get_float32_matmul_precision()"] == "highest"
    assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
    high = set_matmul_precision(TorchBackend(), "high")
    assert high["reported"]["torch.get_float32_matmul_precision()"] == "high"
    assert torch.backends.cuda.matmul.allow_tf32 is True and torch.backends.cudnn.allow_tf32 is True


def test_jax_is_told_float32_or_tensorfloat32_rather_than_xlas_default(jax_precision):
    from mtbench.plugins.backends.jax_backend import JaxBackend
    jax = jax_precision
    assert set_matmul_precision(JaxBackend(), "highest")["reported"] == \
        {"jax.config.jax_default_matmul_precision": "float32"}
    assert jax.config.jax_default_matmul_precision == "float32"
    assert set_matmul_precision(JaxBackend(), "high")["reported"] == \
        {"jax.config.jax_default_matmul_precision": "tensorfloat32"}


def test_a_backend_that_cannot_set_the_precision_is_refused_tf32_and_recorded_as_not_reporting():
    class Silent(Backend):
        name = "silent"
    assert set_matmul_precision(Silent(), "highest") == {"requested": "highest", "reported": None}
    with pytest.raises(MtbenchError, match="backend 'silent' cannot set its matmul precision"):
        set_matmul_precision(Silent(), "high")


def test_matmul_precision_and_measure_only_are_checked_in_the_configuration():
    with pytest.raises(MtbenchError, match="unknown matmul precision 'medium'"):
        TrainConfig(matmul_precision="medium")
    with pytest.raises(MtbenchError, match="--measure-only skips validation"):
        TrainConfig(measure_only=True, eval_every=10)
    proc = run_cli("train", "--matmul-precision", "medium")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "'medium' is not one of" in proc.stderr


def test_every_run_records_the_precision_both_frameworks_reported(tiny_runs):
    for backend, run in tiny_runs.items():
        record = run["result"]["env"]["matmul_precision"]
        assert record["requested"] == run["result"]["config"]["matmul_precision"] == "highest"
        reported = record["reported"]
        if backend == "jax":
            assert reported["jax.config.jax_default_matmul_precision"] == "float32"
        else:
            assert reported["torch.get_float32_matmul_precision()"] == "highest"
            assert reported["torch.backends.cuda.matmul.allow_tf32"] is False


def run_with(extras_state, world_size=1, local_rank=0):
    launch = Launch(num_processes=world_size, process_id=local_rank, local_rank=local_rank)
    return SimpleNamespace(extras_state=extras_state, processes=ProcessGroup(launch))


def test_a_process_counts_the_devices_it_computes_on():
    assert local_devices(run_with({})) == [0]  # one device, whatever the machine has
    assert local_devices(run_with({"pmap": {"devices": 4}})) == [0, 1, 2, 3]
    # torch DDP / JAX over 8 processes of one device each: process 3 computes on its local rank's device.
    assert local_devices(run_with({"ddp": {"devices": 8}}, world_size=8, local_rank=3)) == [3]
    assert local_devices(run_with({"flash-attention": {"applied_to": []}})) == [0]


@pytest.mark.slow  # 31 s, most of it measuring this CPU's float16 matmul peak (for MFU) in a fresh cache
def test_float16_trains_on_torch_with_loss_scaling_and_no_host_wait(tmp_path, cache_dir):
    out = tmp_path / "f16.json"
    proc = run_cli("train", "--backend", "torch", "--dtype", "mixed_float16", "--model", "gpt", "--preset", "tiny",
                   "--batch-size", "8", "--block-size", "32", "--steps", "4", "--measure-only", "--cache-dir", cache_dir,
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert (result["config"]["dtype"], result["compile_options"]["optimizer"]) == ("mixed_float16",
                                                                                   "LossScaleOptimizer")
    scaling = result["loss_scaling"]
    assert (scaling["initial_scale"], scaling["growth_steps"]) == (32768.0, 2000)
    # No growth in 4 steps: each skipped step halved the scale once.
    assert scaling["final_scale"] == 32768.0 / 2 ** scaling["steps_skipped"]
    assert result["host_syncs_per_step"] == 0
    assert all(math.isfinite(entry["loss"]) for entry in result["history"])
    assert f"; loss scaled from 2^15, {scaling['steps_skipped']} step" in proc.stdout
    # Beside the figures of a comparison too: the updates a float16 run skipped.
    report = run_cli("report", str(out), "--format", "csv")
    assert report.returncode == 0, report.stderr
    (row,) = csv.DictReader(io.StringIO(report.stdout))
    assert row["loss_scaling"].startswith(f"loss scaled from 2^15, {scaling['steps_skipped']} step")
    assert row["loss_scaling"].endswith(f"now 2^{15 - scaling['steps_skipped']}")


def test_keras_is_imported_without_the_integrations_mtbench_never_uses(tmp_path, cache_dir):
    for installed in KERAS_OPTIONAL_IMPORTS:  # the test extras install them: otherwise this would prove nothing
        assert importlib.util.find_spec(installed) is not None, installed
    # `mtbench init-weights` in a process that then lists what it imported, and imports one of them itself.
    program = ("import runpy, sys\n"
               f"sys.argv = ['mtbench', 'init-weights', '--backend', 'jax', '--preset', 'tiny', "
               f"'--max-pairs', '4000', '--cache-dir', {cache_dir!r}, '--out', {str(tmp_path / 'w.npz')!r}]\n"
               "try:\n    runpy.run_module('mtbench', run_name='__main__')\nexcept SystemExit as exit:\n"
               "    assert not exit.code, exit.code\n"
               "print(sorted(name.split('.')[0] for name in sys.modules if name.startswith(('keras', 'jax', "
               f"*{KERAS_OPTIONAL_IMPORTS!r}))))\n"
               "import matplotlib.pyplot\nprint(matplotlib.pyplot.__name__)\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=cli_environment())
    assert proc.returncode == 0, proc.stderr
    imported, afterwards = proc.stdout.strip().splitlines()[-2:]
    assert {"keras", "jax"} <= set(eval(imported)) and not set(eval(imported)) & set(KERAS_OPTIONAL_IMPORTS)
    assert afterwards == "matplotlib.pyplot"


@pytest.mark.slow
def test_a_torch_process_imports_no_jax_and_can_afterwards(tmp_path, cache_dir):
    """keras imports JAX at its own import where it is installed (its Orbax callback), whatever the backend: a torch
    run hides the other backends' frameworks while keras is imported, and a plugin can still import them later."""
    assert importlib.util.find_spec("jax") is not None  # installed: otherwise this would prove nothing
    program = ("import runpy, sys\n"
               f"sys.argv = ['mtbench', 'init-weights', '--backend', 'torch', '--preset', 'tiny', "
               f"'--max-pairs', '4000', '--cache-dir', {cache_dir!r}, '--out', {str(tmp_path / 'w.npz')!r}]\n"
               "try:\n    runpy.run_module('mtbench', run_name='__main__')\nexcept SystemExit as exit:\n"
               "    assert not exit.code, exit.code\n"
               "print(sorted({name.split('.')[0] for name in sys.modules if name.startswith(('keras', 'jax', "
               "'torch'))}))\n"
               "import jax\nprint(jax.numpy.ones(2).sum())\n")
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=cli_environment())
    assert proc.returncode == 0, proc.stderr
    imported, afterwards = proc.stdout.strip().splitlines()[-2:]
    assert {"keras", "torch"} <= set(eval(imported)) and "jax" not in eval(imported) and afterwards == "2.0"


def test_hidden_modules_fail_to_import_inside_the_block_and_import_after_it(tmp_path, monkeypatch):
    for name in ("mtbench_probe_a", "mtbench_probe_b"):
        (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import mtbench_probe_b  # already imported: hiding it would break whoever holds it
    with modules_hidden(["mtbench_probe_a", "mtbench_probe_b"]):
        with pytest.raises(ImportError):
            import mtbench_probe_a  # noqa: F401
        assert sys.modules["mtbench_probe_b"] is mtbench_probe_b
    import mtbench_probe_a
    assert mtbench_probe_a.VALUE == 1
    for name in ("mtbench_probe_a", "mtbench_probe_b"):
        sys.modules.pop(name)


def test_a_family_whose_build_returns_no_model_and_shape_is_named():
    import contextlib
    from mtbench import RunFailure
    from mtbench.keras_models.presets import presets_for
    from mtbench.runner.setup import build_model
    shape = presets_for("gpt")["tiny"]
    for built, fine in (("a model", False), (("a model", {"d_model": 8}), False), (("a model", shape), True)):
        family = SimpleNamespace(name="careless-lm", build=lambda *args, built=built: built)
        plugins = SimpleNamespace(model=family, model_path=None, model_code=contextlib.nullcontext)
        run = SimpleNamespace(config=TrainConfig())
        if fine:
            assert build_model(run, plugins, None) == ("a model", shape)
        else:
            with pytest.raises(RunFailure, match=r"^model family 'careless-lm' built (str|tuple), not \(model, "
                                                 r"shape\): a model and its ModelShape$"):
                build_model(run, plugins, None)


def test_profile_is_refused_before_any_import_where_the_backend_has_no_profiler():
    class Unprofiled(Backend):  # a third-party backend written before Backend.step_profiler
        name = "unprofiled"

    plugins = SimpleNamespace(backend=Unprofiled())
    with pytest.raises(MtbenchError, match=r"^--profile 2: backend 'unprofiled' has no step profiler "
                                           r"\(Backend.step_profiler\)$"):
        check_profiling(TrainConfig(preset="tiny", profile_steps=2), plugins)
    check_profiling(TrainConfig(preset="tiny"), plugins)  # not asked for: nothing to refuse


@pytest.mark.parametrize("decay_on", ["all", "matrices"])
def test_the_compiled_optimizer_decays_and_clips_as_the_users_options_say(decay_on):
    """The optimizer the model trains with, not the recipe handed to it: a step of zero gradients moves a weight
    by its decay alone (AdamW's update of a zero gradient is zero), so it shows which weights decay."""
    import keras
    import numpy as np

    from mtbench.keras_models.transformer import build_transformer
    config = TrainConfig(preset="tiny", weight_decay=0.5, weight_decay_on=decay_on, warmup_steps=0,
                         learning_rate=0.1, clip="global", clip_norm=2.0, adam_beta2=0.99)
    model = build_transformer(config.model)
    compile_model(keras, model, config, total_steps=10, compile_options={})
    optimizer = model.optimizer
    assert (optimizer.beta_2, optimizer.global_clipnorm, optimizer.clipnorm) == (0.99, 2.0, None)
    weights = [v for v in model.trainable_variables if np.any(keras.ops.convert_to_numpy(v))]
    before = [keras.ops.convert_to_numpy(v) for v in weights]
    optimizer.apply_gradients([(keras.ops.zeros(v.shape), v) for v in model.trainable_variables])
    decayed = [np.allclose(keras.ops.convert_to_numpy(v), old * (1 - 0.1 * 0.5)) for v, old in zip(weights, before)]
    matrices = [done for done, v in zip(decayed, weights) if len(v.shape) >= 2]
    vectors = [done for done, v in zip(decayed, weights) if len(v.shape) < 2]  # layer norms' scales, at 1
    assert matrices and vectors and all(matrices)
    assert vectors == [decay_on == "all"] * len(vectors)


@pytest.mark.parametrize("changes, refused", [
    # The run read and split its data before the extras were asked: the result recorded sizes it never trained on.
    ({"valid_size": 20, "test_size": 10, "max_pairs": 400}, "valid_size, test_size, max_pairs"),
    ({"learning_rate": "fast"}, None),
])
def test_an_extra_cannot_change_the_data_read_before_it_and_a_mistyped_change_names_its_kind(changes, refused):
    from mtbench.errors import RunFailure
    from mtbench.plugins.api import Extra, RunContext
    from mtbench.plugins.manager import registry
    from mtbench.runner.setup import RunPlugins, configuration_changes

    class Resplit(Extra):
        name = "resplit"

        def config_changes(self, run):
            return changes

    run = RunContext(config=TrainConfig(steps=5), backend=None, device={"count": 1})
    with pytest.raises(RunFailure) as error:
        configuration_changes(run, RunPlugins(None, [Resplit()], [], registry()))
    said = str(error.value)
    assert said.startswith("extra 'resplit' ") and "Traceback" not in said
    if refused:
        assert said.startswith(f"extra 'resplit' changes {refused}, chosen before the extras change")
    else:  # a value of the wrong type: the configuration's refusal, naming the extra and the setting
        assert said == ("extra 'resplit' sets learning_rate='fast', which the configuration refuses: learning_rate "
                        "takes a float, not str 'fast'")
