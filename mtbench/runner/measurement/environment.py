"""What this machine offers mtbench: versions, each backend's framework and devices, and the plugins that would
load; and the environment written beside every figure of a result. Never imports keras (which would fix a
backend); each framework is imported through its backend plugin, and a framework that is missing or broken is
described, not fatal."""

import collections
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys

from mtbench.plugins import manager as plugins
from mtbench.figures import OTHERS_BOUND, peak_measurement_text
from mtbench.plugins.api import cpu_count, cpu_model
from mtbench.runner.measurement.devices import describe_backend
from mtbench.runner.measurement.peaks import calibrate, device_peak_record
from mtbench.runner.run_file import RUN_FILE_FORMAT


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(checkout=None):
    """The commit of the checkout mtbench runs from (`checkout`: its top directory, by default the one above the
    package), '-dirty' added where a tracked file differs from it; None for an installed mtbench (or one copied
    into some other repository), which has no commit of its own: a commit of the enclosing repository would be
    someone else's."""
    if checkout is None:
        import mtbench
        checkout = os.path.dirname(os.path.dirname(os.path.abspath(mtbench.__file__)))
    try:
        top = subprocess.run(["git", "-C", checkout, "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(checkout):
            return None
        commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", checkout, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


PACKAGES = ("keras", "jax", "jaxlib", "torch", "numpy", "sacrebleu", "sentencepiece")

# Environment variables that change what the frameworks compute, which kernels they run or on which devices;
# recorded whether set or not (null: unset).
ARITHMETIC_ENV_VARS = (
    "XLA_FLAGS",                         # XLA's compiler: autotuning, deterministic ops, fusions, host devices
    "NVIDIA_TF32_OVERRIDE",              # 0 turns TF32 off in cuBLAS and cuDNN, whatever a framework asked for
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",  # 1 turns TF32 on in torch's cuBLAS matmuls, whatever it was told
    "CUBLAS_WORKSPACE_CONFIG",           # set for deterministic cuBLAS, which then picks other kernels
    "CUDA_VISIBLE_DEVICES",              # which GPUs the frameworks see
    "CUDA_LAUNCH_BLOCKING",              # 1: every kernel launch waits for the kernel; no host/device overlap
    "PYTORCH_CUDA_ALLOC_CONF",           # torch's caching allocator: device memory figures and fragmentation
    "OMP_NUM_THREADS", "MKL_NUM_THREADS",  # the CPU threads of torch's and XLA's CPU kernels
)
# And every set variable that starts with one of these: JAX's configuration (JAX_PLATFORMS,
# JAX_DEFAULT_MATMUL_PRECISION, JAX_ENABLE_X64, ...), XLA's client allocator (preallocation, memory fraction),
# torch's cuDNN and BLAS library choices, inductor's autotuning (other kernels).
ARITHMETIC_ENV_PREFIXES = ("JAX_", "XLA_PYTHON_CLIENT_", "TORCH_CUDNN_", "TORCH_BLAS_", "TORCHINDUCTOR_MAX_AUTOTUNE")


def arithmetic_environment_variables(environ=None):
    """{name: value or None} of the environment variables above, as this process sees them."""
    environ = os.environ if environ is None else environ
    return {**{name: environ.get(name) for name in ARITHMETIC_ENV_VARS},
            **{name: value for name, value in sorted(environ.items()) if name.startswith(ARITHMETIC_ENV_PREFIXES)}}


NVIDIA_VERSION_FILE = "/proc/driver/nvidia/version"


def nvidia_gpu(version_file=NVIDIA_VERSION_FILE, nvidia_smi="nvidia-smi"):
    """{'gpu_present': bool, 'nvidia_driver_version': str or None}, asked of the NVIDIA driver, never of a
    framework (whose build may see only the CPU): a GPU is present when the driver's kernel module is loaded
    (`version_file`) or `nvidia-smi -L` lists one. The driver's version comes from NVML where pynvml is
    installed (`mtbench[energy]`), else from `version_file`."""
    try:
        with open(version_file) as f:
            module = f.read()
    except OSError:
        module = None
    present = module is not None or _nvidia_smi_lists_a_gpu(nvidia_smi)
    driver = _nvml_driver_version() if present else None
    if driver is None and module:
        found = re.search(r"Kernel Module(?: for \S+)?\s+(\d[\w.-]*)", module)
        driver = found.group(1) if found else None
    return {"gpu_present": present, "nvidia_driver_version": driver}


KFD_TOPOLOGY = "/sys/class/kfd/kfd/topology/nodes"


def amd_gpus(topology=KFD_TOPOLOGY):
    """The architectures of the machine's AMD compute GPUs (['gfx942', ...], empty for none), asked of the ROCm
    kernel driver (amdkfd) as rocminfo asks it, never of a framework: each node of its topology that has SIMD units
    is a GPU (the CPUs' nodes have none), its `gfx_target_version` the architecture (90402: gfx942, 90010:
    gfx90a)."""
    try:
        nodes = sorted(os.listdir(topology), key=lambda node: int(node) if node.isdigit() else -1)
    except OSError:
        return []
    found = []
    for node in nodes:
        try:
            with open(os.path.join(topology, node, "properties")) as f:
                properties = dict(line.split(None, 1) for line in f if len(line.split()) == 2)
            if int(properties.get("simd_count", 0)) > 0:
                version = int(properties["gfx_target_version"])
                found.append(f"gfx{version // 10000}{version // 100 % 100:x}{version % 100:x}")
        except (OSError, KeyError, ValueError):  # a node being torn down, or a driver that says less
            continue
    return found


def _nvidia_smi_lists_a_gpu(nvidia_smi):
    if shutil.which(nvidia_smi) is None:
        return False
    try:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return listing.returncode == 0 and any(line.startswith("GPU ") for line in listing.stdout.splitlines())


def _nvml_driver_version():
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # not installed, or no driver library
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def cpu_quota(cgroups="/sys/fs/cgroup", membership="/proc/self/cgroup"):
    """The CPU time a control group allows this process, in CPUs (a container run with `--cpus 1.5`: 1.5), or None
    where none is set: cgroup v2's `cpu.max`, else v1's CFS quota, of the process's own group or the mount's root
    (a container's view). A quota shares the cores by time: a CI job given 2 CPUs of a 64-core machine sees all 64
    in its affinity, and its figures are 2 CPUs'."""
    try:
        with open(membership) as f:
            groups = [line.rstrip("\n").split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        groups = []
    candidates = []
    for _, controllers, path in groups:
        if controllers == "":  # v2's one hierarchy
            candidates += [(os.path.join(cgroups + path, "cpu.max"), None), (os.path.join(cgroups, "cpu.max"), None)]
        elif "cpu" in controllers.split(","):
            for directory in (os.path.join(cgroups, controllers), os.path.join(cgroups, "cpu")):
                candidates += [(os.path.join(directory + path, "cpu.cfs_quota_us"), "cpu.cfs_period_us"),
                               (os.path.join(directory, "cpu.cfs_quota_us"), "cpu.cfs_period_us")]
    for quota_file, period_name in candidates:
        try:
            with open(quota_file) as f:
                quota, *rest = f.read().split()
            if period_name:
                with open(os.path.join(os.path.dirname(quota_file), period_name)) as f:
                    rest = f.read().split()
        except (OSError, ValueError):
            continue
        if quota in ("max", "-1") or not rest:
            return None
        return int(quota) / int(rest[0])
    return None


def host_environment():
    """Versions and hardware, from package metadata, the OS and the GPU driver: describing a framework never
    imports it."""
    from mtbench import __version__
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,  # which environment: compare may run each run in another's
        **{package: _version(package) for package in PACKAGES},
        "cpu_model": cpu_model(),
        "cpu_count": cpu_count(),
        "cpu_quota": cpu_quota(),
        "platform": platform.platform(),
        "mtbench": __version__,
        "mtbench_git_commit": git_commit(),
        **gpus_present(),
        "framework_env": arithmetic_environment_variables(),
    }


def gpus_present():
    """{'gpu_present', 'nvidia_gpu_present', 'nvidia_driver_version', 'amd_gpus'}: whether the machine has a GPU,
    an NVIDIA one, and which AMD ones, each vendor's asked of its own driver."""
    nvidia, amd = nvidia_gpu(), amd_gpus()
    return {"gpu_present": nvidia["gpu_present"] or bool(amd), "nvidia_gpu_present": nvidia["gpu_present"],
            "nvidia_driver_version": nvidia["nvidia_driver_version"], "amd_gpus": amd}


def accelerator_record(backend):
    """`Backend.accelerator_environment()` with each of its keys present (None where the backend reports none)."""
    reported = backend.accelerator_environment() or {}
    return {key: reported.get(key)
            for key in ("cuda_version", "rocm_version", "cudnn_version", "float32_matmul", "sixteen_bit_matmul")}


def run_environment(backend):
    """The host, and the framework, devices and accelerator software of the backend this run used."""
    return {**host_environment(), "backend_versions": backend.framework_versions(),
            "device": backend.device_info(), **accelerator_record(backend)}


def machine_identity(backend, device):
    """What a run's times depend on beyond its configuration: its devices (`device`, the run's
    `Backend.device_info()`: kind, name, count) and the versions of its framework, keras and mtbench. A resumed
    run's earlier steps count in its figures, so it continues only where this is the same."""
    from mtbench import __version__
    return {"device": {key: device.get(key) for key in ("kind", "name", "count")},
            "versions": {**backend.framework_versions(), "keras": _version("keras"), "mtbench": __version__}}


# How to install each built-in backend's framework with CUDA.
CUDA_BUILDS = {
    "jax": "pip install 'mtbench[jax-cuda]'",
    "torch": "pip install --force-reinstall torch (PyPI's Linux wheel is the CUDA build; the 'torch' extra pins "
             "the CPU build of a machine without a GPU)",
}
# And with ROCm, for the machine's ROCm version.
ROCM_BUILDS = {
    "jax": "JAX's ROCm plugins (https://docs.jax.dev/en/latest/installation.html#amd-gpu-linux)",
    "torch": "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/rocmX.Y",
}


def cpu_only_backend_warnings(backends, gpu_present, amd=False):
    """A warning for each available backend (`describe_environment`'s `backends`) that computes on the CPU of a
    machine that has an NVIDIA GPU (an AMD one where `amd`): its framework is a CPU-only build (or told to use the
    CPU), and a run would time the CPU. Each names the fix."""
    if not gpu_present:
        return []
    vendor, build, builds = ("AMD", "ROCm", ROCM_BUILDS) if amd else ("NVIDIA", "CUDA", CUDA_BUILDS)
    return [f"this machine has an {vendor} GPU but backend '{name}' sees only the CPU; install a {build} build of "
            f"its framework: {builds.get(name, 'see its plugin documentation')}"
            for name, backend in backends.items()
            if backend["available"] and backend["device"].get("kind") == "cpu"]


CALIBRATED_DTYPES = ("float32", "bfloat16")


def calibrate_peaks(description, registry, cache_dir):
    """Measures each available backend's matmul peak on this machine (float32 and bfloat16) and caches it for
    the MFU of later runs. A shared or busy machine gives a low peak, so run this when it is quiet."""
    for name, backend_description in description["backends"].items():
        if not backend_description["available"]:
            continue
        backend, device = registry.backends[name], backend_description["device"]
        peaks = {}
        for dtype in CALIBRATED_DTYPES:
            if device.get("kind") == "cpu":
                peaks[dtype] = calibrate(backend, dtype, device.get("name"), cache_dir)
            else:
                peaks[dtype] = device_peak_record(backend, device, dtype, cache_dir)
        backend_description["peaks"] = peaks


def _describe_backend(backend):
    description = describe_backend(backend)
    if description["available"]:
        try:
            description["accelerator"] = accelerator_record(backend)
        except Exception as error:  # a plugin's failure to say is a fact to show, not a reason to stop
            description["accelerator"] = {"error": f"{type(error).__name__}: {error}"}
    return description


def describe_environment(registry):
    host = host_environment()
    backends = {name: _describe_backend(backend) for name, backend in sorted(registry.backends.items())}
    return {
        "host": host,
        "backends": backends,
        "extras": {name: {"backends": list(extra.backends), "description": extra.description,
                          "plugin": registry.provider[("extras", name)]}
                   for name, extra in sorted(registry.extras.items())},
        "plugins": plugins.plugin_descriptions(),
        "warnings": list(registry.warnings),
        "device_warnings": cpu_only_backend_warnings(backends, host["gpu_present"], amd=only_amd_gpus(host)),
        "run_file_format": RUN_FILE_FORMAT,  # what `train --run-file` reads here (absent: no --run-file)
    }


def only_amd_gpus(host):
    """Whether the GPUs `host_environment` found are AMD's alone."""
    return bool(host.get("amd_gpus")) and not host["nvidia_gpu_present"]


def gpu_row(host):
    """What `mtbench env` shows of the machine's GPUs, as their drivers describe them."""
    shown = []
    if host["nvidia_gpu_present"]:
        shown.append(f"NVIDIA, driver {host['nvidia_driver_version'] or 'version unknown'}")
    counts = collections.Counter(host.get("amd_gpus") or [])
    if counts:
        shown.append("AMD " + ", ".join(f"{arch} x{count}" for arch, count in counts.items()))
    return "; ".join(shown) or "no NVIDIA or AMD GPU"


def environment_rows(description):
    """(section, name, value) rows for the terminal table."""
    host = description["host"]
    commit = host.get("mtbench_git_commit")
    rows = [
        ("mtbench", "version", host["mtbench"] + (f" (git {commit})" if commit else "")),
        ("host", "python", host["python"]),
        ("host", "platform", host["platform"]),
        ("host", "cpu", f"{host['cpu_model']}, {host['cpu_count']} cores"),
        ("host", "gpu", gpu_row(host)),
        ("host", "framework env", ", ".join(f"{name}={value}" for name, value in host["framework_env"].items()
                                            if value is not None) or "none set"),
    ]
    rows += [("package", name, host.get(name) or "not installed") for name in PACKAGES]
    for name, backend in description["backends"].items():
        if backend["available"]:
            device = backend["device"]
            versions = ", ".join(f"{k} {v}" for k, v in backend["versions"].items())
            value = f"{versions}; {device.get('kind')} x{device.get('count')}: {device.get('name')}"
        else:
            value = f"unavailable: {backend['reason']}"
        rows.append(("backend", name, value))
        if "accelerator" in backend:
            rows.append(("backend", f"{name} accelerator", _accelerator_text(backend["accelerator"])))
        for dtype, peak in backend.get("peaks", {}).items():
            figure = "unknown" if peak["flops_per_s"] is None else f"{peak['flops_per_s'] / 1e12:,.3f} TFLOP/s"
            measured = peak_measurement_text(peak.get("measured_at"), peak.get("load_average"), peak.get("cpus"),
                                             peak.get("threads"), peak.get("other_processes_percent"))
            if measured:
                figure += f", {measured}"
            rows.append(("peak", f"{name} {dtype}", f"{figure} ({peak['source']})"))
            if (peak.get("other_processes_percent") or 0) > OTHERS_BOUND:
                rows.append(("warning", "peak", f"{name} {dtype} was measured while other processes used "
                                                f"{peak['other_processes_percent']:.0f} % of the CPUs' time (bound "
                                                f"{OTHERS_BOUND:g} %): it reads low and every MFU of it high; "
                                                f"`mtbench env --calibrate` on a quiet machine measures it again"))
    rows += [("extra", name, f"{', '.join(extra['backends'])} (plugin {extra['plugin']})")
             for name, extra in description["extras"].items()]
    if not description["extras"]:
        rows.append(("extra", "(none)", "no extra is installed"))
    for plugin in description["plugins"]:
        provides = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in plugin["provides"].items())
        origin = "built-in" if plugin["builtin"] else f"version {plugin['version'] or '?'}"
        if plugin.get("status", "loaded") != "loaded":  # not loaded, failed to load, or broken: say why
            why = "; ".join(plugin.get("problems") or ())
            provides = f"{plugin['status']}{': ' + why if why else ''}" + (f"; {provides}" if provides else "")
        rows.append(("plugin", plugin["name"], f"{origin}; {provides or 'hooks only'}"))
    rows += [("warning", "plugin", text) for text in description["warnings"]]
    rows += [("warning", "device", text) for text in description["device_warnings"]]
    return rows


def _switches_text(switches):
    return ", ".join(f"{name} = {value}" for name, value in (switches or {}).items())


def _accelerator_text(accelerator):
    if "error" in accelerator:
        return f"unknown: {accelerator['error']}"
    settings = _switches_text(accelerator["float32_matmul"])
    sixteen_bit = _switches_text(accelerator.get("sixteen_bit_matmul"))
    rocm = accelerator.get("rocm_version")
    software = (f"ROCm {rocm}" if rocm else
                f"CUDA {accelerator['cuda_version'] or 'none'}, cuDNN {accelerator['cudnn_version'] or 'none'}")
    return (f"{software}; float32 matmul: {settings or 'not reported'}"
            + (f"; 16-bit matmul: {sixteen_bit}" if sixteen_bit else ""))
