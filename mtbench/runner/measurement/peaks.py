"""The peak FLOP/s that MFU divides by: a datasheet figure on accelerators, the fastest measured matmul on CPUs."""

import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
from typing import NamedTuple

from mtbench.errors import RunFailure
from mtbench.plugins.api import Backend
from mtbench.plugins.api.host import cpu_count
from mtbench.runner.files import write_json_atomic
from mtbench.runner.launch import process_cpus
from mtbench.runner.measurement.devices import describe_backend
from mtbench.runner.measurement.flops import compute_dtype
from mtbench.runner.measurement.load import load_average, other_processes_percent, sample_load


def _gpu(float32, tf32, bfloat16, source):
    """A GPU's peaks by arithmetic (float16 runs at the bfloat16 rate) and the datasheet they come from."""
    return {"float32": float32, "tf32": tf32, "bfloat16": bfloat16, "float16": bfloat16, "source": source}


def _amd(float32, bfloat16, source):
    """An AMD Instinct GPU's matrix peaks. Whether float32 matmuls at precision 'high' run as XF32 on ROCm depends
    on its libraries' versions and settings: no figure is given for them rather than a wrong one."""
    return {"float32": float32, "tf32": None, "bfloat16": bfloat16, "float16": bfloat16, "source": source}


def _tpu(bfloat16, source):
    """A TPU's MXU multiplies in bfloat16: every dtype counts against that peak, and its source says so."""
    return {"float32": bfloat16, "bfloat16": bfloat16, "float16": bfloat16, "arithmetic": "BF16 MXU",
            "source": source}


# Dense peak FLOP/s per chip from vendor datasheets (without sparsity: half the "with sparsity" figures), by the
# arithmetic the matmuls run in. `match` is a regular expression found, as whole words and in any case, in the
# device name as the frameworks report it (torch.cuda.get_device_name(), JAX's device_kind); where several
# match, the longest match wins, so "NVIDIA H100 PCIe" is the PCIe card and not the SXM one.
# "tf32": float32 matmuls run as TensorFloat-32 (matmul precision "high").
HOPPER_SXM = (67e12, 494.7e12, 989.4e12)   # H100 SXM, H200 SXM and GH200: the same peaks on their datasheets
HOPPER_NVL = (60e12, 417.5e12, 835.5e12)   # H100 NVL and H200 NVL, per GPU
DATASHEET_PEAKS = {
    "NVIDIA H100 SXM": {"match": r"h100", **_gpu(*HOPPER_SXM, "NVIDIA H100 SXM datasheet")},
    "NVIDIA H100 PCIe": {"match": r"h100 pcie", **_gpu(51e12, 378e12, 756e12, "NVIDIA H100 PCIe datasheet")},
    "NVIDIA H100 NVL": {"match": r"h100 nvl", **_gpu(*HOPPER_NVL, "NVIDIA H100 NVL datasheet (per GPU)")},
    "NVIDIA H200": {"match": r"h200", **_gpu(*HOPPER_SXM, "NVIDIA H200 SXM datasheet")},
    "NVIDIA H200 NVL": {"match": r"h200 nvl", **_gpu(*HOPPER_NVL, "NVIDIA H200 NVL datasheet")},
    "NVIDIA GH200": {"match": r"gh200", **_gpu(*HOPPER_SXM, "NVIDIA GH200 Grace Hopper datasheet")},
    # HGX B200's eight GPUs' figures over eight (1,000 W each). A GB200's GPUs run faster at more power; the
    # frameworks name them "NVIDIA GB200", which this pattern does not match.
    "NVIDIA B200": {"match": r"b200", **_gpu(75e12, 1125e12, 2250e12, "NVIDIA HGX B200 datasheet (per GPU)")},
    # 40 GB and 80 GB, SXM4 and PCIe: the same peaks.
    "NVIDIA A100": {"match": r"a100", **_gpu(19.5e12, 156e12, 312e12, "NVIDIA A100 datasheet")},
    "NVIDIA A10": {"match": r"a10", **_gpu(31.2e12, 62.5e12, 125e12, "NVIDIA A10 datasheet")},
    "NVIDIA L4": {"match": r"l4", **_gpu(30.3e12, 60e12, 121e12, "NVIDIA L4 datasheet")},
    "NVIDIA L40": {"match": r"l40", **_gpu(90.5e12, 90.5e12, 181.05e12, "NVIDIA L40 datasheet")},
    "NVIDIA L40S": {"match": r"l40s", **_gpu(91.6e12, 183e12, 362.05e12, "NVIDIA L40S datasheet")},
    # A GeForce card's 16-bit tensor rate with float32 accumulation, Keras's and cuBLAS's, is half its rate with
    # 16-bit accumulation, the one its marketing quotes.
    "NVIDIA GeForce RTX 4090": {"match": r"rtx 4090(?! d(?![a-z0-9]))",  # the 4090 D has fewer cores
                                **_gpu(82.6e12, 82.6e12, 165.2e12, "NVIDIA Ada Lovelace architecture whitepaper")},
    # One device per GPU (its SPX partition mode, the default): a partitioned MI300X is several devices, each with
    # a share of the compute units, which these figures do not describe.
    "AMD Instinct MI300X": {"match": r"mi300x", **_amd(163.4e12, 1307.4e12, "AMD Instinct MI300X datasheet (SPX)")},
    "AMD Instinct MI325X": {"match": r"mi325x", **_amd(163.4e12, 1307.4e12, "AMD Instinct MI325X datasheet (SPX)")},
    "TPU v4": {"match": r"tpu v4", **_tpu(275e12, "Google Cloud TPU v4 documentation")},
    # JAX calls a v5e "TPU v5 lite" and a v5p "TPU v5" (or "TPU v5p").
    "TPU v5e": {"match": r"tpu v5(?: lite|e|litepod)", **_tpu(197e12, "Google Cloud TPU v5e documentation")},
    "TPU v5p": {"match": r"tpu v5p?", **_tpu(459e12, "Google Cloud TPU v5p documentation")},
    "TPU v6e": {"match": r"tpu v6(?: lite|e)", **_tpu(918e12, "Google Cloud TPU v6e (Trillium) documentation")},
}
ARITHMETIC_NAMES = {"float32": "FP32", "tf32": "TF32", "bfloat16": "BF16", "float16": "FP16"}


