"""The result JSON: what it holds, how it is checked, and the environment written beside every figure."""

import importlib.metadata
import os
import platform
import subprocess

from mtbench.runner.hardware import cpu_count, cpu_model

SCHEMA_VERSION = 1

# Required keys and the types their values may take (None: the figure does not exist in this run, e.g. device
# memory on a CPU, which no framework reports).
NUMBER = (int, float)
MAYBE_NUMBER = (int, float, type(None))
SCHEMA = {
    "schema_version": int,
    "status": str,
    "backend": str,
    "extras": list,
    "config": dict,
    "env": {"python": str, "keras": str, "jax": (str, type(None)), "torch": (str, type(None)),
            "device": dict, "cpu_model": str, "cpu_count": int, "platform": str,
            "mtbench": str, "mtbench_git_commit": (str, type(None))},
    "data": {"corpus": str, "origin": str, "pairs": dict, "dropped_too_long": dict, "tokenizer": dict},
    "model": {"parameters": int},
    "timing": {"compile_s": NUMBER, "first_steps_s": NUMBER, "shapes_compiled": int,
               "step_s_median": MAYBE_NUMBER, "step_s_p90": MAYBE_NUMBER, "tokens_per_s": MAYBE_NUMBER,
               "train_s": NUMBER, "total_s": NUMBER, "phases_s": dict, "steps": int},
    "utilization": {"model_flops_per_s": MAYBE_NUMBER, "peak_flops_per_s": MAYBE_NUMBER, "mfu": MAYBE_NUMBER},
    "memory": {"peak_host_bytes": int, "peak_device_bytes": (int, type(None))},
    "metrics": {"train_loss": NUMBER, "val_loss": NUMBER, "test_loss": NUMBER, "val_accuracy": NUMBER,
                "test_accuracy": NUMBER, "bleu": NUMBER, "chrf": NUMBER, "bleu_signature": str,
                "chrf_signature": str},
    "history": list,
    "hypotheses_file": str,
    "references_file": str,
}


def schema_errors(result, schema=SCHEMA, prefix=""):
    """Every way `result` departs from the schema, as 'key: problem' strings (empty when it conforms)."""
    errors = []
    for key, expected in schema.items():
        name = f"{prefix}{key}"
        if key not in result:
            errors.append(f"{name}: missing")
        elif isinstance(expected, dict):
            if isinstance(result[key], dict):
                errors.extend(schema_errors(result[key], expected, prefix=f"{name}."))
            else:
                errors.append(f"{name}: expected an object")
        elif isinstance(result[key], bool) or not isinstance(result[key], expected):
            errors.append(f"{name}: {type(result[key]).__name__} is not {expected}")
    return errors


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit():
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
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


def environment(backend):
    """The host, and the framework and devices of the backend this run used."""
    return {**host_environment(), "backend_versions": backend.framework_versions(),
            "device": backend.device_info()}


def sidecar_paths(result_path):
    """Where the hypotheses and references of a result file live: beside it, one sentence a line."""
    stem = result_path[:-5] if result_path.endswith(".json") else result_path
    return f"{stem}.hyp.txt", f"{stem}.ref.txt"
