"""Which keys of a result, compare or scores JSON docs/results.md does not name: every key must be told there."""

import os
import re

from conftest import REPOSITORY

# Objects whose keys are data, not fields: extra names, settings of a framework, shapes, run labels, sizes.
MAPS = {"extras_record", "config_changed_by", "env.float32_matmul", "env.sixteen_bit_matmul",
        "env.matmul_precision.reported", "env.backend_versions", "env.framework_env", "timing.compilations_by_shape",
        "host_syncs.events", "initial_weights_by_size", "speedups", "scaling", "noise_floor.figures", "summary[]",
        "run_warnings", "env.plugins"}


def documented_names():
    """Every name inside backticks in docs/results.md, and the options of docs/cli.md (`config` holds them under
    their Python names)."""
    with open(os.path.join(REPOSITORY, "docs", "results.md"), encoding="utf-8") as f:
        results = f.read()
    with open(os.path.join(REPOSITORY, "docs", "cli.md"), encoding="utf-8") as f:
        options = {option.replace("-", "_") for option in re.findall(r"`--([a-z][a-z0-9-]*)", f.read())}
    results = re.sub(r"^```.*?^```", "", results, flags=re.S | re.M)  # a fence's backticks would pair up spans
    names = {name for span in re.findall(r"`([^`]+)`", results) for name in re.findall(r"[A-Za-z_][\w-]*", span)}
    return names, options


def undocumented_keys(document, documented=None):
    """The dotted paths (`runs[].result.env.NAME`) of the keys that docs/results.md does not name (`documented`:
    `documented_names()`, read anew where not given)."""
    names, options = documented or documented_names()
    missing = []

    def walk(value, path):
        if isinstance(value, list):
            for item in value[:1]:  # the entries of a list share their keys
                walk(item, f"{path}[]")
            return
        if not isinstance(value, dict) or path.split("result.")[-1] in MAPS:
            return
        for key, item in value.items():
            at = f"{path}.{key}" if path else key
            is_option = path.endswith("config") and key in options
            if key not in names and not is_option:
                missing.append(at)
            walk(item, at)
    walk(document, "")
    return missing
