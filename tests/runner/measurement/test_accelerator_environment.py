"""What a result's `env` says of the accelerator software and the variables that change the arithmetic, read
on this CPU-only machine; and the warning `mtbench env` gives when a GPU is present that a backend does not see,
shown with a stand-in for the driver's answer."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import cli_environment
from mtbench import Backend, cudnn_version_text
from mtbench.plugins.backends.jax_backend import JaxBackend
from mtbench.plugins.backends.torch_backend import TorchBackend
from mtbench.runner.measurement.environment import (NVIDIA_VERSION_FILE, accelerator_record,
                                                    arithmetic_environment_variables, cpu_only_backend_warnings,
                                                    nvidia_gpu, run_environment)

GPU_MACHINE = os.path.exists(NVIDIA_VERSION_FILE) or shutil.which("nvidia-smi") is not None
cpu_machine_only = pytest.mark.skipif(GPU_MACHINE, reason="this machine has an NVIDIA driver")


@cpu_machine_only
@pytest.mark.parametrize("backend", [JaxBackend(), TorchBackend()], ids=["jax", "torch"])
def test_the_run_environment_has_the_accelerator_fields_empty_on_a_cpu(backend, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
    env = run_environment(backend)
    assert env["device"]["kind"] == "cpu"
    assert env["gpu_present"] is False
    assert env["nvidia_driver_version"] is None
    assert env["cuda_version"] is None and env["cudnn_version"] is None
    assert env["framework_env"]["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    assert env["framework_env"]["NVIDIA_TF32_OVERRIDE"] is None
    json.dumps(env)  # all of it goes into the result file


def test_each_framework_reports_its_float32_matmul_settings():
    import jax
    import torch
    assert JaxBackend().accelerator_environment()["float32_matmul"] == \
        {"jax.config.jax_default_matmul_precision": jax.config.jax_default_matmul_precision}
    torch_settings = TorchBackend().accelerator_environment()["float32_matmul"]
    assert torch_settings["torch.backends.cuda.matmul.allow_tf32"] is torch.backends.cuda.matmul.allow_tf32
    assert torch_settings["torch.backends.cudnn.allow_tf32"] is torch.backends.cudnn.allow_tf32
    assert torch_settings["torch.get_float32_matmul_precision()"] == torch.get_float32_matmul_precision()


def test_a_backend_that_reports_nothing_records_none():
    class Quiet(Backend):
        name = "quiet"

    assert accelerator_record(Quiet()) == {"cuda_version": None, "cudnn_version": None, "float32_matmul": None,
                                        "sixteen_bit_matmul": None}


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


def test_the_gpu_and_its_driver_are_read_from_the_driver(tmp_path):
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


CPU_BACKENDS = {"jax": {"available": True, "device": {"kind": "cpu", "name": "EPYC", "count": 1}},
                "torch": {"available": True, "device": {"kind": "gpu", "name": "NVIDIA H100 PCIe", "count": 1}},
                "other": {"available": False, "reason": "not installed"}}


def test_a_backend_on_the_cpu_of_a_gpu_machine_is_warned_of():
    assert cpu_only_backend_warnings(CPU_BACKENDS, gpu_present=False) == []
    assert cpu_only_backend_warnings(CPU_BACKENDS, gpu_present=True) == [
        "this machine has an NVIDIA GPU but backend 'jax' sees only the CPU; install a CUDA build of its "
        "framework: pip install 'mtbench[jax-cuda]'"]


def mtbench_env(*args, gpu_present):
    """`mtbench env ARGS` in a fresh process whose driver check answers `gpu_present`."""
    probe = ("import sys\n"
             "from mtbench.runner.measurement import environment\n"
             f"environment.nvidia_gpu = lambda: {{'gpu_present': {gpu_present}, 'nvidia_driver_version': None}}\n"
             "from mtbench.cli import main\n"
             f"main({['env', *args]!r})\n")
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=cli_environment({"COLUMNS": "400"}))


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
    assert set(data["backends"]["jax"]["accelerator"]) == {"cuda_version", "cudnn_version", "float32_matmul",
                                                             "sixteen_bit_matmul"}