def datasheet_entry(device_name):
    """The entry of DATASHEET_PEAKS whose pattern matches the longest part of `device_name`, or None."""
    best, best_length = None, 0
    for peaks in DATASHEET_PEAKS.values():
        found = re.search(rf"(?<![a-z0-9]){peaks['match']}(?![a-z0-9])", (device_name or "").lower())
        if found and len(found.group()) > best_length:
            best, best_length = peaks, len(found.group())
    return best


def peak_arithmetic(peaks, dtype, matmul_precision="highest"):
    """The arithmetic the matmuls of a run in `dtype` (a Keras dtype policy name) ran in: float32 with matmul
    precision 'high' runs as TF32 on a GPU that has it; anything else in its compute dtype."""
    arithmetic = compute_dtype(dtype)
    if arithmetic == "float32" and matmul_precision == "high" and "tf32" in peaks:
        return "tf32"
    return arithmetic


def datasheet_peak(device_name, dtype, matmul_precision="highest"):
    """(dense peak FLOP/s, source naming the device and the arithmetic), or (None, None) for an unknown device."""
    peaks = datasheet_entry(device_name)
    if peaks is None:
        return None, None
    arithmetic = peak_arithmetic(peaks, dtype, matmul_precision)
    name = peaks.get("arithmetic") or ARITHMETIC_NAMES.get(arithmetic, arithmetic)
    if peaks.get(arithmetic) is None:
        return None, f"{peaks['source']}: no {name} figure known for these matmuls"
    return peaks[arithmetic], f"{peaks['source']}, {name} dense"


