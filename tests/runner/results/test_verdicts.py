"""The statistics of verdicts on synthetic histories, no training: windows, intervals of the log ratio, verdicts
held to the noise floor, break-even with compilation, time to target without it, --repeats auto's stopping rule,
and how compare and report render them."""

import collections
import copy
import csv
import io
import math

import numpy as np
import pytest

from mtbench.errors import MtbenchError
from mtbench.runner.results import verdicts as stats
from mtbench.runner.results.report import (LoadedRun, build_comparison, table_cells, to_csv, to_json_dict, to_markdown,
                                           with_compile_caches)

COMPILE_S = 1.5


def history(step_s, windows=20, window=4, noise=0.03, seed=0, tokens=800, compile_s=COMPILE_S, drift=1.0):
    """A run's history: one first-of-shape step (compilation), then `windows` timing windows of `window` steps
    whose per-step time scatters by `noise` around `step_s` x `drift`."""
    rng = np.random.default_rng(seed)
    entries = [{"step": 1, "seconds": compile_s + step_s, "window_steps": 1, "tokens": tokens, "shape": [32, 32],
                "first_of_shape": True, "loss": 7.0}]
    for _ in range(windows):
        share = step_s * drift * math.exp(rng.normal(0, noise))
        for _ in range(window):
            entries.append({"step": len(entries) + 1, "seconds": share, "window_steps": window, "tokens": tokens,
                            "shape": [32, 32], "first_of_shape": False, "loss": 7.0 - 0.01 * len(entries)})
    return entries


def result(backend="jax", extras=(), step_s=0.015, seed=0, group="c", **history_options):
    steps = history(step_s, seed=seed, **history_options)
    steady = [h["seconds"] for h in steps if not h["first_of_shape"]]
    return {
        "backend": backend, "extras": list(extras), "train_step": "jax-jit-stateless",
        "config": {"dtype": "float32", "steps": len(steps), "seed": 0, "preset": "tiny", "dataset": "bible-en-fr",
                   "max_len": 32, "batch_size": 32, "max_pairs": 4000, "run_group": group},
        "model": {"dtype_policy": "float32", "attention": {"causal": "xla (unfused)", "masked": "xla (unfused)"}},
        "env": {"device": {"kind": "cpu", "name": "CPU"}, "cpu_count": 2, "keras": "3", "python": "3.11"},
        "timing": {"compile_s": stats.compile_excess(steps), "step_s_median": float(np.median(steady)),
                   "steady_s": float(sum(steady)), "steady_steps": len(steady),
                   "step_s_p90": float(np.percentile(steady, 90)),
                   "tokens_per_s": sum(h["tokens"] for h in steps[1:]) / sum(steady), "train_s": None,
                   "total_s": None},
        "memory": {"peak_host_bytes": None, "peak_device_bytes": None},
        "metrics": dict.fromkeys(("train_loss", "val_loss", "test_loss", "val_accuracy", "test_accuracy", "bleu",
                                  "chrf")),
        "history": steps, "target": None,
    }


def repeats(count, seed=0, **options):
    return [result(seed=seed + number, **options) for number in range(count)]


def steady_tokens_per_s(run):
    """A run's steady tokens/s counted from its history by hand: its steady steps' tokens over their seconds."""
    steady = [h for h in run["history"] if not h["first_of_shape"]]
    return sum(h["tokens"] for h in steady) / sum(h["seconds"] for h in steady)


def test_the_step_times_point_is_the_runs_own_median_that_its_resamples_draw():
    """Each resample's step time is the median of its windows' per-step times, the mean of the middle two where
    the steps are even, as np.median and the run's `timing.step_s_median` take it: 0.25 here, not the lower 0.2
    that once put 524.4 ms beside the table's 551.6 ms for one figure of one run."""
    windows = np.array([[0.4, 1, 10], [0.1, 1, 10], [0.3, 1, 10], [0.2, 1, 10]])
    assert stats.window_figure("step_s_median", windows) == pytest.approx(0.25)
    resampled = stats._resampled_window_figure("step_s_median", windows, np.random.default_rng(0), 2000)
    assert np.median(resampled) == pytest.approx(0.25)


def test_one_figure_of_one_run_has_one_centre_in_its_table_interval_json_and_gate():
    """14 windows of 2 steps: 28 steady steps, whose median is the mean of the 14th and 15th. The table's cell,
    the interval's centre, the JSON's `figures` and `intervals` and the gate's figure are that one value."""
    from mtbench.figures import FIGURES_BY_KEY
    run = result(windows=14, window=2, noise=0.2, seed=4)
    recorded = run["timing"]["step_s_median"]
    value, low, high = stats.figure_interval("step_s_median", [run])
    assert value == pytest.approx(recorded) and low < value < high
    compared = build_comparison([LoadedRun(run, "one.json")])
    figure = FIGURES_BY_KEY["step_s_median"]
    by_title = {row[0]: row[1:] for row in table_cells(compared)[1]}
    assert by_title[figure.title][0].startswith(f"{figure.text(recorded)} (95 % interval ")
    (entry,) = to_json_dict(compared)["summary"]
    assert entry["intervals"]["step_s_median"]["value"] == pytest.approx(entry["figures"]["step_s_median"]["median"])
    assert compared.groups[0].over_repeats("step_s_median") == pytest.approx(recorded)  # the gate's


def test_the_step_time_counts_each_step_of_a_window_as_the_runs_own_median_does():
    """Windows of 10 steps at 70 ms beside single-step windows at 100 ms (the steps after a new shape, before a
    validation): the run's steady median (`timing.step_s_median`, over steps) is 70 ms, and so is the figure its
    verdicts and the gate compare, whose windows once counted alike and made it 100 ms; its resamples too."""
    windows = np.array([[0.7, 10, 3200]] * 10 + [[0.1, 1, 320]] * 11)
    per_step = np.repeat(windows[:, 0] / windows[:, 1], windows[:, 1].astype(int))
    assert len(per_step) == 111 and np.median(per_step) == pytest.approx(0.07)
    assert stats.window_figure("step_s_median", windows) == pytest.approx(0.07)
    resampled = stats._resampled_window_figure("step_s_median", windows, np.random.default_rng(0), 2000)
    assert np.median(resampled) == pytest.approx(0.07)
    # Of 4 steps, the middle two's mean: a window of 3 steps at 0.1 s beside one of 1 at 0.3 s is 0.1.
    assert stats.window_figure("step_s_median", np.array([[0.3, 1, 10], [0.3, 3, 30]])) == pytest.approx(0.1)
    assert stats.window_figure("step_s_median", np.array([[0.3, 1, 10], [0.2, 2, 20], [0.3, 1, 10]])) == \
        pytest.approx(0.2)


def test_windows_group_a_windows_steps_and_leave_out_compilation():
    steps = history(0.01, windows=3, window=4)
    steps[-1]["window_steps"] = steps[-2]["window_steps"] = 2  # a last, shorter window
    steps[-3]["window_steps"] = steps[-4]["window_steps"] = 2
    windows = stats.steady_windows(steps)
    assert windows.shape == (4, 3)
    assert list(windows[:, 1]) == [4, 4, 2, 2] and list(windows[:, 2]) == [3200, 3200, 1600, 1600]
    assert windows[0, 0] == pytest.approx(4 * steps[1]["seconds"])
    old = [{k: v for k, v in h.items() if k != "window_steps"} for h in steps]  # before window_steps: a step each
    assert len(stats.steady_windows(old)) == 12


def test_the_same_configuration_twice_is_no_difference():
    interval = stats.ratio_interval("tokens_per_s", repeats(5, seed=10), repeats(5, seed=20), paired=True)
    assert interval.low < 1 < interval.high and interval.repeats == (5, 5) and interval.paired
    verdict = stats.verdict("jax+same-step", "jax", interval)
    assert verdict.call == "no difference" and verdict.warnings == ()
    assert verdict.text.startswith("jax+same-step: no difference from jax in tokens/s beyond the noise (")
    # reproducible: the bootstrap's generator has a fixed seed
    assert stats.ratio_interval("tokens_per_s", repeats(5, seed=10), repeats(5, seed=20), paired=True) == interval


def test_one_runs_interval_spans_its_repeats_and_their_windows():
    # 800 tokens a step: 0.008 s a step is 100,000 tokens/s, 0.004 s 200,000, 0.002 s 400,000. Three repeats:
    # their logs' mean is that of 200,000, their standard deviation ln(2), and Student's t for 2 degrees of
    # freedom 4.303 (a table's).
    slow, middle, fast = (result(step_s=step_s, noise=0.0) for step_s in (0.008, 0.004, 0.002))
    value, low, high = stats.figure_interval("tokens_per_s", [slow, middle, fast])
    assert value == pytest.approx(200_000)
    assert low == pytest.approx(200_000 * 2 ** (-4.303 / math.sqrt(3)), rel=1e-3)
    assert high == pytest.approx(200_000 * 2 ** (4.303 / math.sqrt(3)), rel=1e-3)
    noisy = result(step_s=0.008, noise=0.05)
    value, low, high = stats.figure_interval("tokens_per_s", [noisy])
    assert low < value < high and value == pytest.approx(noisy["timing"]["tokens_per_s"])
    compiled_only = {**noisy, "history": noisy["history"][:1]}  # no steady step
    assert stats.figure_interval("tokens_per_s", [compiled_only]) is None
    # one repeat of one window: its figure, and no bounds (an interval of zero width would claim no noise)
    single = result(windows=1, noise=0.05)
    value, low, high = stats.figure_interval("tokens_per_s", [single])
    assert value == pytest.approx(single["timing"]["tokens_per_s"]) and (low, high) == (None, None)
    # A repeat that recorded no tokens (a result's history may leave them out) gives no figure: it gave 0 tokens/s
    # with NaN bounds, which the JSON then wrote as `NaN`, no JSON number.
    untokened = {**slow, "history": [{**entry, "tokens": 0} for entry in slow["history"]]}
    assert stats.figure_interval("tokens_per_s", [middle, untokened, fast]) is None
    assert stats.figure_point("tokens_per_s", [middle, untokened, fast]) is None


