"""`mtbench report --history DIR`: the train results of one configuration over time (versions, commits, dates),
tokens/s of each with its interval, the change from the point before held to the same rule as `--baseline`
(`regression.change_verdict`), and the steps: changes beyond the noise that the points around them confirm.

The method and its assumptions are described in docs/results.md ("A history").
"""

import csv
import glob
import io
import itertools
import json
import os
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from mtbench.errors import MtbenchError
from mtbench.runner.files import read_json
from mtbench.figures import FIGURES_BY_KEY, hardware, run_label, run_processes, short_commit, versions_text
from mtbench.runner.results import verdicts as stats
from mtbench.runner.results.regression import change_verdict, markdown_of, table_of
from mtbench.runner.run_file import is_run_file
from mtbench.runner.results.schema import HISTORY_KIND
from mtbench.runner.results.report import (
    ASKED_KEYS,
    BOOKKEEPING_KEYS,
    COMPARE_KIND,
    KEY_DEFAULTS,
    _checked,
    compare_record_problem,
    differing,
    recorded_noise_floor,
    run_key,
)

# How many points on each side of a change must agree for it to be a step: every one of the (up to) STEP_SPAN
# points from the change on differs, in the same direction and beyond the noise, from every one of the (up to)
# STEP_SPAN points before it. One point off its neighbours (an outlier) is then no step, nor is the return from it.
STEP_SPAN = 2
# What a history's results may differ in: where their files went, the initial weights (another keras may draw
# the same seed's weights differently), and what a run asked for where its extras say what ran.
IGNORED_KEYS = (*BOOKKEEPING_KEYS, *ASKED_KEYS, "initial_weights_sha256")


@dataclass
class Point:
    """The results of one software state in a row (the same commit and versions): repeats of one point."""
    number: int
    results: list
    sources: list
    date: datetime
    interval: tuple = None  # (tokens/s, low, high), None without steady windows; no bounds where none is stated
    change: object = None   # verdicts.Verdict against the point before, None for the first or without an interval
    mark: str = None        # 'step', 'unconfirmed' (the change is at the last point, or the second: nothing after
    # it, or before it, tells a new level from an outlier)

    @property
    def name(self):
        return f"#{self.number}"

    @property
    def commit(self):
        return self.results[0]["env"].get("mtbench_git_commit")

    @property
    def versions(self):
        return versions_text(self.results[0], with_mtbench=False)  # the commit has its own column

    def mark_text(self):
        if not self.mark:
            return ""
        return f"{'step' if self.mark == 'step' else 'unconfirmed step'}: {self.change.call}"

    def to_dict(self):
        value, low, high = self.interval or (None, None, None)
        return {"point": self.number, "date": self.date.isoformat(), "commit": self.commit,
                "versions": self.versions, "sources": self.sources, "repeats": len(self.results),
                "tokens_per_s": value, "tokens_per_s_low": low, "tokens_per_s_high": high,
                "change": self.change and self.change.to_dict(), "mark": self.mark}


@dataclass
class History:
    directory: str
    label: str        # the configuration's run label
    hardware: str
    points: list
    left_out: list    # (file, why)
    noise_floor: dict

    def steps(self):
        return [point for point in self.points if point.mark]

    def lines(self):
        results = sum(len(point.results) for point in self.points)
        points = len(self.points)
        lines = [f"history of {self.label} on {self.hardware}: {results} result{'s' if results != 1 else ''}, "
                 f"{points} point{'s' if points != 1 else ''}",
                 stats.noise_floor_line(self.noise_floor)]
        where = lambda point: "the last point" if point is self.points[-1] else "one point before it"
        undetermined = [point for point in self.points if point.change and point.change.undetermined]
        changes = sum(1 for point in self.points if point.change)
        none = ("one point: no change to hold" if len(self.points) == 1 else
                "no step can be told: every change undetermined" if undetermined and len(undetermined) == changes
                else "no step beyond the noise")
        lines += [f"{'step' if point.mark == 'step' else f'unconfirmed step ({where(point)})'}: {point.change.text}"
                  for point in self.steps()] or [none]
        if undetermined:
            reason = undetermined[0].change.undetermined
            advice = (f"; consecutive results of one commit are repeats of its point: train each commit "
                      f"{stats.MIN_REPEATS} times" if reason == stats.ONE_REPEAT_EACH else "")
            lines.append(f"{len(undetermined)} of {changes} changes undetermined: {reason}{advice}")
        warnings = dict.fromkeys(w for point in self.points if point.change for w in point.change.warnings)
        lines += [f"interval warning: {text}" for text in warnings]
        lines += [f"left out: {path}: {why}" for path, why in self.left_out]
        return lines


