"""What mtbench chooses where the user left it `auto` (`mtbench.runner.choices`): the dtype for the device it runs
on, and torch's compiled step, placed among the extras. The devices are described, not present (the choices read
only the device's description)."""

import json
from types import SimpleNamespace

import pytest

from conftest import CPU_ONLY, device_kind, env_with, run_cli, with_torch_extra
from mtbench import MtbenchError
from mtbench.runner.config import TrainConfig


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


@pytest.mark.slow
def test_a_dtype_an_extra_sets_is_recorded_as_its_choice_trains_and_is_checked_for_the_device(
        tmp_path, cache_dir, plugin_path):
    """An extra's configuration changes come after `--dtype` has chosen (the TPU strategy's bfloat16): the result
    names the dtype that trained and the extra that set it, the attention's dtypes (read from the compiled program)
    are that dtype's, and a dtype the device cannot train in is refused in one line, naming the extra's change."""
    # on the CPU, also on a GPU machine: the device that refuses float16 (where a GPU would train it)
    env = {**env_with(plugin_path), "MTBENCH_LOAD_PLUGINS": "mtbench-thirdparty", **CPU_ONLY}
    out = tmp_path / "run.json"
    flags = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "4", "--steps", "2",
             "--measure-only", "--dtype", "float32", "--cache-dir", cache_dir]
    proc = run_cli("train", "--backend", "jax", *flags, "--extra", "bfloat16-compute", "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dtype_chosen"] == {"asked": "float32", "dtype": "mixed_bfloat16", "by_extra": "bfloat16-compute"}
    assert result["config_changed_by"] == {"dtype": "bfloat16-compute"}  # what a comparison names
    assert result["config"]["dtype"] == result["model"]["dtype_policy"] == "mixed_bfloat16"
    assert result["model"]["attention"]["arithmetic"]["matmul_inputs"] == "bfloat16"
    proc = run_cli("train", "--backend", "jax", *flags, "--extra", "float16-compute", "--out", str(tmp_path / "f"),
                   env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "Error: --dtype mixed_float16: XLA on the CPU has no float16 matmul (mixed_float16); use bfloat16 or "
        "mixed_bfloat16 there (once extra 'float16-compute' set dtype='mixed_float16')")
    assert not (tmp_path / "f").exists()


def chosen_dtype(backend, device, dtype="auto", refuses=None):
    """(the run's `config.dtype`, `run.dtype_choice`) once `--dtype` has chosen for `device` (described, not
    present: the choice reads only the description); `refuses`: the backend's reason against mixed bfloat16."""
    from mtbench.plugins import manager
    from mtbench.plugins.api import RunContext
    from mtbench.runner.choices import choose_dtype
    from mtbench.runner.setup import choose_plugins
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
    # A node of mixed GPUs, the process on the second (a launcher's local rank 1): its own GPU is described.
    gpus = {0: ("NVIDIA A100-SXM4-80GB", (8, 0)), 1: ("Tesla T4", (7, 5))}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: gpus[index][0])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: gpus[index][1])
    assert TorchBackend().device_info() == {"kind": "gpu", "name": "Tesla T4", "count": 2, "bfloat16": False}
    gpu = SimpleNamespace(platform="gpu", device_kind="NVIDIA A10", compute_capability="8.6")
    monkeypatch.setattr(jax, "devices", lambda: [gpu, gpu])
    assert JaxBackend().device_info() == {"kind": "gpu", "name": "NVIDIA A10", "count": 2, "bfloat16": True}


def test_amd_gpus_compute_bfloat16_natively_from_the_mi100_and_rdna_3_as_each_backend_reports_them(monkeypatch):
    """AMD's matrix units multiply bfloat16 from CDNA's first (MI100, gfx908) and RDNA 3 (gfx11) on; the MI50 and
    MI60 (gfx906) before them emulate it. On ROCm torch's capability tuple is (9, 0) for gfx906 and gfx90a alike,
    so the architecture's name decides; JAX names it as its compute capability, or gives the model only."""
    from mtbench import native_bfloat16
    architectures = ["gfx900", "gfx906", "gfx908", "gfx90a:sramecc+:xnack-", "gfx942", "gfx950", "gfx1030",
                     "gfx1100", "gfx1201", "8.6", "7.5", "gfx", "gfx9zz", "sm_90"]
    assert [native_bfloat16(a) for a in architectures] == [
        False, False, True, True, True, True, False, True, True, True, False, False, False, False]
    import jax
    import torch

    from mtbench.plugins.backends.jax_backend import JaxBackend
    from mtbench.plugins.backends.torch_backend import TorchBackend
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    for name, architecture, bfloat16 in (("AMD Instinct MI60", "gfx906:sramecc+:xnack-", False),
                                         ("AMD Instinct MI250X", "gfx90a:sramecc+:xnack-", True)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0, name=name: name)
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda index=0, architecture=architecture: SimpleNamespace(gcnArchName=architecture))
        assert TorchBackend().device_info() == {"kind": "gpu", "name": name, "count": 1, "bfloat16": bfloat16}
    for device, bfloat16 in ((SimpleNamespace(platform="gpu", device_kind="AMD Instinct MI300X",
                                              compute_capability="gfx942"), True),
                             (SimpleNamespace(platform="gpu", device_kind="AMD Instinct MI300X"), True),
                             (SimpleNamespace(platform="gpu", device_kind="AMD Instinct MI50"), False),
                             (SimpleNamespace(platform="gpu", device_kind="Radeon RX 7900 XTX"), False)):
        monkeypatch.setattr(jax, "devices", lambda device=device: [device])
        assert JaxBackend().device_info()["bfloat16"] is bfloat16, device


