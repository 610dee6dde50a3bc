"""The pieces of benchmarks/overhead.py that decide what its figures mean: the turn order, which steps are timed
and on which batches, where the clock is read, medians and ratios. (A real run takes minutes; none runs here, only
a benchmark's setup.)"""

import pytest

from benchmarks.overhead import (Contestant, interleaved_order, parse_args, ratio, run_interleaved, summarize,
                                 summary_json, table)
from conftest import keras_on_jax


class Recorder:
    """Contestants and a clock that write every event into one log; each step takes `cost[name]` seconds."""

    def __init__(self, cost):
        self.log, self.now, self.cost = [], 0.0, cost

    def clock(self):
        self.log.append(("clock",))
        return self.now

    def contestant(self, name):
        def step(batch):
            self.log.append(("step", name, batch))
            self.now += self.cost[name]

        return Contestant(name, step, lambda: self.log.append(("sync", name)))


def test_every_contestant_takes_one_turn_per_round_in_a_fixed_order():
    assert interleaved_order(["mtbench", "native"], 3) == ["mtbench", "native"] * 3


def test_warm_up_is_untimed_and_every_contestant_walks_the_same_batches():
    recorder = Recorder({"a": 2.0, "b": 1.0})
    seconds = run_interleaved([recorder.contestant("a"), recorder.contestant("b")], batches=[10, 11, 12],
                              warmup=2, rounds=2, steps_per_round=2, clock=recorder.clock)
    assert seconds == {"a": [2.0] * 4, "b": [1.0] * 4}
    steps = [(event[1], event[2]) for event in recorder.log if event[0] == "step"]
    # warm-up (a then b), then turns a a | b b | a a | b b; each contestant's k-th step gets batch k (cycling)
    assert steps == [("a", 10), ("a", 11), ("b", 10), ("b", 11),
                     ("a", 12), ("a", 10), ("b", 12), ("b", 10), ("a", 11), ("a", 12), ("b", 11), ("b", 12)]
    first_timed = recorder.log.index(("step", "a", 12))
    assert recorder.log[first_timed - 2:first_timed + 3] == [("sync", "a"), ("clock",), ("step", "a", 12),
                                                               ("sync", "a"), ("clock",)]
    assert recorder.log.count(("clock",)) == 2 * 8


def test_summary_is_the_median_of_timed_steps_and_ratio_divides_medians():
    summary = summarize([0.3, 0.1, 0.2, 10.0])
    assert summary["median_s"] == pytest.approx(0.25)
    assert summary["steps"] == 4
    assert summary["p10_s"] < summary["median_s"] < summary["p90_s"]
    assert ratio(summarize([0.3]), summarize([0.2])) == pytest.approx(1.5)
    assert ratio(None, summarize([0.2])) is None


def fake_result(backend, dtype, mtbench_s, native_s, keras_s=None):
    contestants = {"mtbench": summarize([mtbench_s]), "native": summarize([native_s])}
    if keras_s:
        contestants["keras"] = summarize([keras_s])
    return {"backend": backend, "dtype": dtype, "contestants": contestants, "torch_threads": None,
            "train_steps": {"mtbench": f"{backend}-step"}}


def test_json_summary_names_each_ratio_and_leaves_missing_ones_null():
    results = [fake_result("jax", "float32", 0.42, 0.40), fake_result("torch", "mixed_bfloat16", 0.33, 0.30)]
    summary = summary_json(results, settings={"preset": "small"})
    assert summary["jax_ratio"] == pytest.approx(1.05)
    assert summary["torch_ratio_bf16"] == pytest.approx(1.1)
    assert summary["torch_ratio"] is None and summary["jax_ratio_bf16"] is None
    assert summary["mfu_jax"] is None and summary["mfu_torch"] is None
    assert summary["settings"] == {"preset": "small"}