def peak_record(flops_per_s, source, measured_at=None, load_average=None, cpus=None, threads=None,
                other_processes_percent=None):
    """A peak and where it comes from; `measured_at` (ISO 8601), `load_average` (the 1, 5 and 15 minute load
    averages as the measurement began), `cpus` (how many CPUs the measuring process could run on), `threads`
    (the framework's compute threads there, where its backend says) and `other_processes_percent` (the share of
    the CPUs' time other processes used while it measured: the load average lags by a minute) for a measured one,
    None for a datasheet figure."""
    return {"flops_per_s": flops_per_s, "source": source, "measured_at": measured_at, "load_average": load_average,
            "cpus": cpus, "threads": threads, "other_processes_percent": other_processes_percent}


def device_peak_record(backend, device, dtype, cache_dir, all_backends=(), matmul_precision="highest", cpus=None):
    """The peak MFU divides by, as a `peak_record`. Accelerators: the datasheet figure of the arithmetic the
    matmuls ran in (`matmul_precision`: float32 with 'high' is TF32 on GPUs that have it). CPUs: the fastest
    square matmul measured on this CPU model in this dtype by any backend of `all_backends` whose framework is
    installed and runs on the CPU. One framework's matmul may reach half of another's on the same cores (on this
    project's 2-core EPYC, XLA's bfloat16 matmul reaches 166 GFLOP/s where torch's reaches 418): the hardware's
    peak is the best of them, so that every backend's MFU is measured against the same figure. Measurements are
    cached per CPU model and count of CPUs measured on (`mtbench env --calibrate` redoes them), one process
    measuring at a time: a run pinned to some of the CPUs divides by their peak, not the machine's. `cpus`: the
    CPUs the measurements run on, in a process of their own (`launch.measuring_cpus`: this process's, or those a
    process of several on this machine shares with them, as one process holding its slice would measure that
    slice); None: in this process."""
    if device.get("kind") != "cpu":
        peak, source = datasheet_peak(device.get("name"), dtype, matmul_precision)
        return peak_record(peak, source or f"no datasheet peak known for {device.get('name')}")
    dtype, device_name = compute_dtype(dtype), device.get("name")
    candidates = [backend] + [other for other in all_backends if other.name != backend.name]
    measured, counted = {}, cpu_count() if cpus is None else len(cpus)
    for candidate in candidates:
        path = calibration_path(cache_dir, candidate.name, dtype, device_name, counted)
        with one_measurement_at_a_time(path):  # the run's other processes wait, off the CPUs, and read it
            if os.path.exists(path):
                measured[candidate.name] = read_calibration(path)
            elif not measures_matmuls(candidate):  # the docs ask it of a backend only for MFU: no peak, no crash
                continue
            elif candidate is backend:
                measured[candidate.name] = calibrate(candidate, dtype, device_name, cache_dir, replace=False,
                                                     cpus=cpus)
            elif cpus is not None or _runs_on_cpu(candidate):
                # Another framework is measured in a process of its own where there is one, which measures only
                # on the CPU: imported here, it would count in this process's memory.
                try:
                    measured[candidate.name] = calibrate(candidate, dtype, device_name, cache_dir, replace=False,
                                                         cpus=cpus, here_if_that_fails=cpus is None)
                except Exception:  # a plugin backend without a matmul measurement (or one that fails) sets no peak
                    pass
    if not measured:
        return peak_record(None, f"backend '{backend.name}' measures no matmul (Backend.matmul_flops_per_s) and no "
                                 f"other backend installed here measured this CPU")
    best = dict(max(measured.values(), key=lambda record: (record["flops_per_s"], record["source"])))
    if len(measured) > 1:
        best["source"] += f" (the fastest of {', '.join(sorted(measured))} on this CPU)"
    return best


def measures_matmuls(backend):
    """Whether `backend` measures a matmul's FLOP/s: a plugin backend may keep the API's default, which cannot."""
    return type(backend).matmul_flops_per_s is not Backend.matmul_flops_per_s


def device_peak(backend, device, dtype, cache_dir, all_backends=(), matmul_precision="highest"):
    """(peak FLOP/s, source) of `device_peak_record`."""
    record = device_peak_record(backend, device, dtype, cache_dir, all_backends, matmul_precision)
    return record["flops_per_s"], record["source"]


