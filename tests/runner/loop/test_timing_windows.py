"""The loop's timing windows, with a fake backend that counts its synchronisations: steady steps share a
synchronisation per window, the first step of each shape is timed alone, and a window ends wherever the loop
must see the weights or the loss (validation, checkpoints, divergence, the last step)."""

import math
import time
from types import SimpleNamespace

import numpy as np
from rich.console import Console

from mtbench.figures import FIGURES_BY_KEY, figure_text, run_warnings
from mtbench.plugins.api import Backend, Batch, Launch, ProcessGroup, TrainStep
from mtbench.plugins.reporters import table_reporter
from mtbench.runner.results import run_result
from mtbench.runner.loop.checkpoints import TrainingState
from mtbench.runner.measurement.flops import StepFlops
from mtbench.runner.loop.target import QualityTarget
from mtbench.runner.config import TrainConfig
from mtbench.runner.loop.loop import Checkpointing, Observers, train_loop


class CountingBackend(Backend):
    def __init__(self):
        self.synchronisations = 0

    def host_sync_counter(self):
        return None  # no probe step: every window here is the loop's own

    def synchronize(self, model=None):
        self.synchronisations += 1

    def compilations(self):
        return None


class FakeStep(TrainStep):
    """Returns a loss per call; `nan_at` makes one step's loss not finite."""

    def __init__(self, nan_at=None):
        self.calls, self.nan_at = 0, nan_at

    def __call__(self, x, y, sample_weight):
        self.calls += 1
        return {"loss": math.nan if self.calls == self.nan_at else 1.0 / self.calls, "accuracy": 0.5}

    def block(self):
        pass

    def finalize(self):
        pass


class Quiet:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def batches(shapes, real_lengths=None):
    """Batches of `shapes`, whose row i holds `real_lengths[i]` real tokens (default: no padding)."""
    for rows, length in shapes:
        weight = np.ones((rows, length), np.float32)
        if real_lengths is not None:
            weight = (np.arange(length) < np.array(real_lengths)[:, None]).astype(np.float32)
        ids = np.ones((rows, length), np.int32)
        yield 0, Batch(ids, ids, ids, weight, np.arange(rows))


def run(shapes, window, nan_at=None, checkpoint_every=None, saved=None, step=None, flops=None, real_lengths=None):
    backend, step = CountingBackend(), step or FakeStep(nan_at)
    # A run's configuration: the loop records each step's learning rate from its recipe.
    config = TrainConfig(preset="tiny", timing_window=window, log_every=10)
    run_dir = SimpleNamespace(save=lambda model, state, *rest: saved.append(state.step) or f"ckpt-{state.step}")
    checkpointing = Checkpointing(run_dir, {}, "fingerprint", checkpoint_every, keep=1)
    energy = SimpleNamespace(read=lambda: None, between=lambda before, after: None)
    flops = flops or StepFlops(lambda rows, source_length, target_length: 1e6)
    outcome = train_loop(config, backend, None, flops, step, TrainingState(), batches(shapes, real_lengths), len(shapes), checkpointing, None, QualityTarget(), Observers(Quiet(), Quiet(), energy),
                         Console(quiet=True), ProcessGroup(Launch()))
    return outcome, backend


def test_steady_steps_share_a_synchronisation_per_window_and_first_steps_are_alone():
    shapes = [(8, 16)] * 12 + [(4, 32)] + [(8, 16)] * 3
    outcome, backend = run(shapes, window=5)
    windows = [h["window_steps"] for h in outcome.state.history]
    # step 1 alone (new shape), 2-6, 7-11, then 12 closes early: step 13 is a new shape, alone; 14-16 to the end.
    assert windows == [1] + [5] * 10 + [1, 1] + [3] * 3
    assert backend.synchronisations == 2 * 6  # one before and one after each of the six windows
    firsts = [h["step"] for h in outcome.state.history if h["first_of_shape"]]
    assert firsts == [1, 13]
    assert outcome.status == "completed" and outcome.state.step == 16
    seconds = [h["seconds"] for h in outcome.state.history[1:6]]
    assert len(set(seconds)) == 1, "the steps of one window share its mean time"


