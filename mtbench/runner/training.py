"""One training run, top to bottom: choose the plugins (the model family's task among them), read the task's data,
start keras on the backend, prepare the data, build the model from numpy-drawn weights (or a checkpoint), train
with honest timing, let the task evaluate, write the result (a partial one when training stopped early) and hand
it to the reporters.

Each stage is a function with explicit inputs and outputs; `run_training` checks the run's choices and output and
holds the result's path, `train_and_report` is the rest of the run on one screen."""

import contextlib
import math
import signal
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console

from mtbench.errors import MtbenchError, RunFailure, RunInterrupted
from mtbench.keras_models.initialization import describe_init, init_note
from mtbench.plugins.api import Launch
from mtbench.runner.data.prefetch import Prefetched
from mtbench.runner.data.weights_file import read_weights_file
from mtbench.runner.loop.callbacks import PluginCallbacks
from mtbench.runner.loop.checkpoints import (
    RunDirectory,
    TrainingState,
    restore,
    restore_generator_state,
    run_dir_for,
)
from mtbench.runner.loop.loop import Checkpointing, Observers, save_checkpoint, train_loop
from mtbench.runner.loop.progress import announced_phases, corpus_progress
from mtbench.runner.loop.signals import Stopped, StoppedAtOnce, stop_at_once, stop_requests
from mtbench.runner.loop.target import QualityTarget
from mtbench.runner.loop.timing import Stopwatch
from mtbench.runner.measurement.device_memory import host_peaks, largest_peak, training_memory
from mtbench.runner.measurement.energy import EnergyMeter, open_counter
from mtbench.runner.measurement.environment import machine_identity
from mtbench.runner.measurement.load import machine_load_of_run, sample_load_together
from mtbench.runner.results.output import check_result_path, holding_result_path
from mtbench.runner.results.schema import PARTIAL_STATUSES, read_status
from mtbench.runner.results.reporting import run_reporters
from mtbench.runner.results.run_result import (add_evaluation, continue_with, record_failures, run_peak,
                                               stop_error, training_result, write_result)
from mtbench.runner.results.tracking import Trackers, tracked_run
from mtbench.runner.saved_model import best_model_keeper, save_trained_model
from mtbench.runner.setup import (build_model, check_compile_options_apply, check_launch, check_options_against_extras,
                                  choose_attention_kernels,
                                  choose_plugins, choose_train_step, compile_model, drawn_init, extras_compile_options,
                                  local_devices,
                                  start_backend, starting_weights, step_flops)
from mtbench.runner.tasks.answers import checked_batch, checked_task_data, task_evaluation, task_validation


def run_training(config, registry, console, resume=None, reporter_names=(), launch=Launch()):
    """Runs `config`; `resume` (a checkpoints.Resumption, whose config `config` is) continues an earlier run
    from its latest checkpoint; `launch` places this process among the run's processes (all train, process 0
    alone prints and writes). Returns (the result, a line for each reporter that failed); a run that stopped
    early raises once its partial result is written and reported."""
    stopwatch = Stopwatch()
    plugins = choose_plugins(config, registry, [*reporter_names, *config.report_to] if launch.is_first else [])
    check_launch(config, plugins, launch)
    check_options_against_extras(config, plugins)
    if not launch.is_first:
        console = Console(quiet=True)
    check_result_path(config.out, config.overwrite, resuming=resume is not None, reads=config.input_files())
    try:
        # The process that writes holds the result's path; a SIGTERM outside training's own handlers stops it as a
        # Ctrl-C there does, so that the path's lock is released and the message says what the run's files keep.
        # The handler is in place before the lock is taken and until it is released.
        with (stop_at_once([signal.SIGTERM]) if launch.is_first else contextlib.nullcontext(),
              holding_result_path(config.out) if launch.is_first else contextlib.nullcontext()):
            return train_and_report(config, registry, console, resume, launch, plugins, stopwatch)
    except (KeyboardInterrupt, Stopped) as stop:  # a second Ctrl-C, or a signal outside training's handlers
        raise stopped_at_once(stop, config.out, launch.num_processes) from None


