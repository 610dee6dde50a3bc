"""Setting a run up the same way on both backends: the float32 matmul arithmetic each framework is told and what
it reports back, a backend that cannot set it, the devices a process computes on (what energy counts), and the
float16 policy torch refuses, and keras imported without the integrations mtbench never uses."""

import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import cli_environment, device_kind, run_cli, with_torch_extra
from mtbench import Backend, Launch, MtbenchError, ProcessGroup
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import KERAS_OPTIONAL_IMPORTS, local_devices, modules_hidden, set_matmul_precision


@pytest.fixture
def torch_precision():
    torch = pytest.importorskip("torch")
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield torch
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]


@pytest.fixture
def jax_precision():
    import jax
    saved = jax.config.jax_default_matmul_precision
    yield jax
    jax.config.update("jax_default_matmul_precision", saved)


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


def test_the_command_lines_dtype_is_chosen_for_the_device_it_ran_on_and_recorded(tmp_path, cache_dir):
    """No --dtype: `auto` trains float32 on a CPU and says why; on a GPU, mixed bfloat16 where the backend reports
    the GPU computing it natively. The result's configuration holds the dtype that ran."""
    out = tmp_path / "run.json"
    proc = run_cli("train", "--backend", "jax", "--model", "gpt", "--preset", "tiny", "--block-size", "32",
                   "--batch-size", "4", "--steps", "2", "--measure-only", "--cache-dir", cache_dir, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    chosen, device = result["dtype_chosen"], result["env"]["device"]
    if device_kind("jax") == "cpu":
        assert chosen == {"asked": "auto", "dtype": "float32", "why_float32": (
            "this cpu does not compute bfloat16 natively, as the jax backend reports it; --dtype mixed_bfloat16 "
            "trains in it anyway")}
    else:
        assert (chosen["asked"], chosen["dtype"]) == ("auto", "mixed_bfloat16" if device["bfloat16"] else "float32")
    assert result["config"]["dtype"] == result["model"]["dtype_policy"] == chosen["dtype"]


def chosen_dtype(backend, device, dtype="auto", refuses=None):
    """(the run's `config.dtype`, `run.dtype_choice`) once `--dtype` has chosen for `device` (described, not
    present: the choice reads only the description); `refuses`: the backend's reason against mixed bfloat16."""
    from mtbench.plugins import manager
    from mtbench.plugins.api import RunContext
    from mtbench.runner.setup import choose_dtype, choose_plugins
    config = TrainConfig(backend=backend, preset="tiny", dtype=dtype)
    plugins = choose_plugins(config, manager.registry())
    framework = plugins.backend
    if refuses:
        framework = type("Refusing", (type(framework),), {
            "unsupported_dtype_reason": lambda self, dtype, device: refuses if dtype == "mixed_bfloat16" else None})()
    run = RunContext(config=config, backend=framework, device=device)
    choose_dtype(run, plugins)
    return run.config.dtype, run.dtype_choice


H100 = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 1, "bfloat16": True}
T4 = {"kind": "gpu", "name": "Tesla T4", "count": 1, "bfloat16": False}


def test_auto_trains_mixed_bfloat16_where_the_device_computes_it_natively_and_float32_elsewhere():
    bf16 = ("mixed_bfloat16", {"asked": "auto", "dtype": "mixed_bfloat16"})
    assert chosen_dtype("jax", H100) == chosen_dtype("torch", H100) == bf16
    assert chosen_dtype("jax", {"kind": "tpu", "name": "TPU v4", "count": 4, "bfloat16": True}) == bf16
    dtype, chosen = chosen_dtype("torch", T4)
    assert dtype == "float32" and chosen["why_float32"] == (
        "this gpu does not compute bfloat16 natively, as the torch backend reports it; --dtype mixed_bfloat16 "
        "trains in it anyway")
    # A backend that reports nothing of bfloat16 (a plugin's, or a CPU) keeps float32.
    assert chosen_dtype("jax", {"kind": "gpu", "name": "?", "count": 1})[0] == "float32"
    # Asked for, a dtype is the run's on any device; the backend's refusal of 16 bits keeps auto in float32.
    assert chosen_dtype("torch", T4, "mixed_bfloat16") == ("mixed_bfloat16", {"asked": "mixed_bfloat16",
                                                                               "dtype": "mixed_bfloat16"})
    assert chosen_dtype("torch", H100, "float32")[0] == "float32"
    assert chosen_dtype("torch", H100, refuses="no bfloat16 here") == ("float32", {
        "asked": "auto", "dtype": "float32", "why_float32": "--dtype mixed_bfloat16: no bfloat16 here"})


