"""`mtbench report NEW.json --baseline OLD.json`: every run of NEW against the same run of OLD, each figure of
GATE_FIGURES with its interval, the figures that changed beyond the noise named, and `--fail-if-slower` as a gate
for CI.

The statistics are `verdicts`'; this module matches the runs, renders the rows and decides the gate.
"""

import csv
import io
import json
from dataclasses import dataclass

from rich.table import Table

from mtbench.errors import MtbenchError
from mtbench.figures import FIGURES_BY_KEY, hardware, run_processes, run_warnings, versions_text
from mtbench.runner.results import verdicts as stats
from mtbench.runner.results.report import (COMPARED_KEYS, KEY_DEFAULTS, check_comparable,
                                           configuration_mismatches, differing, group_runs, load_runs,
                                           recorded_noise_floor, refuse_the_same_run_twice, swept_keys)
from mtbench.runner.results.schema import REGRESSION_KIND

# The figures held against the baseline: how fast each run trains, compiles and finishes.
GATE_FIGURES = ("tokens_per_s", "step_s_median", "step_s_p90", "compile_s", "train_s", "total_s")
# Why a change has no verdict: a figure of whole runs, or one counted over timing windows.
ONE_REPEAT = "one repeat on each side: no spread between repeats"
ONE_WINDOW_EACH = "one repeat of one timing window on each side: nothing to resample"
A_ZERO = "a repeat measured 0 (a step that compiles nothing): no ratio to it"
# The figures that hold the compilation: a persistent cache warm on one side and cold on the other changes them by
# what the cache held, not by the code or the versions (a CI job that keeps the cache between runs).
CACHE_FIGURES = ("compile_s", "train_s", "total_s")
SLOWER_EXIT_CODE = 1


@dataclass
class Change:
    label: str
    figure: str
    baseline: float   # the baseline's figure over its repeats (`RunGroup.over_repeats`)
    new: float        # NEW's
    verdict: object   # verdicts.Verdict, or None where no interval could be drawn
    reason: str = None  # why not

    def to_dict(self):
        return {"label": self.label, "figure": self.figure, "baseline": self.baseline, "new": self.new,
                "verdict": None if self.verdict is None else self.verdict.to_dict(), "reason": self.reason}


