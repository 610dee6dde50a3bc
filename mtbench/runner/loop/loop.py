"""The training loop: one train step per batch, timed in windows between device synchronisations, with validation
BLEU every --eval-every steps, checkpoints every --checkpoint-every steps and on a signal, and a stop on a
non-finite loss, a signal, or the target quality."""

import math
import time
from dataclasses import dataclass

from mtbench.runner.loop import faults
from mtbench.runner.loop.checkpoints import TrainingState
from mtbench.runner.loop.progress import training_progress
from mtbench.runner.loop.signals import stop_requests
from mtbench.runner.loop.target import QualityTarget
from mtbench.runner.loop.timing import StepTimer, TimingWindow, TrainingClock
from mtbench.runner.measurement.flops import training_flops


@dataclass
class Checkpointing:
    """Where and how often checkpoints go, and what a resumed run rebuilds itself from."""
    run_dir: object          # checkpoints.RunDirectory
    run_config: dict         # the configuration as given, before extras adjusted it
    data_fingerprint: str
    every: int               # steps between checkpoints; None: only on a signal
    keep: int
    latest: str = None       # the newest checkpoint of this run (a resumed run starts with its own)


@dataclass
class Observers:
    """What watches the steps without changing them: plugins' Keras callbacks, the experiment trackers
    (`results.tracking.Trackers`) and the energy meter (`measurement.energy.EnergyMeter`)."""
    callbacks: object
    trackers: object
    energy: object


@dataclass
class TrainingOutcome:
    status: str              # completed | interrupted | diverged
    reason: str              # why training stopped early, else None
    state: TrainingState     # step, epoch, history, clocks and validation record
    timer: StepTimer
    clock: TrainingClock
    target: QualityTarget
    checkpoint: str          # the newest checkpoint, or None
    exit_code: int = None    # the signal's exit code when interrupted