def test_a_slowed_run_is_slower_with_an_interval_that_excludes_1():
    slow, fast = repeats(3, step_s=0.015 * 1.3), repeats(3, seed=5)
    for key in stats.WINDOW_FIGURES:
        interval = stats.ratio_interval(key, slow, fast)
        speed, low, high = interval.speed()
        assert high < 1 and speed == pytest.approx(1 / 1.3, rel=0.03), key
        verdict = stats.verdict("jax+slow-step", "jax", interval)
        assert verdict.call == "slower"
        assert verdict.text.startswith(f"jax+slow-step is {1 / speed:.2f}x slower than jax in "
                                       f"{stats.FIGURE_WORDS[key]} ({1 / high:.2f}–{1 / low:.2f})")
        assert verdict.cell() == f"{1 / speed:.2f}x slower ({1 / high:.2f}–{1 / low:.2f})"
        assert verdict.warnings == ("3 repeats: the interval rests on the spread of a few runs, taken to scatter "
                                    "normally (--repeats 5 or more, or --repeats auto with a --repeats-budget "
                                    "that leaves time for 5)",)
    faster = stats.verdict("jax", "jax+slow-step", stats.ratio_interval("tokens_per_s", fast, slow))
    assert faster.call == "faster" and faster.text.startswith("jax is 1.3")


@pytest.mark.parametrize("figure, ratio, low, high, cell, words", [
    # tokens/s 1.004x (1.002 to 1.006): two decimals called it "1.00x faster (1.00–1.01)"
    ("tokens_per_s", 1.004, 1.002, 1.006, "1.004x faster (1.002–1.006)", "faster than jax in tokens/s"),
    ("tokens_per_s", 1.23, 1.19, 1.27, "1.23x faster (1.19–1.27)", "faster than jax in tokens/s"),
    ("tokens_per_s", 1.0104, 1.0049, 1.016, "1.010x faster (1.005–1.016)", "faster than jax in tokens/s"),
    # a step time 1.003x the baseline's: 1 / 1.003 the speed
    ("step_s_median", 1.003, 1.0016, 1.0044, "1.003x slower (1.002–1.004)", "slower than jax in steady step time"),
    ("tokens_per_s", 0.9996, 0.9994, 0.9998, "1.0004x slower (1.0002–1.0006)", "slower than jax in tokens/s"),
])
def test_a_called_difference_is_written_in_the_decimals_that_tell_it_from_none(figure, ratio, low, high, cell,
                                                                                words):
    verdict = stats.verdict("torch", "jax", stats.Interval(figure, ratio, low, high, (5, 5), False, (10, 10), "t"))
    factor, interval = cell.split(" ", 1)[0], cell.split(" ", 2)[2]
    assert verdict.cell() == cell and verdict.text == f"torch is {factor} {words} {interval}"


@pytest.mark.parametrize("low, high, shown", [
    (0.32, 1.005, "0.320–1.005"),  # two decimals read '0.32–1.00': an interval that seemed to end below 1
    (0.9962, 1.21, "0.996–1.210"),
    (0.981, 1.04, "0.98–1.04"),
    (0.99999, 1.2, "0.99999–1.20000"),
])
def test_an_interval_that_holds_1_is_written_in_the_decimals_that_show_it(low, high, shown):
    verdict = stats.verdict("torch", "jax", stats.Interval("step_s_median", 0.57, low, high, (2, 2), True, (9, 9), "t"))
    assert verdict.call == "no difference"
    assert verdict.cell().startswith(f"no difference ({shown})") and f"beyond the noise ({shown})" in verdict.text


def test_student_t_quantiles_are_a_tables():
    # Two-sided 95 % (and one 99 %) critical values as printed in statistics tables; 1e6 degrees: the normal's.
    table = {(0.975, 1): 12.706, (0.975, 2): 4.303, (0.975, 4): 2.776, (0.975, 9): 2.262, (0.975, 30): 2.042,
             (0.975, 1e6): 1.960, (0.995, 3): 5.841}
    for (probability, df), value in table.items():
        assert stats.t_quantile(probability, df) == pytest.approx(value, abs=6e-4), (probability, df)


def null_runs(rng, count, between=0.02, within=0.005, windows=20):
    """`count` repeats of one configuration: each repeat's speed strays from the others' by `between` (the machine
    between runs), each window's within it by `within`."""
    runs = []
    for _ in range(count):
        rate = math.exp(rng.normal(0, between))
        seconds = [1.0 / (rate * math.exp(rng.normal(0, within))) for _ in range(windows)]
        runs.append({"config": {"run_group": "c"}, "history": [
            {"step": 0, "seconds": 2.0, "tokens": 1000, "first_of_shape": True, "window_steps": 1},
            *({"step": i + 1, "seconds": s, "tokens": 1000, "first_of_shape": False, "window_steps": 1}
              for i, s in enumerate(seconds))]})
    return runs


@pytest.mark.parametrize("paired", [True, False])
def test_the_same_configuration_is_called_different_about_as_often_as_the_confidence_allows(paired):
    """400 comparisons of a configuration with itself, 5 repeats each, the noise between runs larger than within
    them (as on a GPU): a 95 % interval excludes 1 in about 5 % of them (binomial spread at 400: 1.1 %)."""
    rng = np.random.default_rng(7)
    called = sum(stats.call_of(stats.ratio_interval("tokens_per_s", null_runs(rng, 5), null_runs(rng, 5), paired))
                 != "no difference" for _ in range(400))
    assert 0.01 <= called / 400 <= 0.09, called


def test_pairing_interleaved_repeats_removes_the_drift_they_share():
    """Each repeat k of both runs ran on the machine in the same state (a drift of ±10 % between repeats): paired,
    the interval is far narrower than unpaired."""
    drifts = [0.9, 1.0, 1.1, 0.95, 1.05]
    fast = [result(seed=i, drift=d, noise=0.005) for i, d in enumerate(drifts)]
    slow = [result(seed=10 + i, drift=d * 1.04, noise=0.005) for i, d in enumerate(drifts)]
    paired = stats.ratio_interval("tokens_per_s", slow, fast, paired=True)
    unpaired = stats.ratio_interval("tokens_per_s", slow, fast, paired=False)
    assert paired.half_width < unpaired.half_width / 3
    assert stats.call_of(paired) == "slower" and stats.call_of(unpaired) == "no difference"
    assert stats.same_session(slow, fast) and not stats.same_session(slow, fast[:4])


def test_two_comparisons_of_one_name_are_no_session_to_pair():
    """Repeats pair where a comparison trained them round by round; two comparisons written under the same file
    name (so one group) a day apart are not interleaved, whatever their group says."""
    def written(runs, times):
        return [{**run, "created": time} for run, time in zip(runs, times)]
    fast, slow = repeats(3), repeats(3, seed=10, step_s=0.016)
    rounds = ["2026-12-01T10:00:0%d+0000" % second for second in range(6)]
    assert stats.same_session(written(slow, rounds[1::2]), written(fast, rounds[0::2]))
    monday, tuesday = (["2026-12-0%dT10:00:0%d+0000" % (day, second) for second in range(3)] for day in (1, 2))
    assert not stats.same_session(written(slow, tuesday), written(fast, monday))
    assert stats.same_session(slow, fast)  # results that do not say when they were written: by their group


def test_paired_repeats_are_left_out_with_their_partners():
    """The candidate's repeat 2 and the reference's repeat 4 stopped before a steady window (compile_s: before it
    was measured): what pairs is repeats 1 and 3 of each, not the candidate's 1, 3, 4 beside the reference's 1, 2,
    3, which never ran side by side."""
    drifts = [0.9, 1.0, 1.1, 0.95]
    candidate = [result(seed=i, drift=d * 1.04, noise=0.005) for i, d in enumerate(drifts)]
    reference = [result(seed=10 + i, drift=d, noise=0.005) for i, d in enumerate(drifts)]
    for lost in (candidate[1], reference[3]):
        lost["history"] = lost["history"][:1]  # its first step alone: compilation
        lost["timing"]["compile_s"] = None
    for key, figure in (("tokens_per_s", steady_tokens_per_s), ("compile_s", lambda run: run["timing"]["compile_s"])):
        interval = stats.ratio_interval(key, candidate, reference, paired=True)
        logs = np.array([math.log(figure(candidate[k]) / figure(reference[k])) for k in (0, 2)])
        half = 12.7062047 * logs.std(ddof=1) / math.sqrt(2)  # Student's t at 97.5 %, 1 degree of freedom
        assert interval.paired and interval.repeats == (2, 2), key
        assert (interval.ratio, interval.low, interval.high) == pytest.approx(
            (math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)), rel=1e-6), key


def test_a_difference_inside_the_noise_floor_is_not_called_one():
    slow, fast = repeats(5, step_s=0.015 * 1.03, noise=0.002), repeats(5, seed=9, noise=0.002)
    interval = stats.ratio_interval("tokens_per_s", slow, fast)
    assert interval.high < 1
    assert stats.verdict("b", "a", interval).call == "slower"
    held = stats.verdict("b", "a", interval, noise_floor=0.05)
    assert held.call == "no difference" and held.noise_floor == 0.05
    assert held.text.endswith(", within the noise floor of ±5.0%)")
    # the floor an A/A shows is how far its repeats' ratios stray from 1: the root mean square of their logs
    twins, baseline = repeats(5, seed=1), repeats(5, seed=2)
    strays = [math.log(twin["timing"]["tokens_per_s"] / base["timing"]["tokens_per_s"])
              for twin, base in zip(twins, baseline)]
    rms = math.sqrt(sum(stray * stray for stray in strays) / len(strays))
    assert stats.noise_floor_of("tokens_per_s", twins, baseline) == pytest.approx(math.exp(rms) - 1)


def test_more_repeats_under_an_aa_floor_call_a_real_difference_more_often_not_less():
    """Runs that scatter by 2 % between processes: a 7 % faster run held to the A/A floor is called faster more
    often with 20 repeats than with 5, nearly always, and the same configuration is not called faster. A floor that
    grows with the repeats (the farthest A/A ratio's) called it in a third of 20-repeat compares."""
    rng = np.random.default_rng(7)

    def runs(count, speedup):
        return [result(step_s=0.015 / speedup * math.exp(rng.normal(0, 0.02)), noise=0.002,
                       seed=int(rng.integers(1 << 30))) for _ in range(count)]

    def calls(count, speedup, trials=30):
        called = 0
        for _ in range(trials):
            baseline, twins, candidate = runs(count, 1.0), runs(count, 1.0), runs(count, speedup)
            floor = stats.noise_floor_of("tokens_per_s", twins, baseline)
            interval = stats.ratio_interval("tokens_per_s", candidate, baseline, paired=True)
            called += stats.call_of(interval, floor) == "faster"
        return called

    few, many = calls(5, 1.07), calls(20, 1.07)
    assert many >= 27 and many >= few, (few, many)
    assert calls(20, 1.0) <= 1


