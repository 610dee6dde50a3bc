"""`mtbench report --history DIR` on histories made from one real tiny train result: copies of it dated one day
apart, each one's steady steps slowed or sped by a chosen level (the run's own window-to-window noise kept, damped
where it strays past ±10 %), so where the steps lie is known by construction: a slowdown that holds is one step at its point, a flat history, an
outlier and the return from it are none, a change at the last point is unconfirmed. Bad directories fail in one
line."""

import copy
import csv
import io
import json
import os
import struct

import numpy as np
import pytest
from conftest import run_cli
from result_keys import undocumented_keys

from mtbench.errors import MtbenchError
from mtbench.figures import is_steady
from mtbench.runner.results.history import build_history, to_csv, to_markdown
from mtbench.runner.results.verdicts import NO_SPREAD, steady_windows

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NOISE_BOUND = 1.1  # each steady step's tokens/s within a factor of this of the run's median step's


def steady_windows_of(history):
    """The entries of each steady timing window, as the verdicts group them (`steady_windows`' step counts)."""
    steps = [entry for entry in history if is_steady(entry)]
    ends = np.cumsum(steady_windows(history)[:, 1]).astype(int)
    return [steps[start:end] for start, end in zip([0, *ends[:-1]], ends)]


def damped(result):
    """The result with each steady window's tokens/s kept in its order and shape but drawn in, where the widest
    strays past NOISE_BOUND of the median window's, until it does not; the run's tokens/s unchanged. On a loaded
    machine (CI's other worker compiling) a tiny run's few windows scatter past any level these tests choose, and
    a bootstrap of them rightly calls a 1.43x change no difference; bounded, every resample's ratio of a copy at
    `level` to one at 1 lies within level / 1.21 .. level * 1.21, so the steps are the construction's."""
    made = copy.deepcopy(result)
    windows = steady_windows_of(made["history"])
    tokens = np.array([sum(entry["tokens"] for entry in window) for window in windows], dtype=float)
    seconds = np.array([sum(entry["seconds"] for entry in window) for window in windows])
    rates = tokens / seconds
    strays = np.log(rates / np.median(rates))
    power = min(1.0, np.log(NOISE_BOUND) / np.abs(strays).max())
    new_seconds = tokens / (np.median(rates) * np.exp(strays * power))
    new_seconds *= seconds.sum() / new_seconds.sum()  # the run's tokens/s kept
    for window, before, after in zip(windows, seconds, new_seconds):
        for entry in window:
            entry["seconds"] *= after / before
    return made


@pytest.fixture(scope="module")
def real(shared_runs):
    """The session's tiny jax run (the torch one, which these tests do not need, is not trained for them), its
    noise damped."""
    return damped(shared_runs.get("jax")["jax"]["result"])


def point(result, level, day, commit=None, jax=None):
    """The result as if run on day `day` of January at `commit`: every steady step's seconds divided by `level`
    (tokens/s times `level`), compilation and the host-sync probe's step left as they ran."""
    made = copy.deepcopy(result)
    for entry in made["history"]:
        if not entry.get("first_of_shape") and not entry.get("host_sync_probe") and entry["seconds"] is not None:
            entry["seconds"] /= level
    made["created"] = f"2026-01-{day:02d}T12:00:00+0000"
    made["env"]["mtbench_git_commit"] = commit or f"{day:040x}"
    if jax:
        made["env"]["backend_versions"]["jax"] = jax
    return made


# Each point's repeats, at these shares of its level: the noise between runs that lets a change be called.
REPEAT_SHARES = (1.0, 1.004, 0.996)


def write_history(directory, result, levels, commits=None, jax_from=None, shares=REPEAT_SHARES):
    """Files of one level each, a repeat of it at each of `shares`, one point a day from day 1 (jax 9.9.9 from
    point `jax_from` on); the files are named in reverse so that only the dates give the order."""
    os.makedirs(directory, exist_ok=True)
    count = len(levels) * len(shares)
    for index, level in enumerate(levels):
        commit = commits[index] if commits else None
        newer = jax_from is not None and index + 1 >= jax_from
        for repeat, share in enumerate(shares):
            made = point(result, level * share, index + 1, commit, "9.9.9" if newer else None)
            made["created"] = made["created"].replace("T12:", f"T{12 + repeat:02d}:")
            with open(os.path.join(directory, f"{count - index * len(shares) - repeat:03d}.json"), "w") as f:
                json.dump(made, f)
    return str(directory)


def marks(history):
    return [(p.number, p.mark, p.change.call) for p in history.points if p.mark]


