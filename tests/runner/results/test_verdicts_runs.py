"""Verdicts on real runs: a compare against a run slowed by a fixed sleep per step (the `mtbench-pace` test plugin,
pace_plugin.py) says "slower" with 1 outside its interval; the A/A noise floor is recorded; the break-even matches a
hand count from the runs' own figures; `report --baseline OLD.json --fail-if-slower` says "no difference" of the same
computation (the A/A pair) and exits 0, and 1 on the slowed one; `--repeats auto` says what ended it."""

import json
import math
import os
import shutil
import statistics

import pytest

from conftest import TINY_COMPARE, assert_refused_in_one_line, install_plugin_distribution, python_path, run_cli
from result_keys import undocumented_keys

PACE = {"MTBENCH_LOAD_PLUGINS": "mtbench-pace"}
# 30 steps in windows of 2: 15 steady windows a run, enough to resample within it.
RUNS = [*TINY_COMPARE, "--steps", "30", "--timing-window", "2", "--measure-only"]


@pytest.fixture(scope="module")
def pace_env(tmp_path_factory):
    """The environment of a process that loads the test plugin `mtbench-pace`, installed into a directory of its
    own with an entry point, as a user's plugin package would be."""
    site = tmp_path_factory.mktemp("pace-site")
    shutil.copy(os.path.join(os.path.dirname(__file__), "pace_plugin.py"), site / "mtbench_pace.py")
    install_plugin_distribution(site, "mtbench_pace", "pace", "mtbench_pace", name="mtbench-pace")
    return {**PACE, "PYTHONPATH": python_path(site)}