def test_the_training_time_ends_with_the_loop(monkeypatch):
    """`train_s` was read as the result was put together, after the machine's load (nvidia-smi on a GPU), the
    environment (git, NVML) and the evaluation: each counted as training."""
    import time
    outcome, _ = run([(8, 16)] * 4, window=2)
    ended = outcome.clock.training_s()
    now = time.perf_counter()
    monkeypatch.setattr(time, "perf_counter", lambda: now + 3600.0)  # an hour of the run's work after training
    assert outcome.clock.training_s() == ended


def test_a_window_of_one_synchronises_around_every_step():
    outcome, backend = run([(8, 16)] * 6, window=1)
    assert backend.synchronisations == 12
    assert [h["window_steps"] for h in outcome.state.history] == [1] * 6


def test_divergence_inside_a_window_names_its_step_and_stops_at_the_window():
    outcome, _ = run([(8, 16)] * 20, window=5, nan_at=4)
    assert outcome.status == "diverged" and "at step 4" in outcome.reason
    assert outcome.state.step == 3 and outcome.state.history[-1]["step"] == 4


def test_checkpoint_steps_end_a_window():
    saved = []
    outcome, _ = run([(8, 16)] * 12, window=5, checkpoint_every=4, saved=saved)
    assert saved == [4, 8, 12]
    assert [h["window_steps"] for h in outcome.state.history] == [1, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4]


class GraphRecordingStep(FakeStep):
    """Takes 1 s of a fake clock a call, 10 s on the second call of a shape (where reduce-overhead records its
    CUDA graph); warms a shape up over `warmup_calls` calls."""

    def __init__(self, clock, warmup_calls):
        super().__init__()
        self.clock, self.warmup_calls, self.shape_calls = clock, warmup_calls, {}

    def __call__(self, x, y, sample_weight):
        calls = self.shape_calls[y.shape] = self.shape_calls.get(y.shape, 0) + 1
        self.clock[0] += 10.0 if calls == 2 else 1.0
        return super().__call__(x, y, sample_weight)


