"""`mtbench compare`: one configuration trained on several backends and extras, each run in a fresh process, every
run starting from one weights file; then the parity check, the speed-ups and one combined JSON.

Keras fixes its backend when it is imported, so no process can hold two runs: this orchestrator imports no
framework and spawns `python -m mtbench` once for the weights file and once for each run.
"""

import dataclasses
import itertools
import os
import shutil
import time
from dataclasses import dataclass

from mtbench.errors import MtbenchError, ReportingFailed, RunFailure, RunInterrupted
from mtbench.runner.config import TrainConfig
from mtbench.runner.data.weights_file import drawn_scheme, read_weights_file
from mtbench.runner.files import read_json, write_json_atomic
from mtbench.runner.orchestration.children import run_child
from mtbench.runner.orchestration.environments import check_runs
from mtbench.runner.orchestration.runs import shape_label
from mtbench.runner.results import verdicts as stats
from mtbench.runner.results.compare_json import combined_json, warned
from mtbench.runner.results.parity import check_parity_options
from mtbench.runner.results.output import check_output_path, check_result_path
from mtbench.runner.results.report import (LoadedRun, baseline_label, build_comparison, configuration_differences,
                                           software_difference)
from mtbench.runner.results.reporting import run_reporters
from mtbench.runner.results.schema import result_stem
from mtbench.runner.run_file import RUN_FILE_FORMAT, write_run_file
from mtbench.runner.setup import resolve_model