def test_one_repeat_and_few_windows_are_warned_of():
    interval = stats.ratio_interval("step_s_median", [result(windows=6)], [result(seed=3, windows=6)])
    assert interval.repeats == (1, 1) and interval.windows == (6, 6)
    assert stats.repeat_warnings(interval) == [
        "1 repeat: the intervals count only the noise within each run, not between runs (--repeats 5 or more, or "
        "--repeats auto with a --repeats-budget that leaves time for 5)",
        "6 steady timing windows in a run: too few to resample (at least 10: more --steps, or a smaller "
        "--timing-window)"]
    assert interval.method == "bootstrap of the log ratio over the steady windows of each run's one repeat"
    # figures of whole runs rest on the spread between repeats alone: none with one repeat each
    assert stats.ratio_interval("compile_s", [result()], [result()]) is None
    assert stats.ratio_interval("compile_s", repeats(2), repeats(2)).method == "Welch's t over the repeats' logs"
    # One repeat of one run beside repeats of the other: the other's spread stands for its own.
    assert stats.repeat_warnings(stats.ratio_interval("tokens_per_s", [result()], repeats(3, seed=3)))[0].startswith(
        "1 repeat: the other run's spread between its repeats stands for this one's")


def test_one_repeat_each_is_shown_but_not_called_since_the_noise_between_runs_is_unmeasured():
    """Two processes of one configuration differ by more than the windows within either show: runs that scatter
    2 % between them and 0.5 % within. Their within-run intervals leave out 1 for most such pairs, and held to a
    floor of that 2 % still for many; each one-repeat pair's ratio and interval are shown, the call undetermined."""
    rng = np.random.default_rng(4)
    pairs = [[[result(seed=100 + 2 * k + side, noise=0.005, drift=math.exp(rng.normal(0, 0.02)))] for side in (0, 1)]
             for k in range(30)]
    intervals = [stats.ratio_interval("tokens_per_s", *pair) for pair in pairs]
    assert sum(not interval.low < 1 < interval.high for interval in intervals) > 20  # what the interval alone calls
    assert sum(not 1 / 1.02 < interval.low and interval.high < 1.02 for interval in intervals) > 5
    for floor in (None, 0.02):
        verdicts = [stats.verdict("jax:twin", "jax", interval, floor) for interval in intervals]
        assert {verdict.call for verdict in verdicts} == {"undetermined"}
    verdict = verdicts[0]
    assert verdict.undetermined == stats.ONE_REPEAT_EACH and not verdict.called
    # Its bounds in three decimals: in two its low bound (1.005) would read 1.00, as if the interval held 1.
    assert f"{verdict.low:.2f}" == "1.00" and f"{verdict.low:.3f}" != "1.000"
    assert verdict.text == (f"jax:twin: {verdict.ratio:.2f}x jax's tokens/s ({verdict.low:.3f}–"
                            f"{verdict.high:.3f}), undetermined: one repeat each, whose interval holds the noise "
                            f"within each run, not between runs (--repeats 5 or more)")
    assert verdict.cell() == f"undetermined ({verdict.low:.3f}–{verdict.high:.3f}), 1 repeat each"
    assert verdict.to_dict()["undetermined"] == stats.ONE_REPEAT_EACH
    # A run 30 % slower is not called from one repeat each either; beside 3 repeats of the other run, whose spread
    # stands for both, it is.
    slow = [result(step_s=0.015 * 1.3, seed=7)]
    assert stats.verdict("slow", "jax", stats.ratio_interval("tokens_per_s", slow, [result(seed=8)])).call == \
        "undetermined"
    assert stats.verdict("slow", "jax", stats.ratio_interval("tokens_per_s", slow, repeats(3, seed=8))).call == \
        "slower"


@pytest.mark.parametrize("paired", [True, False])
def test_repeats_that_measured_a_figure_alike_are_not_called_apart_from_an_interval_of_zero_width(paired):
    """Three repeats of one result each side (a figure to the last digit alike, as a coarse clock or a hand-made
    result gives): their spread is 0, and Student's t made an interval of zero width, a 1.0001x compile time
    called 'faster' as certain. Equal figures on both sides are no difference."""
    alike = lambda run, count: [copy.deepcopy(run) for _ in range(count)]
    one, other = result(seed=1), result(seed=2, step_s=0.0151)
    for key in ("tokens_per_s", "step_s_median", "compile_s"):
        interval = stats.ratio_interval(key, alike(other, 3), alike(one, 3 if paired else 4), paired)
        assert interval.ratio != 1 and interval.half_width < 1e-12
        held = stats.verdict("other", "one", interval)
        assert held.call == stats.UNDETERMINED and held.undetermined == stats.NO_SPREAD and not held.called
        assert held.text.endswith(f"undetermined: {stats.NO_SPREAD}")
        assert held.cell().endswith(", repeats alike")
        same = stats.verdict("one", "one", stats.ratio_interval(key, alike(one, 3), alike(one, 3), paired))
        assert same.call == "no difference" and same.ratio == 1


@pytest.mark.parametrize("low, high, floor, wide", [
    (0.01, 3.79, None, True),    # 3 repeats on a loaded machine: neither a 10x slowdown nor a 3.8x speed-up ruled out
    (0.94, 2.39, None, False),   # a slowdown of 6 % at most: not as wide as ±10 % on the slow side
    (0.85, 1.20, 0.25, False),   # within a noise floor of ±25 %
    (0.70, 1.45, 0.25, True),
])
def test_a_no_difference_too_wide_to_rule_out_a_ten_percent_one_says_so(low, high, floor, wide):
    """'no difference (0.01–3.79)' read as parity; where its interval reaches past ±10 % (or the noise floor, where
    wider) on both sides it says it is too wide to tell."""
    interval = stats.Interval("tokens_per_s", math.sqrt(low * high), low, high, (3, 3), True, None, "t")
    held = stats.verdict("torch", "jax", interval, floor)
    assert held.call == "no difference"
    assert ("an interval too wide to tell it from a ±" in held.text) == wide
    assert held.cell().endswith(", too wide to tell") == wide


def test_one_window_against_one_window_gets_no_verdict_rather_than_an_interval_of_zero_width():
    slowed = [result(windows=1, step_s=0.02)]
    for key in stats.WINDOW_FIGURES:
        assert stats.ratio_interval(key, slowed, [result(windows=1, seed=3)]) is None
        interval = stats.ratio_interval(key, slowed, [result(windows=2, seed=3)])  # one side's windows resample
        assert interval.low < interval.high and interval.windows == (1, 2)
    comparison = build_comparison([LoadedRun(result(windows=1), "a.json"),
                                   LoadedRun(result(extras=("slow",), windows=1, step_s=0.02), "b.json")])
    assert comparison.verdicts == {}
    _, rows = table_cells(comparison)
    titles = [row[0] for row in rows]
    assert "tokens/s vs jax (geometric means over repeats)" in titles and not any("95 % interval" in t for t in titles)
    # Nor a break-even: the two runs' figures alone would name the step after which one overtakes the other.
    assert comparison.break_even(comparison.groups[1]).text == "undetermined: no tokens/s interval to rank them by"


def test_break_even_against_a_hand_count():
    # b compiles 2 s slower but steps 10 ms faster: it catches up after 200 steps, 1 + 200 x 0.03 = 7 s
    even = stats.break_even("b", "a", {"a": 1.0, "b": 3.0}, {"a": 0.03, "b": 0.02})
    assert (even.steps, even.seconds, even.faster_compiling, even.faster_stepping) == (200, pytest.approx(7.0), "a", "b")
    assert even.text == "b overtakes a after 200 steps (7.0 s)"
    odd = stats.break_even("b", "a", {"a": 1.0, "b": 3.5}, {"a": 0.03, "b": 0.02})
    assert odd.steps == 250
    # b compiles 0.01 s slower, 10 ms a step faster: it has caught up after one step
    assert stats.break_even("b", "a", {"a": 1.0, "b": 1.01}, {"a": 0.03, "b": 0.02}).text == \
        "b overtakes a after 1 step (1.0 s)"
    never = stats.break_even("b", "a", {"a": 1.0, "b": 0.5}, {"a": 0.03, "b": 0.02})
    assert never.steps is None and never.text == "never: b compiles faster and steps faster"
    assert stats.break_even("b", "a", {"a": None, "b": 0.5}, {"a": 0.03, "b": 0.02}) is None


def test_time_to_target_with_and_without_compilation():
    """The target is met at step 40, after the first shape's 2 s of compilation; a second shape met after it
    compiles 3 s more, which the run's compile time counts and the time to its target does not."""
    run = result(compile_s=2.0, noise=0.0)
    later = len(run["history"]) + 1
    run["history"] += [{"step": later + k, "seconds": 0.015 + (3.0 if k == 0 else 0.0), "window_steps": 1,
                        "tokens": 800, "shape": [32, 48], "first_of_shape": k == 0, "loss": 6.0} for k in range(5)]
    assert later > 40 and stats.compile_excess(run["history"]) == pytest.approx(5.0, rel=1e-9)
    run["target"] = {"time_to_target_s": 5.0, "steps_to_target": 40}
    assert stats.target_times(run) == pytest.approx((5.0, 3.0), rel=1e-9)
    assert stats.target_times(result()) is None


def test_auto_repeats_ends_on_width_budget_or_count():
    from mtbench.runner.orchestration.compare import AutoRepeats, auto_repeats_end
    auto = AutoRepeats(width=0.03, budget_s=100)
    assert auto_repeats_end(auto, 6, 0.02, 50, 10) ["ended_by"] == "width"
    assert auto_repeats_end(auto, 3, 0.02, 50, 10) is None  # narrow, but too few repeats to trust it
    budget = auto_repeats_end(auto, 2, 0.08, 95, 10)
    assert budget["ended_by"] == "budget" and budget["text"] == (
        "--repeats auto ended by budget after 2 repeat(s): the time budget: 95 s of 100 s used, and two more "
        "repeats would take about 20 s; the widest tokens/s interval is ±8.0% (goal ±3.0%); only 2 repeat(s), fewer "
        "than the 5 the interval needs")
    assert auto_repeats_end(AutoRepeats(most=4), 4, 0.2, 1, 1)["ended_by"] == "most"


