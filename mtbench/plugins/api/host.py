"""Facts about the host that every result carries beside its figures."""

import hashlib
import os
import platform
import resource
import time

import numpy as np


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def cudnn_version_text(number):
    """cuDNN's version number as cudnnGetVersion() gives it (90800 since cuDNN 9, 8902 before) as text: '9.8.0',
    '8.9.2'; None for None."""
    if not number:
        return None
    major_unit = 10000 if number >= 90000 else 1000
    return f"{number // major_unit}.{number % major_unit // 100}.{number % 100}"


def native_bfloat16(capability):
    """Whether a GPU of compute `capability` multiplies bfloat16 in its matrix units: for CUDA ((major, minor), as
    torch reports it, or JAX's '8.6') Ampere (8.0) and later; for AMD (its architecture, 'gfx90a' or ROCm's
    'gfx90a:sramecc+:xnack-') CDNA from MI100 (gfx908, gfx90a, gfx94x, gfx950) and RDNA 3 and later (gfx11, gfx12).
    Older GPUs emulate it, slower than float32; None or a form not known: False. What a backend's `device_info`
    reports as 'bfloat16', which `--dtype auto` reads."""
    if isinstance(capability, str):
        capability = capability.strip().lower()
        if capability.startswith("gfx"):
            return _amd_matrix_bfloat16(capability.split(":")[0].removeprefix("gfx"))
        try:
            capability = tuple(int(part) for part in capability.split(".")[:2])
        except ValueError:
            return False
    return capability is not None and tuple(capability) >= (8, 0)


def _amd_matrix_bfloat16(version):
    """'908' (major 9, then two hexadecimal digits), '1100': whether that AMD architecture has bfloat16 matrix
    instructions (MFMA from gfx908, WMMA from gfx11)."""
    if len(version) < 3 or not version[:-2].isdigit():
        return False
    major = int(version[:-2])
    try:
        step = int(version[-2:], 16)
    except ValueError:
        return False
    return major >= 11 or (major == 9 and step >= 0x08)


def peak_host_bytes():
    """Peak resident memory of this process: on Linux its own high-water mark since it started its program (VmHWM),
    not getrusage's ru_maxrss, which keeps the peak of the process that started it (a run started by a notebook or
    a test worker holding 1.2 GB read 1.2 GB however little it held); elsewhere ru_maxrss (bytes on macOS)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if platform.system() == "Darwin" else peak * 1024


def median_flops_per_s(run_once, flops, warmup=3, repeats=10):
    """FLOP/s of `run_once` (which must block until its work is done): median over repeats after warm-up."""
    for _ in range(warmup):
        run_once()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run_once()
        seconds.append(time.perf_counter() - t0)
    return flops / float(np.median(seconds))


def file_sha256(path):
    """The sha256 of the file at `path` (hex), read a MB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unusable_directory(directory):
    """Why `directory` cannot hold a cache ('CACHE/compile/jax-0.10.2-cpu cannot be made (Not a directory)'), or
    None, having made it where it was missing: a framework whose cache directory cannot be made compiles every
    program again without a word."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        return f"{directory} cannot be made ({error.strerror or error})"
    if not os.access(directory, os.W_OK):
        return f"{directory} cannot be written"
    return None