# Beside each run's result: the run file its process trained from (`mtbench train --run-file`).
RUN_FILE_SUFFIX = ".train.json"


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
    weights_left: bool = False  # the weights files are an earlier comparison's that no run used (`only_weights_left`)

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
        """The first spec of each model shape, in the order they first appear (the last one's own flags, a
        compiled torch run's --compile-mode, went to the weights file's `init-weights`)."""
        first = {}
        for spec in self.specs:
            first.setdefault(spec.shape, spec)
        return list(first.values())

    def run_file(self, spec, repeat, suffix=".json"):
        return os.path.join(self.runs_dir, run_file_name(f"{spec.label}{'-aa' if spec.twin else ''}", repeat, suffix))

    def round(self, repeat):
        """(spec, repeat) of one repeat, in the order they run: the runs' own order in odd repeats, reversed in even
        ones (A B, B A, A B, ...), so that a steady drift of the machine (heat, a neighbour's load) does not always
        fall on the run that comes later, which the paired repeats' interval would take for a difference. With
        --aa the baseline's twin runs beside the baseline, after it in odd repeats and before it in even ones."""
        specs = self.specs if repeat % 2 else self.specs[::-1]
        runs = [(spec, repeat) for spec in specs]
        if self.aa:
            at = specs.index(self.baseline_spec) + repeat % 2
            runs.insert(at, (dataclasses.replace(self.baseline_spec, twin=True), repeat))
        return runs

    def schedule(self):
        """(spec, repeat) in the order they run: round-robin over repeats, each round in turn forwards and backwards
        (`round`), so a slow drift of the machine touches every run alike instead of the last ones. Under --repeats
        auto, the first repeat (how many follow depends on their figures)."""
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
    least `verdicts.MIN_REPEATS` repeats), or until the repeats that would follow would end past `budget_s` seconds,
    or at `most` repeats; each on an even count of repeats (`auto_repeats_end`)."""
    width: float = stats.DEFAULT_WIDTH
    budget_s: float = 1800.0
    most: int = 50  # even: see `auto_repeats_end`


def auto_repeats_end(auto, repeats, widest, elapsed_s, round_s):
    """What ends --repeats auto after `repeats` repeats (None: another repeat): {'ended_by': 'width', 'budget' or
    'most', ...} with the sentence that says so. `widest`: the widest tokens/s interval's half width so far (None
    where there is none yet); `round_s`: the last repeat's time, which each next one is expected to take.

    It ends on an even count: the rounds run forwards and backwards in turn (`ComparePlan.round`), and only as many
    of each cancel a drift of the machine between the runs (an odd count left the last run of the first round the
    later one in one round more, a drift's share of which the paired interval took for a difference). So at an
    even count it goes on only where two more repeats fit the budget, and at an odd one it ends only where the one
    repeat that balances them would end past it, which it then says."""
    balanced = repeats % 2 == 0
    if balanced and widest is not None and widest <= auto.width and repeats >= stats.MIN_REPEATS:
        ended_by = "width"
        text = f"every tokens/s interval is within ±{widest:.1%} (goal ±{auto.width:.1%})"
    elif balanced and repeats >= auto.most:
        ended_by, text = "most", f"{repeats} repeats, the most it runs"
    elif elapsed_s + (2 if balanced else 1) * round_s > auto.budget_s:
        ended_by = "budget"
        text = (f"the time budget: {elapsed_s:,.0f} s of {auto.budget_s:g} s used, and "
                f"{'two more repeats' if balanced else 'another repeat'} would take about "
                f"{(2 if balanced else 1) * round_s:,.0f} s")
    else:
        return None
    widest_text = "" if ended_by == "width" or widest is None else \
        f"; the widest tokens/s interval is ±{widest:.1%} (goal ±{auto.width:.1%})"
    few = f"; only {repeats} repeat(s), fewer than the {stats.MIN_REPEATS} the interval needs" \
        if repeats < stats.MIN_REPEATS else ""
    unbalanced = "" if balanced else ("; an odd count: the runs ran in their given order in one repeat more than "
                                      "in reverse, so a drift of the machine falls unevenly on them")
    return {"ended_by": ended_by, "repeats": repeats, "width": auto.width, "widest": widest, "budget_s": auto.budget_s,
            "elapsed_s": elapsed_s,
            "text": f"--repeats auto ended by {ended_by} after {repeats} repeat(s): {text}{widest_text}{few}"
                    f"{unbalanced}"}


def runs_dir(out):
    """The folder beside a combined JSON that holds its runs' own files (`mtbench compare`'s, `mtbench rerun`'s)."""
    return result_stem(out) + ".runs"


# What names a run's files in place of the characters of its label that Windows' file names, and CI systems'
# artifact uploads (GitHub's refuses `:`), do not take: `jax:model=gpt` -> `jax_model=gpt-1.json`.
UNSAFE_IN_FILE_NAMES = str.maketrans({character: "_" for character in '\\/:*?"<>|'})


# --repeats N's bound: each repeat of each run has its files planned (and checked) before the first run starts, and
# 10^20 repeats planned for ever, silently.
MAX_REPEATS = 1000


def run_file_name(label, repeat, suffix=".json"):
    """The name of the file of repeat `repeat` of the run labelled `label` in a runs folder."""
    return f"{label.translate(UNSAFE_IN_FILE_NAMES)}-{repeat}{suffix}"


def check_repeats_and_parity(repeats, auto, parity_steps, parity_tolerance):
    """The options that need no run planned, checked before the devices are asked (a child process: seconds)."""
    if auto is None and repeats < 1:
        raise MtbenchError(f"--repeats must be at least 1, got {repeats}")
    if auto is None and repeats > MAX_REPEATS:  # every repeat's files are planned and checked before a run starts
        raise MtbenchError(f"--repeats must be at most {MAX_REPEATS:,}, got {repeats:,}")
    if auto is not None and not auto.budget_s > 0:
        raise MtbenchError(f"--repeats-budget must be positive, got {auto.budget_s:g}")
    check_parity_options(parity_steps, parity_tolerance)


def validate_plan(plan, registry):
    check_repeats_and_parity(plan.repeats, plan.auto, plan.parity_steps, plan.parity_tolerance)
    if plan.auto is not None and len(plan.specs) < 2 and not plan.aa:
        raise MtbenchError("--repeats auto repeats until the intervals between runs are narrow: give two runs or "
                           "more, or --aa")
    if plan.baseline is not None:  # as the table names it, or without the model family's name
        plan.baseline = baseline_label(plan.baseline, [spec.label for spec in plan.specs])
    check_runs(plan.specs, registry, plan.interpreters)
    check_output_path(plan.out, plan.overwrite)
    plan.weights_left = only_weights_left(plan)
    for spec in plan.sizes():
        check_output_path(plan.weights_file(spec), plan.overwrite or plan.weights_left, kind=".npz")
    for spec, repeat in plan.schedule():
        check_result_path(plan.run_file(spec, repeat), plan.overwrite)


# What a comparison writes in its runs folder before any run has a result: the weights files, their logs, and the
# runs' logs, run files and result locks (a killed run leaves its lock, which the next run takes again).
BEFORE_ANY_RESULT = (".npz", ".log", RUN_FILE_SUFFIX, ".json.lock")


def only_weights_left(plan):
    """Whether the runs folder holds only what an earlier comparison into the same --out wrote before any run had a
    result (it was refused or failed then, leaving no combined JSON): files the user never asked for, which this
    comparison replaces without --overwrite. A run's result, even partial, stays protected."""
    if os.path.exists(plan.out) or not os.path.isdir(plan.runs_dir):
        return False
    return all(name.endswith(BEFORE_ANY_RESULT) and os.path.isfile(os.path.join(plan.runs_dir, name))
               for name in os.listdir(plan.runs_dir))


# What a comparison writes in its runs folder besides (the runs' results, hypotheses and references, their folders).
RUN_OUTPUTS = (*BEFORE_ANY_RESULT, ".json", ".hyp.txt", ".ref.txt")


def clear_earlier_comparison(plan):
    """With --overwrite, once every check has passed: the comparison written to the same --out before, and what it
    left in the runs folder, go (as `train --overwrite` empties its run's folder), so that no result of its other
    runs (another sweep) lies beside this comparison's for `report NAME.runs/*.json` or a history to read. Only what
    a comparison writes: anything else a user put there stays."""
    if os.path.isfile(plan.out):
        os.remove(plan.out)
    if not os.path.isdir(plan.runs_dir):
        return
    for name in os.listdir(plan.runs_dir):
        path = os.path.join(plan.runs_dir, name)
        if os.path.isdir(path) and name.endswith(".run"):
            shutil.rmtree(path)
        elif os.path.isfile(path) and name.endswith(RUN_OUTPUTS):
            os.remove(path)


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
    weights: dict = dataclasses.field(default_factory=dict)  # model size -> {"file", "sha256", "drawn_on", "init"}
    runs: list = dataclasses.field(default_factory=list)      # LoadedRun of every run that finished
    entries: list = dataclasses.field(default_factory=list)   # their entries in the combined JSON
    doing: str = "starting"                                   # what runs now, for an interruption's message
    twins: list = dataclasses.field(default_factory=list)      # LoadedRun of every A/A twin (--aa) that finished
    twin_entries: list = dataclasses.field(default_factory=list)
    auto: dict = None                                         # what ended --repeats auto
    log_file: str = None                                      # its log
    run: tuple = None  # (spec, repeat, result file, its mtime before the run) while a run trains
    failed_run: tuple = None  # the same of the run that failed
    software_said: str = None  # the last `software_difference` told on the console

    def add(self, spec, repeat, result, result_file, log_file):
        runs, entries = (self.twins, self.twin_entries) if spec.twin else (self.runs, self.entries)
        label = spec.label + (" (A/A twin)" if spec.twin else "")
        runs.append(LoadedRun(result, result_file, asked_as=label))
        entries.append({"label": label, "repeat": repeat,
                        "position": len(self.entries) + len(self.twin_entries) + 1,
                        "status": result.get("status"), "result_file": os.path.abspath(result_file),
                        "log_file": os.path.abspath(log_file), "python": spec.interpreter, "result": result})


def run_compare(plan, registry, console):
    """Writes the weights file, runs every run, checks parity; returns (Comparison, the combined JSON dict, the
    reporters' failures). A Ctrl-C stops the run under way (it writes its partial result), writes the combined
    JSON of what finished, marked interrupted, and ends with RunInterrupted naming those files."""
    validate_plan(plan, registry)
    if plan.overwrite:
        clear_earlier_comparison(plan)
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
                    check_result_path(plan.run_file(spec, repeat), plan.overwrite)
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
    except KeyboardInterrupt as stop:
        raise interrupted(plan, progress, getattr(stop, "exit_code", 130)) from None
    except RunFailure as failure:
        raise failed(plan, progress, failure) from None
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
                                        *sized.size_arguments(), "--out", path,
                                        *(["--overwrite"] if plan.overwrite or plan.weights_left else [])],
                                       progress.log_file, "writing the initial weights",
                                       python=plan.baseline_spec.interpreter))
        drawn, sha256 = read_weights_file(path)
        progress.weights[sized.shape] = {"file": os.path.abspath(path), "sha256": sha256, "drawn_on": baseline_backend,
                                         "init": drawn.init}
        size = shape_label(sized.shape)
        console.print(f"initial weights: {path} (sha256 {sha256[:16]}…, drawn on {baseline_backend}), loaded by "
                      f"every run" + (f" of {size}" if size else ""))


