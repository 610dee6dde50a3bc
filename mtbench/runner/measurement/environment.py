"""What this machine offers mtbench: versions, each backend's framework and devices, and the plugins that would
load; and the environment written beside every figure of a result. Never imports keras (which would fix a
backend); each framework is imported through its backend plugin, and a framework that is missing or broken is
described, not fatal."""

import importlib.metadata
import os
import platform
import subprocess

from mtbench.plugins import manager as plugins
from mtbench.plugins.api import cpu_count, cpu_model
from mtbench.runner.measurement.devices import describe_backend
from mtbench.runner.measurement.peaks import calibrate, device_peak


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit():
    """The commit of the checkout mtbench runs from, or None: an installed mtbench (or one copied into some other
    repository) has no commit of its own, and a commit of the enclosing repository would be someone else's."""
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


def host_environment():
    """Versions and hardware, from package metadata and the OS: describing a framework never imports it."""
    from mtbench import __version__
    return {
        "python": platform.python_version(),
        **{package: _version(package) for package in PACKAGES},
        "cpu_model": cpu_model(),
        "cpu_count": cpu_count(),
        "platform": platform.platform(),
        "mtbench": __version__,
        "mtbench_git_commit": _git_commit(),
    }


def run_environment(backend):
    """The host, and the framework and devices of the backend this run used."""
    return {**host_environment(), "backend_versions": backend.framework_versions(),
            "device": backend.device_info()}


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
                flops, source = calibrate(registry.backends[name], dtype, device.get("name"), cache_dir)
            else:
                flops, source = device_peak(backend, device, dtype, cache_dir)
            peaks[dtype] = {"flops_per_s": flops, "source": source}
        backend_description["peaks"] = peaks


def describe_environment(registry):
    return {
        "host": host_environment(),
        "backends": {name: describe_backend(backend) for name, backend in sorted(registry.backends.items())},
        "extras": {name: {"backends": list(extra.backends), "description": extra.description,
                          "plugin": registry.provider[("extras", name)]}
                   for name, extra in sorted(registry.extras.items())},
        "plugins": plugins.plugin_descriptions(),
        "warnings": list(registry.warnings),
    }


def environment_rows(description):
    """(section, name, value) rows for the terminal table."""
    host = description["host"]
    commit = host.get("mtbench_git_commit")
    rows = [
        ("mtbench", "version", host["mtbench"] + (f" (git {commit})" if commit else "")),
        ("host", "python", host["python"]),
        ("host", "platform", host["platform"]),
        ("host", "cpu", f"{host['cpu_model']}, {host['cpu_count']} cores"),
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
        for dtype, peak in backend.get("peaks", {}).items():
            figure = "unknown" if peak["flops_per_s"] is None else f"{peak['flops_per_s'] / 1e12:,.3f} TFLOP/s"
            rows.append(("peak", f"{name} {dtype}", f"{figure} ({peak['source']})"))
    rows += [("extra", name, f"{', '.join(extra['backends'])} (plugin {extra['plugin']})")
             for name, extra in description["extras"].items()]
    if not description["extras"]:
        rows.append(("extra", "(none)", "no extra is installed"))
    for plugin in description["plugins"]:
        provides = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in plugin["provides"].items())
        origin = "built-in" if plugin["builtin"] else f"version {plugin['version'] or '?'}"
        rows.append(("plugin", plugin["name"], f"{origin}; {provides or 'hooks only'}"))
    rows += [("warning", "plugin", text) for text in description["warnings"]]
    return rows