def _runs_on_cpu(backend):
    """Whether `backend`'s framework is installed, starts, and computes on the CPU by default (a framework that
    would measure a GPU must not set a CPU's peak)."""
    description = describe_backend(backend)
    return description["available"] and description["device"].get("kind") == "cpu"


def calibration_path(cache_dir, backend_name, dtype, device_name, cpus):
    """Where the peak measured on `cpus` CPUs of this model is cached. (Files cached before the CPUs were counted
    are named without them, and are measured again: a process of several measured its share of the CPUs.)"""
    safe = "".join(c if c.isalnum() else "-" for c in (device_name or "cpu"))
    return os.path.join(cache_dir, "calibration", f"{backend_name}-{dtype}-{safe}-{cpus}cpus.json")


def read_calibration(path):
    """A cached measurement as a `peak_record`; a file written before measurements carried their time and load
    reads with those None."""
    with open(path) as f:
        cached = json.load(f)
    return peak_record(cached["flops_per_s"], cached["source"], cached.get("measured_at"),
                       cached.get("load_average"), cached.get("cpus"), cached.get("threads"),
                       cached.get("other_processes_percent"))


@contextlib.contextmanager
def one_measurement_at_a_time(path):
    """Holds the lock of the calibration at `path` (where the OS has file locks): processes that find no cached
    peak together measure it once, one after the other, rather than all at once on shared cores, each measuring
    a share of them."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


PROBE_SIZE = 256          # a first, small matmul: how fast this dtype runs here at all
MATMUL_SECONDS = 0.25     # what one measured matmul may take: 13 of them are run, so a calibration takes seconds


def calibration_size(backend, dtype, largest=2048):
    """The matmul size to measure `dtype`'s peak with: `largest`, or smaller where one matmul of it would take
    more than MATMUL_SECONDS. A CPU without instructions for a 16-bit dtype emulates it at a rate that does not
    grow with the size (torch's float16 on this project's 2-core EPYC: 2.7 GFLOP/s at 512 and at 1280, where a
    1280 matmul takes 1.5 s and a calibration at 2 s a matmul took 20 s; a 2048 bfloat16 matmul took 64 s on a CPU
    without bfloat16). A CPU's fast dtypes still measure at `largest`."""
    probed = backend.matmul_flops_per_s(dtype, PROBE_SIZE)
    fitting = int((MATMUL_SECONDS * probed / 2) ** (1 / 3)) // PROBE_SIZE * PROBE_SIZE
    return max(PROBE_SIZE, min(largest, fitting))


def calibrate(backend, dtype, device_name, cache_dir, size=2048, replace=True, cpus=None, here_if_that_fails=True):
    """Measures `backend`'s matmul peak in `dtype` on matmuls of `size` (smaller where they would be slow:
    `calibration_size`), caches it with when it was measured and how busy the host was as it began (a busy host
    gives a low peak), and returns it as a `peak_record`. `replace=False` (a run that found no measurement): where
    another process cached one meanwhile, that one is kept and returned, so that runs started together divide by
    one peak. `cpus`: measured in a process of its own that runs on these CPUs (`measure_on`), else (or where
    that process fails, unless not `here_if_that_fails`: it raises) here; the record and its file name say how
    many CPUs it ran on, and its source why a measuring process that found the backend failed (the run goes
    on)."""
    measured_at = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    # Counted on the CPUs it measures on: a neighbour elsewhere on a large machine takes nothing from it.
    measured_on = cpus if cpus is not None else process_cpus()
    load, before = load_average(), sample_load(nvidia_smi=None, cpus=measured_on)
    failure = ""
    try:
        size, flops_per_s, measured_cpus, threads = (measure_here(backend, dtype, size) if cpus is None
                                                     else measure_on(cpus, backend.name, dtype, size))
    except RunFailure as failed:  # measured here, under this process's count of CPUs
        if not here_if_that_fails:
            raise
        size, flops_per_s, measured_cpus, threads = measure_here(backend, dtype, size)
        if not isinstance(failed, BackendNotInProcess):  # (one registered by code, not installed, is measured here)
            failure = f", in this process: {failed}"
    # The measuring process has been waited for: its CPU time is this one's own (`own_cpu_seconds`).
    others = other_processes_percent(before, sample_load(nvidia_smi=None, cpus=measured_on))
    record = peak_record(flops_per_s, f"measured: {size}x{size} {dtype} matmul on {backend.name}, median of "
                                      f"repeats{failure}", measured_at, load, measured_cpus, threads, others)
    path = calibration_path(cache_dir, backend.name, dtype, device_name, measured_cpus)
    if not write_json_atomic(path, record, replace=replace):
        return read_calibration(path)
    return record