def test_auto_repeats_ends_on_an_even_count_so_the_run_order_is_balanced():
    """The rounds run forwards and backwards in turn: an odd count ran one order once more, and the drift it
    shared was read as a difference. Narrow at 5 repeats, it runs a 6th; with time for one repeat and not two it
    stops at an even count; at an odd one it stops only where even the balancing repeat would pass the budget,
    and says so."""
    from mtbench.runner.orchestration.compare import AutoRepeats, auto_repeats_end
    auto = AutoRepeats(width=0.03, budget_s=100)
    assert stats.MIN_REPEATS % 2 == 1 and auto_repeats_end(auto, stats.MIN_REPEATS, 0.02, 50, 5) is None
    assert auto_repeats_end(auto, stats.MIN_REPEATS + 1, 0.02, 55, 5)["ended_by"] == "width"
    assert auto_repeats_end(auto, 4, 0.2, 85, 10)["ended_by"] == "budget"  # one more fits, two do not
    assert auto_repeats_end(auto, 3, 0.2, 85, 10) is None  # the one that balances them fits
    odd = auto_repeats_end(auto, 3, 0.2, 95, 10)
    assert odd["ended_by"] == "budget" and odd["text"].endswith(
        "; an odd count: the runs ran in their given order in one repeat more than in reverse, so a drift of the "
        "machine falls unevenly on them")
    assert auto_repeats_end(AutoRepeats(most=5), 5, 0.2, 1, 1) is None


@pytest.mark.parametrize("text, expected", [("5%", 0.05), ("5 %", 0.05), ("2.5", 0.025), (".5%", 0.005)])
def test_percentages(text, expected):
    assert stats.parse_percent(text, "--x") == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "abc", "-5%", "0", "100%", "5%%"])
def test_bad_percentages(text):
    with pytest.raises(MtbenchError, match=r"^--x: '.*' is not a percentage between 0 and 100 \(such as 5%\)$"):
        stats.parse_percent(text, "--x")


def test_a_number_below_one_without_its_sign_is_refused_as_ambiguous():
    """The regression JSON records `fail_if_slower` 0.05 for 5 %: copied back as `--fail-if-slower 0.05`, it made
    the gate a hundred times stricter."""
    with pytest.raises(MtbenchError) as refused:
        stats.parse_percent("0.05", "--fail-if-slower")
    assert str(refused.value) == ("--fail-if-slower: '0.05' is 0.05 % or, as a fraction, 5 %; give it with its % "
                                  "sign ('0.05%' or '5%')")
    assert stats.parse_percent("0.05%", "--x") == pytest.approx(0.0005)


def test_the_gate_fails_only_where_the_whole_interval_is_past_the_threshold():
    fast = repeats(5, noise=0.002)
    much = stats.ratio_interval("tokens_per_s", repeats(5, seed=7, step_s=0.015 * 1.2, noise=0.002), fast)
    little = stats.ratio_interval("tokens_per_s", repeats(5, seed=7, step_s=0.015 * 1.03, noise=0.002), fast)
    same = stats.ratio_interval("tokens_per_s", repeats(5, seed=7), fast)
    assert stats.significantly_slower(much, 0.05)
    assert not stats.significantly_slower(little, 0.05) and stats.call_of(little) == "slower"
    assert not stats.significantly_slower(same, 0.05)


def test_the_gates_columns_divide_to_its_ratio_for_figures_of_whole_runs():
    """compile_s of three repeats each, 1, 1 and 10 s against 1, 1 and 1.01 s: the verdict's ratio is that of the
    geometric means, (10 / 1.01) ** (1 / 3) = 2.147; the baseline and new columns the gate prints beside it divide
    to it (their medians, 1.0 and 1.0, read no change beside 2.147x). Where a repeat measured 0, no ratio: the
    median."""
    from mtbench.runner.results import regression
    from mtbench.runner.results.report import RunGroup

    def run(compile_times, seed):
        made = repeats(len(compile_times), seed=seed)
        for one, seconds in zip(made, compile_times):
            one["timing"]["compile_s"] = seconds
        return RunGroup("jax", [LoadedRun(one, f"{number}.json") for number, one in enumerate(made)])

    new, old = run([1.0, 1.0, 10.0], 0), run([1.0, 1.0, 1.01], 5)
    judged = regression.change_verdict("compile_s", new.results, old.results, "new", "old")
    assert judged.ratio == pytest.approx((10 / 1.01) ** (1 / 3))
    assert new.over_repeats("compile_s") / old.over_repeats("compile_s") == pytest.approx(judged.ratio)
    assert run([0.0, 2.0, 3.0], 0).over_repeats("compile_s") == 2.0


def test_the_gate_fails_where_it_cannot_judge_a_run_of_the_baseline():
    """A gate that passed a run NEW lacks, or one without a tokens/s interval, would pass what it never held."""
    from mtbench.runner.results import regression
    judged = stats.verdict("jax (new)", "jax (baseline)",
                           stats.ratio_interval("tokens_per_s", repeats(5, seed=7), repeats(5, noise=0.002)))
    changes = [regression.Change("jax", "tokens_per_s", 1.0, 1.0, judged),
               regression.Change("torch", "tokens_per_s", 1.0, 1.0, None, regression.ONE_WINDOW_EACH),
               regression.Change("torch", "compile_s", 1.0, 1.0, None, regression.ONE_REPEAT)]
    held = regression.Regression(["new.json"], "old.json", changes, [], ["pmap"], None, threshold=0.05)
    assert judged.call == "no difference" and held.slower_beyond_threshold() == []
    with pytest.raises(MtbenchError) as failed:
        regression.require_not_slower(held)
    assert failed.value.exit_code == 1 and str(failed.value) == (
        "--fail-if-slower 5% cannot judge every run of the baseline: run 'pmap' of old.json is not in new.json; "
        "run 'torch' has no tokens/s verdict (one repeat of one timing window on each side: nothing to resample)")
    assert held.lines()[-1].startswith("--fail-if-slower 5%: cannot judge: run 'pmap' of old.json is not in")
    regression.require_not_slower(regression.Regression(["new.json"], "old.json", changes[:1], [], [], None, 0.05))
    regression.require_not_slower(regression.Regression(["new.json"], "old.json", changes, [], ["pmap"], None))
    # One repeat each: an interval, but no verdict to pass or fail, even of a run 30 % slower.
    slower = stats.verdict("jax (new)", "jax (baseline)", stats.ratio_interval(
        "tokens_per_s", [result(step_s=0.015 * 1.3)], [result(seed=3)]))
    held = regression.Regression(["new.json"], "old.json", [regression.Change("jax", "tokens_per_s", 1.0, 1.3, slower)],
                                 [], [], None, threshold=0.05)
    assert held.beyond_noise() == [] and held.slower_beyond_threshold() == [] and held.not_ruled_out() == []
    assert held.unjudged() == [f"run 'jax' has no tokens/s verdict ({stats.ONE_REPEAT_EACH})"]
    # Its lines say no figure could be judged (not that none changed), its JSON what it could not judge.
    assert f"no figure could be judged: 1 undetermined ({stats.ONE_REPEAT_EACH})" in held.lines()
    assert "no figure changed beyond the noise" not in held.lines()
    assert regression.to_json_dict(held)["cannot_judge"] == held.unjudged()
    with pytest.raises(MtbenchError, match="cannot judge every run of the baseline: run 'jax' has no tokens/s"):
        regression.require_not_slower(held)


def comparison(slow_factor=1.3, count=2, noise=0.03):
    runs = [LoadedRun(r, f"{label}-{i}.json") for label, rs in
            (("jax", repeats(count, compile_s=3.0, noise=noise)),
             ("jax+slow-step", repeats(count, seed=50, extras=("slow-step",), step_s=0.015 * slow_factor,
                                       noise=noise)))
            for i, r in enumerate(rs)]
    return build_comparison(runs)


def test_the_comparisons_break_even_against_a_hand_count():
    """With next to no noise (none at all leaves the verdict undetermined) each run's figures are its history's:
    jax compiles 3.0 s and steps 15 ms, jax+slow-step compiles 1.5 s and steps 19.5 ms; jax makes up its 1.5 s at
    4.5 ms a step after 1.5 / 0.0045 = 333.3 steps (334 whole ones), where both have run 3.0 + 333.3 x 0.015 =
    1.5 + 333.3 x 0.0195 = 8.0 s."""
    compared = comparison(noise=1e-7)
    even = compared.break_even(compared.groups[1])
    assert (even.steps, even.seconds) == (334, pytest.approx(8.0))
    assert even.text == "jax overtakes jax+slow-step after 334 steps (8.0 s)"
    by_title = {row[0]: row[1:] for row in table_cells(compared)[1]}
    assert by_title["break-even vs jax (compile + steps)"][1] == even.text


def test_a_break_even_that_rests_on_step_times_within_the_noise_is_undetermined():
    """A run 1 % slower a step, over 2 repeats whose noise is 3 %: the steady step verdict is no difference, so
    which run overtakes the other, and when, is not known; the medians alone once named a step."""
    compared = comparison(slow_factor=1.002)
    speed = compared.verdicts["jax+slow-step"]["tokens_per_s"]
    assert speed.call == "no difference"
    even = compared.break_even(compared.groups[1])
    assert (even.text, even.steps) == (f"undetermined: tokens/s within the noise "
                                       f"({stats.range_text(speed.low, speed.high)})", None)
    assert comparison().break_even(comparison().groups[1]).steps is not None  # 1.3x slower: a step is named


def test_compare_table_markdown_csv_and_json_carry_the_intervals():
    compared = comparison()
    verdict = compared.verdicts["jax+slow-step"]["tokens_per_s"]
    assert verdict.call == "slower" and verdict.paired  # the same run_group: one compare's interleaved repeats
    header, rows = table_cells(compared)
    by_title = {row[0]: row[1:] for row in rows}
    assert by_title["tokens/s vs jax (95 % interval)"] == ["(baseline)", verdict.cell()]
    # The same break-even in every format (its count against a hand count: the test above).
    steps = compared.break_even(compared.groups[1]).steps
    assert by_title["break-even vs jax (compile + steps)"][1].startswith(f"jax overtakes jax+slow-step after {steps:,} steps")
    markdown = to_markdown(compared)
    assert f"- {verdict.text}" in markdown and "- interval warning: 2 repeats" in markdown
    assert "- noise floor: not measured" in markdown
    row = {r["label"]: r for r in csv.DictReader(io.StringIO(to_csv(compared)))}["jax+slow-step"]
    assert (float(row["tokens_per_s_ratio_low"]), float(row["tokens_per_s_ratio_high"])) == (verdict.low, verdict.high)
    assert row["tokens_per_s_verdict"] == "slower" and int(row["break_even_steps"]) == steps
    data = to_json_dict(compared)
    assert data["verdicts"][0] == verdict.to_dict() and data["break_even"][0]["steps"] == steps
    assert data["summary"][1]["verdicts"]["step_s_median"]["call"] == "slower"