def test_ampere_and_later_gpus_compute_bfloat16_natively_as_each_backend_reports_them(monkeypatch):
    """What each backend's `device_info` reports of a CUDA GPU, read from the framework's own description of it
    (torch's capability tuple, JAX's '8.6' text), without a GPU: the frameworks' calls are stood in for."""
    from mtbench import native_bfloat16
    assert [native_bfloat16(c) for c in ((7, 0), (7, 5), (8, 0), (8, 6), (9, 0), (10, 0), None)] == [
        False, False, True, True, True, True, False]
    import jax
    import torch

    from mtbench.plugins.backends.jax_backend import JaxBackend
    from mtbench.plugins.backends.torch_backend import TorchBackend
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (7, 5))
    assert TorchBackend().device_info() == {"kind": "gpu", "name": "Tesla T4", "count": 1, "bfloat16": False}
    gpu = SimpleNamespace(platform="gpu", device_kind="NVIDIA A10", compute_capability="8.6")
    monkeypatch.setattr(jax, "devices", lambda: [gpu, gpu])
    assert JaxBackend().device_info() == {"kind": "gpu", "name": "NVIDIA A10", "count": 2, "bfloat16": True}


def run_with(extras_state, world_size=1, local_rank=0):
    launch = Launch(num_processes=world_size, process_id=local_rank, local_rank=local_rank)
    return SimpleNamespace(extras_state=extras_state, processes=ProcessGroup(launch))


def test_a_process_counts_the_devices_it_computes_on():
    assert local_devices(run_with({})) == [0]  # one device, whatever the machine has
    assert local_devices(run_with({"pmap": {"devices": 4}})) == [0, 1, 2, 3]
    # torch DDP / JAX over 8 processes of one device each: process 3 computes on its local rank's device.
    assert local_devices(run_with({"ddp": {"devices": 8}}, world_size=8, local_rank=3)) == [3]
    assert local_devices(run_with({"flash-attention": {"applied_to": []}})) == [0]


def test_float16_on_torch_is_refused_with_the_host_sync_it_would_measure(tmp_path, cache_dir):
    proc = run_cli("train", "--backend", "torch", "--dtype", "mixed_float16", "--preset", "tiny",
                   "--cache-dir", cache_dir, "--out", str(tmp_path / "f16.json"))
    assert proc.returncode != 0 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("Error: --dtype mixed_float16: float16 trains through Keras's loss-scaling "
                                  "optimizer, whose finite-gradient check on torch waits for the device")
    assert not (tmp_path / "f16.json").exists()


