"""`mtbench compare`: one configuration trained on several backends and extras, each run in a fresh process, every
run starting from one weights file; then the parity check, the speed-ups and one combined JSON.

Keras fixes its backend when it is imported, so no process can hold two runs: this orchestrator imports no
framework and spawns `python -m mtbench` once for the weights file and once for each run.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from mtbench.errors import MtbenchError, RunFailure
from mtbench.runner.files import write_json_atomic, write_text_atomic
from mtbench.runner.results.parity import percent
from mtbench.runner.data.weights_file import read_weights_file
from mtbench.runner.measurement.environment import host_environment
from mtbench.runner.results.output import check_output_path
from mtbench.runner.results.report import COMPARE_KIND, LoadedRun, build_comparison, to_json_dict
from mtbench.runner.results.reporting import run_reporters
from mtbench.runner.setup import resolve_backend, resolve_extras

COMPARE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunSpec:
    backend: str
    extras: tuple = ()

    @property
    def label(self):
        return "+".join((self.backend, *self.extras))


def parse_run_spec(text):
    """'backend+extra+extra' -> RunSpec."""
    parts = [part.strip() for part in text.split("+")]
    if not all(parts):
        raise MtbenchError(f"--matrix: '{text.strip()}' is not of the form backend+extra+extra")
    return RunSpec(parts[0], tuple(parts[1:]))


def plan_runs(backends=None, extras=(), matrix=None):
    """The runs to compare: each backend of `backends` with every extra of `extras`, or the runs that `matrix`
    lists ('torch;torch+torch-compile;jax')."""
    if matrix is not None:
        if backends or extras:
            raise MtbenchError("give --matrix, or --backends with --extra, not both")
        specs = [parse_run_spec(item) for item in re.split(r"[;,]", matrix) if item.strip()]
    else:
        names = [name.strip() for name in (backends or "jax,torch").split(",") if name.strip()]
        specs = [RunSpec(name, tuple(extras)) for name in names]
    if not specs:
        raise MtbenchError("no runs to compare")
    labels = [spec.label for spec in specs]
    twice = next((label for i, label in enumerate(labels) if label in labels[:i]), None)
    if twice:
        raise MtbenchError(f"run '{twice}' is listed twice; use --repeats to run it again")
    return specs


def check_runs(specs, registry):
    """Every backend and extra exists, is installed and fits its run: checked before any process starts."""
    for spec in specs:
        try:
            resolve_extras(spec.extras, resolve_backend(spec.backend, registry), registry)
        except MtbenchError as error:
            raise MtbenchError(f"run '{spec.label}': {error}") from None


@dataclass
class ComparePlan:
    specs: list
    repeats: int
    baseline: str            # a run label, or None for the first run
    configuration: list      # the shared train options, as command-line arguments for every child
    out: str                 # the combined JSON; the runs' own files go into a folder beside it
    overwrite: bool
    parity_steps: int
    parity_tolerance: float
    reporters: list = ()     # Reporter objects, run here on every run's result (the runs themselves report nothing)

    @property
    def baseline_spec(self):
        return self.specs[0] if self.baseline is None else next(s for s in self.specs if s.label == self.baseline)

    @property
    def runs_dir(self):
        stem = self.out[:-5] if self.out.endswith(".json") else self.out
        return stem + ".runs"

    @property
    def weights_file(self):
        return os.path.join(self.runs_dir, "initial-weights.npz")

    def run_file(self, spec, repeat, suffix=".json"):
        return os.path.join(self.runs_dir, f"{spec.label}-{repeat}{suffix}")

    def schedule(self):
        """(spec, repeat) in the order they run: round-robin over repeats, so a slow drift of the machine (heat,
        a neighbour's load) touches every run alike instead of the last ones."""
        return [(spec, repeat) for repeat in range(1, self.repeats + 1) for spec in self.specs]


def validate_plan(plan, registry):
    if plan.repeats < 1:
        raise MtbenchError(f"--repeats must be at least 1, got {plan.repeats}")
    if plan.parity_steps < 1:
        raise MtbenchError(f"--parity-steps must be at least 1, got {plan.parity_steps}")
    if not plan.parity_tolerance > 0:
        raise MtbenchError(f"--parity-tolerance must be positive, got {plan.parity_tolerance}")
    labels = [spec.label for spec in plan.specs]
    if plan.baseline is not None and plan.baseline not in labels:
        raise MtbenchError(f"--baseline '{plan.baseline}' is none of the runs: {', '.join(labels)}")
    check_runs(plan.specs, registry)
    check_output_path(plan.out, plan.overwrite)
    check_output_path(plan.weights_file, plan.overwrite, kind=".npz")
    for spec, repeat in plan.schedule():
        check_output_path(plan.run_file(spec, repeat), plan.overwrite)


def _last_error_line(stderr, returncode):
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if lines:
        return lines[-1].removeprefix("Error: ")
    if returncode < 0:
        return f"killed by signal {-returncode}, no error message"
    return f"exited with code {returncode}, no error message"


def run_child(arguments, log_file, name):
    """Runs `python -m mtbench ARGUMENTS` in a fresh process and keeps its output in `log_file`. Returns None,
    or for a failure one line that names the run and quotes its last line on stderr."""
    process = subprocess.run([sys.executable, "-m", "mtbench", *arguments], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL)
    write_text_atomic(log_file, f"$ mtbench {shlex.join(arguments)}\n# exit code {process.returncode}\n"
                                f"--- stdout\n{process.stdout}--- stderr\n{process.stderr}")
    if process.returncode != 0:
        return f"{name} failed: {_last_error_line(process.stderr, process.returncode)} (log: {log_file})"
    return None


def _require_success(failure):
    if failure:
        raise RunFailure(failure)


def _read_result(path, name):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise RunFailure(f"{name} finished but its result {path} cannot be read: {error}") from None


def run_compare(plan, registry, console):
    """Writes the weights file, runs every run, checks parity; returns (Comparison, the combined JSON dict)."""
    validate_plan(plan, registry)
    overwrite = ["--overwrite"] if plan.overwrite else []
    schedule = plan.schedule()
    console.print(f"compare: {', '.join(spec.label for spec in plan.specs)}; {plan.repeats} repeat(s), "
                  f"{len(schedule)} runs, each in its own process")

    baseline_backend = plan.baseline_spec.backend
    with console.status("writing the initial weights (data, tokenizer, model shapes)"):
        _require_success(run_child(["init-weights", "--backend", baseline_backend, *plan.configuration,
                                    "--out", plan.weights_file, *overwrite],
                                   os.path.join(plan.runs_dir, "initial-weights.log"), "writing the initial weights"))
    _, weights_sha256 = read_weights_file(plan.weights_file)
    console.print(f"initial weights: {plan.weights_file} (sha256 {weights_sha256[:16]}…, drawn on "
                  f"{baseline_backend}), loaded by every run")

    runs, entries, report_failures = [], [], []
    for number, (spec, repeat) in enumerate(schedule, start=1):
        name = f"run '{spec.label}'" + (f" (repeat {repeat} of {plan.repeats})" if plan.repeats > 1 else "")
        result_file = plan.run_file(spec, repeat)
        extras = [argument for extra in spec.extras for argument in ("--extra", extra)]
        started = time.perf_counter()
        before = os.stat(result_file).st_mtime_ns if os.path.exists(result_file) else None  # --overwrite
        with console.status(f"[{number}/{len(schedule)}] {name}: training in its own process"):
            failure = run_child(["train", "--backend", spec.backend, *extras, *plan.configuration,
                                 "--initial-weights", plan.weights_file, "--out", result_file, "--report", "none",
                                 *overwrite], plan.run_file(spec, repeat, ".log"), name)
        written = os.path.exists(result_file) and os.stat(result_file).st_mtime_ns != before
        if failure and plan.reporters and written:  # a partial result is reported too
            report_failures += run_reporters(plan.reporters, registry, _read_result(result_file, name), console,
                                             result_file)
        _require_success(failure)
        result = _read_result(result_file, name)
        report_failures += run_reporters(plan.reporters, registry, result, console, result_file)
        if result["config"].get("initial_weights_sha256") != weights_sha256:
            raise RunFailure(f"{name} did not start from {plan.weights_file}: it records sha256 "
                             f"{result['config'].get('initial_weights_sha256')}")
        tokens = result["timing"]["tokens_per_s"]
        console.print(f"[{number}/{len(schedule)}] {spec.label}" + (f" #{repeat}" if plan.repeats > 1 else "") +
                      f": {time.perf_counter() - started:.1f} s, "
                      f"{'n/a' if tokens is None else f'{tokens:,.0f}'} tokens/s, "
                      f"final loss {result['history'][-1]['loss']:.3f}")
        runs.append(LoadedRun(result, result_file))
        entries.append({"label": spec.label, "repeat": repeat, "result_file": os.path.abspath(result_file),
                        "log_file": os.path.abspath(plan.run_file(spec, repeat, ".log")), "result": result})

    comparison = build_comparison(runs, baseline=plan.baseline, parity_steps=plan.parity_steps,
                                  parity_tolerance=plan.parity_tolerance)
    figures = to_json_dict(comparison)
    del figures["kind"]
    combined = {
        "kind": COMPARE_KIND,
        "schema_version": COMPARE_SCHEMA_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": shlex.join(["mtbench", *sys.argv[1:]]),
        "initial_weights": {"file": os.path.abspath(plan.weights_file), "sha256": weights_sha256,
                            "drawn_on": baseline_backend},
        "run_order": "round-robin: every run once, then every run again for each further repeat",
        **figures,
        "env": host_environment(),
        "runs": entries,
    }
    write_json_atomic(plan.out, combined)
    return comparison, combined, report_failures


def require_parity(comparison, out):
    """A comparison whose runs failed the parity check ends with status 1 (after its figures were shown and
    written): its timings compare different computations."""
    failures = comparison.parity.failures
    if failures:
        worst = max(failures, key=lambda pair: pair.max_relative_difference)
        raise RunFailure(f"parity check failed: {worst.run} differs from {worst.reference} by up to "
                         f"{percent(worst.max_relative_difference)} (more than "
                         f"{percent(comparison.parity.tolerance)}) over the first {worst.steps} steps; "
                         f"results kept in {out}")
