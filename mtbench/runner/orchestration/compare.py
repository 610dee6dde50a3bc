"""`mtbench compare`: one configuration trained on several backends and extras, each run in a fresh process, every
run starting from one weights file; then the parity check, the speed-ups and one combined JSON.

Keras fixes its backend when it is imported, so no process can hold two runs: this orchestrator imports no
framework and spawns `python -m mtbench` once for the weights file and once for each run.
"""

import contextlib
import dataclasses
import importlib.util
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from mtbench.errors import MtbenchError, ReportingFailed, RunFailure, RunInterrupted
from mtbench.runner.files import read_json, write_json_atomic
from mtbench.runner.orchestration.child_log import LogFollower
from mtbench.plugins import manager as plugins
from mtbench.figures import SIZE_KEYS, run_name, size_label
from mtbench.runner.config import TrainConfig
from mtbench.runner.data.weights_file import read_weights_file
from mtbench.runner.results.output import check_output_path
from mtbench.runner.results.schema import result_stem
from mtbench.runner.results.compare_json import combined_json
from mtbench.runner.results.report import SWEEP_KEYS, TORCH_COMPILED, LoadedRun, build_comparison, environment_names
from mtbench.runner.results.reporting import run_reporters
from mtbench.runner.results import verdicts as stats
from mtbench.runner.run_file import RUN_FILE_FORMAT, write_run_file
from mtbench.runner.setup import (conflicting_extras, dtype_refusal, joined, require_extra_spanning_processes,
                                  resolve_backend, resolve_extras)

# The flags a --matrix entry may set, and how their values are read (as the configuration types them): the
# model's size, and what a sweep varies beside it (batch size, max length, max tokens).
FIELD_TYPES = {field.name: field.type for field in dataclasses.fields(TrainConfig)}
SETTING_TYPES = {name: FIELD_TYPES[name] for name in (*SIZE_KEYS, *SWEEP_KEYS)}
# What the initial weights' shapes follow: the model's size, and --max-len or --block-size (the positions).
SHAPE_KEYS = (*SIZE_KEYS, "max_len", "block_size")
# The --matrix key that runs an entry with another environment's interpreter.
PYTHON_KEY = "python"
# Beside each run's result: the run file its process trained from (`mtbench train --run-file`).
RUN_FILE_SUFFIX = ".train.json"


@dataclass(frozen=True)
class RunSpec:
    backend: str
    extras: tuple = ()
    sizes: tuple = ()  # ((configuration key, value), ...): the flags this run sets over the shared ones (size and
    # sweep flags; --compile-mode, `with_compile_mode`)
    processes: int = 1  # processes on this machine, started by torchrun
    python: str = None  # the interpreter it runs under (absolute), where an entry names another environment's
    python_name: str = None  # the interpreter's name in the label (`environment_names`)
    model: str = "transformer"  # --model of the comparison (every run's), as its label names it
    twin: bool = False  # the baseline's A/A twin (--aa): the same run again, measuring the noise floor

    @property
    def label(self):
        """The run's name: as `comparison_labels` names its result where the comparison sweeps the keys it sets."""
        settings = [(key.replace("_", "-"), value) for key, value in self.sizes if key in SWEEP_KEYS]
        if self.python:
            settings.append((PYTHON_KEY, self.python_name or environment_names([self.python])[self.python]))
        return run_name(self.backend, self.extras, {**dict(self.sizes), "model_name": self.model}, self.processes,
                        settings)

    @property
    def shape(self):
        """The settings its initial weights follow: one weights file per shape."""
        return tuple((key, value) for key, value in self.sizes if key in SHAPE_KEYS)

    @property
    def interpreter(self):
        return self.python or sys.executable

    @property
    def foreign(self):
        """Whether it runs under another interpreter than this process's."""
        return self.interpreter != sys.executable

    def size_arguments(self):
        return [text for key, value in self.sizes
                for text in (f"--{key.replace('_', '-')}", f"{value:g}" if isinstance(value, float) else str(value))]


def shape_label(shape):
    """'d-model=128,heads=4,max-len=64' of a RunSpec.shape; '' for the shared shape."""
    settings = dict(shape)
    length = f"max-len={settings['max_len']}" if "max_len" in settings else ""
    return ",".join(part for part in (size_label(settings), length) if part)


def parse_run_spec(text):
    """'backend+extra+extra', 'backend+extra@2' (2 processes) or 'backend+extra:d-model=128,batch-size=16' (flags
    of this run), with 'python=PATH' among the flags for another environment's interpreter -> RunSpec."""
    run, _, size_text = text.strip().partition(":")
    run, at, count = run.partition("@")
    parts = [part.strip() for part in run.split("+")]
    if not all(parts):
        raise MtbenchError(f"--matrix: '{text.strip()}' is not of the form backend+extra+extra[@N][:flag=value,...]")
    if at and not (count.strip().isdigit() and int(count) >= 1):
        raise MtbenchError(f"--matrix: '@{count.strip()}' in '{text.strip()}' is not a number of processes")
    sizes, python = {}, None
    for item in filter(None, (item.strip() for item in size_text.split(","))):
        flag, _, value = item.partition("=")
        key = flag.strip().lstrip("-").replace("-", "_")
        if key == PYTHON_KEY and value.strip():
            python = os.path.abspath(os.path.expanduser(value.strip()))
            continue
        if key not in SETTING_TYPES or not value.strip():
            raise MtbenchError(f"--matrix: '{item}' in '{text.strip()}' is not flag=value with a size or sweep flag "
                               f"({', '.join(k.replace('_', '-') for k in SETTING_TYPES)}) or python=PATH")
        try:
            sizes[key] = SETTING_TYPES[key](value.strip())
        except ValueError:
            raise MtbenchError(f"--matrix: {flag.strip()}={value.strip()} in '{text.strip()}' is not a number of "
                               f"the flag's kind") from None
    return RunSpec(parts[0], tuple(parts[1:]), tuple(sorted(sizes.items())), int(count) if at else 1,
                   None if python == sys.executable else python)