# The exit statuses of `print_measurement` for a backend its process does not find, and for one that computes on
# another device than the CPU there; any other failure is the measurement's own, which the record reports.
UNKNOWN_BACKEND_EXIT = 3
NOT_ON_THE_CPU_EXIT = 4


class BackendNotInProcess(RunFailure):
    """The measuring process does not find the backend (registered by code in this process, not installed)."""


class Measurement(NamedTuple):
    """A matmul peak as measured: the matmul's size, its FLOP/s, the CPUs the measuring process could run on and
    its framework's compute threads (None where the backend's `device_info` does not say)."""
    size: int
    flops_per_s: float
    cpus: int
    threads: int = None


def measure_here(backend, dtype, largest):
    """`backend`'s `dtype` matmul peak, measured in this process: a `Measurement`."""
    size = calibration_size(backend, dtype, largest)
    return Measurement(size, backend.matmul_flops_per_s(dtype, size), cpu_count(),
                       backend.device_info().get("threads"))


def measure_on(cpus, backend_name, dtype, largest):
    """`measure_here`'s `Measurement` from a process of its own on `cpus`, its frameworks' threads as many as they
    take there (torchrun's OMP_NUM_THREADS, or a share's, left out)."""
    environ = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    # A CPU's peak, on a machine with a GPU too: the frameworks are shown the CPU alone.
    environ.update(CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    # The mtbench this process runs (a checkout's, perhaps not installed) and its plugins.
    import mtbench
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(mtbench.__file__)))
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, environ.get("PYTHONPATH")]))
    program = ("import sys; from mtbench.runner.measurement.peaks import print_measurement; "
               "print_measurement(*sys.argv[1:])")
    # The process takes its CPUs itself: this one may run threads (gloo's, XLA's), and code run between fork and
    # exec in a process with threads may deadlock.
    proc = subprocess.run([sys.executable, "-c", program, ",".join(map(str, cpus)), backend_name, dtype,
                           str(largest)], capture_output=True, text=True, env=environ)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        failure = BackendNotInProcess if proc.returncode == UNKNOWN_BACKEND_EXIT else RunFailure
        raise failure(f"measuring {backend_name}'s {dtype} matmul peak on CPUs {cpus} failed: {last[:300]}")
    return Measurement(**json.loads(proc.stdout.strip().splitlines()[-1]))


def print_measurement(cpus, backend_name, dtype, largest):
    """`measure_on`'s process: takes the CPUs `cpus` (comma-separated) before any framework starts its threads,
    and prints `measure_here`'s answer as JSON."""
    os.sched_setaffinity(0, [int(cpu) for cpu in cpus.split(",")])
    from mtbench.plugins.manager import registry
    backend = registry().backends.get(backend_name)
    if backend is None:
        print(f"no backend '{backend_name}' is installed", file=sys.stderr)
        sys.exit(UNKNOWN_BACKEND_EXIT)
    device = backend.device_info()
    if device.get("kind") != "cpu":  # a framework that would measure a GPU sets no CPU's peak
        print(f"{backend_name} computes on {device.get('name')} here, not on the CPU", file=sys.stderr)
        sys.exit(NOT_ON_THE_CPU_EXIT)
    print(json.dumps(measure_here(backend, dtype, int(largest))._asdict()))