@dataclass
class Regression:
    new: list             # NEW's files
    baseline: str         # OLD's file
    changes: list         # Change of every figure of every run both have
    only_new: list        # labels of NEW's runs the baseline lacks
    only_baseline: list
    noise_floor: dict
    threshold: float = None  # --fail-if-slower, a fraction
    held_anyway: list = ()   # with --force: why a pair would have been refused (a partial run, another run)
    ran_on: dict = None      # {"baseline", "new": the software and hardware of the side's runs, each once}
    warnings: list = ()      # what the files say of their runs (a comparison that stopped early)
    run_warnings: dict = None  # {'LABEL (side)': [why]}: what the held runs' results say of their timings
    new_runs: list = ()        # NEW's runs as loaded (`LoadedRun`), which --report's reporters are handed

    def beyond_noise(self):
        return [change for change in self.changes if change.verdict and change.verdict.called]

    def slower_beyond_threshold(self):
        """The runs whose tokens/s is slower than the baseline's by more than --fail-if-slower, the whole interval
        past it (`verdicts.significantly_slower`) and past the noise floor where one was recorded."""
        if self.threshold is None:
            return []
        return [change for change in self.changes if change.figure == stats.SPEED_FIGURE and change.verdict
                and change.verdict.call == "slower" and stats.significantly_slower(change.verdict, self.threshold)]

    def unjudged(self):
        """Why --fail-if-slower cannot vouch for every run of the baseline: a run NEW lacks, or one whose tokens/s
        has no verdict (no interval, or one from which no difference can be called: `Verdict.undetermined`). A
        gate that passed them would pass what it never held."""
        if self.threshold is None:
            return []
        judged = {change.label for change in self.changes if change.figure == stats.SPEED_FIGURE and change.verdict
                  and not change.verdict.undetermined and not _too_few_repeats(change.verdict)}
        why = {change.label: change.reason or (change.verdict and (change.verdict.undetermined
                                                                   or _too_few_repeats(change.verdict)))
               for change in self.changes if change.figure == stats.SPEED_FIGURE}
        shared = dict.fromkeys(change.label for change in self.changes)
        return ([f"run '{label}' of {self.baseline} is not in {', '.join(self.new)}" for label in self.only_baseline]
                + [f"run '{label}' has no tokens/s verdict ({why.get(label) or 'no steady steps'})"
                   for label in shared if label not in judged])

    def lines(self):
        lines = [f"{side}: {text}" for side, text in (self.ran_on or {}).items()]
        lines += [f"held anyway (--force): {why}" for why in self.held_anyway]
        lines += [f"warning: {text}" for text in self.warnings]
        lines += [f"warning: {run}: {text}" for run, texts in (self.run_warnings or {}).items() for text in texts]
        lines.append(stats.noise_floor_line(self.noise_floor))
        lines += [f"changed beyond the noise: {change.verdict.text}" for change in self.beyond_noise()] or \
            [self.unchanged_line()]
        warnings = dict.fromkeys(w for change in self.changes if change.verdict for w in change.verdict.warnings)
        lines += [f"interval warning: {text}" for text in warnings]
        lines += [f"only in {', '.join(self.new)}: {label}" for label in self.only_new]
        lines += [f"only in {self.baseline}: {label}" for label in self.only_baseline]
        if self.threshold is not None:
            slower, unjudged = self.slower_beyond_threshold(), self.unjudged()
            lines.append(f"--fail-if-slower {self.threshold * 100:g}%: " + (
                "; ".join(change.verdict.text for change in slower) if slower else
                f"cannot judge: {'; '.join(unjudged)}" if unjudged else
                f"no run's tokens/s shown more than {self.threshold * 100:g} % below the baseline's "
                f"({'; '.join(self.speed_changes())})"))
            if not (slower or unjudged):  # a gate that fails does not pass anything
                lines += [f"--fail-if-slower {self.threshold * 100:g}% passes, but cannot rule out a slowdown past "
                          f"it: {text}" for text in self.not_ruled_out()]
        return lines

    def unchanged_line(self):
        """What a regression that found no change says: that no figure changed, or that none of them, or some, could
        be judged (of one repeat each: `Verdict.undetermined`)."""
        held = [change.verdict for change in self.changes if change.verdict]
        undetermined = [verdict for verdict in held if verdict.undetermined]
        if undetermined and len(undetermined) == len(held):
            return f"no figure could be judged: {len(undetermined)} undetermined ({undetermined[0].undetermined})"
        return "no figure changed beyond the noise" + (f"; {len(undetermined)} undetermined" if undetermined else "")

    def speed_changes(self):
        """['jax: tokens/s 16.7 % below the baseline's (15.9–17.6 %)'] of each run the gate held: the measure its
        threshold is of, beside the verdict's 'Nx slower' (a step 1.20x slower is 16.7 % fewer tokens/s)."""
        texts = []
        for change in self.changes:
            if change.figure == stats.SPEED_FIGURE and change.verdict and not change.verdict.undetermined:
                speed, low, high = change.verdict.speed()
                way = "below" if speed <= 1 else "above"
                bounds = sorted(abs(1 - bound) * 100 for bound in (low, high))
                across = f"{(1 - low) * 100:.1f} % below to {(high - 1) * 100:.1f} % above" if low < 1 < high else \
                    f"{bounds[0]:.1f}–{bounds[1]:.1f} %"
                texts.append(f"{change.label}: tokens/s {abs(1 - speed) * 100:.1f} % {way} ({across})")
        return texts

    def not_ruled_out(self):
        """[why] where a run passes the gate with a tokens/s interval that reaches past the threshold: it is not shown
        slower, nor shown not to be (2 repeats of a noisy machine give 0.15–4.06). Said, not failed: the gate fails
        only what it shows, as documented; more repeats narrow the interval."""
        slower = self.slower_beyond_threshold()
        return [f"run '{change.label}' tokens/s {stats.range_text(*change.verdict.speed()[1:])} of the baseline's "
                f"({change.verdict.repeats[0]} and {change.verdict.repeats[1]} repeats)"
                for change in self.changes if change.figure == stats.SPEED_FIGURE and change.verdict
                and not change.verdict.undetermined and change not in slower
                and change.verdict.speed()[1] < 1 - self.threshold]


