"""`mtbench rerun RESULT.json`: the run a result describes (or every run of a compare JSON), trained again in a
child process with the same configuration and, where the weights file it names is still there with the same
sha256, from the same weights; then the two side by side, naming every difference in versions, hardware,
configuration and figures. Figures that can be run again from the JSON they came in are figures a reader can
check.
"""

import os
import time
from dataclasses import dataclass

from mtbench.errors import MtbenchError, ReportingFailed, RunFailure, RunInterrupted
from mtbench.figures import run_processes
from mtbench.runner.config import INPUT_FILE_KEYS, TrainConfig
from mtbench.runner.data.formats import SACREBLEU_PREFIX
from mtbench.runner.files import read_json, write_json_atomic
from mtbench.runner.orchestration.children import run_child
from mtbench.runner.orchestration.compare import RUN_FILE_SUFFIX, run_file_arguments, run_file_name, runs_dir
from mtbench.plugins import manager as plugins
from mtbench.plugins.api import file_sha256
from mtbench.runner.orchestration.environments import check_runs, probe_devices, probe_environment, runs_to_preflight
from mtbench.runner.orchestration.runs import RunSpec
from mtbench.runner.results.compare_json import combined_json
from mtbench.runner.results.output import check_not_read, check_output_path, check_result_path
from mtbench.runner.results.parity import PARITY_STEPS, require_parity
from mtbench.runner.results.report import (LoadedRun, build_comparison, comparison_labels, load_runs,
                                           recorded_baseline, recorded_parity)
from mtbench.runner.results.schema import result_stem
from mtbench.runner.results.side_by_side import side_by_side, side_by_side_table
from mtbench.runner.run_file import RUN_FILE_FORMAT, write_run_file

# Recorded beside the configuration by the run itself, or by an mtbench before the option was removed: not
# options to give again.
RECORDED_KEYS = ("initial_weights_sha256", "parameters", "log_every", "task")
# Where the original's files went and how it was followed: the rerun sets its own (its file, its log, no
# trackers). Backend, extras and weights are given on their own; the cache directory where it exists here.
NOT_REPEATED = ("out", "overwrite", "report_to", "logging_dir", "run_group", "backend", "extras", "initial_weights")

# The files the run read its data from (its weights file is `starting_weights`'s).
DATA_FILE_KEYS = tuple(key for key in INPUT_FILE_KEYS if key != "initial_weights")


@dataclass
class Rerun:
    """One run to train again: the original, where the rerun writes, and how it starts."""
    original: LoadedRun
    label: str
    out: str
    repeat: int = 1
    config: TrainConfig = None  # what it trains: the original's configuration (`repeated_options`), its own files
    weights: str = None       # the weights file to start from, or None (the draw from the seed, as configured)
    weights_note: str = None  # why the rerun does not start from the original's weights file, where it does not
    python: str = None        # the interpreter it runs under: the original's, in a comparison of environments

    @property
    def log_file(self):
        return result_stem(self.out) + ".log"

    @property
    def train_file(self):
        return result_stem(self.out) + RUN_FILE_SUFFIX


def starting_weights(config, near=()):
    """(weights file, note): the original's weights file where it still holds the bytes the run loaded, else
    (None, why not: the rerun then draws its weights from the seed). A file of its name in a folder of `near` (the
    original moved with its weights) stands for it where it holds the bytes the run recorded."""
    path, recorded = config.get("initial_weights"), config.get("initial_weights_sha256")
    if not path:
        return None, None
    seed = f"the rerun draws its weights from --seed {config.get('seed')} instead"
    if not os.path.isfile(path):
        moved = [os.path.join(folder, os.path.basename(path)) for folder in near]
        found = next((candidate for candidate in moved
                      if recorded and os.path.isfile(candidate) and file_sha256(candidate) == recorded), None)
        if found:
            return found, None
        return None, f"the weights file {path} is gone: {seed}"
    found = file_sha256(path)
    if recorded and found != recorded:
        return None, f"the weights file {path} has changed (sha256 {found[:16]}…, the run loaded {recorded[:16]}…): {seed}"
    return path, None


def check_data_files(source, config):
    """Refuses a rerun whose corpus, validation or test file is gone from where the original read it: found missing
    before anything starts, where the run's own process would have failed after its framework's start."""
    for key in DATA_FILE_KEYS:
        path = getattr(config, key)
        if path and not path.startswith(SACREBLEU_PREFIX) and not os.path.exists(path):
            raise MtbenchError(f"{source}: its {key.replace('_', ' ')} {path} is gone (no such file or folder); put "
                               f"it back there to train the run again")