def _overwrite(plan):
    return ["--overwrite"] if plan.overwrite else []


def run_file_arguments(train_file, overwrite):
    """The child's command line that trains `train_file` (a run file), reporting nothing itself; replacing an
    earlier result where the parent command was told to (a run file does not say: `--overwrite` is a command's)."""
    return ["train", "--run-file", train_file, "--report", "none", *(["--overwrite"] if overwrite else [])]


def _run_name(plan, spec, repeat):
    name = f"run '{spec.label}'" + (" (A/A twin)" if spec.twin else "")
    if plan.auto is not None:
        return name + f" (repeat {repeat})"
    return name + (f" (repeat {repeat} of {plan.repeats})" if plan.repeats > 1 else "")


def run_configuration(plan, spec, weights, result_file, registry):
    """What the run file of `spec` gives its process: the shared options and the run's own, its starting weights
    (`weights`: the file and its scheme) and outputs, as its model family completes them (`ModelFamily.check`: the
    `char` preset reads a text by its characters), so that the file says what the run trains."""
    config = TrainConfig.from_options(**{
        **plan.options, **dict(spec.sizes), "backend": spec.backend, "extras": spec.extras,
        "initial_weights": weights["file"], "init": drawn_scheme(weights["init"]), "out": result_file,
        "run_group": plan.group, "overwrite": plan.overwrite})
    resolve_model(config, registry)  # the family's check, as `train` runs it
    return config


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
        write_run_file(train_file, run_configuration(plan, spec, weights, result_file, registry))
        arguments = run_file_arguments(train_file, plan.overwrite)
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
    if failure:
        progress.failed_run = (spec, repeat, result_file, before)
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
    warn_of_software(console, progress)
    return report_failures