def test_a_step_that_records_its_graph_on_the_second_call_of_a_shape_counts_it_in_compile_time(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    shapes = [(8, 16)] * 6 + [(4, 32)] * 4
    outcome, _ = run(shapes, window=3, step=GraphRecordingStep(clock, warmup_calls=2))
    history, summary = outcome.state.history, outcome.timer.summary()
    assert [h["step"] for h in history if h["first_of_shape"]] == [1, 2, 7, 8]
    assert [h["window_steps"] for h in history] == [1, 1, 3, 3, 3, 1, 1, 1, 2, 2]
    assert {h["seconds"] for h in history if not h["first_of_shape"]} == {1.0}
    assert summary["steady_steps"] == 6 and summary["tokens_per_s"] == 6 * 128 / 6.0
    assert summary["compile_s"] == 2 * (10.0 - 1.0) and summary["shapes_compiled"] == 2

    # Counted as a steady step, the recording would weigh in the steady figures.
    clock[0] = 0.0
    outcome, _ = run(shapes, window=3, step=GraphRecordingStep(clock, warmup_calls=1))
    assert max(h["seconds"] for h in outcome.state.history if not h["first_of_shape"]) > 1.0


def test_a_run_of_warm_up_steps_alone_has_no_compile_time_and_says_so(monkeypatch):
    """Two steps of one shape whose first two warm up: nothing steady to take from the first steps' 2 s, so their
    compilation is unknown (it was the whole 2 s, counted as compiling a step that compiles nothing)."""
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    outcome, _ = run([(8, 16)] * 2, window=3, step=GraphRecordingStep(clock, warmup_calls=2))
    summary = outcome.timer.summary()
    assert (summary["steady_steps"], summary["compile_s"], summary["step_s_median"]) == (0, None, None)
    assert summary["first_steps_s"] == 1.0 + 10.0
    result = {"timing": {**summary, "compile_cache": None}, "history": outcome.state.history, "env": {}}
    assert figure_text(result, "compile_s") == "n/a"
    assert run_warnings(result)[0] == (
        "no steady step: every step trained was the first of its shape (or set aside), so neither the step time, "
        "tokens/s nor the compilation apart from the steps is measured; give more --steps")
    assert table_reporter._compile(result) == ("n/a (no steady step to take from the first 11.00 s) over 1 shape, "
                                               "compile cache none (nothing compiled ahead)")


def test_real_tokens_count_each_rows_source_at_its_own_length():
    """An encoder-decoder's row of 6 source tokens and 3 target tokens is counted as such, not as 3 and 3: a
    family whose step costs rows x (source^2 + target^2), padding id 0, rows of 6 + 3, 2 + 5 and a filler row."""
    source = np.array([[7, 7, 7, 7, 7, 7, 0, 0], [7, 7, 0, 0, 0, 0, 0, 0], [0] * 8], np.int32)
    weight = (np.arange(8) < np.array([3, 5, 0])[:, None]).astype(np.float32)
    batch = Batch(source, source, source, weight, np.array([0, 1, -1]))
    flops = StepFlops(lambda rows, source_length, target_length: rows * (source_length ** 2 + target_length ** 2),
                      pad=0)
    assert flops.real_tokens(batch) == (36 + 9) + (4 + 25)
    assert flops.padded(batch.shape) == 3 * (64 + 64)
    # A model without a source (a language model): its target's length for both.
    assert flops.real_tokens(Batch(None, source, source, weight, np.array([0, 1, -1]))) == (9 + 9) + (25 + 25)


def test_mfu_of_real_tokens_counts_each_row_at_its_real_length(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    # A family whose step costs rows x length^2 (attention-like), on batches of 4 rows of 8 tokens holding 8, 5, 5
    # and 0 real tokens: 4 x 64 = 256 FLOPs padded, 64 + 2 x 25 = 114 over the real tokens.
    flops = StepFlops(lambda rows, source_length, length: rows * length ** 2)
    outcome, _ = run([(4, 8)] * 5, window=3, step=GraphRecordingStep(clock, warmup_calls=2), flops=flops,
                     real_lengths=[8, 5, 5, 0])
    summary = outcome.timer.summary()
    assert summary["steady_steps"] == 3 and summary["tokens_per_s"] == 18.0
    assert summary["flops_per_s"] == 256.0 and summary["real_token_flops_per_s"] == 114.0
    assert [h["real_token_flops"] for h in outcome.state.history] == [114.0] * 5

    # Against a peak of 1000 FLOP/s, both MFUs, labelled, in the result and every output's figures.
    monkeypatch.setattr(run_result, "device_peak_record", lambda *args, **kwargs: {
        "flops_per_s": 1000.0, "source": "test", "measured_at": None, "load_average": None})
    run_context = SimpleNamespace(device=None, device_kind="cpu", config=None, processes=ProcessGroup(Launch()))
    config = SimpleNamespace(dtype="float32", cache_dir=None, matmul_precision="highest")
    utilization = run_result.utilization(summary, None, run_context, 1, config, (), SimpleNamespace(name="fake"))
    assert utilization["mfu"] == 0.256 and utilization["mfu_real_tokens"] == 0.114
    result = {"utilization": utilization}
    assert [(FIGURES_BY_KEY[key].title, figure_text(result, key)) for key in ("mfu", "mfu_real_tokens")] == [
        ("MFU (padded, %)", "25.6"), ("MFU (real tokens, %)", "11.4")]
    # 4 processes, 2 on each of 2 machines, on their CPUs (4 devices used): each machine's CPU has its peak, which
    # its 2 processes share, so the run's peak is 2 of them.
    across_machines = SimpleNamespace(device=None, device_kind="cpu", config=None, processes=ProcessGroup(
        Launch(process_id=0, num_processes=4, local_rank=0, local_processes=2, coordinator="host:1")))
    assert run_result.utilization(summary, None, across_machines, 4, config, (), SimpleNamespace(name="fake"))[
        "mfu"] == 0.128
