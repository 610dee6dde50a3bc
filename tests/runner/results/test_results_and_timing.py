"""The result schema check, atomic writes and the arithmetic of step timing."""

import os
import time
from types import SimpleNamespace

import pytest

from mtbench.errors import MtbenchError, RunFailure
from mtbench.figures import FIGURES_BY_KEY, compile_cache_text
from mtbench.plugins.api import Launch, ProcessGroup
from mtbench.plugins.reporters import table_reporter
from mtbench.runner.files import read_json, write_json_atomic
from mtbench.runner.loop.timing import StepTimer, TrainingClock
from mtbench.runner.results.run_result import compile_cache_section, cost, machines_of
from mtbench.runner.results.schema import schema_errors, sidecar_paths
from mtbench.runner.results.verdicts import compile_excess


def test_schema_errors_name_missing_and_mistyped_fields(tiny_runs):
    result = dict(tiny_runs["jax"]["result"])
    assert schema_errors(result) == []
    broken = {**result, "timing": {**result["timing"], "step_s_median": "fast"}}
    del broken["metrics"]
    errors = schema_errors(broken)
    assert "metrics: missing" in errors
    assert any(e.startswith("timing.step_s_median: str") for e in errors)
    # a version above this mtbench's came from a newer one; one below the first from none
    assert schema_errors({**result, "schema_version": 99})[0].endswith("; a newer mtbench wrote it")
    assert schema_errors({**result, "schema_version": -1})[0].endswith("; no mtbench writes it")


@pytest.mark.parametrize("key, value, problem", [
    ("seconds", 0, "0 is not a time above 0"), ("seconds", -0.5, "-0.5 is not a time above 0"),
    ("seconds", float("inf"), "inf is not a time above 0"), ("tokens", -1, "-1 is not a count"),
    ("window_steps", 0, "0 is not a count of steps (at least 1)"),
    ("window_steps", 1.5, "1.5 is not a count of steps (at least 1)")])
def test_a_step_whose_timing_no_run_writes_is_refused(tiny_runs, key, value, problem):
    """Divided by and taken the logarithm of: a window of 0 steps made an interval of no data that the gate
    passed; seconds of 0 printed numpy's warnings beside the table."""
    result = tiny_runs["jax"]["result"]
    history = [dict(entry) for entry in result["history"]]
    history[2][key] = value
    assert schema_errors({**result, "history": history}) == [f"history[2].{key}: {problem}"]


def test_compile_time_is_first_step_minus_the_steady_step_of_its_shape():
    timer = StepTimer()
    for step, (shape, seconds) in enumerate([((8, 16), 5.0), ((8, 16), 1.0), ((8, 32), 9.0), ((8, 16), 1.2),
                                             ((8, 32), 2.0), ((8, 16), 0.8)], start=1):
        timer.add(step, shape, seconds, target_tokens=100)
    summary = timer.summary()
    assert summary["shapes_compiled"] == 2 and summary["steady_steps"] == 4
    assert summary["compile_s"] == pytest.approx((5.0 - 1.0) + (9.0 - 2.0))
    assert summary["step_s_median"] == pytest.approx(1.1)
    assert summary["tokens_per_s"] == pytest.approx(400 / 5.0)


def test_a_shape_met_once_is_measured_against_its_own_tokens_not_another_shapes_step():
    """A length bucket met once (8x48: three times 8x16's tokens) has no steady step: its step time is estimated
    from 8x16's 1 s at its own tokens, 3 s, so its 10 s first step compiled 7 s; the other shape's median step would
    have counted its 2 s of extra work as compilation (13 s in all). The result says that one shape was estimated."""
    timer = StepTimer()
    for step, (shape, seconds) in enumerate([((8, 16), 5.0), ((8, 16), 1.0), ((8, 16), 1.0), ((8, 48), 10.0),
                                             ((8, 16), 1.0)], start=1):
        timer.add(step, shape, seconds, target_tokens=100)
    summary = timer.summary()
    assert summary["compile_s"] == pytest.approx((5.0 - 1.0) + (10.0 - 3.0))
    assert summary["compile_estimated_shapes"] == 1
    # the verdicts' time to target without compilation takes the compilation out as the timing counts it
    history = [{"step": r.step, "shape": list(r.shape), "seconds": r.seconds, "first_of_shape": r.first_of_shape}
               for r in timer.records]
    assert compile_excess(history) == pytest.approx(11.0) and compile_excess(history, up_to_step=3) == 4.0
    measured = StepTimer()
    for step, shape in enumerate([(8, 16), (8, 16), (8, 48), (8, 48)], start=1):
        measured.add(step, shape, 1.0, target_tokens=100)
    assert measured.summary()["compile_estimated_shapes"] == 0