def name_interpreters(specs):
    """Where an entry runs under another environment's interpreter, every run names its interpreter (the others
    this one's), each by a name of its own: the labels `comparison_labels` gives their results."""
    if not any(spec.python for spec in specs):
        return specs
    names = environment_names(spec.interpreter for spec in specs)
    return [dataclasses.replace(spec, python=spec.interpreter, python_name=names[spec.interpreter]) for spec in specs]


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


def torch_on_gpu(devices):
    """Whether torch sees a CUDA GPU (`devices`, from `probe_devices`)."""
    return ((devices or {}).get("torch") or {}).get("kind") == "gpu"


def compile_refusal(extras, registry):
    """Why a torch run with `extras` cannot compile its step, as the extras declare it (an extra that conflicts
    with torch-compile, or one torch-compile conflicts with), or None. An unknown extra is `check_runs`' to name."""
    compiling = registry.extras.get(TORCH_COMPILED)
    clash = compiling and conflicting_extras(compiling, [registry.extras[name] for name in extras
                                                         if name in registry.extras])
    return f"extra '{clash[0]}' cannot run together with '{TORCH_COMPILED}'" if clash else None


def compiled_twin(spec, registry):
    """[`spec` with torch's step compiled] for an eager torch run whose extras let it compile; else []."""
    if spec.backend != "torch" or TORCH_COMPILED in spec.extras or compile_refusal(spec.extras, registry):
        return []
    return [dataclasses.replace(spec, extras=joined(spec.extras, TORCH_COMPILED, registry))]


def eager_only_lines(specs, devices, registry):
    """One line for each torch run that a CUDA GPU would have trained compiled too, but whose extras refuse it."""
    if not torch_on_gpu(devices):
        return []
    return [f"run '{spec.label}' trains torch eager only (no compiled row beside it): "
            f"{compile_refusal(spec.extras, registry)}"
            for spec in specs if spec.backend == "torch" and compile_refusal(spec.extras, registry)]


def eager_torch_note(result):
    """For `mtbench train`: one line where torch trained eager on a CUDA GPU without being asked to (`--step auto`
    whose extras refused the compiled step), where its best users compile it; None for any other run."""
    device = (result.get("env") or {}).get("device") or {}
    chosen = result.get("train_step_chosen") or {}
    if result.get("backend") != "torch" or device.get("kind") != "gpu" or chosen.get("asked") != "auto" \
            or chosen.get("by_extra"):
        return None
    return (f"note: torch trained its step eager on a CUDA GPU, where its best users compile it (JAX's step is "
            f"compiled): {chosen.get('why_not')}")


def with_compile_mode(specs, mode):
    """`specs` with --compile-mode `mode` set on the runs it applies to (those that compile torch's step) alone."""
    return [dataclasses.replace(spec, sizes=tuple(sorted({**dict(spec.sizes), "compile_mode": mode}.items())))
            if mode and TORCH_COMPILED in spec.extras else spec for spec in specs]


def with_compiled_twins(specs, devices, registry=None):
    """`specs`, each eager torch run followed by its compiled twin (`compiled_twin`) where torch sees a CUDA GPU
    (`devices`, from `probe_devices`)."""
    if not torch_on_gpu(devices):
        return specs
    registry = registry or plugins.registry()
    return [added for spec in specs for added in (spec, *compiled_twin(spec, registry))]


def with_steps(specs, step, registry, named=False):
    """`specs`, each with the --step it trains with: a run of a backend whose step compiles through torch-compile
    compiled where its extras name it, else eager (so that a row named eager is eager on a GPU too); any other
    backend's run `auto` (its own step). `step` is compare's --step: `compiled` first adds torch-compile to those
    runs (refused beside an extra that conflicts with it), `eager` adds nothing and refuses a run that names it (the
    compiled twins are `with_compiled_twins`'s, for `auto`). `named`: the runs --matrix listed, whose extras already say."""
    if named and step != "auto":
        raise MtbenchError(f"--matrix names each run's extras ('{TORCH_COMPILED}' for a compiled torch step); "
                           f"leave --step out")
    extra = registry.extras.get(TORCH_COMPILED)
    served = extra.backends if extra else ()
    if step == "eager" and any(spec.backend in served and TORCH_COMPILED in spec.extras for spec in specs):
        raise MtbenchError(f"--step eager contradicts --extra {TORCH_COMPILED}; give one of them")
    if step == "compiled":
        for spec in specs:
            refusal = spec.backend in served and compile_refusal(spec.extras, registry)
            if refusal:
                raise MtbenchError(f"--step compiled: run '{spec.label}': {refusal}")
        specs = [dataclasses.replace(spec, extras=joined(spec.extras, TORCH_COMPILED, registry))
                 if spec.backend in served and TORCH_COMPILED not in spec.extras else spec for spec in specs]
    chosen = lambda spec: ("auto" if spec.backend not in served
                           else "compiled" if TORCH_COMPILED in spec.extras else "eager")
    return [dataclasses.replace(spec, sizes=tuple(sorted({**dict(spec.sizes), "step": chosen(spec)}.items())))
            for spec in specs]


