"""Step timing that keeps compilation apart from steady steps, and does not stall the device.

The first step of each batch shape pays for tracing and compilation (XLA on JAX, torch.compile when enabled)
and for allocator warm-up; it is timed alone, between two device synchronisations, and not mixed into the steady
figures. A step may warm a shape up over more calls (`TrainStep.warmup_calls`: torch.compile's reduce-overhead
records its CUDA graph on a shape's second call): each of them is such a warm-up step. The compile time of a shape
is its warm-up steps minus that shape's steady median each, so it is not inflated by the step's own work; a shape
with no steady step of its own has no measured median, and takes one estimated from the other shapes'
(`compile_seconds`).

Steady steps are timed in windows: the device is synchronised (and the losses read) only at a window's edges, so
the host queues the next steps while the device works, as in a real training loop. Each step of a window is
recorded with the window's mean time; the median and p90 are over those means (a step-weighted median of the
windows' means), not over single steps: timing each step alone would synchronise the device after each.
"""

import collections
import contextlib
import math
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepRecord:
    step: int
    shape: tuple
    seconds: float
    target_tokens: int
    first_of_shape: bool     # a warm-up step of its shape: the first, or one of the first `warmup_calls`
    flops: float = 0.0       # over the padded batch; None where the model family counts no FLOPs
    real_token_flops: float = None  # over the batch's real tokens alone
    input_seconds: float = 0.0
    compilations: int = None
    aside: bool = False      # a step that was timed but is no steady step (`set_aside`: the probe's, a profiled one)


@dataclass
class StepTimer:
    records: list = field(default_factory=list)
    warmup_calls: int = 1  # steps of each shape that are warm-up (`TrainStep.warmup_calls`)
    _calls: collections.Counter = field(default_factory=collections.Counter)  # steps of each shape so far
    started_at_steps: set = field(default_factory=set)  # where a resumed run's later processes began

    def add(self, step, shape, seconds, target_tokens, first_of_shape=None, flops=0.0, input_seconds=0.0,
            compilations=None, aside=False, real_token_flops=None):
        """Records a step; `first_of_shape` (a warm-up step) is given when restoring steps timed by an earlier
        process; a step `aside` counts in neither the steady figures nor compilation."""
        first = self.warming_up(shape) if first_of_shape is None else first_of_shape
        self._calls[shape] += 1
        self.records.append(StepRecord(step, shape, seconds, target_tokens, first, flops, real_token_flops,
                                       input_seconds, compilations, aside))
        return first

    def compilations_by_shape(self):
        """Programs compiled during the steps of each shape ('BxL' keys), where the backend counts them."""
        if any(r.compilations is None for r in self.records):
            return None
        counts = {}
        for r in self.records:
            key = "x".join(map(str, r.shape))
            counts[key] = counts.get(key, 0) + r.compilations
        return counts

    def warming_up(self, shape):
        """Whether the next step of `shape` is a warm-up step (fewer than `warmup_calls` of it so far)."""
        return self._calls[shape] < self.warmup_calls

    def restart(self):
        """A resumed run is a new process: it compiles every shape again, so first steps are first again."""
        self._calls.clear()

    def _warmups(self):
        """How many times a shape was warmed up: runs of warm-up steps of one shape (a resumed process warms its
        shapes up again)."""
        warming, count = set(), 0
        for r in self.records:
            if r.step in self.started_at_steps:  # a new process: every shape compiles anew
                warming.clear()
            if r.aside:
                continue
            if not r.first_of_shape:
                warming.discard(r.shape)
            elif r.shape not in warming:
                warming.add(r.shape)
                count += 1
        return count

    def summary(self):
        steady = [r for r in self.records if not r.first_of_shape and not r.aside]
        first = [r for r in self.records if r.first_of_shape and not r.aside]
        steady_times = np.array([r.seconds for r in steady]) if steady else None
        # Without a steady step there is no step time to take from the first ones: their compilation is unknown.
        compile_s, estimated_shapes = compile_seconds([(r.shape, r.seconds) for r in first],
                                                     [(r.shape, r.seconds) for r in steady])
        return {
            "compile_s": compile_s,
            "compile_estimated_shapes": estimated_shapes,
            "first_steps_s": float(sum(r.seconds for r in first)),
            "shapes_compiled": self._warmups(),
            "steady_steps": len(steady),
            "step_s_median": float(np.median(steady_times)) if steady else None,
            "step_s_p90": float(np.percentile(steady_times, 90)) if steady else None,
            "step_s_min": float(steady_times.min()) if steady else None,
            "tokens_per_s": (sum(r.target_tokens for r in steady) / float(steady_times.sum())) if steady else None,
            "steady_s": float(steady_times.sum()) if steady else 0.0,
            "flops_per_s": _per_second([r.flops for r in steady], steady_times),
            "real_token_flops_per_s": _per_second([r.real_token_flops for r in steady], steady_times),
            # Time spent producing batches, against the steady step time it must hide behind: the same steps'.
            "input_s_median": float(np.median([r.input_seconds for r in steady])) if steady else None,
            "input_fraction": (float(np.median([r.input_seconds for r in steady])) / float(np.median(steady_times)))
            if steady else None,
        }