def test_the_input_wait_is_the_steady_steps_as_the_step_time_it_sits_beside():
    """Three warm-up steps waited 0.5 s for their batches (the first batch built, a bucket's first), the two
    steady steps 1 ms: the median wait a steady step has is 1 ms, not the warm-ups' 0.5 s."""
    timer = StepTimer()
    for step, (shape, wait) in enumerate([((8, 16), 0.5), ((8, 32), 0.5), ((8, 16), 0.001), ((8, 48), 0.5),
                                          ((8, 32), 0.001)], start=1):
        timer.add(step, shape, 0.1, target_tokens=100, input_seconds=wait)
    summary = timer.summary()
    assert summary["steady_steps"] == 2 and summary["input_s_median"] == pytest.approx(0.001)
    assert summary["input_fraction"] == pytest.approx(summary["input_s_median"] / summary["step_s_median"])


def test_the_tables_say_the_step_times_are_of_window_means_and_which_compile_times_are_estimated():
    timing = {"step_s_median": 0.0232, "step_s_p90": 0.0251, "timing_window": 10, "compile_s": 3.2,
              "shapes_compiled": 3, "compile_estimated_shapes": 1, "first_steps_s": 4.0, "compile_cache": None}
    result = {"timing": timing}
    assert table_reporter._steady_step(result) == "23.2 ms / 25.1 ms (windows of up to 10 steps)"
    assert table_reporter._steady_step({"timing": {**timing, "timing_window": 1}}) == \
        "23.2 ms / 25.1 ms (each step timed alone)"
    assert FIGURES_BY_KEY["step_s_median"].title == "steady step, median of window means (ms)"
    assert table_reporter._compile(result) == (
        "3.20 s over 3 shapes (1 with no steady step of its own, whose step time is scaled from the others' time "
        "per padded token), compile cache none (nothing compiled ahead)")
    measured = {"timing": {**timing, "compile_estimated_shapes": 0}}
    assert table_reporter._compile(measured) == "3.20 s over 3 shapes, compile cache none (nothing compiled ahead)"


def test_a_resumed_timer_counts_the_first_step_of_each_shape_again():
    timer = StepTimer()
    timer.add(1, (8, 16), 5.0, 100, first_of_shape=True)  # restored from the earlier process's history
    timer.add(2, (8, 16), 1.0, 100, first_of_shape=False)
    timer.restart()
    assert timer.add(3, (8, 16), 4.0, 100) is True
    assert timer.add(4, (8, 16), 1.0, 100) is False
    summary = timer.summary()
    assert summary["shapes_compiled"] == 2 and summary["steady_steps"] == 2
    assert summary["compile_s"] == pytest.approx(4.0 + 3.0)


def test_a_process_that_resumed_after_warm_up_steps_alone_counts_its_shapes_again():
    """The earlier process's steps of the shape were all warm-up (its checkpoint came before a steady one): the
    resumed process's warm-up is a compilation of its own all the same."""
    timer = StepTimer(started_at_steps={2})
    timer.add(1, (8, 16), 5.0, 100, first_of_shape=True)  # restored from the earlier process's history
    timer.restart()
    assert timer.add(2, (8, 16), 4.0, 100) is True
    assert timer.add(3, (8, 16), 1.0, 100) is False
    assert timer.summary()["shapes_compiled"] == 2