def change_verdict(key, new_results, old_results, new_name, old_name, noise_floor=None):
    """The Verdict of figure `key` of the runs `new_results` against `old_results` (their repeats' results, unpaired:
    they ran apart), held to `noise_floor` and naming a side that trained on a loaded machine; None where no interval
    can be drawn. The one rule by which a report calls a change between runs of different times beyond the noise
    (--baseline, --history)."""
    return stats.held_verdict(key, new_name, new_results, old_name, old_results, noise_floor=noise_floor)


def partial_runs(runs):
    """[why] of each run that stopped before its last step (interrupted, diverged): its figures stop there."""
    return [f"{run.source} is a partial run, {run.result['status']} ({run.result.get('status_reason')})"
            for run in runs if run.result.get("status", "completed") != "completed"]


def run_identity(result):
    """What makes two results the same run beside their shared configuration, which a label leaves out where each
    side holds one run: the settings a comparison may vary (dtype, sizes, batch), the hardware, the processes."""
    config = result["config"]
    return {**{key: config.get(key, KEY_DEFAULTS.get(key)) for key in COMPARED_KEYS},
            "hardware": hardware(result), "processes": run_processes(result)}


def other_runs(label, new, old, baseline_path):
    """[why] where NEW's run `label` is not the baseline's run of that label (another batch size, dtype or
    machine): a ratio between them would be a difference of settings, not of code or versions."""
    differences = differing(run_identity(new.first), run_identity(old.first))
    if not differences:
        return []
    listed = ", ".join(f"{key} ({a!r} vs {b!r})" for key, a, b in differences)  # NEW's value first
    return [f"run '{label}' of {new.runs[0].source} differs from {baseline_path}'s in {listed}"]


def build_regression(new_paths, baseline_path, force=False, threshold=None):
    new_runs, old_runs = load_runs(new_paths), load_runs([baseline_path])
    refuse_the_same_run_twice(old_runs + new_runs)  # a run on both sides would be held against itself
    if not force:
        check_comparable(old_runs + new_runs)
    new_groups, old_groups = matched_groups(new_runs, old_runs)
    both = [label for label in new_groups if label in old_groups]
    if not both:
        raise MtbenchError(f"no run of {', '.join(new_paths)} is in {baseline_path} (they have "
                           f"{', '.join(new_groups)}; it has {', '.join(old_groups)})")
    # A gate must not pass a run that stopped early, nor hold a run against another one: refused, or with --force
    # held and said beside the figures.
    held_anyway = configuration_mismatches(old_runs + new_runs) + partial_runs(new_runs + old_runs) + [
        why for label in both for why in other_runs(label, new_groups[label], old_groups[label], baseline_path)]
    if held_anyway and not force:
        raise MtbenchError(f"{held_anyway[0]}; the gate holds completed runs against the same runs "
                           f"(--force holds them anyway)")
    floor = recorded_noise_floor([*new_paths, baseline_path])
    floors = (floor or {}).get("figures") or {}
    changes = []
    for label in both:
        new, old = new_groups[label], old_groups[label]
        for key in GATE_FIGURES:
            values = old.over_repeats(key), new.over_repeats(key)
            if None in values:
                continue
            caches = compile_cache_states(new.results), compile_cache_states(old.results)
            if key in CACHE_FIGURES and caches[0] != caches[1]:
                changes.append(Change(label, key, *values, None, f"the compile cache was {caches[0]} in the new "
                                                                   f"runs and {caches[1]} in the baseline's"))
                continue
            verdict = change_verdict(key, new.results, old.results, f"{label} (new)", f"{label} (baseline)",
                                     (floors.get(key) or {}).get("floor"))
            reason = None if verdict else no_verdict_reason(key, new.results + old.results)
            changes.append(Change(label, key, *values, verdict, reason))
    return Regression(list(new_paths), baseline_path, changes, [label for label in new_groups if label not in both],
                      [label for label in old_groups if label not in both], floor, threshold, held_anyway,
                      {"baseline": ran_on(old_runs), "new": ran_on(new_runs)},
                      list(dict.fromkeys(warning for run in old_runs + new_runs for warning in run.warnings)),
                      held_runs_warnings(both, new_groups, old_groups), new_runs)