def on_a_gpu(backend, **options):
    """(the run, its plugins) of a run of `options` in mixed bfloat16 on a GPU (the framework's description of it
    stood in for by the caller), told what the model family says before the model is built, as `train` is."""
    from mtbench.plugins import manager
    from mtbench.plugins.api import RunContext
    from mtbench.runner.setup import choose_plugins, read_model_family
    config = TrainConfig(backend=backend, dtype="mixed_bfloat16", **options)
    plugins = choose_plugins(config, manager.registry())
    run = RunContext(config=config, backend=plugins.backend, device={"kind": "gpu"},
                     model_shape=plugins.model.shape(plugins.model_path, config))
    read_model_family(run, plugins.model)
    return run, plugins


def auto_attention_on_a_gpu(backend, **options):
    """What `--attention auto` chose for `on_a_gpu`'s run."""
    from mtbench.runner.choices import choose_fused_attention
    run, plugins = on_a_gpu(backend, **options)
    choose_fused_attention(run, plugins)
    return run.attention_choice


def test_on_a_rocm_gpu_or_one_before_ampere_jax_attends_unfused_under_auto_and_says_why(monkeypatch):
    """Keras's fused attention on JAX is cuDNN's, which a ROCm build has none of, and which Keras refuses (raising)
    below compute capability 8.0, and for heads over 128 wide below 9.0: `--attention auto` leaves it out there
    (where the dtype AMD's GPUs now train in, or an explicit 16-bit dtype on a T4, would otherwise bring it in), and
    says why; on an H100 it joins, heads of 192 too."""
    import jax
    chosen = {}
    wide = {"d_model": 768, "heads": 4}  # heads of 192
    for runtime, capability, size in (("rocm 60400", None, {}), ("cuda 12080", "7.5", {}), ("cuda 12080", "9.0", {}),
                                      ("cuda 12080", "8.0", wide), ("cuda 12080", "9.0", wide)):
        device = SimpleNamespace(client=SimpleNamespace(platform_version=runtime),
                                 **({"compute_capability": capability} if capability else {}))
        monkeypatch.setattr(jax, "devices", lambda device=device: [device])
        chosen[runtime, capability, "wide" if size else "tiny"] = auto_attention_on_a_gpu("jax", preset="tiny", **size)
    assert chosen == {
        ("rocm 60400", None, "tiny"): {"asked": "auto", "fused": False, "why_unfused": "needs cuDNN's fused "
                                       "attention, which JAX has on CUDA only; this GPU runs ROCm"},
        ("cuda 12080", "7.5", "tiny"): {"asked": "auto", "fused": False, "why_unfused": "needs compute capability "
                                        "8.0 or newer on JAX (cuDNN's fused attention); this GPU has 7.5"},
        ("cuda 12080", "9.0", "tiny"): {"asked": "auto", "fused": True, "by_extra": "flash-attention"},
        ("cuda 12080", "8.0", "wide"): {"asked": "auto", "fused": False, "why_unfused": "needs a head size of at "
                                        "most 128 on JAX before compute capability 9.0 (cuDNN's fused attention); "
                                        "this model has 192 on a GPU of 8.0"},
        ("cuda 12080", "9.0", "wide"): {"asked": "auto", "fused": True, "by_extra": "flash-attention"}}


