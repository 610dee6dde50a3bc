"""The peak FLOP/s that MFU divides by: a datasheet figure on accelerators, the fastest measured matmul on CPUs."""

import json
import os

from mtbench.runner.files import write_json_atomic
from mtbench.runner.measurement.devices import describe_backend
from mtbench.runner.measurement.flops import compute_dtype

# Dense peak FLOP/s from vendor datasheets (without sparsity), by device name fragment and dtype class.
DATASHEET_PEAKS = {
    "H200": {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12,
             "source": "NVIDIA H200 datasheet (SXM, dense)"},
    "H100": {"float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12,
             "source": "NVIDIA H100 datasheet (SXM, dense)"},
    "A100": {"float32": 19.5e12, "tf32": 156e12, "bfloat16": 312e12, "float16": 312e12,
             "source": "NVIDIA A100 datasheet (dense)"},
    "TPU v4": {"float32": 275e12, "bfloat16": 275e12, "float16": 275e12, "source": "Google Cloud TPU v4 documentation"},
    "TPU v5": {"float32": 197e12, "bfloat16": 197e12, "float16": 197e12, "source": "Google Cloud TPU v5e documentation"},
}


def datasheet_peak(device_name, dtype):
    for fragment, peaks in DATASHEET_PEAKS.items():
        if fragment.lower() in (device_name or "").lower():
            return peaks.get(compute_dtype(dtype)), peaks["source"]
    return None, None


def device_peak(backend, device, dtype, cache_dir, all_backends=()):
    """(peak FLOP/s, source). Accelerators: the datasheet. CPUs: the fastest square matmul measured on this CPU
    model in this dtype by any backend of `all_backends` whose framework is installed and runs on the CPU. One
    framework's matmul may reach half of another's on the same cores (on this project's 2-core EPYC, torch's
    float32 matmul reaches 235 GFLOP/s where XLA's reaches 525): the hardware's peak is the best of them, so
    that every backend's MFU is measured against the same figure. Measurements are cached per CPU model (`mtbench
    env --calibrate` redoes them)."""
    if device.get("kind") != "cpu":
        peak, source = datasheet_peak(device.get("name"), dtype)
        return peak, source or f"no datasheet peak known for {device.get('name')}"
    dtype, device_name = compute_dtype(dtype), device.get("name")
    candidates = [backend] + [other for other in all_backends if other.name != backend.name]
    measured = {}
    for candidate in candidates:
        path = calibration_path(cache_dir, candidate.name, dtype, device_name)
        if os.path.exists(path):
            with open(path) as f:
                cached = json.load(f)
            measured[candidate.name] = (cached["flops_per_s"], cached["source"])
        elif candidate is backend:
            measured[candidate.name] = calibrate(candidate, dtype, device_name, cache_dir)
        elif _runs_on_cpu(candidate):
            try:
                measured[candidate.name] = calibrate(candidate, dtype, device_name, cache_dir)
            except Exception:  # a plugin backend without a matmul measurement (or one that fails) sets no peak
                pass
    peak, source = max(measured.values())
    if len(measured) > 1:
        source += f" (the fastest of {', '.join(sorted(measured))} on this CPU)"
    return peak, source


def _runs_on_cpu(backend):
    """Whether `backend`'s framework is installed, starts, and computes on the CPU by default (a framework that
    would measure a GPU must not set a CPU's peak)."""
    description = describe_backend(backend)
    return description["available"] and description["device"].get("kind") == "cpu"


def calibration_path(cache_dir, backend_name, dtype, device_name):
    safe = "".join(c if c.isalnum() else "-" for c in (device_name or "cpu"))
    return os.path.join(cache_dir, "calibration", f"{backend_name}-{dtype}-{safe}.json")


def calibrate(backend, dtype, device_name, cache_dir, size=2048):
    flops_per_s = backend.matmul_flops_per_s(dtype, size)
    source = f"measured: {size}x{size} {dtype} matmul on {backend.name}, median of repeats"
    write_json_atomic(calibration_path(cache_dir, backend.name, dtype, device_name),
                      {"flops_per_s": flops_per_s, "source": source})
    return flops_per_s, source