def train_and_report(config, registry, console, resume, launch, plugins, stopwatch):
    """`run_training`'s work once its choices and output are checked, the result's path held."""
    config, weights_file, weights_sha256 = starting_point(config, plugins)
    run_dir = resume.directory if resume else RunDirectory(run_dir_for(config.out), fresh=True)
    run_dir.writes = launch.is_first
    # Read before the framework is imported: a bad corpus file fails in a second, not after the import.
    raw = read_data(config, plugins, console, stopwatch)

    with stopwatch.phase("backend"):
        keras, run, changed_by = start_backend(config, plugins, launch)
    run_config = {**config.to_dict(), "dtype": run.config.dtype}  # what --resume rebuilds, in auto's dtype
    config = run.config  # with what the extras change (a TPU's batch size)
    data = prepare_data(config, plugins, raw, stopwatch)
    for line in data.lines:
        console.print(line, highlight=False, soft_wrap=True)
    ran_on = machine_identity(plugins.backend, run.device)  # what the checkpoints record, and a resume must match
    check_resumable(data, resume, ran_on)
    total_steps = count_steps(config, plugins, data)
    with stopwatch.phase("build"):
        built = build_for_training(keras, config, run, plugins, data, weights_file, total_steps, resume, console)
    with stopwatch.phase("peak"):  # before the energy meter starts: a CPU's is measured, the first time
        peak = run_peak(config, run, plugins.backend, registry.backends.values())
    energy = EnergyMeter(*open_counter(run.device, local_devices(run), launch.local_processes))  # devices known
    if built.starts_pretrained and not config.measure_only:
        with stopwatch.phase("evaluate_pretrained"):
            # As before a validation: a step that holds the weights split or itself gives the model whole ones.
            built.train_step.finalize()
            built.before_training = built.evaluator.before_training()

    run_dir.begin(config.out)  # after every check that could refuse the run: --overwrite's earlier files go now
    checkpointing = Checkpointing(run_dir, run_config, data.fingerprint, config.checkpoint_every,
                                  config.keep_checkpoints, latest=resume.checkpoint if resume else None,
                                  keep_best=best_model_keeper(config, run_dir, data, plugins, built.model_shape),
                                  tokenizer=data.tokenizer, ran_on=ran_on)
    target = QualityTarget(plugins.task.validation_metric, config.target and config.target[1],
                           plugins.task.higher_is_better, config.eval_every, built.state.evaluations)
    callbacks = PluginCallbacks(registry.keras_callbacks(config), built.model)
    trackers = Trackers(plugins.reporters, registry)
    trackers.start(tracked_run(config, plugins, run, config.out, run_dir.path))
    gpus = "nvidia-smi" if run.device.get("kind") == "gpu" else None  # a CPU run's neighbours on a GPU are no matter
    load_before = sample_load_together(run.processes, launch.local_processes, gpus)
    with stopwatch.phase("train"):
        outcome = train_loop(config, plugins.backend, built.model, step_flops(plugins, built.model_shape, data),
                             built.train_step, built.state,
                             built.batches, total_steps, checkpointing, task_validation(plugins, built.evaluator),
                             target,
                             Observers(callbacks, trackers, energy), console, run.processes)
    load_during = machine_load_of_run(load_before, run.processes, launch, gpus)
    built.batches.close()
    result = training_result(config, run, plugins, registry, data, built, outcome, weights_sha256, run_dir,
                             training_memory(plugins.backend, run.processes, run.device), peak)
    result["machine_load"] = load_during
    # Which extra set each key its configuration differs by from the one given: what a comparison names.
    result["config_changed_by"] = changed_by
    result["keras_callbacks"] = callbacks.record()

    stopped = outcome.status == "completed" and evaluate_and_save(result, config, run, plugins, data, built, run_dir,
                                                                    stopwatch, console, outcome, checkpointing)
    # Every process: each adds the joules of its own devices (this process's: from where it resumed the run).
    result["energy"], result["history"] = energy.section(result["history"], run.processes, built.state.resumed_at_steps)
    result["memory"]["peak_device_bytes"] = largest_peak(plugins.backend, run.processes)
    result["memory"].update(host_peaks(run.processes))
    if not run_dir.writes:  # process 0 of several writes and reports
        if outcome.status != "completed":
            raise stop_error(outcome, config.out, run_dir, run.processes.world_size)
        run.processes.close()
        return result, []
    write_result(config.out, result, stopwatch, config.price_per_hour)
    trackers.finish(result)
    still_reporting = [reporter for reporter in plugins.reporters if reporter not in trackers.failed]
    failures = record_failures(result, config.out) + trackers.failures + run_reporters(
        still_reporting, registry, result, console, config.out, followed=True)
    if outcome.status != "completed":
        raise stop_error(outcome, config.out, run_dir, run.processes.world_size, failures)
    if result["model"].get("save_failed"):
        raise RunFailure("; ".join([result["model"]["save_failed"], f"the run's figures are in {config.out}",
                                    *failures]))
    if stopped:
        raise RunInterrupted(f"interrupted: {stopped_after_training(result, stopped)}; the training's figures are in "
                             f"{config.out}", stopped.exit_code)
    # The group is left only by a run that ended well: leaving waits for every process, and one may be gone.
    run.processes.close()
    return result, failures


