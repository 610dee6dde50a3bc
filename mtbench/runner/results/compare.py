"""`mtbench compare`: one configuration trained on several backends and extras, each run in a fresh process, every
run starting from one weights file; then the parity check, the speed-ups and one combined JSON.

Keras fixes its backend when it is imported, so no process can hold two runs: this orchestrator imports no
framework and spawns `python -m mtbench` once for the weights file and once for each run.
"""

import dataclasses
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from mtbench.errors import MtbenchError, ReportingFailed, RunFailure
from mtbench.runner.files import write_json_atomic, write_text_atomic
from mtbench.runner.results.parity import percent
from mtbench.plugins.api import SIZE_KEYS, run_name, size_label
from mtbench.runner.config import TrainConfig
from mtbench.runner.data.weights_file import read_weights_file
from mtbench.runner.measurement.environment import host_environment
from mtbench.runner.results.output import check_output_path
from mtbench.runner.results.report import COMPARE_KIND, LoadedRun, build_comparison, to_json_dict
from mtbench.runner.results.reporting import run_reporters
from mtbench.runner.setup import require_extra_spanning_processes, resolve_backend, resolve_extras

COMPARE_SCHEMA_VERSION = 1


# The size flags a --matrix entry may set, and how their values are read: as the configuration types them.
SIZE_TYPES = {field.name: field.type for field in dataclasses.fields(TrainConfig) if field.name in SIZE_KEYS}


@dataclass(frozen=True)
class RunSpec:
    backend: str
    extras: tuple = ()
    sizes: tuple = ()  # ((configuration key, value), ...): the size flags this run sets over the shared ones
    processes: int = 1  # processes on this machine, started by torchrun

    @property
    def label(self):
        """The name run_label gives the run's result."""
        return run_name(self.backend, self.extras, dict(self.sizes), self.processes)

    def size_arguments(self):
        return [text for key, value in self.sizes for text in (f"--{key.replace('_', '-')}", f"{value:g}")]


def parse_run_spec(text):
    """'backend+extra+extra', 'backend+extra@2' (2 processes) or 'backend+extra:d-model=128,layers=2' -> RunSpec."""
    run, _, size_text = text.strip().partition(":")
    run, at, count = run.partition("@")
    parts = [part.strip() for part in run.split("+")]
    if not all(parts):
        raise MtbenchError(f"--matrix: '{text.strip()}' is not of the form backend+extra+extra[@N][:flag=value,...]")
    if at and not (count.strip().isdigit() and int(count) >= 1):
        raise MtbenchError(f"--matrix: '@{count.strip()}' in '{text.strip()}' is not a number of processes")
    sizes = {}
    for item in filter(None, (item.strip() for item in size_text.split(","))):
        flag, _, value = item.partition("=")
        key = flag.strip().lstrip("-").replace("-", "_")
        if key not in SIZE_TYPES or not value.strip():
            raise MtbenchError(f"--matrix: '{item}' in '{text.strip()}' is not flag=value with a size flag "
                               f"({', '.join(k.replace('_', '-') for k in SIZE_TYPES)})")
        try:
            sizes[key] = SIZE_TYPES[key](value.strip())
        except ValueError:
            raise MtbenchError(f"--matrix: {flag.strip()}={value.strip()} in '{text.strip()}' is not a number of "
                               f"the flag's kind") from None
    return RunSpec(parts[0], tuple(parts[1:]), tuple(sorted(sizes.items())), int(count) if at else 1)


def _matrix_entries(matrix):
    """The entries of --matrix, separated by ';' (or ',' between entries without sizes)."""
    entries = []
    for chunk in matrix.split(";"):
        for token in chunk.split(","):
            if "=" in token and ":" not in token and entries:
                entries[-1] += "," + token  # another flag=value of the entry before
            elif token.strip():
                entries.append(token)
    return entries


# The extra that compiles torch's step: on CUDA, `--backends` with torch also trains torch compiled.
TORCH_COMPILED = "torch-compile"