def test_a_break_even_says_where_a_compile_time_came_from_a_warm_cache():
    """A run whose programs the persistent cache held compiled in less time than a fresh machine will: the
    break-even that rests on it says so, and every break-even records the states it rests on."""
    cold = comparison()
    assert to_json_dict(cold)["break_even"][0]["compile_caches"] == {"jax+slow-step": "none", "jax": "none"}
    warm_runs = comparison().groups[0].results + comparison().groups[1].results
    for run in warm_runs[:2]:  # the baseline's two repeats: its programs came from the cache
        run["timing"]["compile_cache"] = {"state": "warm", "programs": "warm", "hits": 3, "misses": 0}
    for run in warm_runs[2:]:
        run["timing"]["compile_cache"] = {"state": "cold", "programs": "cold", "hits": 0, "misses": 3}
    warm = build_comparison([LoadedRun(run, f"{number}.json") for number, run in enumerate(warm_runs)])
    (even,) = to_json_dict(warm)["break_even"]
    assert even["compile_caches"] == {"jax+slow-step": "cold", "jax": "warm"}
    assert even["text"] == (f"{to_json_dict(cold)['break_even'][0]['text']} (compile caches: jax+slow-step cold, "
                            f"jax warm; a cold start compiles longer)")
    by_title = {row[0]: row[1:] for row in table_cells(warm)[1]}
    assert by_title["break-even vs jax (compile + steps)"][1] == even["text"]
    # A run faster at both beside a warm one: compiling afresh only slows the warm one more, the answer stands.
    faster = stats.BreakEven("jax+slow-step", "jax", "never: jax+slow-step compiles faster and steps faster",
                             faster_compiling="jax+slow-step", faster_stepping="jax+slow-step")
    held = with_compile_caches(faster, {"jax+slow-step": "cold", "jax": "warm"})
    assert held.text == faster.text and held.compile_caches == {"jax+slow-step": "cold", "jax": "warm"}
    moved = with_compile_caches(faster, {"jax+slow-step": "partly warm", "jax": "cold"})
    assert moved.text.endswith("(compile caches: jax+slow-step partly warm, jax cold; a cold start compiles longer)")


T_975_2 = 4.302652729911275  # Student's t, 97.5th percentile, 2 degrees of freedom (3 paired repeats)


def test_a_recorded_noise_floor_is_shown_and_held_to():
    from mtbench.runner.results.verdicts import noise_floor_record
    baseline, twins = repeats(3), repeats(3, seed=30)
    record = noise_floor_record("jax", baseline, twins)
    assert record["measured_by"] == "A/A: run 'jax' twice in each of 3 repeat(s), interleaved"
    # By hand: the twins' log ratios repeat by repeat; the floor their root mean square, the interval Student's.
    logs = np.log([steady_tokens_per_s(t) / steady_tokens_per_s(b) for t, b in zip(twins, baseline)])
    tokens = record["figures"]["tokens_per_s"]
    assert tokens["floor"] == pytest.approx(math.exp(math.sqrt(np.mean(logs ** 2))) - 1, rel=1e-9)
    half = T_975_2 * logs.std(ddof=1) / math.sqrt(3)
    assert (tokens["ratio"], tokens["low"], tokens["high"]) == pytest.approx(
        (math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)), rel=1e-9)
    # Held to: a run 10 % slower a step, its repeats scattering little, is slower beyond its interval; a floor of
    # ±15 % hides it, as its interval's bound nearest 1 lies within the floor.
    slower = repeats(3, seed=60, extras=("same-step",), step_s=0.0165, noise=0.002)
    runs = [LoadedRun(r, "x.json") for r in baseline + slower]
    assert build_comparison(runs).verdicts["jax+same-step"]["tokens_per_s"].call == "slower"
    compared = build_comparison(runs, noise_floor={**record, "figures": {
        key: {**entry, "floor": 0.15} for key, entry in record["figures"].items()}})
    held = compared.verdicts["jax+same-step"]["tokens_per_s"]
    assert held.call == "no difference" and held.high < 1 and held.low > 1 / 1.15
    assert "noise floor: tokens/s ±15.0%, steady step time ±15.0% (A/A: run 'jax' twice in each of 3 repeat(s), " \
           "interleaved; its losses 0 % from the baseline's at most, first 50 steps)" in to_markdown(compared)


def test_a_compare_aa_of_one_configuration_says_what_its_twin_measured():
    """`compare --backends jax --aa` of one configuration: its twin measured 1.73x the baseline, beyond its own
    interval, and the table and markdown said neither the floor nor that warning (only the JSON had them)."""
    from mtbench.runner.results.verdicts import noise_floor_record
    baseline, twins = repeats(3), repeats(3, seed=30, step_s=0.015 / 1.73, noise=0.002)
    record = noise_floor_record("jax", baseline, twins)
    single = build_comparison([LoadedRun(r, f"jax-{i}.json") for i, r in enumerate(baseline)], noise_floor=record)
    shown = to_markdown(single)
    assert "noise floor: tokens/s ±" in shown and "its twins differed beyond their own interval" in shown
    assert "noise floor" not in to_markdown(build_comparison([LoadedRun(r, f"jax-{i}.json")
                                                              for i, r in enumerate(baseline)]))


def test_the_noise_floor_records_how_far_the_twins_losses_strayed():
    """The A/A twin runs the baseline's arithmetic again: its losses, repeat by repeat, are held to the baseline's
    as parity holds a run's, and the largest difference is recorded and said beside the floor."""
    from mtbench.runner.results.verdicts import noise_floor_line, noise_floor_record
    baseline, twins = repeats(3), repeats(3, seed=30)
    assert noise_floor_record("jax", baseline, twins)["twin_losses"]["max_relative_difference"] == 0.0
    twins[1]["history"][4]["loss"] *= 1.002  # repeat 2's twin, step 5
    twins[2]["history"][7]["loss"] *= 1.001
    record = noise_floor_record("jax", baseline, twins, parity_steps=20)
    assert record["twin_losses"]["repeat"] == 2 and record["twin_losses"]["at_step"] == 5
    assert record["twin_losses"]["max_relative_difference"] == pytest.approx(0.002)
    assert record["twin_losses"]["steps"] == 20
    assert noise_floor_line(record).endswith("interleaved; its losses 0.2 % from the baseline's at most, "
                                             "first 20 steps)")


def test_twins_that_differ_beyond_their_own_interval_are_said_to_have_met_another_machine():
    """An A/A whose twin ran 1.5x slower in every repeat (another load came): its floor of ±50 % hides every real
    difference below it, which the line said nothing of."""
    from mtbench.runner.results.verdicts import noise_floor_line, noise_floor_record
    baseline, twins = repeats(3), repeats(3, seed=30, step_s=0.015 * 1.5)
    line = noise_floor_line(noise_floor_record("jax", baseline, twins))
    assert "; its twins differed beyond their own interval (tokens/s 0." in line
    assert line.endswith("): the machine changed between them, so this floor hides real differences below it")
    assert "beyond their own interval" not in noise_floor_line(noise_floor_record("jax", baseline, repeats(3, seed=30)))
    # One repeat each: the twin's interval holds no noise between the two processes, which differ beyond it as a
    # rule (a 1.5 % stray, far inside the noise between runs, lies outside it): no machine is said to have changed.
    one = noise_floor_record("jax", [result()], [result(seed=30, step_s=0.015 * 1.015, noise=0.002)])
    assert not one["figures"]["tokens_per_s"]["low"] <= 1 <= one["figures"]["tokens_per_s"]["high"]
    assert "beyond their own interval" not in noise_floor_line(one)


def test_each_figure_is_held_to_the_widest_floor_any_compare_measured(tmp_path):
    """One A/A scattered 3 % in tokens/s and 1 % in step time, another 2 % and 4 %: the report holds tokens/s to 3 %
    and step time to 4 % (it held both to the second file's, whose widest figure was widest: tokens/s to 2 %)."""
    import json
    from mtbench.runner.results.report import recorded_noise_floor
    paths = []
    for name, tokens, step in (("a", 0.03, 0.01), ("b", 0.02, 0.04)):
        record = {"measured_by": f"A/A of {name}", "figures": {"tokens_per_s": {"floor": tokens},
                                                                "step_s_median": {"floor": step}}}
        (tmp_path / f"{name}.json").write_text(json.dumps({"kind": "mtbench-compare", "runs": [],
                                                            "noise_floor": record}))
        paths.append(str(tmp_path / f"{name}.json"))
    floor = recorded_noise_floor(paths)
    assert {key: entry["floor"] for key, entry in floor["figures"].items()} == {"tokens_per_s": 0.03,
                                                                               "step_s_median": 0.04}
    assert floor["measured_by"] == "A/A of a; A/A of b (each figure's widest)"
    assert recorded_noise_floor(paths[1:])["measured_by"] == "A/A of b"


def fake_compare(monkeypatch, tmp_path, plan):
    """Runs compare's loop with each run's training replaced by a synthetic result (no process, no framework):
    returns the combined JSON and the order the runs were trained in."""
    from rich.console import Console
    from mtbench.runner.orchestration import compare
    trained = []

    def train_one(plan, registry, console, progress, number, spec, repeat):
        trained.append((spec.label + ("~aa" if spec.twin else ""), repeat))
        step_s = 0.015 * (1.3 if spec.extras else 1.0)
        made = result(extras=spec.extras, step_s=step_s, seed=len(trained), noise=0.004, group="c")
        progress.add(spec, repeat, made, str(tmp_path / f"{len(trained)}.json"), str(tmp_path / "log"))
        return []

    monkeypatch.setattr(compare, "validate_plan", lambda plan, registry: None)
    monkeypatch.setattr(compare, "write_weights_files", lambda plan, console, progress: progress.weights.update(
        {spec.shape: {"file": "w.npz", "sha256": "0", "drawn_on": "jax"} for spec in plan.specs}))
    monkeypatch.setattr(compare, "train_one", train_one)
    _, combined, _ = compare.run_compare(plan, None, Console(file=io.StringIO()))
    return combined, trained