def evaluate_and_save(result, config, run, plugins, data, built, run_dir, stopwatch, console, outcome, checkpointing):
    """The evaluation after training and the saved model of a completed run, added to `result` (--measure-only:
    neither). A signal in a run of one process stops them at once: the result keeps the training's figures and
    says what it lacks, and the trained weights are kept in a checkpoint that `--resume` evaluates. A run of
    several finishes them first, since a process that left the evaluation's collectives would keep the others
    waiting for it. The Stopped is returned (None when no signal came)."""
    if config.measure_only:
        result["metrics"]["skipped"] = "--measure-only: no evaluation, translation or saved model"
        return None
    several = run.processes.world_size > 1
    evaluated = False
    try:
        with stop_requests() if several else stop_at_once() as requests:
            try:
                evaluation = task_evaluation(plugins, built.evaluator, announced_phases(stopwatch, console))
            except RunInterrupted:
                raise
            except MtbenchError as error:
                if several:  # the others wait in the evaluation's collectives: the launcher ends them all
                    raise
                evaluation_failed(result, outcome, error)
                keep_trained_state(result, run, plugins, built, run_dir, outcome, checkpointing)
                return None
            add_evaluation(result, *evaluation)
            evaluated = True
            if config.save_model and run_dir.writes:
                with stopwatch.phase("save_model"), run.processes.alone():  # the others do not wait for it
                    try:
                        result["model"]["saved"] = save_trained_model(run_dir.path, built.model, data.tokenizer,
                                                                      plugins, built.model_shape, config)
                    except (MtbenchError, OSError) as error:  # a full disk: the figures are written all the same
                        result["model"]["save_failed"] = str(error) if isinstance(error, MtbenchError) else \
                            f"cannot save the trained model: {error}"
    except Stopped as stopped:
        if not stopped.deferred:  # a deferred one came once the block had done its work
            missing = "no saved model" if evaluated else "no evaluation, translation or saved model"
            result["metrics"]["skipped"] = f"{stopped.name} received after training: {missing}"
            kept = checkpoint_after_training(run, plugins, built, run_dir, outcome, checkpointing)
            if kept:
                result["metrics"]["unevaluated_checkpoint"] = kept
                result["metrics"]["skipped"] += (f"; the trained weights are in {kept} (mtbench train --resume "
                                                 f"{run_dir.path} evaluates them)")
        return stopped
    if several and requests.agree(run.processes):
        return Stopped(requests.received)
    return None


def evaluation_failed(result, outcome, error):
    """Makes the result of a run whose evaluation after training failed a failed one, with its training's figures
    and the task's metrics left null: the run ends as a failure in training does."""
    outcome.status = "failed"
    outcome.reason = f"after step {outcome.state.step}, in the evaluation: {error}"
    result["status"], result["status_reason"] = outcome.status, outcome.reason


def keep_trained_state(result, run, plugins, built, run_dir, outcome, checkpointing):
    """After a failed evaluation, the trained state in a checkpoint that `--resume` evaluates, named in the result
    and its reason: the training cost more than the evaluation that lost it. A checkpoint that cannot be written
    (a full disk) leaves the evaluation's failure as the run's."""
    try:
        kept = checkpoint_after_training(run, plugins, built, run_dir, outcome, checkpointing)
    except Exception as error:  # noqa: BLE001 (said in the reason, beside the failure the run ends with)
        outcome.reason += f"; the trained weights could not be kept either: {type(error).__name__}: {error}"
        kept = None
    if kept:
        result["metrics"]["unevaluated_checkpoint"] = kept
        outcome.reason += f"; the trained weights are in {kept} (mtbench train --resume {run_dir.path} evaluates them)"
    result["status_reason"] = outcome.reason


def checkpoint_after_training(run, plugins, built, run_dir, outcome, checkpointing):
    """The checkpoint that holds the trained state, written where none holds it yet, so that a run stopped in its
    evaluation (a scheduler's SIGTERM) loses none of its training; None in a process that writes nothing."""
    if not run_dir.writes:
        return None
    kept = dict(run_dir.checkpoints()).get(outcome.state.step)  # --checkpoint-every's at the last step
    if kept is None:
        kept = save_checkpoint(checkpointing, plugins.backend, built.model, built.train_step, outcome.state,
                               outcome.clock, outcome.target, run.processes)
    return kept


