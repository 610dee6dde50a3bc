"""The training loop: one train step per batch, timed in windows between device synchronisations, with the task's
validation every --eval-every steps, checkpoints every --checkpoint-every steps and on a signal, and a stop on a
non-finite loss, a signal, or the target quality."""

import contextlib
import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from mtbench.errors import MtbenchError, RunFailure
from mtbench.figures import set_aside
from mtbench.runner.loop import faults
from mtbench.runner.loop.checkpoints import TrainingState
from mtbench.runner.loop.profiling import StepProfiling
from mtbench.runner.loop.progress import training_progress
from mtbench.runner.loop.recipe import optimizer_recipe
from mtbench.runner.loop.signals import stop_requests
from mtbench.runner.loop.target import QualityTarget  # noqa: F401 (TrainingOutcome.target)
from mtbench.runner.loop.timing import StepTimer, TimingWindow, TrainingClock
from mtbench.runner.measurement.energy import joules_of_every_process


@dataclass
class Checkpointing:
    """Where and how often checkpoints go, and what a resumed run rebuilds itself from."""
    run_dir: object          # checkpoints.RunDirectory
    run_config: dict         # the configuration as given, before extras adjusted it
    data_fingerprint: str
    every: int               # steps between checkpoints; None: only on a signal
    keep: int
    latest: str = None       # the newest checkpoint of this run (a resumed run starts with its own)
    keep_best: object = None  # model -> path: keeps the weights of the best validation so far (None: not kept)
    tokenizer: object = None  # the run's, kept beside the checkpoints (what a checkpoint translates with)
    ran_on: dict = None       # the devices and versions the run trains on, which a resume must match


@dataclass
class Observers:
    """What watches the steps without changing them: plugins' Keras callbacks (`callbacks.PluginCallbacks`), the
    experiment trackers (`results.tracking.Trackers`) and the energy meter (`measurement.energy.EnergyMeter`)."""
    callbacks: object
    trackers: object
    energy: object


@dataclass
class TrainingOutcome:
    status: str              # completed | interrupted | diverged | failed (an exception, in a run of one process)
    reason: str              # why training stopped early, else None
    state: TrainingState     # step, epoch, history, clocks and validation record
    timer: StepTimer
    clock: TrainingClock
    target: QualityTarget
    checkpoint: str          # the newest checkpoint, or None
    exit_code: int = None    # the signal's exit code when interrupted
    host_syncs: dict = None  # the host waits of the probed steady step (`Backend.host_sync_counter`), or None
    profile: dict = None     # --profile's steps and trace (`profiling.StepProfiling.record`), or None


def train_loop(config, backend, model, step_flops, train_step, state, batches, total_steps, checkpointing,
               validate, target, observers, console, processes):
    """Trains from `state.step + 1` to `total_steps`; `validate()` scores the validation split ({figure: value},
    `Evaluator.validate`), at the steps `target` (a QualityTarget holding the resumed run's evaluations) is due.
    `step_flops` (`measurement.flops.StepFlops`) counts a step's FLOPs over its padded batch and its real tokens.
    Returns the TrainingOutcome; the model's variables hold the trained weights (`train_step.finalize()` done).

    `batches` yields the global batches; this process trains on its shard of each (`processes`, the run's
    ProcessGroup) and counts the global batch's tokens. Of several processes, every one ends its windows at
    the same steps, and there they agree whether any received a signal or reached the target, so that all
    stop after the same step.

    Steps run in timing windows of up to `config.timing_window` steps (see `timing`): a window ends before and
    after the first step of a new shape, at validation and checkpoint steps, on a signal and at the last step.
    Losses are read, and callbacks, trackers and the divergence check see each step, when its window ends."""
    return TrainingLoop(config, backend, model, step_flops, train_step, state, batches, total_steps, checkpointing,
                        validate, target, observers, processes).run(console)