def test_repeats_auto_stops_once_every_interval_is_narrow(monkeypatch, tmp_path):
    from mtbench.runner.orchestration.compare import AutoRepeats, ComparePlan
    from mtbench.runner.orchestration.runs import plan_runs
    plan = ComparePlan(plan_runs(matrix="jax;jax+slow-step"), None, None, [], str(tmp_path / "c.json"), False, 50,
                       0.01, aa=True, auto=AutoRepeats(width=0.03, budget_s=600))
    combined, trained = fake_compare(monkeypatch, tmp_path, plan)
    auto = combined["repeats_auto"]
    # narrow from the 5th repeat on (MIN_REPEATS), which is odd: a 6th sets every run first as often as last
    assert auto["ended_by"] == "width" and auto["repeats"] == stats.MIN_REPEATS + 1 and auto["widest"] <= 0.03
    assert auto["text"].startswith(f"--repeats auto ended by width after {stats.MIN_REPEATS + 1} repeat(s): every "
                                   f"tokens/s interval is within ±")
    first = [label for (label, repeat), before in zip(trained, [(None, 0)] + trained) if repeat != before[1]]
    assert first.count("jax") == first.count("jax+slow-step") == auto["repeats"] / 2
    # Even repeats in reverse order; the A/A twin beside the baseline, after it in odd repeats and before it in even
    assert trained[:6] == [("jax", 1), ("jax~aa", 1), ("jax+slow-step", 1), ("jax+slow-step", 2), ("jax~aa", 2),
                           ("jax", 2)]
    assert len(combined["aa_runs"]) == auto["repeats"]
    assert combined["noise_floor"]["figures"]["tokens_per_s"]["floor"] > 0
    assert [entry["label"] for entry in combined["summary"]] == ["jax", "jax+slow-step"]  # the twin is no run of its own
    assert combined["verdicts"][0]["call"] == "slower"


def test_repeats_auto_stops_when_the_budget_runs_out(monkeypatch, tmp_path):
    from mtbench.runner.orchestration.compare import AutoRepeats, ComparePlan
    from mtbench.runner.orchestration.runs import plan_runs
    plan = ComparePlan(plan_runs(matrix="jax;jax+slow-step"), None, None, [], str(tmp_path / "c.json"), False, 50,
                       0.01, auto=AutoRepeats(width=0.03, budget_s=1e-6))
    combined, trained = fake_compare(monkeypatch, tmp_path, plan)
    assert combined["repeats_auto"]["ended_by"] == "budget" and len(trained) == 2
    # the advice fits a comparison that --repeats auto ran already: a budget that leaves time for more repeats
    assert "1 repeat: the intervals count only the noise within each run, not between runs (--repeats 5 or more, " \
           "or --repeats auto with a --repeats-budget that leaves time for 5)" in combined["verdicts"][0]["warnings"]


def test_a_repeat_measured_zero_gives_no_interval_rather_than_one_over_the_other_repeats():
    """torch's eager step compiles nothing: a compile_s of 0.0 has no ratio; leaving it out would rest the verdict
    on the other repeats and call it theirs."""
    from mtbench.runner.results import regression
    eager, compiled = repeats(3), repeats(3, seed=10, compile_s=2.0)
    for run, compile_s in zip(eager, (0.0, 0.04, 0.05)):
        run["timing"]["compile_s"] = compile_s
    assert stats.ratio_interval("compile_s", compiled, eager) is None
    assert stats.ratio_interval("compile_s", compiled, eager[1:]).low > 1  # the other two alone: a verdict
    assert regression.no_verdict_reason("compile_s", compiled + eager) == (
        "a repeat measured 0 (a step that compiles nothing): no ratio to it")
    assert regression.no_verdict_reason("compile_s", compiled[:1] + eager[1:2]) == (
        "one repeat on each side: no spread between repeats")


def test_the_speed_up_and_the_ranking_are_the_verdicts_ratio_not_a_ratio_of_medians():
    """Repeats of 100, 100 and 160 tokens/s against 105, 106 and 107: the ratio of medians (1.06) and the verdict's
    ratio of geometric means (0.906) point opposite ways. The speed-up, the ranking and the verdict read one ratio."""
    base = [result(step_s=800 / speed, noise=0, seed=k) for k, speed in enumerate((100, 100, 160))]
    other = [result(extras=("other",), step_s=800 / speed, noise=0, seed=k) for k, speed in enumerate((105, 106, 107))]
    comparison = build_comparison([LoadedRun(r, f"a{k}.json") for k, r in enumerate(base)]
                                  + [LoadedRun(r, f"b{k}.json") for k, r in enumerate(other)])
    candidate = next(group for group in comparison.groups if group is not comparison.baseline)
    expected = (105 * 106 * 107) ** (1 / 3) / (100 * 100 * 160) ** (1 / 3)  # 0.906
    assert comparison.speedup(candidate) == pytest.approx(expected)
    assert comparison.verdicts[candidate.label]["tokens_per_s"].ratio == pytest.approx(expected)
    assert comparison.ranking()["order"] == [comparison.baseline.label, candidate.label]


def test_the_gate_fails_a_run_whose_tokens_per_s_dropped_past_the_threshold_and_no_other():
    """--fail-if-slower 5%: tokens/s below 0.95 of the baseline's across the whole interval. It once held the time
    per token to 1.05, so a drop of 4.9 % (0.951, 1.05x the time) failed a 5 % gate."""
    def tokens_per_s(ratio, low, high):
        return stats.Interval("tokens_per_s", ratio, low, high, (5, 5), True, None, "t")
    assert not stats.significantly_slower(tokens_per_s(0.951, 0.9505, 0.9515), 0.05)
    assert stats.significantly_slower(tokens_per_s(0.94, 0.935, 0.945), 0.05)
    assert not stats.significantly_slower(tokens_per_s(0.93, 0.90, 0.96), 0.05)  # the interval reaches past it
    # A time figure is the same rule on its speed: 1.06x the step time is 0.943 of the speed.
    step = stats.Interval("step_s_median", 1.06, 1.058, 1.062, (5, 5), True, None, "t")
    assert stats.significantly_slower(step, 0.05)