def train_loop(config, backend, model, model_shape, train_step, state, batches, total_steps, checkpointing,
               validate, observers, console, processes):
    """Trains from `state.step + 1` to `total_steps`; `validate()` translates the validation set and scores it.
    Returns the TrainingOutcome; the model's variables hold the trained weights (`train_step.finalize()` done).

    `batches` yields the global batches; this process trains on its shard of each (`processes`, the run's
    ProcessGroup) and counts the global batch's tokens. Of several processes, every one ends its windows at
    the same steps, and there they agree whether any received a signal or reached the target, so that all
    stop after the same step.

    Steps run in timing windows of up to `config.timing_window` steps (see `timing`): a window ends before and
    after the first step of a new shape, at validation and checkpoint steps, on a signal and at the last step.
    Losses are read, and callbacks, trackers and the divergence check see each step, when its window ends."""
    callbacks, trackers, energy = observers.callbacks, observers.trackers, observers.energy
    timer = StepTimer()
    step_flops = lambda shape: training_flops(model_shape, shape[0], shape[1], shape[1])
    for h in state.history:  # a resumed run's earlier steps count in its figures
        timer.add(h["step"], tuple(h["shape"]), h["seconds"], h["tokens"], first_of_shape=h["first_of_shape"],
                  flops=step_flops(h["shape"]), input_seconds=h["input_seconds"], compilations=h["compilations"])
    timer.restart()
    target = QualityTarget(config.target_bleu, config.eval_every, state.evaluations)
    clock = TrainingClock(state.training_s, state.aside_s)
    window = TimingWindow(backend, model, train_step, energy)
    poison_at = faults.nan_step()
    die_at = faults.kill_step(processes.rank)
    stop = None  # (status, reason) when training ends before its last step

    def end_window(progress):
        """Measures the open window and records its steps; (status, reason) if a loss was not finite."""
        steps, seconds, joules, compiled = window.close()
        for position, (step, epoch, batch, logs, input_seconds) in enumerate(steps):
            share = seconds / len(steps)
            loss, accuracy = float(logs["loss"]), float(logs["accuracy"])
            first = timer.add(step, batch.shape, share, batch.target_tokens, flops=step_flops(batch.shape),
                              input_seconds=input_seconds, compilations=compiled if position == 0 else
                              (None if compiled is None else 0))
            state.history.append({"step": step, "epoch": epoch, "loss": finite_or_none(loss),
                                  "accuracy": finite_or_none(accuracy), "seconds": share,
                                  "window_steps": len(steps), "shape": list(batch.shape),
                                  "tokens": batch.target_tokens, "first_of_shape": first,
                                  "input_seconds": input_seconds, "compilations": compiled if position == 0 else
                                  (None if compiled is None else 0),
                                  "joules": None if joules is None else joules / len(steps)})
            callbacks.on_train_batch_begin(step)
            callbacks.on_train_batch_end(step, {"loss": loss, "accuracy": accuracy})
            trackers.step(step, finite_or_none(loss), batch.target_tokens, share, first)
            if not math.isfinite(loss):
                return "diverged", f"the loss is {loss} at step {step}"
            state.step, state.epoch = step, epoch
            progress.advance(loss, batch.target_tokens / share)
        return None

    callbacks.on_train_begin()
    with training_progress(console, total_steps, state.step) as progress, stop_requests() as signals:
        for step in range(state.step + 1, total_steps + 1):
            t_input = time.perf_counter()
            epoch, batch = next(batches)
            input_seconds = time.perf_counter() - t_input
            # The step that compiles this shape is timed on its own; so is the test hook's poisoned step, so that a
            # test knows which steps ran (a real divergence is seen at the end of its window).
            alone = not timer.seen(batch.shape) or step == poison_at
            if window.open and alone:
                stop = end_window(progress)
                if stop:
                    break
            if step == die_at:
                faults.die()
            if step == poison_at:
                train_step.finalize()  # a step holding its own copy of the weights re-reads them next call
                faults.poison_weights(model)
            if not window.open:
                window.start()
            part = batch.shard(processes.rank, processes.world_size)
            logs = train_step((part.source, part.target_input), part.target_output, part.weight)
            window.steps.append((step, epoch, batch, logs, input_seconds))
            # A signal ends one process's window at once; several processes take it up at their next common edge.
            signalled = signals.requested and processes.world_size == 1
            checkpoint_due = signalled or (checkpointing.every and step % checkpointing.every == 0)
            if not (alone or len(window.steps) >= config.timing_window or step == total_steps
                    or target.due(step) or checkpoint_due):
                continue
            stop = end_window(progress)
            if stop:
                break
            if processes.world_size > 1:
                signals.agree(processes)
            reached = False
            if target.due(step):
                training_s = clock.training_s()
                with clock.aside("validation"):
                    eval_t0 = time.perf_counter()
                    train_step.finalize()
                    scores = validate()
                    eval_seconds = time.perf_counter() - eval_t0
                reached = processes.any(target.record(step, scores.bleu, scores.chrf, training_s, eval_seconds))
                trackers.validation(step, scores.bleu, scores.chrf)
            if signals.requested or (checkpointing.every and step % checkpointing.every == 0):
                checkpointing.latest = save_checkpoint(checkpointing, model, train_step, state, clock, target)
            if signals.requested:
                stop = ("interrupted", f"{signals.name} received; stopped after step {step}")
                break
            if reached:
                stop = ("completed", f"validation BLEU {scores.bleu:.2f} reached the target {config.target_bleu} "
                                     f"at step {step}")
                break
    callbacks.on_train_end()
    train_step.finalize()
    status, reason = stop or ("completed", None)
    return TrainingOutcome(status, reason, state, timer, clock, target, checkpointing.latest,
                           signals.exit_code if status == "interrupted" else None)


def finite_or_none(value):
    """JSON has no NaN: a diverged step's loss is written as null (the result's status_reason says what it was)."""
    return value if math.isfinite(value) else None


def save_checkpoint(checkpointing, model, train_step, state, clock, target):
    # The figures so far are read before the checkpoint's own time starts counting apart.
    state.training_s, state.aside_s, state.evaluations = clock.training_s(), dict(clock.aside_s), target.evaluations
    with clock.aside("checkpoint"):
        train_step.finalize()  # a train step that keeps state outside the Keras variables writes it back
        return checkpointing.run_dir.save(model, state, checkpointing.run_config, checkpointing.data_fingerprint,
                                          checkpointing.keep)
