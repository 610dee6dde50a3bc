"""Saved results side by side: loading single-run and compare JSONs, refusing runs that do not compare, grouping
repeats, and rendering the comparison as a terminal table, markdown, CSV or JSON.

Every format is built from the same `Comparison` and the figures of `mtbench.FIGURES`, so they carry the
same numbers.
"""

import csv
import dataclasses
import io
import json
import statistics
from dataclasses import asdict, dataclass

from rich.table import Table

from mtbench.errors import MtbenchError
from mtbench.runner.config import TrainConfig, decoding_name
from mtbench.plugins.api import (FIGURES, FIGURES_BY_KEY, RUN_CHOICES, SIZE_KEYS, hardware, run_dtype, run_label,
                                 run_processes, size_label)
from mtbench.runner.results.parity import PARITY_STEPS, PARITY_TOLERANCE, check_parity
from mtbench.runner.results.schema import schema_errors

COMPARE_KIND = "mtbench-compare"
REPORT_KIND = "mtbench-report"
# What a comparison is about: these may differ between the runs compared (the size flags: a size sweep).
COMPARED_KEYS = ("backend", "extras", "dtype", *SIZE_KEYS)
# Derived from the keys above and the rest of the configuration, so never a difference of their own.
DERIVED_KEYS = ("model", "parameters")
# Where a run's files went, and how its start was written down (the weights' hash is compared instead).
# `log_every` appears only in results written before that unused option was removed.
BOOKKEEPING_KEYS = ("out", "overwrite", "cache_dir", "initial_weights", "log_every", "report_to", "logging_dir",
                    "run_group", "price_per_hour", "save_model")
# A result written before a configuration key existed ran with its default.
KEY_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}


@dataclass
class LoadedRun:
    result: dict
    source: str  # the file, and which of its runs for a compare JSON


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise MtbenchError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise MtbenchError(f"{path}: is a directory; give result JSON files") from None
    except UnicodeDecodeError:
        raise MtbenchError(f"{path}: not valid UTF-8") from None
    except json.JSONDecodeError as error:
        raise MtbenchError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    except OSError as error:
        raise MtbenchError(f"{path}: cannot read: {error.strerror}") from None


def _checked(result, source):
    errors = schema_errors(result) if isinstance(result, dict) else ["not a JSON object"]
    if errors:
        more = f" and {len(errors) - 1} more problems" if len(errors) > 1 else ""
        raise MtbenchError(f"{source}: not an mtbench result ({errors[0]}{more})")
    return LoadedRun(result, source)


def load_runs(paths):
    """Every run in the given files: a single-run result is one run, a compare JSON holds several."""
    runs = []
    for path in paths:
        data = _read_json(path)
        if isinstance(data, dict) and data.get("kind") == COMPARE_KIND:
            runs.extend(_checked(entry.get("result"), f"{path} ({entry.get('label')}, repeat {entry.get('repeat')})")
                        for entry in data.get("runs", []))
        elif isinstance(data, dict) and data.get("kind") == REPORT_KIND:
            raise MtbenchError(f"{path}: a report's JSON output holds summaries, not runs; "
                               f"give the result or compare JSON files it was made from")
        else:
            runs.append(_checked(data, path))
    if not runs:
        raise MtbenchError("no runs in the given files")
    return runs


def configuration_differences(reference, other):
    """[(key, reference value, other value)] for every configuration key that matters and differs."""
    ignored = set(COMPARED_KEYS) | set(BOOKKEEPING_KEYS) | set(DERIVED_KEYS)
    if size_label(reference) != size_label(other):
        ignored.add("initial_weights_sha256")  # models of different sizes start from weights of their own shapes
    keys = [k for k in dict.fromkeys([*reference, *other]) if k not in ignored]
    value = lambda config, key: config.get(key, KEY_DEFAULTS.get(key))
    return [(k, value(reference, k), value(other, k)) for k in keys if value(reference, k) != value(other, k)]