def plan_runs(backends=None, extras=(), matrix=None, devices=None, model="transformer", registry=None):
    """The runs to compare, all of the model family `model` (--model): each backend of `backends` with every extra
    of `extras`, or the runs that `matrix` lists ('torch;torch+torch-compile;jax'). Where torch sees a CUDA GPU
    (`devices`, from `probe_devices`), `--backends` trains each torch run both eager and compiled (its extras
    plus torch-compile) wherever its extras allow (`compile_refusal`; `registry`: the plugins, by default
    those installed): on a GPU an eager Keras step is bound by Python's dispatch, and a comparison of one XLA
    program with it alone would answer another question."""
    if matrix is not None:
        if backends or extras:
            raise MtbenchError("give --matrix, or --backends with --extra, not both")
        specs = name_interpreters([parse_run_spec(item) for item in _matrix_entries(matrix)])
    else:
        names = [name.strip() for name in (backends or "jax,torch").split(",") if name.strip()]
        specs = with_compiled_twins([RunSpec(name, tuple(extras)) for name in names], devices, registry)
    if not specs:
        raise MtbenchError("no runs to compare")
    specs = [dataclasses.replace(spec, model=model) for spec in specs]
    labels = [spec.label for spec in specs]
    twice = next((label for i, label in enumerate(labels) if label in labels[:i]), None)
    if twice:
        raise MtbenchError(f"run '{twice}' is listed twice; use --repeats to run it again")
    return specs


def check_dtype(specs, dtype, devices, registry):
    """A dtype a run's backend refuses on its device (float16 on torch) is refused before any run starts, as the
    run would refuse it; a run under another interpreter, or of a backend not found here, is left to
    `check_runs`. `auto` is each run's to choose on its device, never a dtype its backend refuses
    (`setup.auto_dtype`)."""
    if dtype == "auto":
        return
    for spec in specs:
        backend = registry.backends.get(spec.backend)
        if spec.foreign or backend is None:
            continue
        reason = dtype_refusal(backend, dtype, (devices or {}).get(spec.backend) or {})
        if reason:
            raise MtbenchError(f"run '{spec.label}': {reason}")


def probe_devices():
    """{backend: its devices (`Backend.device_info()`), or None where it is unavailable}, asked of a child
    `mtbench env --json`: importing the frameworks here would hold device memory while the runs train."""
    return backend_devices(probe_environment(sys.executable, "cannot tell which devices the backends see"))