def test_a_ranking_across_devices_says_it_ranks_the_machines_too():
    """Results from two machines (`mtbench report A.json B.json`) rank their machines with their ways to train:
    not a reliable ranking of the frameworks. Runs on one machine that use more or fewer of its devices are not."""
    faster = repeats(3, seed=40, extras=("fast",), step_s=0.010)
    for run in faster:
        run["env"] = {**run["env"], "device": {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3"}}
    slower = repeats(3)
    for run in slower:
        run["env"] = {**run["env"], "device": {"kind": "gpu", "name": "NVIDIA A100-SXM4-80GB"}}
    ranking = build_comparison([LoadedRun(r, "x.json") for r in slower + faster]).ranking()
    assert ranking["order"] == ["jax+fast", "jax"] and not ranking["reliable"]
    assert ranking["reason"].endswith("the runs ran on different devices (gpu: NVIDIA A100-SXM4-80GB; gpu: NVIDIA H100 "
                                      "80GB HBM3): the order ranks the machines as well as the ways to train")
    for run in slower:
        run["env"]["device"] = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3"}
        run["devices_used"] = 2
    assert build_comparison([LoadedRun(r, "x.json") for r in slower + faster]).ranking()["reliable"]


def test_a_time_to_target_says_how_many_repeats_reached_it():
    """A median over the repeats that reached the target says how many did, and a run that reached it in some
    repeats only is not named the cheapest to it on their cost."""
    from mtbench.runner.results.report import energy_and_cost_lines
    lucky, steady = repeats(3, compile_s=2.0, noise=0.0), repeats(3, seed=50, extras=("other",), noise=0.0)
    for number, run in enumerate(lucky):
        reached = number == 0
        run["target"] = {"time_to_target_s": 5.0, "steps_to_target": 40} if reached else {"time_to_target_s": None}
        run["cost"] = {"price_per_hour": 2.0, "usd": 0.01, "usd_to_target": 0.001 if reached else None}
    for run in steady:
        run["target"] = {"time_to_target_s": 6.0, "steps_to_target": 40}
        run["cost"] = {"price_per_hour": 2.0, "usd": 0.01, "usd_to_target": 0.004}
    compared = build_comparison([LoadedRun(r, "x.json") for r in lucky + steady])
    by_title = {row[0]: row[1:] for row in table_cells(compared)[1]}
    assert by_title["time to target, with compilation (s)"] == ["5.0 (1 of 3 reached it)", "6.0"]
    assert to_json_dict(compared)["summary"][0]["time_to_target"] == {
        "with_compilation_s": 5.0, "without_compilation_s": pytest.approx(3.0), "repeats_reached": 1, "repeats": 3}
    lines = energy_and_cost_lines(compared)
    assert "cost to the target quality of jax: 1 of 3 repeats reached it, not ranked" in lines
    assert any(line.startswith("cheapest to the target quality: jax+other,") for line in lines), lines


def test_a_break_even_counts_the_mean_step_that_the_total_time_grows_by():
    """A run whose steps are mostly 10 ms with one in five at 60 ms steps 20 ms on average, its median 10 ms: beside
    a run of steady 15 ms steps that compiles 2 s more, it steps slower, and the steady run overtakes it after
    2 s / 5 ms = 400 steps, at 1.0 + 400 x 0.020 = 9.0 s; by the medians it was faster at both."""
    from mtbench.runner.results.verdicts import mean_step_s
    skewed, steady = result(extras=("skewed",), compile_s=1.0, noise=0.0), result(compile_s=3.0, noise=0.0)
    for entry in skewed["history"][1:]:
        entry["seconds"] = 0.060 if entry["step"] % 5 == 0 else 0.010
    seconds = [h["seconds"] for h in skewed["history"][1:]]
    skewed["timing"].update(step_s_median=float(np.median(seconds)), steady_s=float(sum(seconds)),
                            steady_steps=len(seconds))
    assert (skewed["timing"]["step_s_median"], mean_step_s(skewed)) == (0.010, pytest.approx(0.020))
    compared = build_comparison(loaded_thrice(steady, "a") + loaded_thrice(skewed, "b", turn=1))
    even = compared.break_even(compared.groups[1])
    assert (even.steps, even.seconds) == (400, pytest.approx(9.0))
    assert even.text == "jax overtakes jax+skewed after 400 steps (9.0 s)"


def test_runs_whose_steps_differ_in_work_break_even_in_tokens_not_steps():
    """A batch of 64 rows trains 1,600 tokens in a 20 ms step, 80,000 tokens/s, against 800 in 15 ms, 53,333
    tokens/s: 1.5x the speed though each step is slower. It compiles 1.5 s longer, which its 6.25 us less a token
    makes up after 1.5 / (1 / 53,333 - 1 / 80,000) = 240,000 tokens, where both have trained 1.5 + 4.5 = 6.0 s.
    Counted in steps it 'compiles slower and steps slower' and never caught up, beside its 1.5x the tokens/s."""
    small = result(noise=0.0)
    large = result(step_s=0.020, tokens=1600, compile_s=3.0, noise=0.0)
    large["config"]["batch_size"] = 64
    compared = build_comparison(loaded_thrice(small, "small") + loaded_thrice(large, "large", turn=1))
    assert compared.speedup(compared.groups[1]) == pytest.approx(1.5)
    even = compared.break_even(compared.groups[1])
    assert (even.tokens, even.steps, even.seconds, even.unit) == (240_000, None, pytest.approx(6.0), "token")
    assert even.text == "jax:batch-size=64 overtakes jax:batch-size=32 after 240,000 tokens (6.0 s)"
    by_title = {row[0]: row[1:] for row in table_cells(compared)[1]}
    assert by_title["break-even vs jax:batch-size=32 (compile + tokens)"] == ["(baseline)", even.text]
    assert f"- break-even: {even.text}" in to_markdown(compared)
    row = list(csv.DictReader(io.StringIO(to_csv(compared))))[1]
    assert (row["break_even_tokens"], row["break_even_steps"]) == ("240000", "")
    # Where the large batch's tokens/s is 0.7 % above the small one's, within the noise, which overtakes is not known.
    levels = repeats(3, seed=1, step_s=0.0298, tokens=1600, compile_s=3.0)
    for level in levels:
        level["config"]["batch_size"] = 64
    compared = build_comparison([LoadedRun(run, f"{name}-{k}.json") for name, runs in
                                 (("small", repeats(3, seed=5)), ("level", levels)) for k, run in enumerate(runs)])
    held = compared.verdicts["jax:batch-size=64"]["tokens_per_s"]
    assert held.call == "no difference"
    assert compared.break_even(compared.groups[1]).text == \
        f"undetermined: tokens/s within the noise ({stats.range_text(held.low, held.high)})"
    # One repeat each: which steps faster is not known whatever the interval within the runs.
    compared = build_comparison([LoadedRun(small, "small.json"), LoadedRun(large, "large.json")])
    held = compared.verdicts["jax:batch-size=64"]["tokens_per_s"]
    assert held.call == "undetermined" and held.ratio == pytest.approx(1.5)
    assert compared.break_even(compared.groups[1]).text == \
        f"undetermined: tokens/s undetermined ({stats.range_text(held.low, held.high)})"


def loaded_thrice(run, name, turn=0):
    """Three repeats of `run` as a report loads them: its copies, of which two step 1e-7 apart from it either way
    (repeats alike to the last digit leave a verdict undetermined, `verdicts.NO_SPREAD`), which moves neither their
    median nor, but by 1e-14, their geometric mean. `turn`: which copy is which; another run's of another turn,
    paired with these, differs from them by more than a spread of 0."""
    scales = collections.deque((1 + 1e-7, 1.0, 1 - 1e-7))
    scales.rotate(turn)
    copies = [copy.deepcopy(run) for _ in range(3)]
    for scale, repeat in zip(scales, copies):
        for entry in repeat["history"]:
            entry["seconds"] *= 1.0 if entry["first_of_shape"] else scale
    return [LoadedRun(repeat, f"{name}-{k}.json") for k, repeat in enumerate(copies)]


def loaded(run, others=60.0, steal=0.0):
    """`run` as if other processes used `others` % of the CPUs' time, and the hypervisor took `steal` %, while it
    trained (`machine_load`, which `run_warnings` reads)."""
    run["machine_load"] = {"cores": 2, "other_processes_percent": others, "steal_percent": steal}
    return run


@pytest.mark.parametrize("others, steal", [(60.0, 0.0), (1.0, 20.0)])
def test_a_verdict_on_runs_of_a_loaded_machine_says_so_on_its_line_cell_and_json(others, steal):
    """Other processes used 55-76 % of the CPUs as a compare's runs trained: `torch:init=flax is 12.62x slower than
    torch:init=torch in tokens/s (2.58-76.84)`, of an initialisation that cannot change the speed, was stated flatly,
    the load said only in the warnings row and a `ranking not reliable` line. A verdict of which either run carries
    a load warning (in any repeat) says so, in the table's cell and the JSON too; the call stays the interval's,
    which excludes 1 (the load is what the interval cannot count, not its width)."""
    quiet = repeats(2, compile_s=3.0)
    slowed = repeats(2, seed=50, extras=("slow-step",), step_s=0.015 * 1.3)
    loaded(slowed[1], others, steal)
    compared = build_comparison([LoadedRun(run, f"{number}.json") for number, run in enumerate(quiet + slowed)])
    qualifier = ", measured on a loaded machine (jax+slow-step): not reliable"
    for key in stats.WINDOW_FIGURES:
        held = compared.verdicts["jax+slow-step"][key]
        assert held.call == "slower" and held.loaded == ("jax+slow-step",)
        assert held.text.endswith(f"){qualifier}") and held.cell().endswith("), loaded machine: not reliable")
        assert f"- {held.text}" in to_markdown(compared)
    assert to_json_dict(compared)["verdicts"][0]["loaded"] == ["jax+slow-step"]
    by_title = {row[0]: row[1:] for row in table_cells(compared)[1]}
    assert by_title["tokens/s vs jax (95 % interval)"][1] == compared.verdicts["jax+slow-step"]["tokens_per_s"].cell()
    # The baseline's load qualifies each verdict held to it; a quiet pair none.
    runs = [loaded(quiet[0], others, steal), quiet[1], slowed[0]]
    compared = build_comparison([LoadedRun(run, f"{number}.json") for number, run in enumerate(runs)])
    assert compared.verdicts["jax+slow-step"]["tokens_per_s"].loaded == ("jax",)
    quiet_pair = build_comparison([LoadedRun(run, f"{number}.json")
                                   for number, run in enumerate(repeats(2) + repeats(2, seed=9, extras=("a",)))])
    held = quiet_pair.verdicts["jax+a"]["tokens_per_s"]
    assert held.loaded == () and "loaded" not in held.text and held.to_dict()["loaded"] == []
    # The ranking's line, where the two fastest are no different, says the load as their verdict does.
    loaded_pair = build_comparison([LoadedRun(run, f"{number}.json") for number, run in enumerate(
        [loaded(run, others, steal) for run in repeats(2)] + repeats(2, seed=9, extras=("a",)))])
    assert ", measured on a loaded machine (jax): not reliable" in loaded_pair.ranking()["reason"]
    # A regression gate's and a history's changes are held by the same rule.
    from mtbench.runner.results.regression import change_verdict
    change = change_verdict("tokens_per_s", slowed, repeats(2), "jax (new)", "jax (baseline)")
    assert change.loaded == ("jax (new)",)
    assert change.text.endswith("), measured on a loaded machine (jax (new)): not reliable")


def single_cells(runs):
    """{title: cell} of the table of one run's repeats `runs`, and its lines below."""
    compared = build_comparison([LoadedRun(run, f"{number}.json") for number, run in enumerate(runs)])
    markdown = to_markdown(compared)
    return {row[0]: row[1] for row in table_cells(compared)[1]}, markdown


def test_one_run_of_too_few_windows_to_resample_shows_no_interval_and_says_why():
    """`11.6 (95 % interval 10.1-11.6)` stood above `interval warning: 2 steady timing windows in a run: too few
    to resample`: an interval its own line called invalid. Below `MIN_WINDOWS` none is drawn, in the table or the
    JSON, and the cell and the line below say why."""
    from mtbench.figures import FIGURES_BY_KEY
    run = result(windows=2, noise=0.05)
    assert stats.figure_interval("tokens_per_s", [run])[1:] == (None, None)
    cells, markdown = single_cells([run])
    for key in stats.WINDOW_FIGURES:
        figure = FIGURES_BY_KEY[key]
        assert cells[figure.title] == (f"{figure.text(figure.value(run))} (95 % interval: none, too few steady timing "
                                       f"windows to resample)")
    assert "- 95 % intervals: none: 2 steady timing windows in a run: too few to resample (at least 10" in markdown
    assert "interval warning: 2 steady timing windows" not in markdown
    assert to_json_dict(build_comparison([LoadedRun(run, "a.json")]))["summary"][0]["intervals"]["tokens_per_s"][
        "low"] is None
    enough = result(windows=10, noise=0.05)
    assert "95 % interval " in single_cells([enough])[0][FIGURES_BY_KEY["tokens_per_s"].title]


def test_two_repeats_state_no_students_t_interval():
    """Two repeats 151.7 and 551.6 ms a step read `351.6 (range 151.7-551.6; 95 % interval 0.1-1,146,099.4)`:
    Student's t of one degree of freedom (12.71 standard errors) makes a bound of nothing and one of 20 minutes.
    Below `MIN_T_REPEATS` repeats no interval is stated; the centre is the interval's, the geometric mean."""
    from mtbench.figures import FIGURES_BY_KEY
    runs = [result(step_s=0.15, noise=0.0), result(step_s=0.55, noise=0.0, seed=1)]
    value, low, high = stats.figure_interval("step_s_median", runs)
    assert value == pytest.approx(math.sqrt(0.15 * 0.55)) and (low, high) == (None, None)
    cells, markdown = single_cells(runs)
    figure = FIGURES_BY_KEY["step_s_median"]
    assert cells[figure.title] == (f"{figure.text(value)} (range {figure.text(0.15)}–{figure.text(0.55)}; 95 % "
                                   f"interval: too wide to state with 2 repeats)")
    assert "- 95 % intervals: none: 2 repeats: Student's t of 1 degree of freedom" in markdown
    three = [*runs, result(step_s=0.3, noise=0.0, seed=2)]
    assert "95 % interval " in single_cells(three)[0][figure.title]


def test_a_break_even_cell_is_short_and_never_claims_a_step_the_verdict_did_not_find():
    """`undetermined: the steady step times differ within the noise (torch+torch-compile:...: no difference from
    ... beyond the noise (0.04-2.47), measured on a loaded machine (...): not reliable)` nested a verdict in a cell;
    `never: X compiles faster and steps faster` stood beside that pair's `no difference (0.99-12.59)`."""
    compared = comparison(slow_factor=1.002)
    speed = compared.verdicts["jax+slow-step"]["tokens_per_s"]
    assert speed.call == "no difference"
    even = compared.break_even(compared.groups[1])
    assert even.text == f"undetermined: tokens/s within the noise ({stats.range_text(speed.low, speed.high)})"
    # jax+fast compiles 1.5 s faster and its mean step is 0.07 % shorter, within 3 % noise over 2 repeats.
    runs = [LoadedRun(r, f"{label}-{i}.json") for label, rs in
            (("jax", repeats(2, compile_s=3.0)), ("jax+fast", repeats(2, seed=50, extras=("fast",), step_s=0.01499)))
            for i, r in enumerate(rs)]
    compared = build_comparison(runs)
    speed = compared.verdicts["jax+fast"]["tokens_per_s"]
    assert speed.call == "no difference"
    assert stats.break_even("jax+fast", "jax", {"jax+fast": 1.0, "jax": 2.0}, {"jax+fast": 1.0, "jax": 2.0}).text == \
        "never: jax+fast compiles faster and steps faster"
    even = compared.break_even(compared.groups[1])
    assert even.text == (f"undetermined: jax+fast compiles faster, tokens/s within the noise "
                         f"({stats.range_text(speed.low, speed.high)})") and not even.names_a_point


def test_a_break_even_is_held_to_the_tokens_per_s_verdict_not_the_median_step():
    """A run whose median step is shorter and whose mean step is as long (a tail of slow steps): the steady step
    verdict called it 1.18x faster, tokens/s no difference, and the break-even, held to the first, named a point
    from the mean steps (`never: torch+ddp@2 compiles faster and steps faster` beside them, in a compare of two
    processes). The total time of n steps grows with the mean step, whose verdict is tokens/s'."""
    tailed = []
    for run in repeats(2, seed=50, extras=("tail",), step_s=0.012):
        steady = [entry for entry in run["history"] if not entry.get("first_of_shape")]
        for start in range(0, len(steady), 16):  # a quarter of the windows 2x slower: the mean as jax's, 15 ms
            for entry in steady[start:start + 4]:
                entry["seconds"] *= 2
        run["timing"]["steady_s"] = sum(entry["seconds"] for entry in steady)
        tailed.append(run)
    runs = [LoadedRun(r, f"{label}-{i}.json") for label, rs in
            (("jax", repeats(2, compile_s=3.0)), ("jax+tail", tailed)) for i, r in enumerate(rs)]
    compared = build_comparison(runs)
    by_figure = compared.verdicts["jax+tail"]
    assert by_figure["step_s_median"].call == "faster" and by_figure["tokens_per_s"].call == "no difference"
    even = compared.break_even(compared.groups[1])
    speed = by_figure["tokens_per_s"]
    assert even.text == f"undetermined: tokens/s within the noise ({stats.range_text(speed.low, speed.high)})"


def attending(run, **chosen):
    """`run` with what `--attention` asked and chose recorded (`model.attention.chosen`), the extra it joined
    named among its extras."""
    run["model"]["attention"]["chosen"] = chosen
    if chosen.get("fused"):
        run["extras"] = ["flash-attention"]
    return run


def test_runs_asked_alike_that_computed_otherwise_carry_a_warning_that_names_what_differs():
    """`--attention auto` fuses the attention where a backend's kernels run: JAX's may and torch's not, and the
    verdict between them then holds a fused kernel against an unfused one, labelled by the extra alone. Each
    difference that nobody asked for (the attention fused by auto, its dtypes, one --dtype trained in two) is a
    warning of the run held to the other; one asked for (the extra named) is what the comparison compares."""
    why = "needs a GPU (or TPU) and float16/bfloat16; this run has cpu/float32"
    jax = [attending(run, asked="auto", fused=True, by_extra="flash-attention") for run in repeats(3)]
    torch = [attending(run, asked="auto", fused=False, why_unfused=why)
             for run in repeats(3, seed=10, backend="torch", step_s=0.02)]
    compared = build_comparison([LoadedRun(run, f"{k}.json") for k, run in enumerate(jax + torch)])
    expected = (f"computes otherwise than jax+flash-attention, though both were asked alike: --attention auto fused "
                f"the attention of jax+flash-attention (flash-attention), not of torch ({why}); its verdict against it "
                f"measures that too, not the backends alone")
    assert [compared.warnings(group) for group in compared.groups] == [[], [expected]]
    assert expected in to_json_dict(compared)["summary"][1]["warnings"]
    assert "torch carries warnings" in compared.ranking()["reason"]
    # The extra given to one run: asked otherwise, no warning.
    for run in jax:
        run["model"]["attention"]["chosen"] = {"asked": "auto", "fused": True}
    asked = build_comparison([LoadedRun(run, f"{k}.json") for k, run in enumerate(jax + torch)])
    assert [asked.warnings(group) for group in asked.groups] == [[], []]
    # Both unfused, scores in other dtypes; one --dtype auto trained in two dtypes.
    plain = repeats(3)
    other = repeats(3, seed=10, backend="torch", step_s=0.02)
    for run, scores in [(run, "float32") for run in plain] + [(run, "bfloat16") for run in other]:
        run["model"]["attention"]["arithmetic"] = {"matmul_inputs": "bfloat16", "accumulation": "float32",
                                                   "scores": scores, "softmax": "float32", "projections": "fused"}
        run["dtype_chosen"] = {"asked": "auto", "dtype": run["config"]["dtype"]}
    for run in other:
        run["config"]["dtype"] = run["model"]["dtype_policy"] = run["dtype_chosen"]["dtype"] = "mixed_bfloat16"
    apart = build_comparison([LoadedRun(run, f"{k}.json") for k, run in enumerate(plain + other)])
    assert apart.warnings(apart.groups[1]) == [
        "computes otherwise than jax:dtype=float32, though both were asked alike: the attention's scores bfloat16 "
        "in torch:dtype=mixed_bfloat16, float32 in jax:dtype=float32; --dtype auto trained "
        "torch:dtype=mixed_bfloat16 in mixed_bfloat16, jax:dtype=float32 in float32; its verdict against it measures "
        "that too, not the backends alone"]
    # asked apart: a dtype sweep is what it compares
    for run in other:
        run["dtype_chosen"]["asked"] = "mixed_bfloat16"
    swept = build_comparison([LoadedRun(run, f"{k}.json") for k, run in enumerate(plain + other)])
    assert swept.warnings(swept.groups[1]) == []  # neither the dtypes trained nor the attention's that follow them
    # An extra asked of one run alone (tensor-parallel fuses the projections): asked apart, no warning.
    older, split = repeats(3), repeats(3, seed=10, backend="torch", step_s=0.02)
    for run in older + split:
        run["model"]["attention"]["arithmetic"] = {"matmul_inputs": "float32", "accumulation": "float32",
                                                   "scores": "float32", "softmax": "float32", "projections": "fused"}
    for run in split:
        run["config"]["extras"] = ["tensor-parallel"]
    extra = build_comparison([LoadedRun(run, f"{k}.json") for k, run in enumerate(older + split)])
    assert extra.warnings(extra.groups[1]) == []
    # A result written before `projections` was recorded ran three products: against a new one that ran three, none.
    for run in older:
        del run["model"]["attention"]["arithmetic"]["projections"]
    for run in split:
        run["config"]["extras"] = []
        run["model"]["attention"]["arithmetic"]["projections"] = "separate"
    earlier = build_comparison([LoadedRun(run, f"{k}.json") for k, run in enumerate(older + split)])
    assert earlier.warnings(earlier.groups[1]) == []


def test_a_load_on_every_run_is_said_once_not_on_every_verdict():
    """Each of 10-16 verdict lines ended `measured on a loaded machine (A and B): not reliable`. Where every run
    was loaded it is one line before the verdicts; the JSON's `loaded` stays each verdict's."""
    quiet = [loaded(run) for run in repeats(2, compile_s=3.0)]
    slowed = [loaded(run) for run in repeats(2, seed=50, extras=("slow-step",), step_s=0.015 * 1.3)]
    compared = build_comparison([LoadedRun(run, f"{number}.json") for number, run in enumerate(quiet + slowed)])
    markdown = to_markdown(compared)
    said = [line for line in markdown.splitlines() if line.startswith("- ") and "loaded machine" in line]
    assert said == ["- every run of this comparison trained on a loaded machine (its warnings say how): its "
                    "verdicts are not reliable"]
    for held in compared.verdicts["jax+slow-step"].values():
        assert held.loaded == ("jax+slow-step", "jax") and held.unqualified_text() in markdown
    assert to_json_dict(compared)["verdicts"][0]["loaded"] == ["jax+slow-step", "jax"]


def test_the_tokens_per_s_cells_of_repeats_rank_the_runs_as_the_speed_up_beside_them():
    """Repeats at 0.90, 1.01 and 1.02 times the baseline's tokens/s: their median, 1.01x, sat in the tokens/s row
    above a speed-up of 0.98x (a real compare: 40,300 against 50,584 tokens/s beside 0.39x). The row shows the
    verdicts' centre, the geometric mean over repeats, with the range; the CSV the interval's centre beside its
    bounds, which the median may lie outside."""
    from mtbench.figures import FIGURES_BY_KEY
    base = [LoadedRun(r, f"jax-{i}.json") for i, r in enumerate(repeats(3, noise=0.0))]
    scattered = [LoadedRun(result(seed=10 + i, extras=("spread",), step_s=0.015 / factor, noise=0.0), f"s-{i}.json")
                 for i, factor in enumerate((0.90, 1.01, 1.02))]
    compared = build_comparison([*base, *scattered])
    speedup = compared.speedup(compared.groups[1])
    assert speedup == pytest.approx((0.90 * 1.01 * 1.02) ** (1 / 3)) and speedup < 1
    figure = FIGURES_BY_KEY["tokens_per_s"]
    cells = {row[0]: row[1:] for row in table_cells(compared)[1]}[figure.title]
    values = [float(cell.split(" ")[0].replace(",", "")) for cell in cells]
    assert values[1] < values[0] and values[1] / values[0] == pytest.approx(speedup, rel=1e-3)
    row = list(csv.DictReader(io.StringIO(to_csv(compared))))[1]
    assert float(row["tokens_per_s"]) > float(row["tokens_per_s_interval_value"])  # the median, the centre
    assert float(row["tokens_per_s_interval_value"]) == pytest.approx(speedup * values[0], rel=1e-3)


def test_a_repeat_whose_windows_counted_no_tokens_gets_no_verdict_rather_than_no_difference():
    """Windows of 0 tokens: a ratio of 0 whose interval was NaN, read as `no difference`, which the regression gate
    counted as judged and passed. No interval, as for a whole-run figure that measured 0: the gate's `cannot be
    judged`."""
    empty = result(seed=5)
    for entry in empty["history"]:
        entry["tokens"] = 0
    assert stats.ratio_interval("tokens_per_s", [empty], [result()]) is None
    assert stats.ratio_interval("tokens_per_s", [result(seed=6)], [result()]) is not None