def compile_seconds(warm_ups, steady):
    """(compile seconds, shapes estimated) of warm-up steps against steady ones, each a (shape, seconds) pair: each
    warm-up step's seconds less the median steady step of its shape, at least 0, summed; (None, 0) without a steady
    step. A shape with no steady step of its own (a length bucket met once) has no measured step time: it is
    estimated as the steady steps' median seconds per padded token (the shape's product, rows x length) times its
    own tokens, where the other shapes' median step would count the shapes' difference in work as compilation;
    `shapes estimated` counts those shapes, so that the figure can say how much of it rests on the estimate."""
    if not steady:
        return None, 0
    by_shape = collections.defaultdict(list)
    for shape, seconds in steady:
        by_shape[tuple(shape)].append(seconds)
    per_token = float(np.median([seconds / math.prod(shape) for shape, seconds in steady]))
    total, estimated = 0.0, set()
    for shape, seconds in warm_ups:
        shape = tuple(shape)
        if shape in by_shape:
            baseline = float(np.median(by_shape[shape]))
        else:
            baseline = per_token * math.prod(shape)
            estimated.add(shape)
        total += max(seconds - baseline, 0.0)
    return total, len(estimated)


def _per_second(amounts, seconds):
    """The steady steps' total of a figure over their time; None without steady steps or where one is missing."""
    if not amounts or any(amount is None for amount in amounts):
        return None
    return sum(amounts) / float(seconds.sum())


class TimingWindow:
    """Steps run between two device synchronisations: their clock, energy and compilations, measured once."""

    def __init__(self, backend, model, train_step, energy):
        self.backend, self.model, self.train_step, self.energy = backend, model, train_step, energy
        self.steps = []  # whatever the caller keeps per step, in order
        self._t0 = None  # the clock's start while the window is open

    @property
    def open(self):
        return bool(self.steps) or self._t0 is not None

    def start(self):
        self._compiled_before = self.backend.compilations()
        self.backend.synchronize(self.model)
        self._energy_before = self.energy.read()
        self._t0 = time.perf_counter()

    def close(self):
        """Waits for the device; returns (steps, seconds, joules, programs compiled or None) and starts empty."""
        self.train_step.block()
        self.backend.synchronize(self.model)
        seconds = time.perf_counter() - self._t0
        joules = self.energy.between(self._energy_before, self.energy.read())
        compiled = self.backend.compilations()
        compiled = None if self._compiled_before is None or compiled is None else compiled - self._compiled_before
        steps, self.steps = self.steps, []
        self._t0 = None
        return steps, seconds, joules, compiled


class Stopwatch:
    """Wall time of named phases (data, tokenizer, build, train, evaluate, ...)."""

    def __init__(self):
        self.phases = {}
        self._start = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

    def total(self):
        return time.perf_counter() - self._start


class TrainingClock:
    """Wall time spent training, from the first step of a run (an earlier process's share included), with the
    time set aside inside the loop (validation, checkpoints) taken out and kept apart by name."""

    def __init__(self, earlier_s=0.0, earlier_aside=None):
        self._start, self._end = time.perf_counter(), None
        self._earlier_s = earlier_s
        self._earlier_aside = dict(earlier_aside or {})
        self._aside = Stopwatch()

    def aside(self, name):
        return self._aside.phase(name)

    @property
    def aside_s(self):
        names = set(self._earlier_aside) | set(self._aside.phases)
        return {name: self._earlier_aside.get(name, 0.0) + self._aside.phases.get(name, 0.0) for name in names}

    def stop(self):
        """Ends the training time where the loop ends: what the run does after it (reading the machine's load and
        the environment for its result, evaluating, writing) is no training."""
        self._end = time.perf_counter()

    def training_s(self):
        end = time.perf_counter() if self._end is None else self._end
        return self._earlier_s + end - self._start - sum(self._aside.phases.values())