def test_a_slowdown_that_holds_is_one_step_at_its_point(real, tmp_path):
    history = build_history(write_history(tmp_path, real, [1, 1, 1, 0.7, 0.7, 0.7], jax_from=4))
    assert marks(history) == [(4, "step", "slower")]
    speed = real["timing"]["tokens_per_s"]
    assert [p.interval[0] for p in history.points] == pytest.approx([speed] * 3 + [0.7 * speed] * 3, rel=1e-4)
    # Three repeats a point: Student's t over them.
    assert all(low < value < high for value, low, high in (p.interval for p in history.points))
    assert history.points[3].change.ratio == pytest.approx(0.7)
    assert [p.change.call for p in history.points[4:]] == ["no difference"] * 2  # the same timings again
    assert [p.date.day for p in history.points] == [1, 2, 3, 4, 5, 6]
    assert history.lines()[2].startswith("step: #4 is 1.43x slower than #3 in tokens/s (")
    rows = list(csv.DictReader(io.StringIO(to_csv(history))))
    assert [(row["point"], row["change_verdict"], row["mark"]) for row in rows[2:5]] == \
        [("3", "no difference", ""), ("4", "slower", "step"), ("5", "no difference", "")]
    assert float(rows[3]["tokens_per_s"]) == pytest.approx(0.7 * speed, rel=1e-4)
    markdown = to_markdown(history)
    assert "| 1.43x slower (" in markdown and markdown.count("| step: slower |") == 1
    table = markdown.splitlines()
    assert "jax 9.9.9" not in table[4] and table[5].startswith("| 4 |") and "jax 9.9.9" in table[5]
    assert "- step: #4 is 1.43x slower" in markdown


def test_a_history_of_one_run_a_point_calls_no_change_from_the_noise_within_runs(real, tmp_path):
    """A slowdown to 0.7 that holds, one run a point: each change's ratio and interval shown, none called, since
    two runs differ by more than the noise within either shows; a line says how to make them callable."""
    history = build_history(write_history(tmp_path, real, [1, 1, 1, 0.7, 0.7, 0.7], shares=(1.0,)))
    assert marks(history) == [] and {p.change.call for p in history.points[1:]} == {"undetermined"}
    assert history.points[3].change.ratio == pytest.approx(0.7)
    lines = history.lines()
    assert "no step can be told: every change undetermined" in lines and "no step beyond the noise" not in lines
    assert "5 of 5 changes undetermined: one repeat each, whose interval holds the noise within each run, not " \
           "between runs (--repeats 5 or more); consecutive results of one commit are repeats of its point: train " \
           "each commit 5 times" in lines
    # One point: nothing to hold a change against.
    alone = build_history(write_history(tmp_path / "alone", real, [1]))
    assert "one point: no change to hold" in alone.lines()


def test_a_flat_history_and_an_outlier_have_no_step(real, tmp_path):
    flat = build_history(write_history(tmp_path / "flat", real, [1, 1.03, 0.98, 1.01, 0.99]))
    assert marks(flat) == [] and "no step beyond the noise" in flat.lines()
    outlier = build_history(write_history(tmp_path / "outlier", real, [1, 1, 0.7, 1, 1]))
    assert outlier.points[2].change.call == "slower" and outlier.points[3].change.call == "faster"
    assert marks(outlier) == []  # one point off its neighbours: neither it nor the return from it is a step


def test_a_change_at_the_last_point_is_unconfirmed(real, tmp_path):
    history = build_history(write_history(tmp_path, real, [1, 1, 1, 0.7]))
    assert marks(history) == [(4, "unconfirmed", "slower")]
    assert any(line.startswith("unconfirmed step (the last point): #4 is 1.43x slower") for line in history.lines())


def test_the_return_from_an_outlier_at_the_first_point_is_no_step(real, tmp_path):
    """Only one point before the second: an outlier there, and the level the others hold, look like a step."""
    history = build_history(write_history(tmp_path, real, [0.7, 1, 1, 1, 1]))
    assert marks(history) == [(2, "unconfirmed", "faster")]
    assert any(line.startswith("unconfirmed step (one point before it): #2 is 1.43x faster")
               for line in history.lines())


def test_results_of_one_commit_in_a_row_are_repeats_of_one_point(real, tmp_path):
    commits = ["a" * 40, "a" * 40, "b" * 40, "b" * 40, "a" * 40]
    # (each commit's two results 0.4 % apart, since of results alike to the last digit, a spread of 0, no change
    # could be called: the next test)
    history = build_history(write_history(tmp_path, real, [1, 1.004, 0.5, 0.502, 1], commits, shares=(1.0,)))
    assert [(p.commit[0], len(p.results)) for p in history.points] == [("a", 2), ("b", 2), ("a", 1)]
    assert history.points[1].change.call == "slower" and history.points[1].change.repeats == (2, 2)