def test_keras_is_imported_without_the_integrations_mtbench_never_uses(tmp_path):
    for installed in KERAS_OPTIONAL_IMPORTS:  # the test extras install them: otherwise this would prove nothing
        assert importlib.util.find_spec(installed) is not None, installed
    # `mtbench init-weights` in a process that then lists what it imported, and imports one of them itself.
    program = ("import runpy, sys\n"
               f"sys.argv = ['mtbench', 'init-weights', '--backend', 'jax', '--preset', 'tiny', '--out', "
               f"{str(tmp_path / 'w.npz')!r}]\n"
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


def chosen_step(backend, kind, step="auto", extras=(), registry=None):
    """(the run's extras, the extras' plugins, `run.step_choice`) once `--step` has chosen, for a device of `kind`
    (a GPU described, not present: the choice reads only the device's description)."""
    from mtbench.plugins import manager
    from mtbench.plugins.api import RunContext
    from mtbench.runner.setup import choose_compiled_step, choose_plugins
    config = TrainConfig(backend=backend, preset="tiny", step=step, extras=extras)
    plugins = choose_plugins(config, registry or manager.registry())
    run = RunContext(config=config, backend=plugins.backend, device={"kind": kind})
    choose_compiled_step(run, plugins)
    return run.config.extras, [extra.name for extra in plugins.extras], run.step_choice


def test_the_obvious_command_compiles_torchs_step_on_a_cuda_gpu_and_nowhere_else_unasked():
    compiled = {"asked": "auto", "by_extra": "torch-compile"}
    assert chosen_step("torch", "gpu") == (("torch-compile",), ["torch-compile"], compiled)
    # After the extras given: fsdp wraps the compiled step, as with `--extra fsdp --extra torch-compile`.
    assert chosen_step("torch", "gpu", extras=("fsdp",))[:2] == (("fsdp", "torch-compile"), ["fsdp", "torch-compile"])
    assert chosen_step("torch", "gpu", extras=("torch-compile",))[0] == ("torch-compile",)
    extras, plugins, cpu = chosen_step("torch", "cpu")
    assert (extras, plugins, cpu["by_extra"]) == ((), [], None) and "CUDA GPU only" in cpu["why_not"]
    assert chosen_step("torch", "cpu", "compiled") == (("torch-compile",), ["torch-compile"],
                                                       {"asked": "compiled", "by_extra": "torch-compile"})
    assert chosen_step("torch", "gpu", "eager") == ((), [], {"asked": "eager", "by_extra": None,
                                                             "why_not": "asked (--step eager)"})
    # JAX's step is XLA's program whatever --step says: nothing joins it.
    assert chosen_step("jax", "gpu") == ((), [], {
        "asked": "auto", "by_extra": None,
        "why_not": "the jax backend trains its own step: no 'torch-compile' extra serves it"})
    with pytest.raises(MtbenchError, match="^--step eager: no 'torch-compile' extra serves the jax backend"):
        chosen_step("jax", "gpu", "eager")


def test_the_compiled_step_joins_inside_an_extra_that_wraps_any_step_and_after_the_others():
    from mtbench.plugins import manager
    registry = with_torch_extra(manager.registry(), "wrapping", wraps_step=True)
    placed = ("fsdp", "torch-compile", "wrapping")
    # The run's extras and the plugins that make its step, in the one order: fsdp's step wraps the compiled one,
    # and the wrapping extra wraps them both.
    assert chosen_step("torch", "gpu", extras=("fsdp", "wrapping"), registry=registry)[:2] == (placed, list(placed))
    assert chosen_step("torch", "cpu", "compiled", extras=("wrapping",), registry=registry)[:2] == (
        ("torch-compile", "wrapping"), ["torch-compile", "wrapping"])
    # An order the user gave is theirs: torch-compile then refuses to replace the wrapper (tested end to end).
    assert chosen_step("torch", "gpu", extras=("wrapping", "torch-compile"), registry=registry)[0] == (
        "wrapping", "torch-compile")


def test_an_extra_that_cannot_run_compiled_keeps_auto_eager_and_refuses_compiled():
    from mtbench.plugins import manager
    registry = with_torch_extra(manager.registry(), "uncompiled", conflicts=("torch-compile",))
    extras, _, chosen = chosen_step("torch", "gpu", extras=("uncompiled",), registry=registry)
    assert extras == ("uncompiled",) and chosen == {
        "asked": "auto", "by_extra": None, "why_not": "extra 'uncompiled' cannot run together with 'torch-compile'"}
    with pytest.raises(MtbenchError, match="^--step compiled: extra 'uncompiled' cannot run together with"):
        chosen_step("torch", "gpu", "compiled", extras=("uncompiled",), registry=registry)


def test_step_eager_beside_the_compile_extra_is_refused_and_old_results_read_as_they_ran():
    with pytest.raises(MtbenchError, match="^--step eager contradicts --extra torch-compile"):
        TrainConfig(backend="torch", step="eager", extras=("torch-compile",))
    with pytest.raises(MtbenchError, match="^unknown --step 'jit'"):
        TrainConfig(step="jit")
    # Written before --step: torch compiled only with the extra, so such a run reruns as it ran, on a GPU too.
    old = {key: value for key, value in TrainConfig(backend="torch").to_dict().items() if key != "step"}
    assert TrainConfig.from_dict(old).step == "eager"
    assert TrainConfig.from_dict({**old, "extras": ["torch-compile"]}).step == "auto"
    assert TrainConfig.from_dict({**old, "backend": "jax"}).step == "auto"
