"""What a result's `env` says of the accelerator software and the variables that change the arithmetic, read
on this CPU-only machine; and the warning `mtbench env` gives when a GPU is present that a backend does not see,
shown with a stand-in for the driver's answer."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import cli_environment, cpu_machine_only
from mtbench import Backend, cudnn_version_text
from mtbench.plugins.backends.jax_backend import JaxBackend
from mtbench.plugins.backends.torch_backend import TorchBackend
from mtbench.runner.measurement import environment
from mtbench.runner.measurement.environment import (accelerator_record, amd_gpus,
                                                    arithmetic_environment_variables, cpu_only_backend_warnings,
                                                    gpu_row, nvidia_gpu, only_amd_gpus, run_environment)



@cpu_machine_only
@pytest.mark.parametrize("backend", [JaxBackend(), TorchBackend()], ids=["jax", "torch"])
def test_the_run_environment_has_the_accelerator_fields_empty_on_a_cpu(backend, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    env = run_environment(backend)
    assert env["device"]["kind"] == "cpu"
    assert env["gpu_present"] is False and env["nvidia_gpu_present"] is False
    assert env["nvidia_driver_version"] is None
    assert env["amd_gpus"] == []
    assert env["cuda_version"] is None and env["cudnn_version"] is None
    assert env["framework_env"]["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    assert env["framework_env"]["NVIDIA_TF32_OVERRIDE"] is None
    json.dumps(env)  # all of it goes into the result file


@pytest.fixture
def framework_precisions():
    """The frameworks' float32 matmul settings put back as they were after the test."""
    import jax
    import torch
    before = jax.config.jax_default_matmul_precision, torch.get_float32_matmul_precision(), \
        torch.backends.cudnn.allow_tf32
    yield
    jax.config.update("jax_default_matmul_precision", before[0])
    torch.set_float32_matmul_precision(before[1])
    torch.backends.cudnn.allow_tf32 = before[2]


# What each --matmul-precision means to each framework: TF32 allowed everywhere, or IEEE float32 everywhere.
TORCH_PRECISIONS = {
    "high": {"torch.backends.cuda.matmul.allow_tf32": True, "torch.backends.cudnn.allow_tf32": True,
             "torch.get_float32_matmul_precision()": "high", "torch.backends.cuda.matmul.fp32_precision": "tf32",
             "torch.backends.cudnn.fp32_precision": "none"},
    "highest": {"torch.backends.cuda.matmul.allow_tf32": False, "torch.backends.cudnn.allow_tf32": False,
                "torch.get_float32_matmul_precision()": "highest", "torch.backends.cuda.matmul.fp32_precision": "ieee",
                "torch.backends.cudnn.fp32_precision": "none"}}
JAX_PRECISIONS = {"high": "tensorfloat32", "highest": "float32"}


def test_the_report_records_the_float32_matmul_precision_a_run_set(framework_precisions):
    torch_backend, jax_backend = TorchBackend(), JaxBackend()
    for precision in ("high", "highest", "high"):  # there and back: nothing of the last setting sticks
        torch_backend.set_matmul_precision(precision)
        jax_backend.set_matmul_precision(precision)
        assert torch_backend.accelerator_environment()["float32_matmul"] == TORCH_PRECISIONS[precision]
        assert jax_backend.accelerator_environment()["float32_matmul"] == \
            {"jax.config.jax_default_matmul_precision": JAX_PRECISIONS[precision]}
    import torch
    torch_backend.set_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True  # torch's own default beside IEEE matmuls: each switch read on its own
    assert torch_backend.accelerator_environment()["float32_matmul"] == {
        **TORCH_PRECISIONS["highest"], "torch.backends.cudnn.allow_tf32": True}


@pytest.mark.parametrize("precision, stablehlo", [("highest", "HIGHEST"), ("high", "HIGH")])
def test_the_jax_train_step_lowered_for_a_gpu_runs_every_matmul_at_the_precision_recorded(
        framework_precisions, precision, stablehlo):
    """What the record says, counted in the program that runs: every matmul of the train step, lowered for CUDA
    after the backend set --matmul-precision, at XLA's HIGHEST (IEEE float32) or HIGH (TF32 on a GPU), none left
    at the default."""
    import re

    import numpy as np

    from conftest import tiny_jax_gpt
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    backend = JaxBackend()
    backend.set_matmul_precision(precision)
    ids = np.ones((4, 32), np.int32)
    program = JitTrainStep(tiny_jax_gpt()).lowered_program((ids,), ids, np.ones((4, 32), np.float32), "cuda")
    matmuls = [line for line in program.splitlines() if "stablehlo.dot_general" in line]
    assert len(matmuls) > 20  # forward and backward of every projection, attention and the output layer
    assert {re.search(r"precision = \[(\w+), (\w+)\]", line).groups() for line in matmuls} == {(stablehlo,) * 2}
    assert backend.accelerator_environment()["float32_matmul"] == \
        {"jax.config.jax_default_matmul_precision": JAX_PRECISIONS[precision]}