def warn_of_software(console, progress):
    """Says `software_difference` on the console once the runs that finished differ, and again where a later run
    adds another: as it happens, since the comparison may yet fail before its table shows it."""
    difference = software_difference([*progress.entries, *progress.twin_entries])
    if difference and difference != progress.software_said:
        console.print(f"Warning: {difference}", highlight=False, soft_wrap=True)
        progress.software_said = difference


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
    try:
        comparison = build_comparison(progress.runs, baseline=baseline, parity_steps=plan.parity_steps,
                                parity_tolerance=plan.parity_tolerance,
                                noise_floor=stats.noise_floor_record(
                                    plan.baseline_spec.label, [run.result for run in _baseline_runs(plan, progress)],
                                    [run.result for run in progress.twins], plan.parity_steps))
    except MtbenchError as error:
        changed = changed_while_training(progress.runs)
        if not str(error).startswith("not comparable") or not changed:
            raise
        raise MtbenchError(f"{error}; {changed}") from None
    difference = software_difference([*progress.entries, *progress.twin_entries])
    return warned(comparison, difference) if difference else comparison


def changed_while_training(runs):
    """What the runs' extras changed (`config_changes`), as each result's configuration differs from the run file it
    was given, in words, or '': where the preflight could not ask them (a run of several processes, another
    environment's), this is where runs parted that the user gave alike. Each change names the extra its result
    records for it (`config_changed_by`); a result from before that names all of its run's extras."""
    found = []
    for run in runs:
        train_file = run.source[:-len(".json")] + RUN_FILE_SUFFIX
        try:
            given = read_json(train_file, "its run file")["config"]
        except (MtbenchError, KeyError, TypeError):  # another environment's mtbench from before run files
            continue
        # what the run records beside the given options (its weights' sha256, its task) is no change
        differences = [(key, before, after) for key, before, after in configuration_differences(
            given, run.result["config"]) if given.get(key) is not None]
        if differences:
            changed_by = run.result.get("config_changed_by") or {}
            by_extra = {}
            for key, before, after in differences:
                by_extra.setdefault(changed_by.get(key), []).append(f"{key} {before!r} -> {after!r}")
            every = f"its extras ({', '.join(run.result['config'].get('extras') or ())})"
            found.append(f"run '{run.asked_as}' changed " + ", and ".join(
                f"{', '.join(changes)} as it trained, set by the config_changes of "
                f"{f'extra {extra!r}' if extra else every}" for extra, changes in by_extra.items()))
    return "; ".join(found)