def stopped_at_once(stop, out, processes=1):
    """A KeyboardInterrupt that ended the run where it was (a second Ctrl-C: `StoppedAtOnce`; or one before
    training's handlers were in place, or after, as the result was reported; or a SIGTERM there, a `Stopped` whose
    exit code it keeps) saying what the run's files keep now:
    the result (partial or not, this run's or the one a resume continues), the last complete checkpoint and how
    to continue from it (a run of several processes: with its launcher)."""
    status = read_status(out)
    kept = [f"{'partial ' if status in PARTIAL_STATUSES else ''}result in {out}"] if status else []
    run_dir = RunDirectory(run_dir_for(out), fresh=False)
    latest = run_dir.latest()
    if latest and status not in (None, *PARTIAL_STATUSES):
        kept.append(f"checkpoint {latest[1]}")
    elif latest:
        kept.append(f"checkpoint {latest[1]}; {continue_with(run_dir.path, processes)}")
    said = f"{stop.name} received" if isinstance(stop, Stopped) else str(stop) or "interrupted"
    stopped = StoppedAtOnce(f"{said}; {'; '.join(kept) or 'no checkpoint or result was written'}")
    stopped.exit_code = getattr(stop, "exit_code", StoppedAtOnce.exit_code)  # a SIGTERM's 143
    return stopped


def stopped_after_training(result, stopped):
    """What a signal after training cut short, in words."""
    if stopped.deferred:
        return (f"{stopped.name} received after training, taken once the evaluation and any saved model were done "
                f"(Python had dropped its stop inside a callback)")
    return result["metrics"].get("skipped") or f"{stopped.name} received after training, once every process " \
                                                "had finished the evaluation"


def read_initial_weights(config):
    """(weights, sha256) of --initial-weights, read before any framework is imported so a bad file fails at
    once; (None, None) for the numpy draw from --seed."""
    if not config.initial_weights:
        return None, None
    weights, sha256 = read_weights_file(config.initial_weights)
    # A file that names no scheme (a trained model's, or one written before --init) is taken at its word.
    if config.init and weights.init and weights.init != config.init:
        raise MtbenchError(f"--init {config.init}: the weights of {config.initial_weights} were drawn with "
                           f"{weights.init}; a run starts from a weights file as it is")
    return weights, sha256


def starting_point(config, plugins):
    """(`config` with the scheme its weights are drawn by, `read_initial_weights`'s weights and sha256)."""
    weights_file, weights_sha256 = read_initial_weights(config)
    with plugins.model_code():
        return drawn_init(config, plugins.model, weights_file), weights_file, weights_sha256


def read_data(config, plugins, console, stopwatch):
    """The task's raw data (a corpus, a text), read before the framework is imported."""
    with stopwatch.phase("data"), corpus_progress(console) as progress, plugins.task_code():
        return plugins.task.read(config, plugins.registry, progress)


def prepare_data(config, plugins, raw, stopwatch):
    """The task's `TaskData`: its tokenizer (the model family's own, or the task's default) and encoded splits."""
    with stopwatch.phase("tokenizer"):
        with plugins.model_code():
            tokenizer = plugins.model.tokenizer(plugins.model_path, config)
        with plugins.task_code():
            return checked_task_data(plugins.task.prepare(config, raw, tokenizer))


def check_resumable(data, resume, ran_on):
    """A resumed run must train on the same data, tokenized alike, as the run it continues, and on the same devices
    and versions (`ran_on`): its earlier steps' times count in its figures, which name one machine. The versions
    are compared first: another mtbench may tokenize the same data otherwise."""
    differences = identity_differences(resume.ran_on, ran_on) if resume and resume.ran_on else []
    if differences:
        raise MtbenchError(f"{resume.directory.path}: the run trained on other devices or versions "
                           f"({'; '.join(differences)}); its earlier steps' times would count beside this "
                           f"process's in one result: resume it where it ran")
    if resume and resume.data_fingerprint != data.fingerprint:
        raise MtbenchError(f"{resume.directory.path}: the training data, or the tokens made of it, differ from the "
                           f"run's (now {data.fingerprint}, the run had {resume.data_fingerprint}); it cannot be "
                           f"resumed")


def identity_differences(before, now):
    """'device name: AMD EPYC 7B13 before, Intel Xeon now' for each entry of two `machine_identity`s that differ."""
    differences = []
    for section, prefix in (("device", "device "), ("versions", "")):
        earlier, current = before.get(section) or {}, now[section]
        differences += [f"{prefix}{key}: {earlier.get(key)} before, {current.get(key)} now"
                        for key in sorted(set(earlier) | set(current)) if earlier.get(key) != current.get(key)]
    return differences