def test_against_the_best_by_hand_the_json_names_each_backends_best_ratio_and_mfu():
    results = [{**fake_result("jax", "mixed_bfloat16", 0.6, 0.4), "baseline": "best"},
               {**fake_result("torch", "float32", 0.21, 0.2), "baseline": "best"}]
    for result in results:
        result["contestants"]["best"] = result["contestants"].pop("native")
        result.update(step_flops=1e12, peak_flops_per_s=1e13)
    summary = summary_json(results, settings={"baseline": "best"})
    assert summary["jax_ratio_best"] == pytest.approx(1.5) and summary["torch_ratio_best_float32"] == pytest.approx(1.05)
    assert summary["mfu_jax_best"] == pytest.approx(1 / 6) and summary["jax_ratio_bf16"] is None
    assert "best ms" in table(results).splitlines()[0] and "mtbench/best" in table(results).splitlines()[0]
    with pytest.raises(SystemExit):
        parse_args(["--baseline", "best", "--cache-dir", "x"])  # the references are the language model's


def test_table_shows_times_ratios_and_the_step_that_ran():
    text = table([fake_result("jax", "float32", 0.42, 0.40, keras_s=0.5)])
    row = text.splitlines()[2].split()
    assert row[:7] == ["jax", "float32", "420.0", "400.0", "1.050", "500.0", "1.250"]
    assert row[-1] == "jax-step"


def test_quick_run_shrinks_the_measurement():
    quick, full = parse_args(["--quick", "--cache-dir", "x"]), parse_args(["--cache-dir", "x"])
    assert quick.rounds * quick.steps_per_round < full.rounds * full.steps_per_round
    assert quick.batch_size < full.batch_size


def test_the_language_models_length_is_its_block_and_defaults_to_the_presets():
    from benchmarks.overhead import workload_config
    gpt = parse_args(["--model", "gpt", "--quick", "--cache-dir", "x"])
    assert (gpt.preset, gpt.length) == ("small", 128)  # GPT_PRESETS['small']'s block
    config = workload_config(gpt, "torch")
    assert config.model_family[0] == "gpt" and config.max_len == 128 and config.tokenizer == "byte"
    assert workload_config(parse_args(["--model", "gpt", "--length", "64", "--cache-dir", "x"]), "jax").max_len == 64
    assert parse_args(["--cache-dir", "x"]).length == 32  # the translation model's bucket
    with pytest.raises(SystemExit):
        parse_args(["--text", "corpus.txt", "--cache-dir", "x"])  # a translation run takes no text


@pytest.mark.parametrize("kind", ["own wait", "no wait", "wrapped, no wait"])
def test_mtbenchs_contestant_waits_for_what_its_step_holds_as_the_native_ones_do(kind):
    """A step that waits for its own state (JAX's jitted step) is waited for by that alone, as a native contestant
    by its state: the backend is asked to wait for no Keras variable (on JAX a walk of every variable's buffers a
    step, host time the other contestants skip). A step without a wait of its own (Keras's `train_on_batch`, which
    updates the variables), wrapped or not, is waited for by its model's variables."""
    from benchmarks.overhead import keras_contestant
    from mtbench import TrainStep, WrappingStep
    waits = []

    class Step(TrainStep):
        name = "step"

        def __call__(self, x, y, sample_weight):
            return {"loss": 1.0}

    if kind == "own wait":
        Step.block = lambda self: waits.append("its state")
    model = object()
    backend = type("Backend", (), {"synchronize": lambda self, model=None: waits.append(("backend", model))})()
    step = WrappingStep(Step()) if kind.startswith("wrapped") else Step()
    keras_contestant("mtbench", backend, model, step).synchronize()
    assert waits == (["its state", ("backend", None)] if kind == "own wait" else [("backend", model)])


def test_a_benchmark_reads_the_model_familys_dropout_before_it_asks_for_fused_attention(cache_dir, jax_precision):
    """As `mtbench train` does: a GPT that drops attention probabilities is refused the fused kernels, which drop
    none (on a GPU its model would otherwise be built with them and fail); on this CPU that reason comes first."""
    keras_on_jax()
    from benchmarks.overhead import workload_config
    from benchmarks.workload import prepare_benchmark
    from mtbench.plugins import manager
    args = parse_args(["--model", "gpt", "--preset", "tiny", "--length", "32", "--cache-dir", cache_dir])
    _, _, run, _ = prepare_benchmark(workload_config(args, "jax", dropout=0.2), 2, 32, fused_attention=True)
    assert run.attention_dropout == 0.2 and run.attention["causal"] == "xla (unfused)"
    assert manager.registry().extras["flash-attention"].unavailable_reason(run).startswith(
        "drops no attention probabilities, and this model drops 0.2 of them while training")