def write_combined(plan, progress, status="completed", status_reason=None):
    """Builds the comparison of the runs that finished and writes the combined JSON; returns (Comparison, JSON)."""
    comparison = _comparison(plan, progress)
    weights = progress.weights
    combined = combined_json(comparison, progress.entries, {"status": status, "status_reason": status_reason}, {
        "initial_weights": weights[plan.baseline_spec.shape],
        "initial_weights_by_size": {shape_label(shape): record for shape, record in weights.items()},
        "run_order": "round-robin: every run once, then every run again for each further repeat, in reverse "
                     "order in even repeats (each run's `position` is its place in that order)",
        "repeats_auto": progress.auto,
        "aa_runs": progress.twin_entries,
    })
    write_json_atomic(plan.out, combined)
    return comparison, combined


def interrupted(plan, progress, exit_code=130):
    """After a Ctrl-C (or a SIGTERM, `exit_code` 143): keeps the interrupted run's partial result, writes the
    combined JSON of every run that has a result (status 'interrupted'), and returns the one-line error naming
    what was written."""
    stopped = _combine_what_ran(plan, progress, progress.run, "interrupted", f"interrupted during {progress.doing}")
    log = [f"log {progress.log_file}"] if progress.log_file and os.path.exists(progress.log_file) else []
    return RunInterrupted("; ".join([stopped.reason, *stopped.run_kept, *log, stopped.combined]), exit_code)


def failed(plan, progress, failure):
    """After a run failed (its log named by `failure`): writes the combined JSON of the runs that finished and of
    the failed run's partial result if it left one (a diverged run's), status 'failed', so that the comparison
    file holds what its runs folder does; returns `failure` with what was written."""
    stopped = _combine_what_ran(plan, progress, progress.failed_run, "failed", str(failure))
    run_kept = [] if stopped.run_result_added else stopped.run_kept  # the failure names a partial result
    if stopped.combined_written or not os.path.exists(plan.out):
        return RunFailure("; ".join([str(failure), *run_kept, stopped.combined]))
    # --overwrite, before a run finished: the earlier comparison's file is left, its runs' files partly replaced
    return RunFailure("; ".join([str(failure), *run_kept, f"{stopped.combined}: {plan.out} is still the comparison "
                                 f"before, whose files in {plan.runs_dir} this one began to replace"]))


@dataclass
class StoppedEarly:
    """What `_combine_what_ran` did where a comparison stopped early."""
    reason: str               # the combined JSON's status_reason
    run_kept: list            # what the stopped run left: its (partial) result, or none
    run_result_added: bool    # whether that result is among the combined runs
    combined: str             # what was combined, in words
    combined_written: bool


def _combine_what_ran(plan, progress, stopped_run, status, why):
    """Where a comparison stopped early (`why`): adds the stopped run's result where it wrote one, and combines
    every run with a result in plan.out with `status`; returns the StoppedEarly saying what it kept."""
    total = "?" if plan.auto else len(plan.schedule())
    finished = len(progress.entries) + len(progress.twin_entries)
    run_kept, added = [], False
    if stopped_run:
        spec, repeat, result_file, before = stopped_run
        result = _partial_result(result_file, before)
        if result is None:
            run_kept.append(f"no result from {progress.doing}")
        else:
            # a Ctrl-C as it ended, or a failure after it wrote its result
            finished_first = result.get("status") == "completed"
            run_kept.append(f"its {'result (it had completed)' if finished_first else 'partial result'} "
                            f"{result_file}")
            progress.add(spec, repeat, result, result_file, progress.log_file)
            added = True
    reason = f"{why} ({finished} of {total} runs finished)"
    if progress.entries:
        try:
            write_combined(plan, progress, status, reason)
            return StoppedEarly(reason, run_kept, added, f"the {len(progress.entries)} result(s) combined in "
                                f"{plan.out} (status {status})", True)
        except MtbenchError as error:
            return StoppedEarly(reason, run_kept, added, f"no combined JSON ({error})", False)
    return StoppedEarly(reason, run_kept, added,
                        "no run finished: no combined JSON" if progress.weights else "nothing was trained", False)


def _partial_result(path, mtime_before):
    """The result an interrupted run wrote (partial, or complete when it finished first), or None."""
    if not _written(path, mtime_before):
        return None
    try:
        result = _read_result(path, "the interrupted run")
    except RunFailure:  # killed while writing: atomic writes leave no half file, but a foreign one may be there
        return None
    return result if isinstance(result, dict) and result.get("history") is not None else None