def test_repeats_of_a_commit_alike_to_the_last_digit_leave_its_change_undetermined_without_asking_for_repeats(
        real, tmp_path):
    history = build_history(write_history(tmp_path, real, [1, 1, 0.5, 0.5], ["a" * 40] * 2 + ["b" * 40] * 2,
                                          shares=(1.0,)))
    change = history.points[1].change
    assert change.undetermined == NO_SPREAD and change.repeats == (2, 2)
    undetermined = [line for line in history.lines() if "undetermined:" in line]
    assert undetermined == [f"1 of 1 changes undetermined: {NO_SPREAD}"]  # two repeats each were given


def test_a_recorded_noise_floor_holds_the_changes(real, tmp_path):
    directory = write_history(tmp_path, real, [1, 1, 1, 0.7, 0.7, 0.7])
    aa = {"kind": "mtbench-compare", "runs": [],
          "noise_floor": {"figures": {"tokens_per_s": {"floor": 0.5}}, "measured_by": "A/A of jax"}}
    (tmp_path / "aa.json").write_text(json.dumps(aa))
    history = build_history(directory)
    assert marks(history) == [] and history.points[3].change.call == "no difference"  # 1.43x is inside ±50 %
    assert f"left out: {tmp_path / 'aa.json'}: a compare JSON: a history's points are train results (its A/A " \
           "noise floor is used)" in history.lines()


def test_the_run_files_beside_a_compares_results_are_left_out(real, tmp_path):
    """A compare's `.runs` folder holds each run's run file (`NAME.train.json`) beside its result: a history of
    it reads the results and names the run files it left out (failed before: a run file read as a broken result)."""
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.run_file import write_run_file
    directory = write_history(tmp_path, real, [1, 1, 1])
    write_run_file(str(tmp_path / "001.train.json"), TrainConfig(preset="tiny"))
    (tmp_path / "002.train.json").write_text(json.dumps({"mtbench_run_file": 1, "config": {}}))  # before `kind`
    history = build_history(directory)
    assert len(history.points) == 3
    for name in ("001.train.json", "002.train.json"):
        assert f"left out: {tmp_path / name}: a run file: the configuration a run was given, not its result" \
            in history.lines()


def test_the_cli_writes_every_point_and_the_plot(real, tmp_path):
    directory = write_history(tmp_path / "results", real, [1, 1, 0.7, 0.7])
    plot = tmp_path / "history.png"
    proc = run_cli("report", "--history", directory, "--format", "json", "--plot", str(plot))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["kind"] == "mtbench-history" and [p["point"] for p in data["points"]] == [1, 2, 3, 4]
    assert undocumented_keys(data) == []
    assert [p["mark"] for p in data["points"]] == [None, None, "step", None]
    assert data["steps"][0].startswith("#3 is 1.43x slower than #2 in tokens/s")
    png = plot.read_bytes()
    assert png.startswith(PNG_SIGNATURE) and struct.unpack(">II", png[16:24])[0] > 400


@pytest.mark.parametrize("setup, expected", [
    ("missing", "--history {d}: no such directory"),
    ("empty", "--history {d}: no result JSON files (*.json) in it"),
    ("compare only", "--history {d}: no train results among its 1 JSON files"),
    ("two configurations", "--history: {d}/001.json is another configuration than {d}/002.json: batch_size (16 vs 32)"),
])
def test_bad_history_directories_are_refused_in_one_line(real, tmp_path, setup, expected):
    directory = tmp_path / "history"
    if setup != "missing":
        directory.mkdir()
    if setup == "compare only":
        (directory / "c.json").write_text(json.dumps({"kind": "mtbench-compare", "runs": []}))
    if setup == "two configurations":
        write_history(directory, real, [1, 1], shares=(1.0,))
        other = json.loads((directory / "001.json").read_text())
        other["config"]["batch_size"] = 16
        (directory / "001.json").write_text(json.dumps(other))
    with pytest.raises(MtbenchError) as error:
        build_history(str(directory))
    assert str(error.value).startswith(expected.format(d=directory))


def test_the_cli_refuses_in_one_line(real, tmp_path):
    proc = run_cli("report", "--history", str(tmp_path / "absent"))
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == \
        [f"Error: --history {tmp_path / 'absent'}: no such directory"]
    mixed = run_cli("report", "x.json", "--history", str(tmp_path), "--baseline", "old.json")
    assert mixed.returncode != 0 and mixed.stderr.strip().splitlines() == \
        ["Error: --history DIR reads the results in DIR alone: drop RESULTS, --baseline"]
    # options of a comparison, that a history would take without a word; a default given is given all the same
    unused = run_cli("report", "--history", str(tmp_path), "--force", "--parity-steps", "50")
    assert unused.returncode == 2 and unused.stderr.strip().splitlines() == \
        ["Error: --history DIR reads the results in DIR alone: drop --force, --parity-steps"]
    assert run_cli("report", "--history", str(tmp_path), "--parity-steps", "0").stderr.strip() == \
        "Error: --history DIR reads the results in DIR alone: drop --parity-steps"