def test_training_clock_keeps_validation_and_checkpoints_apart(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    clock = TrainingClock(earlier_s=5.0, earlier_aside={"validation": 2.0})
    now[0] += 3.0
    with clock.aside("validation"):
        now[0] += 4.0
    with clock.aside("checkpoint"):
        now[0] += 1.0
    now[0] += 2.0
    assert clock.training_s() == pytest.approx(5.0 + 3.0 + 2.0)
    assert clock.aside_s == {"validation": 6.0, "checkpoint": 1.0}


def test_a_run_across_machines_costs_each_machines_time():
    """--price-per-hour is a machine's: 4 processes, 2 on each of 2 machines, for 1,800 s at 3.60 an hour."""
    across = ProcessGroup(Launch(process_id=0, num_processes=4, local_rank=0, local_processes=2, coordinator="h:1"))
    assert machines_of(across) == 2 and machines_of(ProcessGroup(Launch())) == 1
    assert machines_of(SimpleNamespace()) == 1  # a plugin's process group that kept no launch
    priced = cost(3.6, 1800.0, {"time_to_target_s": 900.0}, machines_of(across))
    assert (priced["machines"], priced["usd"], priced["usd_to_target"]) == (2, pytest.approx(3.6), pytest.approx(1.8))


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "result.json"
    write_json_atomic(str(path), {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(str(path), {"a": object()})
    assert path.read_text() == '{\n  "a": 1\n}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_write_into_an_unwritable_place_is_a_clear_failure(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(RunFailure, match="cannot write"):
        write_json_atomic(os.path.join(str(blocker), "result.json"), {})


def test_reading_json_fails_in_one_line_naming_the_file_and_what_was_expected(tmp_path):
    write_json_atomic(str(tmp_path / "good.json"), {"a": [1, 2]})
    assert read_json(str(tmp_path / "good.json"), "a result") == {"a": [1, 2]}
    (tmp_path / "broken.json").write_text('{\n  "a": 1,\n}')
    (tmp_path / "latin1.json").write_bytes(b'{"a": "\xe9"}')
    for name, problem in (("absent.json", "no such file"), ("broken.json", ":3: not valid JSON"),
                          ("latin1.json", "not valid UTF-8"), (".", "is a directory")):
        path = str(tmp_path / name)
        with pytest.raises(MtbenchError) as raised:
            read_json(path, "a result")
        message = str(raised.value)
        assert message.startswith(path) and problem in message and message.endswith("expected a result")
        assert "\n" not in message


def test_sidecar_files_sit_beside_the_result():
    assert sidecar_paths("runs/a.json") == ("runs/a.hyp.txt", "runs/a.ref.txt")


def test_steady_steps_are_timed_in_windows_and_first_steps_alone(tiny_runs):
    for run in tiny_runs.values():
        result = run["result"]
        window = result["timing"]["timing_window"]
        history = result["history"]
        assert window == result["config"]["timing_window"] == 10
        assert all(h["window_steps"] == 1 for h in history if h["first_of_shape"])
        assert max(h["window_steps"] for h in history) == window, "the steady steps of a tiny run fill windows"
        # The steps of one window share its time: recorded spans add up to whole windows.
        position = 0
        while position < len(history):
            size = history[position]["window_steps"]
            assert {h["seconds"] for h in history[position:position + size]} == {history[position]["seconds"]}
            position += size
        assert position == len(history)


def test_a_step_description_that_fails_says_which_code_failed_and_keeps_the_run():
    from mtbench.runner.results.run_result import step_description

    class Counted:
        def description(self):
            return "counted, 3 steps"

    class Careless:
        def description(self):
            raise RuntimeError("desc boom")

    class Wordless:
        def description(self):
            return 42

    assert step_description(Counted()) == "counted, 3 steps" and step_description(object()) == ""
    assert step_description(Careless()) == (
        f"not described: {__name__}.test_a_step_description_that_fails_says_which_code_failed_and_keeps_the_run."
        f"<locals>.Careless.description() failed: RuntimeError: desc boom")
    assert step_description(Wordless()).endswith("Wordless.description() failed: TypeError: it returned int, not a str")


def test_a_steps_numerics_that_fail_say_which_code_failed_under_each_key():
    from mtbench.plugins.api import TrainStep
    from mtbench.runner.results.run_result import step_numerics

    class Said(TrainStep):
        def numerics(self):
            return {"layer_norm": "two passes"}

    class Careless(TrainStep):
        def numerics(self):
            raise RuntimeError("numerics boom")

    class Misnamed(TrainStep):
        def numerics(self):
            return {"layernorm": "two passes"}

    assert step_numerics(Said()) == {"layer_norm": "two passes"}
    assert step_numerics(TrainStep()) == {} and step_numerics(object()) == {}
    failed = step_numerics(Careless())
    assert set(failed) == {"layer_norm", "optimizer_update", "rounding_16_bit"} and len(set(failed.values())) == 1
    assert failed["layer_norm"].endswith("Careless.numerics() failed: RuntimeError: numerics boom")
    assert step_numerics(Misnamed())["optimizer_update"].endswith(
        "Misnamed.numerics() failed: TypeError: it returned the key 'layernorm', not one of layer_norm, "
        "optimizer_update, rounding_16_bit")


class SecondProcessLookups(ProcessGroup):
    """Two processes, the other of which looked the cache up `others` times (hits, misses), or counted nothing."""

    def __init__(self, others):
        super().__init__(Launch(process_id=0, num_processes=2))
        self.others = others

    def sum(self, values):
        counted, hits, misses = values
        other = self.others or (0, 0)
        return [counted + (self.others is not None), hits + other[0], misses + other[1]]


def cache_of_run(processes, hits, misses):
    backend = SimpleNamespace(compile_cache_hits=lambda: {"hits": hits, "misses": misses},
                              compile_cache_entries=lambda directory: 28)
    run = SimpleNamespace(compile_cache={"dir": "/cache", "state": "warm", "reason": None, "entries_before": 28},
                          backend=backend, processes=processes)
    return compile_cache_section(run)


def test_a_run_of_several_processes_is_warm_only_where_every_process_loaded_its_programs():
    alone = cache_of_run(ProcessGroup(Launch()), hits=28, misses=0)
    assert alone["programs"] == "warm" and "every_process" not in alone
    assert compile_cache_text({"timing": {"compile_cache": alone}}) == "warm (28 hits, 0 misses)"
    # Process 0 loaded every program; the other process compiled all of its own.
    cache = cache_of_run(SecondProcessLookups((0, 28)), hits=28, misses=0)
    assert (cache["hits"], cache["misses"]) == (28, 0)  # process 0's own, as before
    assert cache["every_process"] == {"processes": 2, "hits": 28, "misses": 28}
    assert cache["programs"] == "partly warm"
    assert compile_cache_text({"timing": {"compile_cache": cache}}) == \
        "partly warm (28 hits, 28 misses over 2 processes)"
    assert cache_of_run(SecondProcessLookups((28, 0)), hits=28, misses=0)["programs"] == "warm"
    # A process that counts no lookups leaves the run's state unknown, not process 0's.
    unknown = cache_of_run(SecondProcessLookups(None), hits=28, misses=0)
    assert unknown["every_process"] is None and unknown["programs"] is None