def probe_environment(python, failing):
    """`mtbench env --json` of the interpreter `python`, in a child; `failing` begins the line of its failure."""
    environment = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    process = subprocess.run([python, "-m", "mtbench", "env", "--json"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, env=environment)
    if process.returncode != 0:
        raise MtbenchError(f"{failing}: `mtbench env` failed ({_last_error_line(process.stderr, process.returncode)})")
    return json.loads(process.stdout)


def backend_devices(description):
    return {name: described.get("device") if described.get("available") else None
            for name, described in description["backends"].items()}


def check_interpreters(specs):
    """{interpreter: its `mtbench env --json`} of every other environment an entry names (python=PATH), each
    checked before any run starts: the file exists, is executable, and imports mtbench."""
    described = {}
    for spec in specs:
        path = spec.interpreter
        if not spec.foreign or path in described:
            continue
        where = f"run '{spec.label}': python={path}"
        if not os.path.exists(path):
            raise MtbenchError(f"{where}: no such file")
        if os.path.isdir(path) or not os.access(path, os.X_OK):
            raise MtbenchError(f"{where}: not an executable file")
        try:
            process = subprocess.run([path, "-c", "import mtbench"], capture_output=True, text=True,
                                     stdin=subprocess.DEVNULL)
        except OSError as error:
            raise MtbenchError(f"{where}: cannot start it ({error.strerror})") from None
        if process.returncode != 0:
            raise MtbenchError(f"{where}: cannot import mtbench ({_last_error_line(process.stderr, process.returncode)}"
                               f"); install mtbench into that environment")
        described[path] = probe_environment(path, where)
    return described


def _check_in_environment(spec, description):
    """The backend and extras of a run under another interpreter, as that environment's `mtbench env` sees them."""
    backend = description["backends"].get(spec.backend)
    if backend is None:
        raise MtbenchError(f"run '{spec.label}': unknown backend '{spec.backend}' in {spec.interpreter} (it has "
                           f"{', '.join(description['backends']) or 'none'})")
    if not backend.get("available"):
        raise MtbenchError(f"run '{spec.label}': backend '{spec.backend}' is not available in {spec.interpreter}: "
                           f"{backend.get('reason')}")
    for extra in spec.extras:
        known = description.get("extras", {}).get(extra)
        if known is None or spec.backend not in known.get("backends", ()):
            raise MtbenchError(f"run '{spec.label}': {spec.interpreter} has no extra '{extra}' for {spec.backend}")


def device_text(device):
    return f"{device.get('kind')} ({device.get('name')})"


def check_same_hardware(specs, devices, interpreters=None):
    """Runs whose backends see different hardware (JAX's CPU build beside torch's CUDA build) would compare
    machines, not frameworks: refused before anything trains. `interpreters`: `check_interpreters`' answer, for
    the runs under another environment's interpreter (whose backends may see other devices)."""
    seen = {}
    for spec in specs:
        other = (interpreters or {}).get(spec.interpreter) if spec.foreign else None
        device = (backend_devices(other) if other else devices).get(spec.backend)
        if device:
            seen.setdefault(f"{spec.backend} in {spec.python_name}" if other else spec.backend, device)
    kinds = {(device.get("kind"), device.get("name")) for device in seen.values()}
    if len(kinds) <= 1:
        return
    listed = ", ".join(f"{backend} sees {device_text(device)}" for backend, device in seen.items())
    on_cpu = [backend for backend, device in seen.items() if device.get("kind") == "cpu"]
    hint = ""
    if on_cpu and len(on_cpu) < len(seen):
        builds = {"jax": "JAX: pip install 'mtbench[jax-cuda]'", "torch": "torch: a CUDA build of torch"}
        how = "; ".join(builds[name] for name in on_cpu if name in builds) or "see the backend's documentation"
        hint = (f"; {' and '.join(on_cpu)} see{'s' if len(on_cpu) == 1 else ''} only the CPU on a machine with an "
                f"accelerator: install its accelerator build ({how})")
    raise MtbenchError(f"the runs would train on different hardware: {listed}{hint}")


def check_runs(specs, registry, interpreters=None):
    """Every backend and extra exists, is installed and fits its run: checked before any process starts (for a
    run under another interpreter, in that environment: `interpreters`, else asked here)."""
    interpreters = check_interpreters(specs) if interpreters is None else interpreters
    for spec in specs:
        if spec.foreign:
            _check_in_environment(spec, interpreters[spec.interpreter])
            if spec.processes > 1 and not interpreters[spec.interpreter]["host"].get("torch"):
                raise MtbenchError(f"run '{spec.label}': several processes are started with torchrun, which "
                                   f"{spec.interpreter} lacks (it comes with torch)")
            continue
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
    interpreters: dict = None  # `check_interpreters` of the specs, where the caller asked already
    aa: bool = False         # --aa: the baseline runs twice in each repeat, interleaved, to measure the noise floor
    auto: "AutoRepeats" = None  # --repeats auto (then `repeats` is None): repeat until narrow enough or out of time
    options: dict = None     # the shared train options by name: what each child's run file is made of
    train_arguments: list = ()  # options `train` takes and `init-weights` does not (validation), for a child
                                # that reads no run file

    @property
    def baseline_spec(self):
        return self.specs[0] if self.baseline is None else next(s for s in self.specs if s.label == self.baseline)

    @property
    def group(self):
        """How the trackers group this comparison's runs: the name of its JSON."""
        return os.path.splitext(os.path.basename(self.out))[0]

    @property
    def runs_dir(self):
        return runs_dir(self.out)

    def weights_file(self, spec):
        """One weights file per model shape (size and max length): every run of a shape starts from the same
        weights."""
        shape = shape_label(spec.shape)
        return os.path.join(self.runs_dir, f"initial-weights{'-' + shape if shape else ''}.npz")

    def sizes(self):
        """One spec of each model shape, in the order they first appear."""
        return list({spec.shape: spec for spec in self.specs}.values())

    def run_file(self, spec, repeat, suffix=".json"):
        return os.path.join(self.runs_dir, f"{spec.label}{'-aa' if spec.twin else ''}-{repeat}{suffix}")

    def round(self, repeat):
        """(spec, repeat) of one repeat, in the order they run. With --aa the baseline's twin runs beside the
        baseline, after it in odd repeats and before it in even ones, so neither always runs first."""
        runs = [(spec, repeat) for spec in self.specs]
        if self.aa:
            at = self.specs.index(self.baseline_spec) + repeat % 2
            runs.insert(at, (dataclasses.replace(self.baseline_spec, twin=True), repeat))
        return runs

    def schedule(self):
        """(spec, repeat) in the order they run: round-robin over repeats, so a slow drift of the machine (heat,
        a neighbour's load) touches every run alike instead of the last ones. Under --repeats auto, the first
        repeat (how many follow depends on their figures)."""
        return [run for repeat in range(1, (self.repeats or 1) + 1) for run in self.round(repeat)]

    @property
    def repeats_text(self):
        if self.auto is None:
            return f"{self.repeats} repeat(s)"
        return (f"repeats until every tokens/s interval is within ±{self.auto.width:.1%} or {self.auto.budget_s:g} s "
                f"have passed")


@dataclass(frozen=True)
class AutoRepeats:
    """--repeats auto: repeat every run until every tokens/s interval lies within ±`width` of its ratio (after at
    least `verdicts.MIN_REPEATS` repeats), or until another repeat would end past `budget_s` seconds, or at
    `most` repeats."""
    width: float = stats.DEFAULT_WIDTH
    budget_s: float = 1800.0
    most: int = 50


def auto_repeats_end(auto, repeats, widest, elapsed_s, round_s):
    """What ends --repeats auto after `repeats` repeats (None: another repeat): {'ended_by': 'width', 'budget' or
    'most', ...} with the sentence that says so. `widest`: the widest tokens/s interval's half width so far (None
    where there is none yet); `round_s`: the last repeat's time, which the next is expected to take."""
    if widest is not None and widest <= auto.width and repeats >= stats.MIN_REPEATS:
        ended_by = "width"
        text = f"every tokens/s interval is within ±{widest:.1%} (goal ±{auto.width:.1%})"
    elif repeats >= auto.most:
        ended_by, text = "most", f"{auto.most} repeats, the most it runs"
    elif elapsed_s + round_s > auto.budget_s:
        ended_by = "budget"
        text = (f"the time budget: {elapsed_s:,.0f} s of {auto.budget_s:g} s used, and another repeat would take "
                f"about {round_s:,.0f} s")
    else:
        return None
    widest_text = "" if ended_by == "width" or widest is None else \
        f"; the widest tokens/s interval is ±{widest:.1%} (goal ±{auto.width:.1%})"
    few = f"; only {repeats} repeat(s), fewer than the {stats.MIN_REPEATS} the interval needs" \
        if repeats < stats.MIN_REPEATS else ""
    return {"ended_by": ended_by, "repeats": repeats, "width": auto.width, "widest": widest, "budget_s": auto.budget_s,
            "elapsed_s": elapsed_s,
            "text": f"--repeats auto ended by {ended_by} after {repeats} repeat(s): {text}{widest_text}{few}"}


def runs_dir(out):
    """The folder beside a combined JSON that holds its runs' own files (`mtbench compare`'s, `mtbench rerun`'s)."""
    return result_stem(out) + ".runs"


def validate_plan(plan, registry):
    if plan.auto is None and plan.repeats < 1:
        raise MtbenchError(f"--repeats must be at least 1, got {plan.repeats}")
    if plan.auto is not None and len(plan.specs) < 2 and not plan.aa:
        raise MtbenchError("--repeats auto repeats until the intervals between runs are narrow: give two runs or "
                           "more, or --aa")
    if plan.auto is not None and not plan.auto.budget_s > 0:
        raise MtbenchError(f"--repeats-budget must be positive, got {plan.auto.budget_s:g}")
    if plan.parity_steps < 1:
        raise MtbenchError(f"--parity-steps must be at least 1, got {plan.parity_steps}")
    if not plan.parity_tolerance > 0:
        raise MtbenchError(f"--parity-tolerance must be positive, got {plan.parity_tolerance}")
    labels = [spec.label for spec in plan.specs]
    if plan.baseline is not None and plan.baseline not in labels:
        raise MtbenchError(f"--baseline '{plan.baseline}' is none of the runs: {', '.join(labels)}")
    check_runs(plan.specs, registry, plan.interpreters)
    check_output_path(plan.out, plan.overwrite)
    for spec in plan.sizes():
        check_output_path(plan.weights_file(spec), plan.overwrite, kind=".npz")
    for spec, repeat in plan.schedule():
        check_output_path(plan.run_file(spec, repeat), plan.overwrite)


# torchrun's own report of a failed process follows the processes' lines: its elastic agent's log line, its
# traceback and a banner of '=' lines. Before them, its notice about OMP_NUM_THREADS between lines of '*'.
LAUNCHER_REPORT = re.compile(r"torch[./]distributed[./]elastic")
LAUNCHER_NOTICE = re.compile(r"^(\*+|Setting OMP_NUM_THREADS .*)$")
LAUNCHER_EXIT_CODE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def _last_error_line(stderr, returncode):
    """The line that says why a child failed: its last `Error: ` line (mtbench's one-line errors), else its last
    line. Of processes under torchrun, their own lines, not torchrun's report after them."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    report = next((i for i, line in enumerate(lines) if LAUNCHER_REPORT.search(line)), None)
    if report is not None:
        lines = [line for line in lines[:report] if not LAUNCHER_NOTICE.match(line)]
        failed = LAUNCHER_EXIT_CODE.search(stderr)
        if failed and not lines:
            rank, code = failed.groups()
            if int(code) >= 0:
                return f"the process of rank {rank} exited with code {code}, no error message"
            return f"the process of rank {rank} was killed by signal {-int(code)}, no error message"
    errors = [line for line in lines if line.startswith("Error: ")]
    if errors:
        return errors[-1].removeprefix("Error: ")
    if lines:
        return lines[-1]
    if returncode < 0:
        return f"killed by signal {-returncode}, no error message"
    return f"exited with code {returncode}, no error message"


def launcher_command(processes, python=None, launcher_dir=None):
    """How a child of `processes` processes is started: `python -m mtbench` (this interpreter, or `python`), or
    torchrun (its module, so the interpreter's own) with one process per device on this machine, its agent's
    files in `launcher_dir` (without one, torchrun leaves a `torchelastic_*` folder in the temporary directory
    for every run)."""
    python = python or sys.executable
    if processes == 1:
        return [python]
    return [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
            *([f"--log-dir={launcher_dir}"] if launcher_dir else [])]


def run_child(arguments, log_file, name, processes=1, python=None, show=None):
    """Runs `python -m mtbench ARGUMENTS` in fresh processes (several under torchrun) with their stdout written
    into `log_file` as they run, their stderr after it. Returns None, or for a failure one line that names the run
    and quotes its last line on stderr. `show(line)`, when given, receives each training line as it is written
    (`child_log.LogFollower`). A Ctrl-C while it runs is passed on to it (`wait_passing_interrupts`); once it has
    stopped and its log is complete, KeyboardInterrupt is raised again."""
    # Output goes to files, not pipes: nothing is lost when the wait is interrupted.
    os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
    with open(log_file, "w", encoding="utf-8") as log, \
            tempfile.TemporaryFile("w+", encoding="utf-8") as err, \
            (tempfile.TemporaryDirectory(prefix="mtbench-torchrun-") if processes > 1
             else contextlib.nullcontext()) as launcher_dir:
        command = [*launcher_command(processes, python, launcher_dir), "-m", "mtbench", *arguments]
        log.write(f"$ {shlex.join(command)}\n--- stdout\n")
        log.flush()
        process = subprocess.Popen(command, stdout=log, stderr=err, stdin=subprocess.DEVNULL, text=True,
                                   start_new_session=True)
        with LogFollower(log_file, log.tell(), show) if show else contextlib.nullcontext():
            interrupted = wait_passing_interrupts(process)
        err.seek(0)
        stderr = err.read()
        log.seek(0, os.SEEK_END)
        log.write(f"--- stderr\n{stderr}# exit code {process.returncode}"
                  f"{' (interrupted)' if interrupted else ''}\n")
    if interrupted:
        raise KeyboardInterrupt
    if process.returncode != 0:
        return ChildFailure(f"{name} failed: {_last_error_line(stderr, process.returncode)} "
                            f"(log: {log_file})", process.returncode)
    return None


def wait_passing_interrupts(process):
    """Waits for `process`, started in a session of its own so that a terminal's Ctrl-C reaches only this one:
    each Ctrl-C here is passed on to it once. The first lets a training run finish its step and write a partial
    result, a second stops it at once, a third kills it. Returns whether it was interrupted."""
    interrupts = 0
    while True:
        try:
            process.wait()
            return interrupts > 0
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts < 3:
                process.send_signal(signal.SIGINT)
            else:
                process.kill()


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
        return read_json(path, "its result JSON")
    except MtbenchError as error:
        raise RunFailure(f"{name} finished but {error}") from None


@dataclass
class CompareProgress:
    """What a comparison has done so far: what an interrupted one writes and names."""
    weights: dict = dataclasses.field(default_factory=dict)  # model size -> {"file", "sha256", "drawn_on"}
    runs: list = dataclasses.field(default_factory=list)      # LoadedRun of every run that finished
    entries: list = dataclasses.field(default_factory=list)   # their entries in the combined JSON
    doing: str = "starting"                                   # what runs now, for an interruption's message
    twins: list = dataclasses.field(default_factory=list)      # LoadedRun of every A/A twin (--aa) that finished
    twin_entries: list = dataclasses.field(default_factory=list)
    auto: dict = None                                         # what ended --repeats auto
    log_file: str = None                                      # its log
    run: tuple = None  # (spec, repeat, result file, its mtime before the run) while a run trains

    def add(self, spec, repeat, result, result_file, log_file):
        runs, entries = (self.twins, self.twin_entries) if spec.twin else (self.runs, self.entries)
        runs.append(LoadedRun(result, result_file))
        entries.append({"label": spec.label + (" (A/A twin)" if spec.twin else ""), "repeat": repeat,
                        "position": len(self.entries) + len(self.twin_entries) + 1,
                        "status": result.get("status"), "result_file": os.path.abspath(result_file),
                        "log_file": os.path.abspath(log_file), "python": spec.interpreter, "result": result})


def run_compare(plan, registry, console):
    """Writes the weights file, runs every run, checks parity; returns (Comparison, the combined JSON dict, the
    reporters' failures). A Ctrl-C stops the run under way (it writes its partial result), writes the combined
    JSON of what finished, marked interrupted, and ends with RunInterrupted naming those files."""
    validate_plan(plan, registry)
    twin = f" (and {plan.baseline_spec.label} again in each, A/A)" if plan.aa else ""
    console.print(f"compare: {', '.join(spec.label for spec in plan.specs)}; {plan.repeats_text}{twin}, each run in "
                  f"its own process")
    progress = CompareProgress()
    report_failures = []
    try:
        write_weights_files(plan, console, progress)
        number, started = 0, time.perf_counter()
        for repeat in itertools.count(1):
            round_started = time.perf_counter()
            if repeat > 1 and plan.auto is not None:  # the first repeat's files were checked with the plan
                for spec, _ in plan.round(repeat):
                    check_output_path(plan.run_file(spec, repeat), plan.overwrite)
            for spec, _ in plan.round(repeat):
                number += 1
                report_failures += train_one(plan, registry, console, progress, number, spec, repeat)
            if plan.auto is None:
                if repeat >= plan.repeats:
                    break
                continue
            now = time.perf_counter()
            widest = max((stats.half_width(low, high) for low, high in _auto_intervals(plan, progress)),
                         default=None)
            progress.auto = auto_repeats_end(plan.auto, repeat, widest, now - started, now - round_started)
            if progress.auto:
                console.print(progress.auto["text"], highlight=False)
                break
    except KeyboardInterrupt:
        raise interrupted(plan, progress) from None
    comparison, combined = write_combined(plan, progress)
    return comparison, combined, report_failures


def _auto_intervals(plan, progress):
    """(low, high) of the tokens/s intervals --repeats auto waits to narrow: every run against the baseline, and
    the A/A."""
    comparison = _comparison(plan, progress)
    found = [by_figure[stats.SPEED_FIGURE] for by_figure in comparison.verdicts.values()
             if stats.SPEED_FIGURE in by_figure]
    twin = ((comparison.noise_floor or {}).get("figures") or {}).get(stats.SPEED_FIGURE)
    return [(verdict.low, verdict.high) for verdict in found] + ([(twin["low"], twin["high"])] if twin else [])


def write_weights_files(plan, console, progress):
    """One initial-weights file per model size, drawn on the baseline's backend."""
    baseline_backend = plan.baseline_spec.backend
    for sized in plan.sizes():
        path = plan.weights_file(sized)
        progress.doing, progress.log_file = "writing the initial weights", path[:-len(".npz")] + ".log"
        with console.status("writing the initial weights (data, tokenizer, model shapes)"):
            _require_success(run_child(["init-weights", "--backend", baseline_backend, *plan.configuration,
                                        *sized.size_arguments(), "--out", path, *_overwrite(plan)],
                                       progress.log_file, "writing the initial weights",
                                       python=plan.baseline_spec.interpreter))
        _, sha256 = read_weights_file(path)
        progress.weights[sized.shape] = {"file": os.path.abspath(path), "sha256": sha256, "drawn_on": baseline_backend}
        size = shape_label(sized.shape)
        console.print(f"initial weights: {path} (sha256 {sha256[:16]}…, drawn on {baseline_backend}), loaded by "
                      f"every run" + (f" of {size}" if size else ""))


def _overwrite(plan):
    return ["--overwrite"] if plan.overwrite else []


def _run_name(plan, spec, repeat):
    name = f"run '{spec.label}'" + (" (A/A twin)" if spec.twin else "")
    if plan.auto is not None:
        return name + f" (repeat {repeat})"
    return name + (f" (repeat {repeat} of {plan.repeats})" if plan.repeats > 1 else "")


def train_one(plan, registry, console, progress, number, spec, repeat):
    """Trains one run of the schedule in its own process and adds its result to `progress`; returns the
    reporters' failures."""
    name = _run_name(plan, spec, repeat)
    total = "?" if plan.auto else len(plan.schedule())
    result_file, log_file = plan.run_file(spec, repeat), plan.run_file(spec, repeat, ".log")
    weights = progress.weights[spec.shape]
    extras = [argument for extra in spec.extras for argument in ("--extra", extra)]
    started = time.perf_counter()
    before = os.stat(result_file).st_mtime_ns if os.path.exists(result_file) else None  # --overwrite
    progress.doing, progress.log_file, progress.run = name, log_file, (spec, repeat, result_file, before)
    report_failures = []
    if reads_run_files(plan, spec):
        train_file = plan.run_file(spec, repeat, RUN_FILE_SUFFIX)
        write_run_file(train_file, TrainConfig.from_options(**{
            **plan.options, **dict(spec.sizes), "backend": spec.backend, "extras": spec.extras,
            "initial_weights": weights["file"], "out": result_file, "run_group": plan.group,
            "overwrite": plan.overwrite}))
        arguments = ["train", "--run-file", train_file, "--report", "none"]
    else:  # another environment's mtbench from before run files
        arguments = ["train", "--backend", spec.backend, *extras, *plan.configuration, *spec.size_arguments(),
                     "--initial-weights", weights["file"], "--out", result_file, "--report", "none",
                     "--run-group", plan.group, *plan.train_arguments, *_overwrite(plan)]
    with console.status(f"[{number}/{total}] {name}: training in its own process") as status:
        failure = run_child(arguments, log_file, name, spec.processes, spec.interpreter,
                            show=training_lines(console, status, f"[{number}/{total}] {spec.label}"))
    progress.run = None
    if failure and failure.exit_code == ReportingFailed.EXIT_CODE:
        report_failures.append(failure)  # the run completed; only one of its trackers failed
        failure = None
    if failure and plan.reporters and _written(result_file, before):  # a partial result is reported too
        report_failures += run_reporters(plan.reporters, registry, _read_result(result_file, name), console,
                                         result_file)
    _require_success(failure)
    result = _read_result(result_file, name)
    report_failures += run_reporters(plan.reporters, registry, result, console, result_file)
    if result["config"].get("initial_weights_sha256") != weights["sha256"]:
        raise RunFailure(f"{name} did not start from {weights['file']}: it records sha256 "
                         f"{result['config'].get('initial_weights_sha256')}")
    tokens = result["timing"]["tokens_per_s"]
    console.print(f"[{number}/{total}] {spec.label}" + (" (A/A twin)" if spec.twin else "") +
                  (f" #{repeat}" if plan.auto or plan.repeats > 1 else "") +
                  f": {time.perf_counter() - started:.1f} s, "
                  f"{'n/a' if tokens is None else f'{tokens:,.0f}'} tokens/s, "
                  f"final loss {result['history'][-1]['loss']:.3f}")
    progress.add(spec, repeat, result, result_file, log_file)
    return report_failures


def training_lines(console, status, prefix):
    """How a child's training lines are shown: on a terminal as the status line under the spinner, elsewhere (a
    log file, a pipe) printed and flushed one by one, each after the run's name, as `train` logs its own."""
    if console.is_terminal:
        return lambda line: status.update(f"{prefix}: {line}")

    def printed(line):
        console.print(f"{prefix}: {line}", highlight=False, soft_wrap=True)
        console.file.flush()
    return printed


def reads_run_files(plan, spec):
    """Whether the mtbench that trains `spec` reads this mtbench's run files: this interpreter's does; another
    environment's where its `mtbench env --json` names the same run file format."""
    if plan.options is None:
        return False
    if not spec.foreign:
        return True
    return ((plan.interpreters or {}).get(spec.interpreter) or {}).get("run_file_format") == RUN_FILE_FORMAT


def _written(path, mtime_before):
    """Whether the run wrote `path` (a file there before it, kept by --overwrite until then, is not its own)."""
    return os.path.exists(path) and os.stat(path).st_mtime_ns != mtime_before


def _baseline_runs(plan, progress):
    return [run for run, entry in zip(progress.runs, progress.entries) if entry["label"] == plan.baseline_spec.label]


def _comparison(plan, progress):
    # The baseline spec's first run (an interrupted comparison may lack it): its label in the comparison may
    # name more than the spec's (a key another run sweeps).
    baseline = next(iter(_baseline_runs(plan, progress)), None)
    return build_comparison(progress.runs, baseline=baseline, parity_steps=plan.parity_steps,
                            parity_tolerance=plan.parity_tolerance,
                            noise_floor=stats.noise_floor_record(plan.baseline_spec.label,
                                                                 [run.result for run in _baseline_runs(plan, progress)],
                                                                 [run.result for run in progress.twins]))


def write_combined(plan, progress, status="completed", status_reason=None):
    """Builds the comparison of the runs that finished and writes the combined JSON; returns (Comparison, JSON)."""
    comparison = _comparison(plan, progress)
    weights = progress.weights
    combined = combined_json(comparison, progress.entries, {"status": status, "status_reason": status_reason}, {
        "initial_weights": weights[plan.baseline_spec.shape],
        "initial_weights_by_size": {shape_label(shape): record for shape, record in weights.items()},
        "run_order": "round-robin: every run once, then every run again for each further repeat (each run's "
                     "`position` is its place in that order)",
        "repeats_auto": progress.auto,
        "aa_runs": progress.twin_entries,
    })
    write_json_atomic(plan.out, combined)
    return comparison, combined


def interrupted(plan, progress):
    """After a Ctrl-C: keeps the interrupted run's partial result, writes the combined JSON of every run that has
    a result (status 'interrupted'), and returns the one-line error naming what was written (exit code 130)."""
    total = "?" if plan.auto else len(plan.schedule())
    finished = len(progress.entries) + len(progress.twin_entries)
    kept = [f"log {progress.log_file}"] if progress.log_file and os.path.exists(progress.log_file) else []
    if progress.run:
        spec, repeat, result_file, before = progress.run
        result = _partial_result(result_file, before)
        if result is None:
            kept.insert(0, f"no result from {progress.doing}")
        else:
            kept.insert(0, f"its partial result {result_file}")
            progress.add(spec, repeat, result, result_file, progress.log_file)
    reason = f"interrupted during {progress.doing} ({finished} of {total} runs finished)"
    if progress.entries:
        try:
            write_combined(plan, progress, "interrupted", reason)
            kept.append(f"the {len(progress.entries)} result(s) combined in {plan.out} (status interrupted)")
        except MtbenchError as error:
            kept.append(f"no combined JSON ({error})")
    elif progress.weights:
        kept.append("no run finished: no combined JSON")
    else:
        kept.append("nothing was trained")
    return RunInterrupted(f"{reason}; {'; '.join(kept)}", 130)


def _partial_result(path, mtime_before):
    """The result an interrupted run wrote (partial, or complete when it finished first), or None."""
    if not _written(path, mtime_before):
        return None
    try:
        result = _read_result(path, "the interrupted run")
    except RunFailure:  # killed while writing: atomic writes leave no half file, but a foreign one may be there
        return None
    return result if isinstance(result, dict) and result.get("history") is not None else None