def held_runs_warnings(labels, new_groups, old_groups):
    """{'LABEL (side)': [why its timings may mislead]} of the runs held, each side's repeats' warnings once: a
    rerun of the same commit that a loaded machine slowed fails a gate, which must say what the results say."""
    found = {}
    for label in labels:
        for side, groups in (("baseline", old_groups), ("new", new_groups)):
            texts = list(dict.fromkeys(text for result in groups[label].results for text in run_warnings(result)))
            if texts:
                found[f"{label} ({side})"] = texts
    return found


def matched_groups(new_runs, old_runs):
    """({label: RunGroup} of NEW, of OLD), labelled so that a label names the same run on both sides: by the keys
    either side sweeps (a run added to NEW's sweep renames its fellows within NEW's file, `jax` becoming
    `jax:batch-size=64`, but not against OLD). Where that leaves no label in common, by each side's own (one run a
    side, of two batch sizes: `other_runs` refuses the pair by its settings, which --force holds anyway)."""
    swept = swept_keys([run.result for run in new_runs + old_runs])
    for labelled_by in (swept, None):
        new_groups, old_groups = ({group.label: group for group in group_runs(runs, labelled_by)}
                                  for runs in (new_runs, old_runs))
        if new_groups.keys() & old_groups.keys():
            break
    return new_groups, old_groups


def compile_cache_states(results):
    """'cold', 'warm', 'cold and warm', ...: what the persistent compilation cache gave these runs' programs (by
    their lookups, else whether it held programs as each started; 'not recorded' for results before it was)."""
    states = []
    for result in results:
        cache = (result.get("timing") or {}).get("compile_cache") or {}
        states.append(cache.get("programs") or cache.get("state") or "not recorded")
    return " and ".join(sorted(set(states)))


def no_verdict_reason(key, results):
    """Why figure `key` of these runs (both sides' repeats) has no interval."""
    if key in stats.WINDOW_FIGURES:
        return ONE_WINDOW_EACH
    return A_ZERO if any(FIGURES_BY_KEY[key].value(r) == 0 for r in results) else ONE_REPEAT


def ran_on(runs):
    """'jax 0.10.2, jaxlib 0.10.2, keras 3.15.1, python 3.11.7 on HARDWARE; torch 2.13.0, ...': what a side's
    figures came from, each backend's software once (a torch upgrade shows beside an unchanged JAX)."""
    return "; ".join(dict.fromkeys(f"{versions_text(run.result)} on {hardware(run.result)}" for run in runs))


HEADER = ("run", "figure", "baseline", "new", "new / baseline (95 % interval)", "verdict")


def rows(regression):
    out = []
    for change in regression.changes:
        figure = FIGURES_BY_KEY[change.figure]
        verdict = change.verdict
        ratio = (f"{verdict.ratio:.3f}x ({stats.range_text(verdict.low, verdict.high, 3)})" if verdict else
                 f"{change.new / change.baseline:.3f}x" if change.baseline else "n/a")
        out.append([change.label, figure.title, figure.text(change.baseline), figure.text(change.new), ratio,
                    verdict.cell() if verdict else change.reason])
    return out


def table_of(title, header, right, cells):
    """A rich Table of one row per list in `cells` under `header`, the columns numbered in `right` right-aligned."""
    table = Table(title=title)
    for index, column in enumerate(header):
        table.add_column(column, justify="right" if index in right else "left")
    for row in cells:
        table.add_row(*row)
    return table