def check_comparable(runs):
    """Refuses runs whose configurations differ beyond backend, extras and dtype, naming the keys."""
    reference = runs[0]
    for run in runs[1:]:
        differences = configuration_differences(reference.result["config"], run.result["config"])
        if differences:
            listed = ", ".join(f"{key} ({a!r} vs {b!r})" for key, a, b in differences)
            raise MtbenchError(f"not comparable: {run.source} differs from {reference.source} in {listed}; "
                               f"only backend, extras, dtype and the model size flags may differ (--force reports "
                               f"them anyway)")


@dataclass(frozen=True)
class Stat:
    """A figure over the repeats of one run: the median and the range."""
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values):
        values = [v for v in values if v is not None]
        if not values:
            return cls(None, None, None)
        return cls(float(statistics.median(values)), float(min(values)), float(max(values)))


@dataclass
class RunGroup:
    """The repeats of one run: same backend, extras, dtype and hardware."""
    label: str
    runs: list

    @property
    def results(self):
        return [run.result for run in self.runs]

    @property
    def first(self):
        return self.runs[0].result

    @property
    def dtype(self):
        return run_dtype(self.first)

    @property
    def hardware(self):
        return hardware(self.first)

    def stat(self, key):
        figure = FIGURES_BY_KEY[key]
        return Stat.of([figure.value(result) for result in self.results])

    def versions(self):
        env = self.first["env"]
        framework = ", ".join(f"{name} {version}" for name, version in
                              (env.get("backend_versions") or {}).items())
        return f"{framework}, keras {env['keras']}" if framework else f"keras {env['keras']}"


def _group_key(result):
    return run_label(result), run_dtype(result), hardware(result)


def group_runs(runs):
    """Groups repeats, in the order runs first appear. A label names the backend and extras, and adds the dtype
    or the hardware only where runs of the same backend and extras differ in them."""
    by_key = {}
    for run in runs:
        by_key.setdefault(_group_key(run.result), []).append(run)
    groups = []
    for key, members in by_key.items():
        base, dtype, machine = key
        namesakes = [k for k in by_key if k[0] == base]
        details = []
        if len({k[1] for k in namesakes}) > 1:
            details.append(dtype)
        if len({k[2] for k in namesakes}) > 1:
            details.append(machine)
        groups.append(RunGroup(f"{base} ({', '.join(details)})" if details else base, members))
    return groups


@dataclass
class Comparison:
    groups: list
    baseline: RunGroup
    parity: object  # parity.ParityReport

    @property
    def config(self):
        """The configuration the runs share (what may differ between them left out)."""
        per_run = set(COMPARED_KEYS) | set(DERIVED_KEYS) | {"out", "overwrite"}
        return {k: v for k, v in self.baseline.first["config"].items() if k not in per_run}

    def speedup(self, group):
        """Steady tokens/s against the baseline's (medians over repeats): above 1 is faster."""
        mine, theirs = group.stat("tokens_per_s").median, self.baseline.stat("tokens_per_s").median
        return mine / theirs if mine is not None and theirs else None

    def scaling(self, group):
        """A run of N processes against the run of one process it scales (the same backend, extras less those
        that span the processes, dtype and hardware): {'processes', 'against', 'efficiency'}, the efficiency
        being N-process tokens/s over N x one-process tokens/s (medians over repeats); None for a run of one
        process, or of N without its one-process run in the comparison."""
        count = run_processes(group.first)
        if count == 1:
            return None
        spanning = set((group.first.get("processes") or {}).get("spanned_by") or ())
        single = [extra for extra in group.first["extras"] if extra not in spanning]
        for other in self.groups:
            result = other.first
            if (run_processes(result) == 1 and result["backend"] == group.first["backend"]
                    and list(result["extras"]) == single and other.dtype == group.dtype
                    and other.hardware == group.hardware):
                mine, theirs = group.stat("tokens_per_s").median, other.stat("tokens_per_s").median
                efficiency = mine / (count * theirs) if mine is not None and theirs else None
                return {"processes": count, "against": other.label, "efficiency": efficiency}
        return None

    def shared_hardware(self):
        machines = {group.hardware for group in self.groups}
        return machines.pop() if len(machines) == 1 else None