def test_a_backend_that_reports_nothing_records_none():
    class Quiet(Backend):
        name = "quiet"

    assert accelerator_record(Quiet()) == {"cuda_version": None, "rocm_version": None, "cudnn_version": None,
                                        "float32_matmul": None, "sixteen_bit_matmul": None}


def test_torch_on_rocm_records_its_rocm_and_no_cudnn(monkeypatch):
    """torch's cuDNN on ROCm is MIOpen: its version (3003000 for MIOpen 3.3) read as cuDNN's would be 300.3.0."""
    import torch
    monkeypatch.setattr(torch.version, "hip", "6.4.43482")
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 3003000)
    record = accelerator_record(TorchBackend())
    assert (record["rocm_version"], record["cuda_version"], record["cudnn_version"]) == ("6.4.43482", None, None)
    assert environment._accelerator_text(record).startswith("ROCm 6.4.43482; float32 matmul: ")


def test_jax_on_rocm_records_its_rocm_as_its_client_names_it(monkeypatch):
    """XLA names a ROCm client's runtime 'rocm 60400' (major * 10000 + minor * 100 + patch), a CUDA one's
    'cuda 12080'; JAX's own code tells them apart by that name."""
    import jax
    for platform_version, recorded in (("rocm 60400", "6.4.0"), ("rocm 70102", "7.1.2"), ("cuda 12080", None),
                                       ("cpu", None)):
        device = SimpleNamespace(client=SimpleNamespace(platform_version=platform_version))
        monkeypatch.setattr(jax, "devices", lambda device=device: [device])
        assert accelerator_record(JaxBackend())["rocm_version"] == recorded, platform_version


def test_cudnn_versions_read_in_both_numberings():
    assert cudnn_version_text(90800) == "9.8.0"
    assert cudnn_version_text(91002) == "9.10.2"
    assert cudnn_version_text(8902) == "8.9.2"
    assert cudnn_version_text(None) is None


def test_the_framework_variables_are_recorded_set_or_not():
    recorded = arithmetic_environment_variables({
        "XLA_FLAGS": "--xla_gpu_autotune_level=0", "JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT": "100", "HOME": "/root", "PATH": "/usr/bin"})
    assert recorded["XLA_FLAGS"] == "--xla_gpu_autotune_level=0"
    assert recorded["NVIDIA_TF32_OVERRIDE"] is None  # named ones appear unset
    assert recorded["JAX_PLATFORMS"] == "cpu" and recorded["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert recorded["TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT"] == "100"
    assert "HOME" not in recorded and "PATH" not in recorded


def test_the_gpu_and_its_driver_are_read_from_the_driver(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "_nvml_driver_version", lambda: None)  # a GPU machine's NVML answers first
    version_file = tmp_path / "version"
    version_file.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC "
                            "2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    assert nvidia_gpu(str(version_file), nvidia_smi="absent-nvidia-smi") == \
        {"gpu_present": True, "nvidia_driver_version": "550.54.15"}
    assert nvidia_gpu(str(tmp_path / "missing"), nvidia_smi="absent-nvidia-smi") == \
        {"gpu_present": False, "nvidia_driver_version": None}
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 PCIe (UUID: GPU-0000)'\n")
    smi.chmod(0o755)
    assert nvidia_gpu(str(tmp_path / "missing"), nvidia_smi=str(smi))["gpu_present"] is True


def kfd_node(topology, node, **properties):
    (topology / node).mkdir(parents=True)
    (topology / node / "properties").write_text("".join(f"{key} {value}\n" for key, value in properties.items()))


def test_amd_gpus_and_their_architectures_are_read_from_the_rocm_driver(tmp_path):
    """As amdkfd describes an MI300X and an MI250X beside the CPU: each node with SIMD units is a GPU, its target
    version the architecture; a node that names none is left out, and a machine without the driver has none."""
    topology = tmp_path / "nodes"
    kfd_node(topology, "0", cpu_cores_count=96, simd_count=0, gfx_target_version=0)
    kfd_node(topology, "1", cpu_cores_count=0, simd_count=1216, gfx_target_version=90402)
    kfd_node(topology, "2", simd_count=440, gfx_target_version=90010)
    kfd_node(topology, "10", simd_count=192, gfx_target_version=110000)
    kfd_node(topology, "3", simd_count=440)
    assert amd_gpus(str(topology)) == ["gfx942", "gfx90a", "gfx1100"]
    assert amd_gpus(str(tmp_path / "missing")) == []


def test_each_vendors_gpus_are_told_apart_by_its_own_driver(monkeypatch):
    """A machine with both kinds whose NVIDIA driver gives no version still has NVIDIA GPUs: the vendor is the
    driver's answer, not inferred from a missing version."""
    def machine(nvidia, driver, amd):
        monkeypatch.setattr(environment, "nvidia_gpu", lambda: {"gpu_present": nvidia, "nvidia_driver_version": driver})
        monkeypatch.setattr(environment, "amd_gpus", lambda: amd)
        return environment.gpus_present()

    amd_only = machine(False, None, ["gfx942"] * 8)
    assert amd_only["gpu_present"] and only_amd_gpus(amd_only) and gpu_row(amd_only) == "AMD gfx942 x8"
    both_unversioned = machine(True, None, ["gfx942"] * 8)
    assert not only_amd_gpus(both_unversioned)
    assert gpu_row(both_unversioned) == "NVIDIA, driver version unknown; AMD gfx942 x8"
    assert gpu_row(machine(True, "550.54.15", ["gfx942"] * 8)) == "NVIDIA, driver 550.54.15; AMD gfx942 x8"
    nvidia_only = machine(True, None, [])
    assert not only_amd_gpus(nvidia_only) and gpu_row(nvidia_only) == "NVIDIA, driver version unknown"
    neither = machine(False, None, [])
    assert not neither["gpu_present"] and gpu_row(neither) == "no NVIDIA or AMD GPU"


CPU_BACKENDS = {"jax": {"available": True, "device": {"kind": "cpu", "name": "EPYC", "count": 1}},
                "torch": {"available": True, "device": {"kind": "gpu", "name": "NVIDIA H100 PCIe", "count": 1}},
                "other": {"available": False, "reason": "not installed"}}


def test_a_backend_on_the_cpu_of_a_gpu_machine_is_warned_of():
    assert cpu_only_backend_warnings(CPU_BACKENDS, gpu_present=False) == []
    assert cpu_only_backend_warnings(CPU_BACKENDS, gpu_present=True) == [
        "this machine has an NVIDIA GPU but backend 'jax' sees only the CPU; install a CUDA build of its "
        "framework: pip install 'mtbench[jax-cuda]'"]
    assert cpu_only_backend_warnings(CPU_BACKENDS, gpu_present=True, amd=True) == [
        "this machine has an AMD GPU but backend 'jax' sees only the CPU; install a ROCm build of its framework: "
        "JAX's ROCm plugins (https://docs.jax.dev/en/latest/installation.html#amd-gpu-linux)"]


def mtbench_env(*args, gpu_present):
    """`mtbench env ARGS` in a fresh process whose driver check answers `gpu_present`."""
    probe = ("import sys\n"
             "from mtbench.runner.measurement import environment\n"
             f"environment.nvidia_gpu = lambda: {{'gpu_present': {gpu_present}, 'nvidia_driver_version': None}}\n"
             "from mtbench.cli import main\n"
             f"main({['env', *args]!r})\n")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=cli_environment({"COLUMNS": "400"}))