def plan_runs(backends=None, extras=(), matrix=None, devices=None):
    """The runs to compare: each backend of `backends` with every extra of `extras`, or the runs that `matrix`
    lists ('torch;torch+torch-compile;jax'). Where torch sees a CUDA GPU (`devices`, from `probe_devices`),
    `--backends` without extras trains torch both eager and compiled: on a GPU an eager Keras step is bound by
    Python's dispatch, and a comparison of one XLA program with it alone would answer another question."""
    if matrix is not None:
        if backends or extras:
            raise MtbenchError("give --matrix, or --backends with --extra, not both")
        specs = [parse_run_spec(item) for item in _matrix_entries(matrix)]
    else:
        names = [name.strip() for name in (backends or "jax,torch").split(",") if name.strip()]
        specs = [RunSpec(name, tuple(extras)) for name in names]
        if not extras and ((devices or {}).get("torch") or {}).get("kind") == "gpu":
            specs = [added for spec in specs for added in
                     ([spec, RunSpec("torch", (TORCH_COMPILED,))] if spec.backend == "torch" else [spec])]
    if not specs:
        raise MtbenchError("no runs to compare")
    labels = [spec.label for spec in specs]
    twice = next((label for i, label in enumerate(labels) if label in labels[:i]), None)
    if twice:
        raise MtbenchError(f"run '{twice}' is listed twice; use --repeats to run it again")
    return specs


def probe_devices():
    """{backend: its devices (`Backend.device_info()`), or None where it is unavailable}, asked of a child
    `mtbench env --json`: importing the frameworks here would hold device memory while the runs train."""
    environment = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    process = subprocess.run([sys.executable, "-m", "mtbench", "env", "--json"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, env=environment)
    if process.returncode != 0:
        raise MtbenchError(f"cannot tell which devices the backends see: `mtbench env` failed "
                           f"({_last_error_line(process.stderr, process.returncode)})")
    backends = json.loads(process.stdout)["backends"]
    return {name: described.get("device") if described.get("available") else None
            for name, described in backends.items()}


def device_text(device):
    return f"{device.get('kind')} ({device.get('name')})"


def check_same_hardware(specs, devices):
    """Runs whose backends see different hardware (JAX's CPU build beside torch's CUDA build) would compare
    machines, not frameworks: refused before anything trains."""
    seen = {spec.backend: devices.get(spec.backend) for spec in specs if devices.get(spec.backend)}
    kinds = {(device.get("kind"), device.get("name")) for device in seen.values()}
    if len(kinds) <= 1:
        return
    listed = ", ".join(f"{backend} sees {device_text(device)}" for backend, device in seen.items())
    on_cpu = [backend for backend, device in seen.items() if device.get("kind") == "cpu"]
    hint = ""
    if on_cpu and len(on_cpu) < len(seen):
        hint = (f"; {' and '.join(on_cpu)} see{'s' if len(on_cpu) == 1 else ''} only the CPU on a machine with an "
                f"accelerator: install its accelerator build (JAX: pip install 'mtbench[jax-cuda]')")
    raise MtbenchError(f"the runs would train on different hardware: {listed}{hint}")


def check_runs(specs, registry):
    """Every backend and extra exists, is installed and fits its run: checked before any process starts."""
    for spec in specs:
        try:
            backend = resolve_backend(spec.backend, registry)
            require_extra_spanning_processes(spec.processes, backend, resolve_extras(spec.extras, backend, registry),
                                             registry)
        except MtbenchError as error:
            raise MtbenchError(f"run '{spec.label}': {error}") from None
        if spec.processes > 1 and importlib.util.find_spec("torch") is None:
            raise MtbenchError(f"run '{spec.label}': several processes are started with torchrun, which comes "
                               f"with torch (pip install 'mtbench[torch]')")


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
    def group(self):
        """How the trackers group this comparison's runs: the name of its JSON."""
        return os.path.splitext(os.path.basename(self.out))[0]

    @property
    def runs_dir(self):
        stem = self.out[:-5] if self.out.endswith(".json") else self.out
        return stem + ".runs"

    def weights_file(self, spec):
        """One weights file per model size: every run of a size starts from the same weights."""
        size = size_label(dict(spec.sizes))
        return os.path.join(self.runs_dir, f"initial-weights{'-' + size if size else ''}.npz")

    def sizes(self):
        """One spec of each model size, in the order they first appear."""
        return list({spec.sizes: spec for spec in self.specs}.values())

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
    for spec in plan.sizes():
        check_output_path(plan.weights_file(spec), plan.overwrite, kind=".npz")
    for spec, repeat in plan.schedule():
        check_output_path(plan.run_file(spec, repeat), plan.overwrite)


def _last_error_line(stderr, returncode):
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if lines:
        return lines[-1].removeprefix("Error: ")
    if returncode < 0:
        return f"killed by signal {-returncode}, no error message"
    return f"exited with code {returncode}, no error message"


def launcher_command(processes):
    """How a child of `processes` processes is started: `python -m mtbench`, or torchrun (its module, so the
    interpreter's own) with one process per device on this machine."""
    if processes == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]