def created(result, source):
    """When a result was written; one without a time zone (edited by hand) is read as UTC."""
    try:
        date = datetime.fromisoformat(result["created"])
    except ValueError:
        raise MtbenchError(f"{source}: 'created' is not a date ({result['created']!r})") from None
    return date if date.tzinfo else date.replace(tzinfo=timezone.utc)


def identity(result):
    """What one configuration shares: the run (backend, extras, processes), the hardware and the configuration."""
    config = {k: v for k, v in result["config"].items() if k not in IGNORED_KEYS}
    return {"run": run_label(result), "processes": run_processes(result), "hardware": hardware(result), **config}


def read_directory(directory):
    """([(result, file)] of the train results in `directory`, [(file, why)] of the JSON files left out, the
    files of compare JSONs (which may hold an A/A noise floor)); one-line errors for a missing or empty one."""
    if not os.path.isdir(directory):
        what = "not a directory (give the directory of the results)" if os.path.exists(directory) else \
            "no such directory"
        raise MtbenchError(f"--history {directory}: {what}")
    paths = sorted(glob.glob(os.path.join(directory, "*.json")))
    if not paths:
        raise MtbenchError(f"--history {directory}: no result JSON files (*.json) in it")
    runs, left_out, compares = [], [], []
    first_of_run = {}  # {run_key: the file that holds it first}
    for path in paths:
        try:
            data = read_json(path, "a result JSON")
        except MtbenchError as error:  # unreadable, or not JSON: named, and the history goes on without it
            left_out.append((path, _without_path(error, path)))
            continue
        kind = data.get("kind") if isinstance(data, dict) else None
        if is_run_file(data):
            left_out.append((path, "a run file: the configuration a run was given, not its result"))
        elif kind == COMPARE_KIND and compare_record_problem(data):
            left_out.append((path, f"not an mtbench compare JSON ({compare_record_problem(data)})"))
        elif kind == COMPARE_KIND:
            compares.append(path)
            floor = " (its A/A noise floor is used)" if data.get("noise_floor") else ""
            left_out.append((path, f"a compare JSON: a history's points are train results{floor}"))
        elif kind is not None:
            left_out.append((path, f"not a train result (kind {kind!r})"))
        else:
            try:
                result = _checked(data, path).result
            except MtbenchError as error:  # a stray JSON beside the results
                left_out.append((path, _without_path(error, path)))
                continue
            if result.get("status", "completed") != "completed":
                left_out.append((path, f"a partial run, {result['status']} ({result.get('status_reason')}): its "
                                       f"figures stop where it stopped"))
                continue
            copied = first_of_run.setdefault(run_key(result), path)
            if copied != path:  # counted twice, a copy would be a repeat with no spread
                left_out.append((path, f"the same run as {os.path.basename(copied)} (a copy of it)"))
                continue
            runs.append((result, path))
    if not runs:
        first = f" ({left_out[0][0]}: {left_out[0][1]})" if len(left_out) == 1 else ""
        raise MtbenchError(f"--history {directory}: no train results among its {len(paths)} JSON files{first}")
    return runs, left_out, compares


def _without_path(error, path):
    """The one-line error about the file `path`, without the path that begins it ('PATH:LINE: ...' keeps the line)."""
    text = str(error)
    if text.startswith(f"{path}: "):
        return text[len(path) + 2:]
    return f"line {text[len(path) + 1:]}" if text.startswith(f"{path}:") else text


def check_one_configuration(runs):
    """Refuses a history whose results differ in configuration, naming the first that differs from the earliest."""
    reference, first = runs[0]
    for result, source in runs[1:]:
        differences = differing(identity(reference), identity(result), defaults=KEY_DEFAULTS)
        if differences:
            listed = ", ".join(f"{key} ({b!r} vs {a!r})" for key, a, b in differences)  # the file's value first
            raise MtbenchError(f"--history: {source} is another configuration than {first}: {listed}; a history "
                               f"holds the train results of one configuration (move the others out of the directory)")


def group_points(runs):
    """The runs (in date order) as points: consecutive results of the same commit and versions are repeats."""
    software = lambda run: (run[0]["env"].get("mtbench_git_commit"), versions_text(run[0]))
    points = []
    for number, (_, members) in enumerate(itertools.groupby(runs, key=software), start=1):
        members = list(members)
        points.append(Point(number, [result for result, _ in members], [source for _, source in members],
                            created(*members[0])))
    return points