@pytest.fixture(scope="module")
def paced(tmp_path_factory, cache_dir, pace_env):
    """jax and jax+slow-step, three repeats, with the A/A twin of jax (the same computation under another name: a
    third run, jax+same-step, made three more runs, 26 CPU s, for the "no difference" that the twins get in
    test_the_regression_gate_passes_the_aa_pair_and_fails_the_slowed_one). Two repeats give the paired interval one
    degree of freedom (Student's t of 12.7): under a loaded machine (jax at 30k and 41k tokens/s in its two repeats,
    the test suite's other worker beside it) even the 7x slower run read "no difference"; at three, t is 4.3."""
    out = tmp_path_factory.mktemp("paced") / "paced.json"
    proc = run_cli("compare", "--matrix", "jax;jax+slow-step", "--repeats", "3", "--aa", *RUNS,
                   "--cache-dir", cache_dir, "--out", str(out), env={**pace_env, "COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"path": str(out), "combined": json.loads(out.read_text()), "stdout": proc.stdout}


def shown(verdict, output, prefix=""):
    """Whether `output` says the verdict: its JSON text, whose loaded-machine qualifier the lines may say once for
    every verdict instead (when every run was loaded)."""
    call = verdict["text"].split(", measured on a loaded machine")[0]
    return f"{prefix}{call}" in output and (not verdict.get("loaded") or "loaded machine" in output)


def verdicts_of(combined):
    return {(verdict["run"], verdict["figure"]): verdict for verdict in combined["verdicts"]}


@pytest.mark.slow
def test_the_slowed_computation_is_slower_beyond_the_noise_floor_of_the_aa_twins(paced):
    combined, stdout = paced["combined"], paced["stdout"]
    found = verdicts_of(combined)
    slow = found[("jax+slow-step", "tokens_per_s")]
    assert slow["call"] == "slower" and slow["high"] < 1, slow  # the interval excludes 1
    assert slow["paired"] and slow["repeats"] == [3, 3]
    assert found[("jax+slow-step", "step_s_median")]["call"] == "slower"
    # A loaded machine (another process beside the suite's) is said on each line, or once where every run was.
    assert shown(slow, stdout)
    assert "interval warning: 3 repeats: the interval rests on the spread of a few runs" in stdout
    # the A/A twin: recorded, shown, and no run of the comparison
    floor = combined["noise_floor"]
    assert floor["measured_by"] == "A/A: run 'jax' twice in each of 3 repeat(s), interleaved"
    assert set(floor["figures"]) == {"tokens_per_s", "step_s_median"}
    assert f"noise floor: tokens/s ±{floor['figures']['tokens_per_s']['floor']:.1%}" in stdout
    # the same arithmetic twice: the twins' losses are the baseline's, repeat by repeat
    assert floor["twin_losses"]["max_relative_difference"] <= 1e-6 and floor["twin_losses"]["steps"] == 30
    assert "from the baseline's at most, first 30 steps)" in stdout
    assert [(run["label"], run["repeat"]) for run in combined["aa_runs"]] == [("jax (A/A twin)", k) for k in (1, 2, 3)]
    assert [entry["label"] for entry in combined["summary"]] == ["jax", "jax+slow-step"]


@pytest.mark.slow
def test_break_even_matches_a_hand_count_from_the_runs_figures(paced):
    combined = paced["combined"]
    by_label = {}
    for run in combined["runs"]:
        by_label.setdefault(run["label"], []).append(run["result"]["timing"])
    median = lambda label, key: statistics.median(timing[key] for timing in by_label[label])
    even = {entry["run"]: entry for entry in combined["break_even"]}["jax+slow-step"]
    c_jax, c_slow = median("jax", "compile_s"), median("jax+slow-step", "compile_s")
    # Each repeat's mean steady step, its steady seconds over its steady steps: what its total time grows by.
    mean_step = lambda label: statistics.median(t["steady_s"] / t["steady_steps"] for t in by_label[label])
    s_jax, s_slow = mean_step("jax"), mean_step("jax+slow-step")
    assert s_slow > s_jax
    if c_slow < c_jax:  # the slowed run compiled faster: jax overtakes it
        steps = math.ceil(round((c_jax - c_slow) / (s_slow - s_jax), 6))
        assert even["steps"] == steps and even["seconds"] == pytest.approx(c_slow + (c_jax - c_slow) /
                                                                           (s_slow - s_jax) * s_slow)
        text = f"jax overtakes jax+slow-step after {steps:,} step{'' if steps == 1 else 's'} "
    else:
        assert even["steps"] is None
        text = "never: jax compiles faster and steps faster"
    assert even["text"].startswith(text)
    assert "break-even vs jax (compile + steps)" in paced["stdout"] and text in paced["stdout"]


@pytest.mark.slow
def test_report_of_the_compare_json_carries_the_intervals_in_every_format(paced):
    import csv
    import io
    found = verdicts_of(paced["combined"])
    csv_rows = {row["label"]: row for row in
                csv.DictReader(io.StringIO(run_cli("report", paced["path"], "--format", "csv").stdout))}
    slow = found[("jax+slow-step", "tokens_per_s")]
    assert float(csv_rows["jax+slow-step"]["tokens_per_s_ratio_high"]) == pytest.approx(slow["high"])
    assert csv_rows["jax+slow-step"]["tokens_per_s_verdict"] == "slower"
    markdown = run_cli("report", paced["path"], "--format", "markdown").stdout
    assert shown(slow, markdown, "- ") and "| tokens/s vs jax (95 % interval) | (baseline) |" in markdown
    assert "- noise floor: tokens/s ±" in markdown  # read back from the compare JSON
    data = json.loads(run_cli("report", paced["path"], "--format", "json").stdout)
    assert verdicts_of(data) == found and data["noise_floor"] == paced["combined"]["noise_floor"]


def relabelled(entry, path):
    """A run's result file as a run of plain `jax`, so that the regression gate holds it against jax's."""
    result = dict(entry["result"], extras=[], config=dict(entry["result"]["config"], extras=[]))
    path.write_text(json.dumps(result))
    return str(path)


@pytest.mark.slow
def test_the_regression_gate_passes_the_aa_pair_and_fails_the_slowed_one(paced, tmp_path):
    runs = paced["combined"]["runs"]
    jax = [run["result_file"] for run in runs if run["label"] == "jax"]
    twins = [run["result_file"] for run in paced["combined"]["aa_runs"]]
    slowed = [relabelled(run, tmp_path / f"slowed-{run['repeat']}.json") for run in runs
              if run["label"] == "jax+slow-step"]
    baseline = tmp_path / "old.json"  # the baseline's repeats, as a compare JSON of them alone would hold
    baseline.write_text(json.dumps({**paced["combined"], "runs": [r for r in runs if r["label"] == "jax"]}))

    same = run_cli("report", *twins, "--baseline", str(baseline), "--fail-if-slower", "5%", "--format", "json")
    assert same.returncode == 0, same.stderr
    data = json.loads(same.stdout)
    assert data["slower_beyond_threshold"] == [] and data["fail_if_slower"] == 0.05
    assert undocumented_keys(data) == []
    tokens = next(c for c in data["changes"] if c["figure"] == "tokens_per_s")
    assert tokens["label"] == "jax" and tokens["verdict"]["call"] == "no difference"

    slow = run_cli("report", *slowed, "--baseline", str(baseline), "--fail-if-slower", "5%", env={"COLUMNS": "250"})
    assert slow.returncode == 1, slow.stderr
    lines = slow.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: slower than the baseline by more than 5%: jax (new) is ")
    assert "changed beyond the noise: jax (new) is " in slow.stdout and "x slower than jax (baseline) in tokens/s (" \
        in slow.stdout
    assert run_cli("report", *slowed, "--baseline", str(baseline)).returncode == 0  # no gate, no failure
    missing = run_cli("report", *jax, "--baseline", str(tmp_path / "absent.json"))
    assert missing.returncode == 2 and missing.stderr.strip() == f"Error: {tmp_path / 'absent.json'}: no such file; expected a result or compare JSON"


@pytest.mark.slow
def test_repeats_auto_says_the_budget_ended_it(tmp_path, cache_dir, pace_env):
    out = tmp_path / "auto.json"
    proc = run_cli("compare", "--matrix", "jax;jax+same-step", "--repeats", "auto", "--repeats-budget", "1", *RUNS,
                   "--cache-dir", cache_dir, "--out", str(out), env={**pace_env, "COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    auto = json.loads(out.read_text())["repeats_auto"]
    assert auto["ended_by"] == "budget" and auto["repeats"] == 1 and auto["budget_s"] == 1
    assert "--repeats auto ended by budget after 1 repeat(s): the time budget: " in proc.stdout
    assert "fewer than the 5 the interval needs" in proc.stdout


@pytest.mark.parametrize("args, expected", [
    (["--repeats", "many"], "--repeats: 'many' is neither a number of repeats nor 'auto'"),
    (["--repeats", "auto", "--repeats-width", "wide"], "--repeats-width: 'wide' is not a percentage between 0 and 100"),
    (["--matrix", "jax", "--repeats", "auto"], "--repeats auto repeats until the intervals between runs are narrow: "
                                                "give two runs or more, or --aa"),
])
def test_bad_repeats_fail_with_one_line(tmp_path, args, expected):
    proc = run_cli("compare", *args, "--out", str(tmp_path / "c.json"))
    assert_refused_in_one_line(proc, expected)
    assert list(tmp_path.iterdir()) == []