def repeated_options(result):
    """The configuration of `result` to train again, by TrainConfig field: all of it but its weights and files.
    One this mtbench cannot read (a key it does not know) is refused."""
    recorded = {key: value for key, value in result["config"].items() if key not in RECORDED_KEYS}
    try:
        config = TrainConfig.from_dict(recorded).to_dict()
    except (MtbenchError, TypeError) as error:
        raise MtbenchError(f"its configuration cannot be read: {error}") from None
    repeated = {key: value for key, value in config.items() if key not in NOT_REPEATED and key != "model"
                and not (key == "cache_dir" and not os.path.isdir(value))}
    return {**repeated, "backend": result["backend"], "extras": tuple(result["extras"])}


def plan_reruns(path, out, overwrite):
    """The runs of `path` to train again, each with its output file and its configuration, all checked before
    anything starts."""
    runs = load_runs([path])
    single = len(runs) == 1 and runs[0].source == path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if out is None:  # --out '' is refused as train refuses it, not taken for the default
        out = os.path.join("mtbench-results", f"{stamp}-rerun{'-' + runs[0].result['backend'] if single else ''}.json")
    labels = comparison_labels([run.result for run in runs])
    environments = {}  # {interpreter: its `mtbench env --json`} of the runs under other interpreters
    check_not_read(out, (path,))  # a rerun is compared with its original: never written over it
    if single:
        reruns = [Rerun(runs[0], labels[0], out)]
    else:
        repeats = {}
        reruns = []
        pythons, environments = compared_interpreters(path)
        for run, label, python in zip(runs, labels, pythons):
            repeats[label] = repeats.get(label, 0) + 1
            reruns.append(Rerun(run, label, os.path.join(runs_dir(out), run_file_name(label, repeats[label])),
                                repeats[label], python=python))
        check_output_path(out, overwrite)
    for rerun in reruns:  # the original's file is never written over
        check_result_path(rerun.out, overwrite, beside=(rerun.log_file, rerun.train_file), reads=(path,))
        near = (runs_dir(path), os.path.dirname(os.path.abspath(path)))  # the original moved with its weights
        rerun.weights, rerun.weights_note = starting_weights(rerun.original.result["config"], near)
        try:
            rerun.config = TrainConfig.from_options(**repeated_options(rerun.original.result),
                                                    initial_weights=rerun.weights, out=rerun.out, overwrite=overwrite)
        except MtbenchError as error:
            raise MtbenchError(f"{rerun.original.source}: {error}") from None
        check_data_files(rerun.original.source, rerun.config)
    # A backend or extra (a plugin's) missing here fails now, not in a child after other runs have trained.
    specs = [RunSpec(rerun.config.backend, rerun.config.extras, processes=run_processes(rerun.original.result),
                     python=rerun.python) for rerun in reruns]
    try:
        check_runs(specs, plugins.registry(), environments)
    except MtbenchError as error:
        raise MtbenchError(f"{path}: {error}; install what it ran with to train it again") from None
    preflight = [] if single else runs_to_preflight(specs, [rerun.config.to_dict() for rerun in reruns])
    if preflight:  # a device here that refuses a run (fewer devices than it had) fails now, not after the others
        try:
            probe_devices(preflight)
        except MtbenchError as error:
            raise MtbenchError(f"{path}: {error}") from None
    return reruns, out, single


def compared_interpreters(path):
    """([the interpreter of each run of the compare JSON `path`, in order], {interpreter: its `mtbench env
    --json`}) where its runs ran under several (an upgrade comparison, `python=PATH`), each checked to exist and to
    read run files; else ([None, ...], {}): every run under this interpreter."""
    pythons = [entry.get("python") for entry in read_json(path, "a compare JSON").get("runs", [])]
    if len(set(pythons)) < 2:
        return [None] * len(pythons), {}
    environments = {}
    for python in dict.fromkeys(pythons):
        if not (python and os.path.isfile(python) and os.access(python, os.X_OK)):
            raise MtbenchError(f"{path}: its runs ran under several interpreters, and {python} is not an "
                               f"executable file here")
        # A rerun hands each run its configuration as a run file: an mtbench from before them would fail in the
        # child, after other runs had trained.
        described = probe_environment(python, f"{path}: the interpreter {python}")
        if described.get("run_file_format") != RUN_FILE_FORMAT:
            raise MtbenchError(f"{path}: the mtbench of {python} reads no run files of format {RUN_FILE_FORMAT} "
                               f"(`mtbench train --run-file`), which rerun gives every run: upgrade it there, or "
                               f"run the comparison again with `mtbench compare`")
        environments[python] = described
    return pythons, environments