def failure_text(error):
    """A failure in one line: an mtbench error's own words (they name the plugin), else the exception's kind too."""
    return str(error) if isinstance(error, MtbenchError) else f"{type(error).__name__}: {error}"


class TrainingLoop:
    """`train_loop`'s state between steps; `run` is the loop, and each method one thing it does."""

    def __init__(self, config, backend, model, step_flops, train_step, state, batches, total_steps, checkpointing,
                 validate, target, observers, processes):
        self.config, self.backend, self.model = config, backend, model
        self.step_flops, self.train_step = step_flops, train_step
        self.state, self.batches, self.total_steps, self.checkpointing = state, batches, total_steps, checkpointing
        self.validate, self.processes = validate, processes
        self.callbacks, self.trackers = observers.callbacks, observers.trackers
        self.timer = resumed_timer(state.history, step_flops, train_step.warmup_calls, state.resumed_at_steps)
        self.target = target
        self.clock = TrainingClock(state.training_s, state.aside_s)
        self.window = TimingWindow(backend, model, train_step, observers.energy)
        self.poison_at, self.die_at = faults.nan_step(), faults.kill_step(processes.rank)
        # One steady step of the run is counted for host waits, alone in its window and kept out of the figures.
        self.sync_counter = backend.host_sync_counter()
        self.probe_pending = self.sync_counter is not None
        self.probed_step = None
        self.profiling = StepProfiling(backend, config.profile_steps, checkpointing.run_dir, processes)
        self.stop = None  # (status, reason) when training ends before its last step
        self.progress = self.signals = None
        self._schedule = None

    def run(self, console):
        self.callbacks.on_train_begin()
        with training_progress(console, self.total_steps, self.state.step, self.config.log_every,
                               self.learning_rate) as self.progress, \
                stop_requests() as self.signals:
            try:
                self.train_steps()
            except Exception as error:
                if self.processes.world_size > 1:
                    raise  # the others wait in the run's collectives: the launcher ends them all
                recorded = self.state.history[-1]["step"] if self.state.history else self.state.step
                self.stop = ("failed", f"after step {recorded}, {failure_text(error)}")
        ended = self.end_training()
        self.clock.stop()
        status, reason = self.stop or ("completed", None)
        reason = "; ".join([reason, *ended]) if ended else reason
        return TrainingOutcome(status, reason, self.state, self.timer, self.clock, self.target,
                               self.checkpointing.latest, self.signals.exit_code if status == "interrupted" else None,
                               self.host_syncs(), self.profiling.record())

    def end_training(self):
        """The step's `finalize` (a step holding the weights itself writes them back), then the callbacks' end.
        After a failed step either may fail too: what failed is returned, one line each, for the result's reason;
        else they raise."""
        failed = []
        for what, end in (("the step's finalize", self.train_step.finalize),
                          ("the callbacks' end", self.callbacks.on_train_end)):
            try:
                end()
            except Exception as error:
                if not self.stop or self.stop[0] != "failed":
                    raise
                failed.append(f"then {what} failed: {failure_text(error)}")
        return failed

    def train_steps(self):
        """The loop over the steps, to the last or to the step that stops it (`self.stop`)."""
        for step in range(self.state.step + 1, self.total_steps + 1):
            epoch, batch, input_seconds = self.next_batch()
            alone = self.timed_alone(step, batch)
            probe = self.probe_pending and not alone  # a shape already compiled: a steady step
            profiled = not (alone or probe) and self.profiling.due()
            starts_alone = alone or probe or (profiled and not self.profiling.running)
            if starts_alone and self.window.open and self.end_window_before():
                break
            # The probe's step, timed alone, is slowed by its counting (differently on each backend), as the
            # profiled steps are by the profiler: the training time leaves them out, as the steady figures do.
            aside = "host_sync_probe" if probe else "profiled" if profiled else None
            with self.clock.aside(aside) if aside else contextlib.nullcontext():
                if profiled and not self.profiling.running:
                    self.profiling.start(step)
                self.train(step, epoch, batch, input_seconds, aside)
                window_ended = self.window_ends_after(step, alone or probe or self.profiling.has_all_steps())
                diverged = window_ended and self.end_window()
            if diverged or (window_ended and self.at_window_edge(step)):
                break

    def learning_rate(self, step):
        """The rate the optimizer applied at `step` (its schedule at the update count before it), from the
        recipe on the host: reading the optimizer's own would wait for the device."""
        from mtbench.keras_models.schedules import cosine_decay, schedule_of_recipe
        if self._schedule is None:
            self._schedule = schedule_of_recipe(optimizer_recipe(self.config, self.total_steps))
        return float(cosine_decay(self._schedule, step - 1))

    def host_syncs(self):
        """What the host-sync probe counted: waits per step, where they came from, the step it counted."""
        counter = self.sync_counter
        if counter is None or not counter.steps:
            return None
        return {"per_step": counter.per_step(), "events": dict(counter.events), "counted_steps": counter.steps,
                "step": self.probed_step}

    def next_batch(self):
        """(epoch, the global batch, seconds the loop waited for it: batches are built ahead, see `prefetch`)."""
        started = time.perf_counter()
        epoch, batch = next(self.batches)
        return epoch, batch, time.perf_counter() - started

    def timed_alone(self, step, batch):
        """The steps that warm a shape up (compile it, record its CUDA graph) are timed on their own; so is the test
        hook's poisoned step, so that a test knows which steps ran (a real divergence is seen at the end of its
        window)."""
        return self.timer.warming_up(batch.shape) or step == self.poison_at

    def train(self, step, epoch, batch, input_seconds, aside=None):
        """One step on this process's shard of `batch`, queued in the open window (or a new one); a step `aside`
        'host_sync_probe' runs under the host-sync counter, one 'profiled' under the backend's profiler."""
        if step == self.die_at:
            faults.die()
        if not self.window.open:
            self.window.start()
        part = batch.shard(self.processes.rank, self.processes.world_size)
        if step == self.poison_at:
            part = faults.poisoned(part)
        try:
            if aside == "host_sync_probe":
                self.probe_pending, self.probed_step = False, step
                logs = self.sync_counter.count_step(self.train_step, part.inputs, part.target_output, part.weight)
            elif aside == "profiled":
                with self.profiling.step(step):
                    logs = self.train_step(part.inputs, part.target_output, part.weight)
            else:
                logs = self.train_step(part.inputs, part.target_output, part.weight)
        except MtbenchError:
            raise
        except Exception as error:  # the step's own code: name what made it (an extra, and its plugin)
            made_by = getattr(self.train_step, "made_by", "the run's")
            raise RunFailure(f"train step '{self.train_step.name}' of {made_by} failed at step {step}: "
                             f"{type(error).__name__}: {error}") from error
        # Its keys alone, not its values: reading one would wait for the device inside the timed window.
        if not (isinstance(logs, Mapping) and "loss" in logs and "accuracy" in logs):
            made_by = getattr(self.train_step, "made_by", "the run's")
            said = f"a {type(logs).__name__} of {sorted(map(str, logs))}" if isinstance(logs, Mapping) else \
                type(logs).__name__
            raise RunFailure(f"train step '{self.train_step.name}' of {made_by} returned {said} at step {step}, not "
                             f"its logs {{'loss': ..., 'accuracy': ...}}")
        self.window.steps.append((step, epoch, batch, logs, input_seconds, aside))

    def end_window_before(self):
        """`end_window` before a step that starts a window of its own; a profiled window's end is set aside with
        its steps."""
        with self.clock.aside("profiled") if self.profiling.running else contextlib.nullcontext():
            return self.end_window()

    def window_ends_after(self, step, alone):
        """Whether the open window ends after `step`: a step timed alone (the last of a profile too), a full
        window, the last step, a validation or checkpoint step, or this process's signal (several processes take a
        signal up at their next common edge)."""
        signalled = self.signals.requested and self.processes.world_size == 1
        # A profiled window holds --profile's steps, however short the timing windows are.
        full = len(self.window.steps) >= self.config.timing_window and not self.profiling.running
        return (alone or full or step == self.total_steps
                or self.target.due(step) or signalled or self.checkpoint_due(step))

    def checkpoint_due(self, step):
        every = self.checkpointing.every
        return bool(every and step % every == 0)

    def end_window(self):
        """Measures the open window and records its steps; True (with `self.stop`) when a loss was not finite. A
        profiled window ends its trace."""
        steps, seconds, joules, compiled = self.window.close()
        if self.profiling.running:
            self.profiling.stop(seconds)
        for position, (step, epoch, batch, logs, input_seconds, aside) in enumerate(steps):
            share = seconds / len(steps)
            loss, accuracy = float(logs["loss"]), float(logs["accuracy"])
            compilations = compiled if position == 0 else (None if compiled is None else 0)
            real_token_flops = self.step_flops.real_tokens(batch)
            learning_rate = self.learning_rate(step)
            first = self.timer.add(step, batch.shape, share, batch.target_tokens,
                                   flops=self.step_flops.padded(batch.shape), real_token_flops=real_token_flops,
                                   input_seconds=input_seconds, compilations=compilations, aside=aside is not None)
            self.state.history.append({
                "step": step, "epoch": epoch, "loss": finite_or_none(loss), "accuracy": finite_or_none(accuracy),
                "seconds": share, "window_steps": len(steps), "shape": list(batch.shape),
                "tokens": batch.target_tokens, "first_of_shape": first, "input_seconds": input_seconds,
                "compilations": compilations, "joules": None if joules is None else joules / len(steps),
                "real_token_flops": real_token_flops, "learning_rate": learning_rate,
                **({aside: True} if aside else {})})
            self.callbacks.on_train_batch_begin(step)
            self.callbacks.on_train_batch_end(step, {"loss": loss, "accuracy": accuracy})
            self.trackers.step(step, finite_or_none(loss), batch.target_tokens, share, first or aside is not None,
                               learning_rate)
            if not math.isfinite(loss):
                self.stop = ("diverged", f"the loss is {loss} at step {step}")
                return True
            self.state.step, self.state.epoch = step, epoch
            self.progress.advance(loss, batch.target_tokens / share, step, share)
        return False

    def at_window_edge(self, step):
        """What happens between windows: the processes agree on signals, validation, a checkpoint; True (with
        `self.stop`) when training ends here (a signal, or the target quality reached)."""
        if self.processes.world_size > 1:
            self.signals.agree(self.processes)
        try:
            reached = self.target.due(step) and self.validation_reaches_target(step)
        except Exception:
            # The steps trained are the run's whatever its validation did: the checkpoint due here keeps them for
            # --resume. Not with several processes: the others would wait in its collectives for this one.
            if self.processes.world_size == 1 and (self.signals.requested or self.checkpoint_due(step)):
                with contextlib.suppress(Exception):  # the validation's failure is the one the run ends with
                    self.save_checkpoint()
            raise
        noted = self.signals.requested
        if noted:
            self.note_stopping(step)
        if self.signals.requested or self.checkpoint_due(step):
            self.save_checkpoint()
        if self.signals.requested:
            if not noted:  # the signal came as the checkpoint due here was written
                self.note_stopping(step)
            self.stop = ("interrupted", f"{self.signals.name} received; stopped after step {step}")
        elif reached:
            value = f"BLEU {reached:.2f}" if self.target.metric == "bleu" else f"{self.target.metric} {reached:.4g}"
            self.stop = ("completed", f"validation {value} reached the target {self.target.target} at step {step}")
        return self.stop is not None

    def note_stopping(self, step):
        """Says, as it begins, what a signal's stop writes, and what a second Ctrl-C would do."""
        again = " (Ctrl-C again stops at once, without them)" if self.signals.name == "SIGINT" else ""
        self.progress.note(f"{self.signals.name} received: stopping after step {step}, writing a checkpoint and the "
                           f"partial result{again}")

    def save_checkpoint(self):
        self.checkpointing.latest = save_checkpoint(self.checkpointing, self.backend, self.model, self.train_step,
                                                    self.state, self.clock, self.target, self.processes)

    def validation_reaches_target(self, step):
        """Scores the validation split with the weights so far (its time kept apart from training); the target
        figure when any process reached the target quality, else None."""
        training_s = self.clock.training_s()
        with self.clock.aside("validation"):
            started = time.perf_counter()
            self.train_step.finalize()
            scores = self.validate()
            seconds = time.perf_counter() - started
        reached = self.processes.any(self.target.record(step, scores, training_s, seconds))
        self.keep_if_best()
        self.trackers.validation(step, scores)
        self.progress.validation(step, scores)
        return scores[self.target.metric] if reached else None


    def keep_if_best(self):
        """Keeps the model of the best validation so far beside the run's checkpoints, as nanoGPT keeps its best
        (its time kept apart with the checkpoints'); every process agrees, process 0 writes."""
        keep = self.checkpointing.keep_best
        if keep is None or not self.processes.any(self.target.latest_is_best()):
            return
        if not self.checkpointing.run_dir.writes:
            return
        with self.clock.aside("checkpoint"), self.processes.alone():  # the variables hold the validated weights
            self.target.evaluations[-1]["saved_as_best"] = keep(self.model)