def markdown_of(header, right, cells, lines):
    """The same as markdown, the `lines` as a list below it."""
    line = lambda row: "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
    rule = "|" + "".join("---:|" if index in right else "---|" for index in range(len(header)))
    return "\n".join([line(header), rule, *map(line, cells), "", *(f"- {text}" for text in lines)]) + "\n"


RIGHT = (2, 3, 4)  # the figures and the ratio


def rich_table(regression):
    return table_of(f"mtbench report: against the baseline {regression.baseline}", HEADER, RIGHT, rows(regression))


def to_markdown(regression):
    return markdown_of(HEADER, RIGHT, rows(regression), regression.lines())


def to_json_dict(regression):
    return {"kind": REGRESSION_KIND, "new": regression.new, "baseline": regression.baseline,
            "noise_floor": regression.noise_floor, "changes": [change.to_dict() for change in regression.changes],
            "beyond_noise": [change.verdict.text for change in regression.beyond_noise()],
            "only_in_new": regression.only_new, "only_in_baseline": regression.only_baseline,
            "fail_if_slower": regression.threshold, "held_anyway": list(regression.held_anyway),
            "ran_on": regression.ran_on, "warnings": list(regression.warnings),
            "run_warnings": regression.run_warnings or {},
            "slower_beyond_threshold": [change.label for change in regression.slower_beyond_threshold()],
            "cannot_judge": regression.unjudged(),
            "not_ruled_out": regression.not_ruled_out() if regression.threshold is not None else []}


def to_json(regression):
    return json.dumps(to_json_dict(regression), indent=2) + "\n"


# `verdict_loaded`: the sides that trained on a loaded machine, whose verdict is then not reliable (`Verdict.loaded`).
CSV_COLUMNS = ("label", "figure", "baseline", "new", "ratio", "ratio_low", "ratio_high", "verdict", "verdict_loaded",
               "reason")


def to_csv(regression):
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for change in regression.changes:
        verdict = change.verdict
        writer.writerow({"label": change.label, "figure": change.figure, "baseline": change.baseline,
                         "new": change.new, "ratio": verdict.ratio if verdict else "",
                         "ratio_low": verdict.low if verdict else "", "ratio_high": verdict.high if verdict else "",
                         "verdict": verdict.call if verdict else "",
                         "verdict_loaded": "; ".join(verdict.loaded) if verdict else "", "reason": change.reason or ""})
    return buffer.getvalue()


def _too_few_repeats(verdict):
    """Why a gate cannot hold a tokens/s verdict, where a side has 2 repeats: Student's t of 1 degree of freedom
    (12.71 standard errors each side), whose interval a single run's figure is not stated from either
    (`verdicts.MIN_T_REPEATS`) and which reaches past any threshold (0.32–2.11 of a real 20 % slowdown): a gate
    that passed it could never fail. None otherwise (1 repeat a side is judged by its windows' spread)."""
    few = [count for count in verdict.repeats if 1 < count < stats.MIN_T_REPEATS]
    if not few:
        return None
    return (f"{verdict.repeats[0]} and {verdict.repeats[1]} repeats: a side of 2 gives an interval too wide to gate "
            f"on; give each side {stats.MIN_T_REPEATS} repeats or more")


def require_not_slower(regression):
    """Ends with exit code 1 where --fail-if-slower found a run slower beyond its threshold, or could not judge one
    of the baseline's runs (`Regression.unjudged`)."""
    slower = regression.slower_beyond_threshold()
    if slower:
        warned = [run for run in regression.run_warnings or {}
                  if any(run.startswith(f"{change.label} (") for change in slower)]
        raise MtbenchError(f"slower than the baseline by more than {regression.threshold * 100:g}%: "
                           f"{'; '.join(change.verdict.text for change in slower)}" +
                           (f" ({', '.join(warned)} carr{'ies' if len(warned) == 1 else 'y'} warnings, above, that "
                            f"may explain it)" if warned else ""), SLOWER_EXIT_CODE)
    unjudged = regression.unjudged()
    if unjudged:
        raise MtbenchError(f"--fail-if-slower {regression.threshold * 100:g}% cannot judge every run of the "
                           f"baseline: {'; '.join(unjudged)}", SLOWER_EXIT_CODE)