def find_steps(points, held):
    """The mark of each point (`Point.mark`): 'step' where its change from the point before is beyond the noise
    and every pair across it (`STEP_SPAN` points on each side) is called the same by `held(after, before)`;
    'unconfirmed' where that holds but no point follows, or only one precedes, to tell a new level from an outlier
    (the first point off the level the others hold would make the second a step)."""
    marks = []
    for index, point in enumerate(points):
        call = point.change and point.change.call
        if index == 0 or not (point.change and point.change.called):
            marks.append(None)
            continue
        before = points[max(0, index - STEP_SPAN):index]
        after = points[index:index + STEP_SPAN]
        agree = all(held(later, earlier) == call for later in after for earlier in before)
        marks.append(None if not agree else "step" if len(after) > 1 and len(before) > 1 else "unconfirmed")
    return marks


def build_history(directory):
    runs, left_out, compares = read_directory(directory)
    runs = sorted(runs, key=lambda run: (created(*run), run[1]))
    check_one_configuration(runs)
    floor_record = recorded_noise_floor(compares)
    floor = (((floor_record or {}).get("figures") or {}).get(stats.SPEED_FIGURE) or {}).get("floor")
    verdicts = {}

    def verdict(later, earlier):
        key = (later.number, earlier.number)
        if key not in verdicts:
            verdicts[key] = change_verdict(stats.SPEED_FIGURE, later.results, earlier.results, later.name,
                                           earlier.name, floor)
        return verdicts[key]

    def call(later, earlier):
        found = verdict(later, earlier)
        return found.call if found else None

    grouped = group_points(runs)
    points = [replace(point, interval=stats.figure_interval(stats.SPEED_FIGURE, point.results),
                      change=verdict(point, grouped[index - 1]) if index else None)
              for index, point in enumerate(grouped)]
    points = [replace(point, mark=mark) for point, mark in zip(points, find_steps(points, call))]
    first = runs[0][0]
    return History(directory, run_label(first), hardware(first), points, left_out, floor_record)


# ---- rendering ---------------------------------------------------------------------------------------------------

HEADER = ("#", "date", "commit", "versions", "repeats", "tokens/s (95 % interval)", "change from the point before",
          "step")
RIGHT = (0, 4, 5)  # the number, the repeats and tokens/s


def _speed_text(interval):
    if interval is None:
        return "n/a"
    text = FIGURES_BY_KEY[stats.SPEED_FIGURE].text
    if interval[1] is None:
        return f"{text(interval[0])} (no interval: too few windows or repeats)"  # `verdicts.figure_interval_gap`
    return f"{text(interval[0])} ({text(interval[1])}–{text(interval[2])})"


def rows(history):
    return [[str(point.number), point.date.strftime("%Y-%m-%d %H:%M"),
             short_commit(point.commit) if point.commit else "n/a", point.versions, str(len(point.results)),
             _speed_text(point.interval),
             point.change.cell() if point.change else "", point.mark_text()] for point in history.points]


def rich_table(history):
    """The table, each step's row in bold."""
    table = table_of(f"mtbench report: history of {history.directory}", HEADER, RIGHT, [])
    for point, row in zip(history.points, rows(history)):
        table.add_row(*row, style="bold" if point.mark else None)
    return table


def to_markdown(history):
    return markdown_of(HEADER, RIGHT, rows(history), history.lines())


def to_json_dict(history):
    return {"kind": HISTORY_KIND, "directory": history.directory, "label": history.label,
            "hardware": history.hardware, "noise_floor": history.noise_floor,
            "points": [point.to_dict() for point in history.points],
            "steps": [point.change.text for point in history.steps() if point.mark == "step"],
            "unconfirmed": [point.change.text for point in history.steps() if point.mark == "unconfirmed"],
            "left_out": [{"file": path, "why": why} for path, why in history.left_out]}


def to_json(history):
    return json.dumps(to_json_dict(history), indent=2) + "\n"


CSV_COLUMNS = ("point", "date", "commit", "versions", "repeats", "tokens_per_s", "tokens_per_s_low",
               "tokens_per_s_high", "change_ratio", "change_low", "change_high", "change_verdict", "mark")


def to_csv(history):
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for point in history.points:
        entry, change = point.to_dict(), point.change
        row = {key: entry.get(key) for key in CSV_COLUMNS}
        if change:
            row.update(change_ratio=change.ratio, change_low=change.low, change_high=change.high,
                       change_verdict=change.call)
        writer.writerow({key: "" if value is None else value for key, value in row.items()})
    return buffer.getvalue()