def resumed_timer(history, step_flops, warmup_calls=1, resumed_at_steps=()):
    """A step timer holding a resumed run's earlier steps (they count in its figures), whose step warms each
    shape up over `warmup_calls` steps; `resumed_at_steps`, the first step of each process after the first."""
    timer = StepTimer(warmup_calls=warmup_calls, started_at_steps=set(resumed_at_steps))
    for h in history:
        timer.add(h["step"], tuple(h["shape"]), h["seconds"], h["tokens"], first_of_shape=h["first_of_shape"],
                  flops=step_flops.padded(h["shape"]), real_token_flops=h.get("real_token_flops"),
                  input_seconds=h["input_seconds"], compilations=h["compilations"],
                  aside=set_aside(h))
    timer.restart()
    return timer


def finite_or_none(value):
    """JSON has no NaN: a diverged step's loss is written as null (the result's status_reason says what it was)."""
    return value if math.isfinite(value) else None


def save_checkpoint(checkpointing, backend, model, train_step, state, clock, target, processes):
    # The figures so far are read before the checkpoint's own time starts counting apart.
    state.training_s, state.aside_s, state.evaluations = clock.training_s(), dict(clock.aside_s), target.evaluations
    with clock.aside("checkpoint"):
        # Every process: a train step that keeps state outside the Keras variables writes it back, and one whose
        # state spans the processes gathers it whole (a collective), so that process 0 can read it by itself;
        # each process's random generators, which differ (each data replica drops with masks of its own).
        train_step.finalize()
        generator = backend.random_generator_state()
        generator_states = None if generator is None else processes.gather_bytes(generator)
        # Each step's joules as the result gives them, every process's summed: a resumed run restores process 0's
        # checkpoint alone, so the others' readings must be in it.
        history = joules_of_every_process(state.history, processes, max(state.resumed_at_steps, default=0))
        saved = dataclasses.replace(state, history=history)
        # Process 0 alone writes (the others return at once and go on to the next step), so nothing it does
        # there may wait for them.
        with processes.alone():
            return checkpointing.run_dir.save(model, saved, checkpointing.run_config, checkpointing.data_fingerprint,
                                              checkpointing.keep, checkpointing.tokenizer, generator_states,
                                              checkpointing.ran_on)