@cpu_machine_only  # a stand-in driver says there is a GPU, which the backends here do not see
def test_mtbench_env_warns_of_each_cpu_only_backend_on_a_gpu_machine():
    shown = mtbench_env(gpu_present=True)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if "sees only the CPU" in line]
    assert len(lines) == 2
    assert "backend 'jax' sees only the CPU" in lines[0] and "pip install 'mtbench[jax-cuda]'" in lines[0]
    assert "backend 'torch' sees only the CPU" in lines[1] and "pip install --force-reinstall torch" in lines[1]
    described = mtbench_env("--json", gpu_present=False)
    assert described.returncode == 0, described.stderr
    data = json.loads(described.stdout)
    assert data["device_warnings"] == [] and data["host"]["gpu_present"] is False
    assert set(data["backends"]["jax"]["accelerator"]) == {"cuda_version", "rocm_version", "cudnn_version",
                                                             "float32_matmul", "sixteen_bit_matmul"}


def test_the_commit_is_the_checkouts_own_and_says_when_a_tracked_file_differs(tmp_path):
    """A checkout's commit, '-dirty' while a tracked file is changed (an untracked file changes nothing that ran);
    no commit for a package copied into another repository or outside any."""
    def git(*args, cwd=tmp_path / "checkout"):
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()

    checkout = tmp_path / "checkout"
    (checkout / "mtbench").mkdir(parents=True)
    (checkout / "mtbench" / "__init__.py").write_text("")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    sha = git("rev-parse", "HEAD")
    assert len(sha) == 40 and environment.git_commit(str(checkout)) == sha
    (checkout / "notes.txt").write_text("untracked")
    assert environment.git_commit(str(checkout)) == sha
    (checkout / "mtbench" / "__init__.py").write_text("changed = True\n")
    assert environment.git_commit(str(checkout)) == sha + "-dirty"
    assert environment.git_commit(str(checkout / "mtbench")) is None  # inside a repository, not its top
    (tmp_path / "elsewhere").mkdir()
    assert environment.git_commit(str(tmp_path / "elsewhere")) is None