def count_steps(config, plugins, data):
    """The steps the run trains: --steps, or those of --epochs over the data (a validation every --eval-every of
    them refused, as of --steps, where none would run)."""
    if config.epochs is None:
        return config.steps
    with plugins.task_code():
        per_epoch = plugins.task.batches_per_epoch(data, config)
    steps = max(1, math.ceil(config.epochs * per_epoch))
    if config.eval_every is not None and config.eval_every > steps:
        raise MtbenchError(f"--eval-every {config.eval_every} exceeds the {steps:,} step{'s' * (steps != 1)} of "
                           f"--epochs {config.epochs:g}: no validation would run while training")
    return steps


@dataclass
class BuiltRun:
    """What training needs once keras runs: the model, how it is stepped, the batches, and the decoder."""
    model: object
    model_shape: object
    init: str              # how the starting weights were drawn: a scheme of --init, 'pretrained', or None (a file)
    compile_record: dict   # what model.compile was given, and whether training ran through it
    train_step: object
    state: TrainingState   # where training starts: step 0, or the resumed checkpoint's
    batches: object        # (epoch, Batch) iterator from the step after `state.step`
    evaluator: object      # the task's `Evaluator` of the model
    starts_pretrained: bool = False  # a fresh run of a pretrained model (its weights loaded, or in a weights file)
    init_description: str = None     # the draw in words (`initialization.describe_init`), what a tied head inherits
    before_training: dict = None     # the task's test figures of the pretrained weights


def build_for_training(keras, config, run, plugins, data, weights_file, total_steps, resume, console):
    """Builds and compiles the model with its starting weights, restores a checkpoint when resuming, chooses
    the train step (the extras wrap or replace the backend's), and lets each extra verify it takes effect."""
    keras.utils.set_random_seed(config.seed)
    keras.config.set_dtype_policy(config.dtype)
    plugins.ask_extras("before_model", run)
    run.attention = choose_attention_kernels(run, plugins)
    model, model_shape = build_model(run, plugins, data.tokenizer)
    init = starting_weights(config, plugins, model, weights_file)
    note = init_note(init, model)
    if note:  # the scheme's name alone reads as torch's own start, which its tied head is not
        console.print(f"note: init {init}: {note}", highlight=False, soft_wrap=True)
    asked, asked_by = extras_compile_options(run, plugins)
    compile_record = compile_model(keras, model, config, total_steps, asked, plugins.model)
    state = TrainingState()
    if resume:
        state = restore(resume.checkpoint, model)
        state.resumed_at_steps.append(state.step + 1)
        console.print(f"resuming {resume.directory.path} after step {state.step}", highlight=False, soft_wrap=True)
    # Chosen after a restore: a step that keeps its own copy of the state reads the restored variables.
    train_step = choose_train_step(run, model, plugins)
    check_compile_options_apply(asked, asked_by, train_step)
    compile_record.update(requested_by_extras=asked_by,
                          applies_to="training and evaluation" if train_step.uses_compile_options
                          else f"evaluation only (training runs the '{train_step.name}' step)")
    with plugins.task_code():
        first_batch = checked_batch(next(plugins.task.batches(data, config)))
        batches = Prefetched(plugins.task.batches(data, config, skip=state.step))
    first_batch = first_batch.shard(run.processes.rank, run.processes.world_size)
    for extra, reason in plugins.ask_extras("verify", run, model, first_batch):
        if reason:
            # A refusal as `unavailable_reason`'s, found only by measuring (what XLA holds differs by model and
            # dtype): nothing has trained, and the user's way out is to run without the extra.
            raise MtbenchError(f"extra '{extra.name}' did not take effect: {reason}")
    with plugins.task_code():
        evaluator = plugins.task.evaluator(model, data, config, lambda fn: plugins.registry.answer(
            "backends", plugins.backend, "compile_inference", fn, model, expect=(Callable, "a callable")))
    if resume:
        not_restored = restore_generator_state(resume.checkpoint, plugins.backend, run.processes)
        if not_restored:
            console.print(f"note: the random generators start afresh, so dropout draws other masks than the "
                          f"uninterrupted run would: {not_restored}", highlight=False, soft_wrap=True)
    return BuiltRun(model, model_shape, init, compile_record, train_step, state, batches, evaluator,
                    starts_pretrained=plugins.model.pretrained and resume is None,
                    init_description=describe_init(init, model))