def run_child(arguments, log_file, name, processes=1):
    """Runs `python -m mtbench ARGUMENTS` in fresh processes (several under torchrun) and keeps their output in
    `log_file`. Returns None, or for a failure one line that names the run and quotes its last line on stderr."""
    command = [*launcher_command(processes), "-m", "mtbench", *arguments]
    process = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    write_text_atomic(log_file, f"$ {shlex.join(command)}\n# exit code {process.returncode}\n"
                                f"--- stdout\n{process.stdout}--- stderr\n{process.stderr}")
    if process.returncode != 0:
        return ChildFailure(f"{name} failed: {_last_error_line(process.stderr, process.returncode)} "
                            f"(log: {log_file})", process.returncode)
    return None


class ChildFailure(str):
    """The one line naming a failed child process, and its exit code."""

    def __new__(cls, text, exit_code):
        line = super().__new__(cls, text)
        line.exit_code = exit_code
        return line



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
    weights = {}  # model size -> {"file", "sha256", "drawn_on"}
    for sized in plan.sizes():
        path = plan.weights_file(sized)
        with console.status("writing the initial weights (data, tokenizer, model shapes)"):
            _require_success(run_child(["init-weights", "--backend", baseline_backend, *plan.configuration,
                                        *sized.size_arguments(), "--out", path, *overwrite],
                                       path[:-len(".npz")] + ".log", "writing the initial weights"))
        _, sha256 = read_weights_file(path)
        weights[sized.sizes] = {"file": os.path.abspath(path), "sha256": sha256, "drawn_on": baseline_backend}
        size = size_label(dict(sized.sizes))
        console.print(f"initial weights: {path} (sha256 {sha256[:16]}…, drawn on {baseline_backend}), loaded by "
                      f"every run" + (f" of {size}" if size else ""))

    runs, entries, report_failures = [], [], []
    for number, (spec, repeat) in enumerate(schedule, start=1):
        name = f"run '{spec.label}'" + (f" (repeat {repeat} of {plan.repeats})" if plan.repeats > 1 else "")
        result_file = plan.run_file(spec, repeat)
        extras = [argument for extra in spec.extras for argument in ("--extra", extra)]
        started = time.perf_counter()
        before = os.stat(result_file).st_mtime_ns if os.path.exists(result_file) else None  # --overwrite
        with console.status(f"[{number}/{len(schedule)}] {name}: training in its own process"):
            failure = run_child(["train", "--backend", spec.backend, *extras, *plan.configuration,
                                 *spec.size_arguments(), "--initial-weights", weights[spec.sizes]["file"],
                                 "--out", result_file, "--report", "none", "--run-group", plan.group, *overwrite],
                                plan.run_file(spec, repeat, ".log"), name, spec.processes)
        if failure and failure.exit_code == ReportingFailed.EXIT_CODE:
            report_failures.append(failure)  # the run completed; only one of its trackers failed
            failure = None
        written = os.path.exists(result_file) and os.stat(result_file).st_mtime_ns != before
        if failure and plan.reporters and written:  # a partial result is reported too
            report_failures += run_reporters(plan.reporters, registry, _read_result(result_file, name), console,
                                             result_file)
        _require_success(failure)
        result = _read_result(result_file, name)
        report_failures += run_reporters(plan.reporters, registry, result, console, result_file)
        if result["config"].get("initial_weights_sha256") != weights[spec.sizes]["sha256"]:
            raise RunFailure(f"{name} did not start from {weights[spec.sizes]['file']}: it records sha256 "
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
        "initial_weights": weights[plan.baseline_spec.sizes],
        "initial_weights_by_size": {size_label(dict(sizes)): record for sizes, record in weights.items()},
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