def run_again(rerun, console):
    """Trains the rerun in its own process (under torchrun for a run of several processes); returns its result."""
    result = rerun.original.result
    name = f"the rerun of {rerun.original.source}"
    if rerun.weights_note:
        console.print(f"{rerun.label}: {rerun.weights_note}", highlight=False)
    elif rerun.weights:
        console.print(f"{rerun.label}: starts from {rerun.weights}, the original's weights file (sha256 unchanged)",
                      highlight=False)
    write_run_file(rerun.train_file, rerun.config)
    with console.status(f"{rerun.label}: training again in its own process"):
        failure = run_child(run_file_arguments(rerun.train_file, rerun.config.overwrite), rerun.log_file, name,
                            run_processes(result), rerun.python)
    if failure and failure.exit_code != ReportingFailed.EXIT_CODE:
        raise RunFailure(failure)
    loaded = load_runs([rerun.out])[0]
    return loaded.result


def rerun_results(path, out, overwrite, console, parity_steps=None):
    """Trains every run of `path` again and shows each beside its original, their loss curves held to each other
    over `parity_steps` (None: the compare JSON's own, else PARITY_STEPS); returns the file(s) written."""
    reruns, out, single = plan_reruns(path, out, overwrite)
    parity_steps = parity_steps or recorded_parity([path]).get("steps", PARITY_STEPS)
    console.print(f"rerun of {path}: {len(reruns)} run(s), each in its own process", highlight=False)
    entries = []
    try:
        for rerun in reruns:
            result = run_again(rerun, console)
            differences = side_by_side(rerun.original.result, result, parity_steps)
            console.print(side_by_side_table(differences, f"mtbench rerun: {rerun.label}"))
            for line in differences["parity_lines"]:
                console.print(line.replace("parity rerun vs original", "losses of the rerun against the original"),
                              highlight=False)
            entries.append((rerun, result, differences))
    except (KeyboardInterrupt, RunFailure) as stopped:
        if single:
            raise
        interrupted = isinstance(stopped, KeyboardInterrupt)
        doing = reruns[len(entries)].label
        why = f"{'interrupted during' if interrupted else 'failed in'} the rerun of '{doing}'"
        kept = keep_finished(path, out, entries, "interrupted" if interrupted else "failed",
                             f"{why} ({len(entries)} of {len(reruns)} runs finished)", parity_steps)
        if interrupted:  # a child's Interrupted carries its signal's exit code, a Ctrl-C here 130
            raise RunInterrupted(f"{why}; {kept}", getattr(stopped, "exit_code", 130)) from None
        raise RunFailure(f"{stopped}; {kept}") from None
    if not single:
        # as its compare ended: status 1 on a failure
        require_parity(write_rerun_compare(path, out, entries, parity_steps), out)
    return out


def keep_finished(path, out, entries, status, reason, parity_steps):
    """Where a rerun of a compare JSON stopped early: the reruns that finished, combined in `out` with `status`
    and `reason`, as `compare` keeps what it ran; what was kept, in words."""
    if not entries:
        return "no rerun finished: nothing combined"
    write_rerun_compare(path, out, entries, parity_steps, {"status": status, "status_reason": reason})
    return f"the {len(entries)} finished rerun(s) combined in {out} (status {status})"


def write_rerun_compare(path, out, entries, parity_steps, status=None):
    """The reruns of a compare JSON as a compare JSON of their own (`mtbench report` reads it), with each run's
    differences from its original, their losses held over `parity_steps` (`rerun_results`'); `status`: {'status',
    'status_reason'} of one that stopped early. Returns the comparison."""
    runs = [LoadedRun(result, rerun.out) for rerun, result, _ in entries]
    # Held as the compare held its runs: to its baseline (where that one was rerun) and its parity gate.
    baseline = recorded_baseline([path])
    parity = recorded_parity([path])
    comparison = build_comparison(runs, baseline=baseline if baseline in {rerun.label for rerun, _, _ in entries}
                                  else None, force=True, parity_steps=parity_steps,
                                  parity_tolerance=parity.get("tolerance"), baseline_named_by=f"{path}: its baseline")
    write_json_atomic(out, combined_json(
        comparison,
        [{"label": rerun.label, "repeat": rerun.repeat, "result_file": os.path.abspath(rerun.out),
          "log_file": os.path.abspath(rerun.log_file), "original": rerun.original.source,
          "weights_note": rerun.weights_note, "differences": differences, "result": result}
         for rerun, result, differences in entries],
        status or {"status": "completed"}, {"rerun_of": os.path.abspath(path)}))
    return comparison