def parity_class(result):
    """Runs held to the same loss curve: the same dtype policy and the same model size."""
    size = size_label(result["config"])
    return f"{run_dtype(result)}, {size}" if size else run_dtype(result)


def _parity_names(groups):
    return [(group.label if len(group.runs) == 1 else f"{group.label} #{i}", run.result)
            for group in groups for i, run in enumerate(group.runs, start=1)]


def build_comparison(runs, baseline=None, force=False, parity_steps=PARITY_STEPS, parity_tolerance=PARITY_TOLERANCE):
    if not force:
        check_comparable(runs)
    groups = group_runs(runs)
    labels = [group.label for group in groups]
    if baseline is None:
        chosen = groups[0]
    elif baseline in labels:
        chosen = groups[labels.index(baseline)]
    else:
        raise MtbenchError(f"--baseline '{baseline}' is none of the runs: {', '.join(labels)}")
    ordered = [chosen] + [group for group in groups if group is not chosen]
    parity = check_parity(_parity_names(ordered), parity_class, steps=parity_steps, tolerance=parity_tolerance)
    return Comparison(groups, chosen, parity)


# ---- rendering -------------------------------------------------------------------------------------------------

def _cell(group, figure):
    stat = group.stat(figure.key)
    text = figure.text(stat.median)
    if figure.is_timing and len(group.runs) > 1 and stat.median is not None:
        text += f" ({figure.text(stat.low)}–{figure.text(stat.high)})"
    return text


def _speedup_cell(comparison, group):
    speedup = comparison.speedup(group)
    text = "n/a" if speedup is None else f"{speedup:.2f}x"
    return text + " (baseline)" if group is comparison.baseline else text


def table_cells(comparison):
    """(header, rows) of the comparison table: one column per run, one row per figure. Timings of repeated runs
    read 'median (min–max)'."""
    groups = comparison.groups
    header = ["figure", *(group.label for group in groups)]
    rows = [
        ["dtype", *(group.dtype for group in groups)],
        ["hardware", *(group.hardware for group in groups)],
        ["versions", *(group.versions() for group in groups)],
        *([title, *(text(group.first) for group in groups)] for _, title, text in RUN_CHOICES),
        ["runs (repeats)", *(str(len(group.runs)) for group in groups)],
    ]
    rows += [[figure.title, *(_cell(group, figure) for group in groups)] for figure in FIGURES]
    rows.append([f"speed-up vs {comparison.baseline.label} (tokens/s)",
                 *(_speedup_cell(comparison, group) for group in groups)])
    if any(comparison.scaling(group) for group in groups):
        rows.append(["scaling efficiency (N processes vs N x 1)", *(_scaling_cell(comparison, group) for group in groups)])
    return header, rows


def _scaling_cell(comparison, group):
    scaling = comparison.scaling(group)
    if scaling is None:
        return ""
    efficiency = scaling["efficiency"]
    return ("n/a" if efficiency is None else f"{efficiency:.0%}") + f" of {scaling['processes']}x {scaling['against']}"


def describe_configuration(config):
    length = f"{config['steps']} steps" if config.get("epochs") is None else f"{config['epochs']} epochs"
    corpus = config.get("data_file") or config["dataset"]
    return (f"{corpus}, preset {config['preset']}, {length} x batch {config['batch_size']}, "
            f"max-len {config['max_len']}, max-pairs {config.get('max_pairs') or 'all'}, seed {config['seed']}, "
            f"{decoding_name(config.get('beam', 1), config.get('length_penalty', 0.6))} decoding")


def context_lines(comparison):
    return [f"configuration: {describe_configuration(comparison.config)}", *comparison.parity.lines(),
            *energy_and_cost_lines(comparison)]


