"""Where an mtbench process's start goes: what a train process imports before its data and model (mtbench's CLI,
then keras on the run's backend as `import_keras` imports it), timed by Python's `-X importtime` in fresh
processes, side by side, the median of --repeats. Every run pays it, and `mtbench compare` once per run: each
trains in a process of its own.

    python benchmarks/process_start.py [--backends jax,torch] [--repeats 5] [--top 8]

Prints, per backend, the seconds of the imports in all and the packages that took the most (each module's own
time, summed by top-level package); the last line is a JSON object of the same figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import Counter

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)

from benchmarks.overhead import hardware, versions  # noqa: E402

# A train process's imports up to its data: the CLI, then keras through mtbench's setup (the other backends'
# frameworks and keras's unused integrations hidden, as a run hides them).
CHILD = """
import sys, tempfile
import mtbench.cli
from mtbench.plugins.manager import registry
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import import_keras
plugins = registry()
import_keras(TrainConfig(backend=sys.argv[1], cache_dir=tempfile.mkdtemp()), plugins.backends[sys.argv[1]],
             registry=plugins)
"""


def package_seconds(importtime_lines):
    """{top-level package: seconds} of `-X importtime`'s lines, each module's own time summed by package."""
    seconds = Counter()
    for line in importtime_lines:
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        seconds[name.strip().split(".")[0]] += int(own) / 1e6
    return seconds


def one_start(backend):
    """{package: seconds} of one fresh process importing what a `backend` run imports."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", CHILD, backend], capture_output=True, text=True,
                          cwd=REPOSITORY)
    if proc.returncode != 0:
        raise SystemExit(f"the {backend} process failed: {proc.stderr.strip().splitlines()[-1]}")
    return package_seconds(proc.stderr.splitlines())


def measure(backend, repeats, top):
    starts = [one_start(backend) for _ in range(repeats)]
    packages = {name for start in starts for name in start}
    medians = {name: statistics.median(start.get(name, 0.0) for start in starts) for name in packages}
    return {"imports_s": statistics.median(sum(start.values()) for start in starts),
            "largest_s": dict(sorted(medians.items(), key=lambda item: -item[1])[:top])}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="jax,torch", help="comma-separated, each timed in processes of its own")
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per backend")
    parser.add_argument("--top", type=int, default=8, help="packages to name per backend")
    args = parser.parse_args(argv)
    for name in ("repeats", "top"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, not {getattr(args, name)}")
    from mtbench.plugins.manager import registry
    installed = registry().backends
    args.backends = args.backends.split(",")
    unknown = [name for name in args.backends if name not in installed]
    if unknown:
        parser.error(f"--backends: no backend '{unknown[0]}'; installed: {', '.join(sorted(installed))}")
    return args


def main(argv=None):
    args = parse_args(argv)
    summary = {"repeats": args.repeats, "versions": versions(), "hardware": hardware(), "backends": {}}
    for backend in args.backends:
        summary["backends"][backend] = figures = measure(backend, args.repeats, args.top)
        print(f"{backend}: {figures['imports_s']:.2f} s of imports (median of {args.repeats}); the largest:")
        for name, seconds in figures["largest_s"].items():
            print(f"  {name:24} {seconds:6.2f} s")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
