"""benchmarks/aa_count.py's reading of a compare JSON: the A/A twin held against its baseline (not against another
run of the comparison) in tokens/s, on hand-made histories whose answer is known: the same windows in another
order are no difference, every window 1.5x longer is slower by 1.5x."""

import pytest

from benchmarks.aa_count import aa_verdict

TOKENS = 800


def entry(seconds, first=False):
    return {"step": 1, "seconds": seconds, "window_steps": 1, "tokens": TOKENS, "first_of_shape": first}


def run(label, window_seconds):
    """A compare JSON's entry of a run whose steady windows (a step each) took `window_seconds`."""
    history = [entry(2.0, first=True), *map(entry, window_seconds)]
    return {"label": label, "result": {"history": history, "config": {}}}


WINDOWS = [0.010 * (1 + 0.02 * ((-1) ** i) + 0.001 * i) for i in range(20)]


def combined(twin_windows, other_windows, second_twin=None):
    """The twin's second repeat takes its first's windows in reverse, or `second_twin`."""
    second = twin_windows[::-1] if second_twin is None else second_twin
    return {"runs": [run("jax", WINDOWS), run("jax", WINDOWS[::-1]), run("torch", other_windows)],
            "aa_runs": [run("jax (A/A twin)", twin_windows), run("jax (A/A twin)", second)]}


def test_the_twin_is_held_against_its_baseline_alone():
    # The twin's windows are the baseline's in another order, so its tokens/s is the same in each repeat (no spread
    # between them: the interval is the ratio, 1); torch, 3x slower, is another run of the comparison and must not
    # count.
    same = aa_verdict(combined(WINDOWS[5:] + WINDOWS[:5], [3 * s for s in WINDOWS]))
    assert same.call == "no difference" and same.ratio == pytest.approx(1.0)
    assert same.low == pytest.approx(1.0) and same.high == pytest.approx(1.0)
    assert same.run == "jax (A/A twin)" and same.against == "jax" and same.repeats == (2, 2) and same.paired
    # 1.5x and 1.503x longer: repeats alike to the last digit (a spread of 0) would leave it undetermined
    slower = aa_verdict(combined([1.5 * s for s in WINDOWS], WINDOWS, [1.503 * s for s in WINDOWS]))
    assert slower.call == "slower" and slower.ratio == pytest.approx(1 / 1.5, rel=2e-3)


def test_a_compare_json_without_a_twin_is_refused():
    with pytest.raises(SystemExit, match="no A/A twin"):
        aa_verdict({"runs": [run("jax", WINDOWS)], "aa_runs": []})