def energy_and_cost_lines(comparison):
    """Why energy is missing where it is, and the cheapest run to the target quality where runs were priced."""
    missing = {group.label: reason for group in comparison.groups
               for reason in {(result.get("energy") or {}).get("reason") for result in group.results} if reason}
    if missing and len(set(missing.values())) == 1 and len(missing) == len(comparison.groups):
        lines = [f"energy: not measured, {next(iter(missing.values()))}"]
    else:
        lines = [f"energy of {label}: not measured, {reason}" for label, reason in missing.items()]
    priced = [group for group in comparison.groups if group.stat("usd_to_target").median is not None]
    if priced:
        cheapest = min(priced, key=lambda group: group.stat("usd_to_target").median)
        figure = FIGURES_BY_KEY["usd_to_target"]
        lines.append(f"cheapest to the target BLEU: {cheapest.label}, {figure.text(cheapest.stat('usd_to_target').median)}"
                     f" USD (at {cheapest.first['cost']['price_per_hour']:g} USD/h)")
    elif any((group.first.get("cost") or {}).get("price_per_hour") is not None for group in comparison.groups) \
            and any((group.first.get("target") or {}).get("target_bleu") for group in comparison.groups):
        lines.append("cheapest to the target BLEU: no run reached it")
    return lines


def rich_table(comparison, title="mtbench comparison"):
    header, rows = table_cells(comparison)
    table = Table(title=title)
    table.add_column(header[0])
    for label in header[1:]:
        table.add_column(label, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def to_markdown(comparison):
    header, rows = table_cells(comparison)

    def line(cells):
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    lines = [line(header), "|" + "---|" + "---:|" * (len(header) - 1)]
    lines += [line(row) for row in rows]
    lines += [""] + [f"- {text}" for text in context_lines(comparison)]
    return "\n".join(lines) + "\n"


def summary(comparison):
    """Per run: its identity and every figure as median/min/max of the raw values (JSON and CSV carry these)."""
    entries = []
    for group in comparison.groups:
        entries.append({
            "label": group.label,
            "backend": group.first["backend"],
            "extras": list(group.first["extras"]),
            "dtype": group.dtype,
            "hardware": group.hardware,
            **{key: text(group.first) for key, _, text in RUN_CHOICES},
            "repeats": len(group.runs),
            "sources": [run.source for run in group.runs],
            "figures": {figure.key: asdict(group.stat(figure.key)) for figure in FIGURES},
            "speedup": comparison.speedup(group),
            "processes": run_processes(group.first),
            "scaling": comparison.scaling(group),
        })
    return entries


def to_json_dict(comparison):
    return {
        "kind": REPORT_KIND,
        "baseline": comparison.baseline.label,
        "config": comparison.config,
        "summary": summary(comparison),
        "speedups": {group.label: comparison.speedup(group) for group in comparison.groups},
        "scaling": {label: scaling for label, scaling in
                    ((group.label, comparison.scaling(group)) for group in comparison.groups) if scaling is not None},
        "parity": comparison.parity.to_dict(),
    }


def to_json(comparison):
    return json.dumps(to_json_dict(comparison), indent=2) + "\n"


CSV_IDENTITY = ("label", "backend", "extras", "dtype", "hardware", *(key for key, _, _ in RUN_CHOICES), "repeats")


def to_csv(comparison):
    """One row per run. A timing has its median and its min and max over repeats; other figures one value."""
    columns = list(CSV_IDENTITY)
    for figure in FIGURES:
        columns += [figure.key, f"{figure.key}_min", f"{figure.key}_max"] if figure.is_timing else [figure.key]
    columns += ["speedup", "processes", "scaling_efficiency"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for entry in summary(comparison):
        row = {key: entry[key] for key in CSV_IDENTITY}
        row["extras"] = "+".join(entry["extras"])
        for figure in FIGURES:
            stat = entry["figures"][figure.key]
            row[figure.key] = stat["median"]
            if figure.is_timing:
                row[f"{figure.key}_min"], row[f"{figure.key}_max"] = stat["low"], stat["high"]
        row["speedup"], row["processes"] = entry["speedup"], entry["processes"]
        row["scaling_efficiency"] = entry["scaling"] and entry["scaling"]["efficiency"]
        writer.writerow({key: "" if value is None else value for key, value in row.items()})
    return buffer.getvalue()