def test_torch_attends_unfused_where_flash_attention_cannot_train_its_heads(monkeypatch):
    """FlashAttention-2 trains heads over 192 wide on an A100's or H100's shared memory only: on an RTX 4090 (8.9)
    `--attention auto` leaves heads of 200 unfused and says why; heads of 64 there, and of 200 on an A100, fuse."""
    import torch
    chosen = {}
    for capability, size in (((8, 9), {"d_model": 800, "heads": 4}), ((8, 9), {}),
                             ((8, 0), {"d_model": 800, "heads": 4})):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0, capability=capability: capability)
        chosen[capability, "wide" if size else "tiny"] = auto_attention_on_a_gpu("torch", preset="tiny", **size)
    assert chosen == {
        ((8, 9), "wide"): {"asked": "auto", "fused": False, "why_unfused": "needs a head size of at most 192 to "
                           "train on torch's FlashAttention on compute capability 8.9; this model has 200"},
        ((8, 9), "tiny"): {"asked": "auto", "fused": True, "by_extra": "flash-attention"},
        ((8, 0), "wide"): {"asked": "auto", "fused": True, "by_extra": "flash-attention"}}


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_auto_attends_unfused_where_the_model_drops_attention_probabilities(monkeypatch, backend):
    """nanoGPT's Shakespeare model drops a fifth of its attention probabilities, which no fused kernel Keras calls
    can: on a GPU `--attention auto` keeps it unfused on both backends and says why, fuses it at --dropout 0, and
    fuses the translation Transformer's `base`, whose dropout (0.1) leaves the probabilities alone."""
    import jax
    import torch

    from mtbench.runner.setup import device_refusal
    monkeypatch.setattr(jax, "devices", lambda: [SimpleNamespace(client=SimpleNamespace(platform_version="cuda"))])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    chosen = {}
    for label, options in (("char", {"model_name": "gpt", "preset": "char"}),
                           ("char at --dropout 0", {"model_name": "gpt", "preset": "char", "dropout": 0.0}),
                           ("base", {"preset": "base"})):
        chosen[label] = auto_attention_on_a_gpu(backend, **options)
    assert chosen == {
        "char": {"asked": "auto", "fused": False, "why_unfused": "drops no attention probabilities, and this model "
                 "drops 0.2 of them while training (--dropout 0 lets it run)"},
        "char at --dropout 0": {"asked": "auto", "fused": True, "by_extra": "flash-attention"},
        "base": {"asked": "auto", "fused": True, "by_extra": "flash-attention"}}
    run, plugins = on_a_gpu(backend, model_name="gpt", preset="char", attention="fused")
    assert device_refusal(run, plugins.extras) == ("extra 'flash-attention' cannot run here: drops no attention "
                                                   "probabilities, and this model drops 0.2 of them while training "
                                                   "(--dropout 0 lets it run)")


def chosen_step(backend, kind, step="auto", extras=(), registry=None, **options):
    """(the run's extras, the extras' plugins, `run.step_choice`) once `--step` has chosen, for a device of `kind`
    (a GPU described, not present: the choice reads only the device's description)."""
    from mtbench.plugins import manager
    from mtbench.plugins.api import RunContext
    from mtbench.runner.choices import choose_compiled_step
    from mtbench.runner.setup import choose_plugins
    config = TrainConfig(backend=backend, preset="tiny", step=step, extras=extras, **options)
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


def test_a_compile_mode_where_nothing_compiles_the_step_is_refused_with_the_reason():
    """The result would record a mode that never ran."""
    assert chosen_step("torch", "gpu", compile_mode="reduce-overhead")[0] == ("torch-compile",)
    with pytest.raises(MtbenchError, match=r"^--compile-mode reduce-overhead: this run's step is not compiled "
                                           r"\(compiled by default on a CUDA GPU only; this device is cpu"):
        chosen_step("torch", "cpu", compile_mode="reduce-overhead")


def test_auto_says_which_of_the_device_and_the_dtype_keeps_attention_unfused():
    """`why_unfused` names what is missing: it said 'needs a GPU (or TPU) and float16/bfloat16; this run has
    cpu/bfloat16' of a bfloat16 run on a CPU, as if bfloat16 were wanting too."""
    from mtbench.plugins import manager
    from mtbench.plugins.api import RunContext
    from mtbench.runner.choices import choose_fused_attention
    from mtbench.runner.setup import choose_plugins, read_model_family
    chosen = {}
    for kind, dtype in (("cpu", "bfloat16"), ("cpu", "mixed_bfloat16"), ("gpu", "float32"), ("cpu", "float32")):
        config = TrainConfig(backend="torch", preset="tiny", dtype=dtype)
        plugins = choose_plugins(config, manager.registry())
        run = RunContext(config=config, backend=plugins.backend, device={"kind": kind})
        read_model_family(run, plugins.model)
        choose_fused_attention(run, plugins)
        chosen[kind, dtype] = run.attention_choice["why_unfused"]
    assert chosen == {("cpu", "bfloat16"): "needs a GPU (or TPU); this run is on the cpu",
                      ("cpu", "mixed_bfloat16"): "needs a GPU (or TPU); this run is on the cpu",
                      ("gpu", "float32"): "needs float16 or bfloat16; this run computes in float32",
                      ("cpu", "float32"): "needs a GPU (or TPU) and float16/bfloat16; this run has cpu/float32"}
