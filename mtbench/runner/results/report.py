"""Saved results side by side: loading single-run and compare JSONs, refusing runs that do not compare, grouping
repeats, and rendering the comparison as a terminal table, markdown, CSV or JSON.

Every format is built from the same `Comparison` and the figures of `mtbench.FIGURES`, so they carry the
same numbers.
"""

import csv
import dataclasses
import io
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass
from functools import cached_property

from rich.table import Table
from rich.text import Text

from mtbench.errors import MtbenchError
from mtbench.runner.config import COMPILED_STEP_EXTRA, EXTRA_OPTIONS, TrainConfig, decoding_name
from mtbench.runner.files import read_json
from mtbench.figures import (DEFAULT_MODEL, FIGURES, FIGURES_BY_KEY, RUN_CHOICES, SIZE_KEYS, batch_text,
                             energy_counter_text, hardware, is_number, kinds_against_text, last_step, machine_device,
                             mtbench_text, profile_operations_text, run_dtype, run_name, run_processes, run_warnings,
                             scored_sentences_text, shown_figures, size_label, split_scored_text, versions_text)
from mtbench.runner.results.parity import (PARITY_STEPS, check_parity, parity_steps_problem,
                                           parity_tolerance_problem)
from mtbench.runner.results.schema import (COMPARE_SCHEMA_VERSION, HISTORY_KIND, REGRESSION_KIND,
                                           is_evaluation_scores, result_task, schema_errors)
from mtbench.runner.run_file import is_run_file
from mtbench.runner.results import verdicts as stats

COMPARE_KIND = "mtbench-compare"
RESULT_FILES = "a result or compare JSON"
REPORT_KIND = "mtbench-report"
# The JSON outputs of `mtbench report`, which a report is sometimes given by mistake for the files they summarise.
REPORTS_OF_RUNS = {REPORT_KIND: "a report's JSON output", REGRESSION_KIND: "the JSON output of a report against a "
                   "baseline", HISTORY_KIND: "the JSON output of a report of a history"}
# What a sweep may vary beside the model size (configuration keys; with dashes, the --matrix keys and labels').
SWEEP_KEYS = ("batch_size", "max_len", "max_tokens", "block_size", "dtype", "grad_accum", "tensor_parallel_size",
              "init", "remat_policy", "pipeline_parallel_size", "pipeline_micro_batches", "pipeline_schedule")
# What a comparison is about: these may differ between the runs compared (a size sweep, a batch or length sweep).
COMPARED_KEYS = tuple(dict.fromkeys(("backend", "extras", "dtype", *SIZE_KEYS, *SWEEP_KEYS)))
# Derived from the keys above and the rest of the configuration, so never a difference of their own.
DERIVED_KEYS = ("model", "parameters")
# Where a run's files went, how often it printed, how many checkpoints it kept on disk (pruned in the checkpoint's
# time, set apart), and how its start was written down (the weights' hash is compared instead).
BOOKKEEPING_KEYS = ("out", "overwrite", "cache_dir", "initial_weights", "log_every", "report_to", "logging_dir",
                    "run_group", "price_per_hour", "save_model", "sample_prompt", "sample_tokens", "keep_checkpoints")
# What a run asked for where its `extras` (compared) say what ran: --step (torch-compile joined or not) and
# --attention (flash-attention joined or not); where `vocab_size` says it: whether --vocab-size was given.
ASKED_KEYS = ("step", "attention", "vocab_size_given")
# The extra that compiles torch's step: --compile-mode is its alone, and differs only between runs that both have it.
TORCH_COMPILED = COMPILED_STEP_EXTRA
# A result written before a configuration key existed ran with its default.
KEY_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
# Except the float32 arithmetic: before it was set, XLA ran TF32 on GPUs and torch did not, so a result without it
# matches no precision.
del KEY_DEFAULTS["matmul_precision"]
# Results written before --init drew mtbench's first scheme, whatever the model.
KEY_DEFAULTS["init"] = "glorot"


def config_value(result, key):
    """A run's configuration `key`, or its default where the result was written before the key existed."""
    return result["config"].get(key, KEY_DEFAULTS.get(key))


def corpus_of(result):
    """What a run read: its --data file, else the corpus its data section names (a plugin's task may read data of
    its own, whatever --dataset says), else --dataset."""
    config = result["config"]
    return config.get("data_file") or (result.get("data") or {}).get("corpus") or config.get("dataset")


# What tells a run's row of a CSV (and its JSON summary entry) from another's beside backend, extras and dtype, each
# a column of its own: the keys a comparison may vary (the size flags, the sweep keys), those it holds its runs to
# (task, data, model, length) and the optimizer recipe, so that rows of several reports, concatenated, still say
# what each ran.
RUN_CONFIG_KEYS = ("task", "corpus", "model_name", "preset", "checkpoint", *SIZE_KEYS, "parameters",
                   *(key for key in SWEEP_KEYS if key != "dtype"), "steps", "epochs", "seed")
# The recipe's settings as columns (`compile_options.optimizer_recipe`), its `decay` named for what it says.
RECIPE_COLUMNS = {"learning_rate": "learning_rate", "warmup_steps": "warmup_steps", "decay_steps": "decay_steps",
                  "min_lr_ratio": "min_lr_ratio", "beta_1": "beta_1", "beta_2": "beta_2", "epsilon": "epsilon",
                  "weight_decay": "weight_decay", "weight_decay_on": "decay", "clip": "clip",
                  "clip_norm": "clip_norm"}
RUN_CONFIG_KEYS += tuple(RECIPE_COLUMNS)
# The size keys as the model a run built records them (`model`): the shape that ran, whatever the flags left to the
# preset or a checkpoint.
MODEL_SIZE_KEYS = {"encoder_layers": "encoder_layers", "decoder_layers": "decoder_layers", "d_model": "d_model",
                   "heads": "num_heads", "ff_dim": "ff_dim", "dropout": "dropout"}


def built_sizes(result):
    """{size key: value} of the model a run built (`model`), where it records them; `layers` where one count holds
    for its stacks (a decoder-only model's decoder, or equal encoder and decoder)."""
    model = result.get("model") or {}
    sizes = {key: model[name] for key, name in MODEL_SIZE_KEYS.items() if model.get(name) is not None}
    encoder, decoder = sizes.get("encoder_layers"), sizes.get("decoder_layers")
    if decoder is not None and encoder in (0, decoder):
        sizes["layers"] = decoder
    return sizes


def run_configuration(result):
    """{key of RUN_CONFIG_KEYS: a run's value}: the configuration that ran, not the flags alone. The sizes are the
    built model's (`built_sizes`; the flags' where a result lacks them), a language model's block its max length
    (which --block-size sets), a checkpoint's run names the checkpoint (`checkpoint_text`) and no preset, and the
    optimizer's settings are the recipe it trained with (results before it: the configuration's learning rate)."""
    config = result["config"]
    checkpoint = (result.get("model") or {}).get("path")
    task = result_task(result)
    recipe = (result.get("compile_options") or {}).get("optimizer_recipe") or {"learning_rate": config.get(
        "learning_rate")}
    derived = {"task": task, "corpus": corpus_of(result), "model_name": config.get("model_name") or DEFAULT_MODEL,
               "preset": None if checkpoint else config.get("preset"),
               "checkpoint": checkpoint_text(result) if checkpoint else None,
               "parameters": (result.get("model") or {}).get("parameters", config.get("parameters")),
               **built_sizes(result),
               **{column: recipe.get(key) for column, key in RECIPE_COLUMNS.items()}}
    if task == "language-modelling":
        derived["block_size"] = config.get("block_size") or config.get("max_len")
    return {key: derived[key] if key in derived else config_value(result, key) for key in RUN_CONFIG_KEYS}


@dataclass
class LoadedRun:
    result: dict
    source: str  # the file, and which of its runs for a compare JSON
    warnings: tuple = ()  # what its file says of it beyond its result: a comparison that stopped early
    asked_as: str = None  # the label its compare JSON gives it, the run as --matrix asked it (`dtype=auto`)
    result_file: str = None  # its own result file: the path given, or where its compare wrote it (as recorded)

    @property
    def path(self):
        """The file that holds this run's result alone (where trackers replaying it keep their files beside it),
        or, of a compare JSON that recorded none, its source."""
        return self.result_file or self.source


def stopped_comparison_warning(status, status_reason):
    """The warning every run of a compare JSON carries where the comparison stopped early (`status` interrupted or
    failed): its reason names the run it stopped in and how many finished. None for a completed comparison (compare
    JSONs from before the status was recorded have none)."""
    if status in (None, "completed"):
        return None
    return (f"partial comparison: {status_reason or f'{status}, no reason recorded'}; the runs that did not finish "
            f"are missing from it, or partial")


def software_difference(entries):
    """The warning where a comparison's runs (`entries`: a compare JSON's, each with its `label`, `repeat` and
    `result`) trained with different mtbench code (another version, another commit, a commit's tree changed:
    '-dirty'), naming each run's; None where they all ran the same. Each run is a process of its own that imports
    mtbench afresh, so an edit of the checkout while a comparison runs reaches only the runs after it, and the
    figures then differ by mtbench's code as well as by the frameworks'. Compare says it as its runs finish, and
    `report` of its JSON derives it again from the runs."""
    by_software = {}
    for entry in entries:
        env = entry["result"].get("env") or {}
        by_software.setdefault((env.get("mtbench"), env.get("mtbench_git_commit")), []).append(entry)
    if len(by_software) < 2:
        return None
    labels = [entry.get("label") for entry in entries]
    name = lambda entry: f"{entry.get('label')}" + (f" #{entry.get('repeat')}" if labels.count(entry.get("label")) > 1
                                                   else "")
    said = "; ".join(f"{', '.join(map(name, group))}: {mtbench_text(group[0]['result'].get('env') or {})}"
                     for group in by_software.values())
    return (f"the runs trained with different mtbench code ({said}): the checkout changed while the comparison ran, "
            f"or an environment holds another mtbench; their figures may differ by mtbench's code, not only by the "
            f"frameworks'")


def check_result(result, source):
    """Refuses, in one line naming `source`, what is not an mtbench result as the schema has it."""
    errors = schema_errors(result) if isinstance(result, dict) else ["not a JSON object"]
    if errors:
        more = f" and {len(errors) - 1} more problems" if len(errors) > 1 else ""
        raise MtbenchError(f"{source}: not an mtbench result ({errors[0]}{more})")


def _checked(result, source, warnings=(), asked_as=None, result_file=None):
    check_result(result, source)
    return LoadedRun(result, source, warnings, asked_as, result_file if isinstance(result_file, str) else None)


def load_runs(paths):
    """Every run in the given files: a single-run result is one run, a compare JSON holds several."""
    runs = []
    for path in paths:
        data = read_json(path, RESULT_FILES)
        if isinstance(data, dict) and data.get("kind") == COMPARE_KIND:
            entries, version = data.get("runs", []), data.get("schema_version")
            if isinstance(version, int) and version > COMPARE_SCHEMA_VERSION:
                raise MtbenchError(f"{path}: schema_version: {version} is a compare layout this mtbench does not "
                                   f"read (it reads {COMPARE_SCHEMA_VERSION}); a newer mtbench wrote it")
            if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
                raise MtbenchError(f"{path}: not an mtbench compare JSON (runs: not a list of objects)")
            check_compare_record(data, path)
            loaded = [_checked(entry.get("result"), f"{path} ({entry.get('label')}, repeat {entry.get('repeat')})",
                               asked_as=entry.get("label"), result_file=entry.get("result_file"))
                      for entry in entries]
            # The A/A twins count as compare counted them: a twin of other code is as much a difference.
            twins = [entry for entry in data.get("aa_runs") or () if isinstance(entry, dict)
                     and isinstance(entry.get("result"), dict)]
            said = tuple(warning for warning in (
                stopped_comparison_warning(data.get("status"), data.get("status_reason")),
                software_difference([*entries, *twins])) if warning)
            runs.extend(dataclasses.replace(run, warnings=said) for run in loaded)
        elif isinstance(data, dict) and data.get("kind") in REPORTS_OF_RUNS:
            raise MtbenchError(f"{path}: {REPORTS_OF_RUNS[data['kind']]} holds summaries, not runs; "
                               f"give the result or compare JSON files it was made from")
        elif is_evaluation_scores(data):
            raise MtbenchError(f"{path}: `mtbench evaluate`'s scores ({data['model']} on a test set), not a run's "
                               f"figures; give the result JSON of the run that trained it")
        elif is_run_file(data):
            raise MtbenchError(f"{path}: a run file (what `mtbench train --run-file` and `rerun` read) holds a "
                               f"run's configuration, not its figures; give its result, the JSON beside it")
        else:
            runs.append(_checked(data, path, result_file=path))
    if not runs:
        raise MtbenchError("no runs in the given files")
    refuse_the_same_run_twice(runs)
    return runs


def check_compare_record(data, path):
    """Refuses, in one line naming `path`, a compare JSON whose baseline or A/A noise floor is not as compare
    writes them: report holds the runs to both."""
    problem = compare_record_problem(data)
    if problem:
        raise MtbenchError(f"{path}: not an mtbench compare JSON ({problem})")


def compare_record_problem(data):
    baseline, floor, parity = data.get("baseline"), data.get("noise_floor"), data.get("parity")
    if baseline is not None and not isinstance(baseline, str):
        return f"baseline: {type(baseline).__name__}, not a run's label"
    if parity is not None and not isinstance(parity, dict):
        return f"parity: {type(parity).__name__}, not the parity check's record"
    # The check `report` and `rerun` hold the runs to again, as the options that set it are held (an edit to
    # steps 2.5 or tolerance 'abc' ended in a TypeError, one of 0 or -1 checked nothing)
    for key, problem in (("steps", "steps" in (parity or {}) and parity_steps_problem(parity["steps"])),
                         ("tolerance", parity_tolerance_problem((parity or {}).get("tolerance")))):
        if problem:
            return f"parity.{key} {problem}"
    if floor is None:
        return None
    if not (isinstance(floor, dict) and isinstance(floor.get("measured_by"), str)
            and isinstance(floor.get("figures"), dict)):
        return "noise_floor: not an A/A measure with measured_by and figures"
    for key, entry in floor["figures"].items():
        if not (isinstance(entry, dict) and is_number(entry.get("floor"))):
            return f"noise_floor.figures.{key}: holds no floor"
    losses = floor.get("twin_losses")
    if losses is not None and not (isinstance(losses, dict) and is_number(losses.get("max_relative_difference"))
                                   and is_number(losses.get("steps"))):
        return "noise_floor.twin_losses: not the twins' largest loss difference over their steps"
    return None


def run_key(result):
    """What makes two results one run: the same result, field for field (a copy of a file is its run again)."""
    return json.dumps(result, sort_keys=True, default=str)


def refuse_the_same_run_twice(runs):
    """One run given twice (a file named twice, a copy of it, a compare JSON beside one of its runs) would count as
    two repeats: a spread of zero, a verdict the runs do not support."""
    seen = {}
    for run in runs:
        key = run_key(run.result)
        if key in seen:
            raise MtbenchError(f"{seen[key]} and {run.source} hold the same run (created {run.result.get('created')}); "
                               f"give each run once")
        seen[key] = run.source


def differing(reference, other, ignored=(), defaults=None):
    """[(key, reference value, other value)] for every key of either dict, `ignored` aside, whose values differ; a
    key one of them lacks reads as its value in `defaults` (None where that lacks it too)."""
    defaults = defaults or {}
    value = lambda values, key: values.get(key, defaults.get(key))
    keys = [k for k in dict.fromkeys([*reference, *other]) if k not in ignored]
    return [(k, value(reference, k), value(other, k)) for k in keys if value(reference, k) != value(other, k)]


def configuration_differences(reference, other):
    """[(key, reference value, other value)] for every configuration key that matters and differs."""
    ignored = set(COMPARED_KEYS) | set(BOOKKEEPING_KEYS) | set(DERIVED_KEYS) | set(ASKED_KEYS)
    if not all(TORCH_COMPILED in config.get("extras", ()) for config in (reference, other)):
        ignored.add("compile_mode")
    if model_shape(reference) != model_shape(other):
        # models of different shapes, or drawn by different schemes, start from weights of their own
        ignored.add("initial_weights_sha256")
    return differing(reference, other, ignored, KEY_DEFAULTS)


def compared_configuration(result):
    """`result`'s configuration as comparisons hold it to another's: a language model's default tokenizer (None)
    as the tokenizer it trained (`data.tokenizer.type`), the run `--tokenizer byte` gives too."""
    config = result["config"]
    if config.get("tokenizer") is not None or result_task(result) != "language-modelling":
        return config
    trained = ((result.get("data") or {}).get("tokenizer") or {}).get("type")
    return {**config, "tokenizer": trained} if trained else config


def configuration_mismatches(runs):
    """['RUN differs from FIRST in KEY (its value vs FIRST's), ...'] of each run whose configuration differs from
    the first run's beyond what a comparison may vary."""
    reference, found = runs[0], []
    for run in runs[1:]:
        differences = configuration_differences(compared_configuration(reference.result),
                                                 compared_configuration(run.result))
        if differences:
            listed = ", ".join(f"{key} ({b!r} vs {a!r})" for key, a, b in differences)  # the run's value first
            found.append(f"{run.source} differs from {reference.source} in {listed}")
    return found


def check_comparable(runs):
    """Refuses runs whose configurations differ beyond what a comparison may vary, naming the keys."""
    mismatches = configuration_mismatches(runs)
    if mismatches:
        raise MtbenchError(f"not comparable: {mismatches[0]}; only backend, extras, the model size flags and "
                           f"{', '.join(key.replace('_', '-') for key in SWEEP_KEYS)} may differ (--force reports "
                           f"them anyway)")


# The settings that set how many tokens a step trains on (--block-size sets max_len): runs that differ in one do
# different work a step.
STEP_WORK_KEYS = ("batch_size", "max_len", "max_tokens", "grad_accum")


def step_work(result):
    """What sets the work of a run's step (`STEP_WORK_KEYS`), as a list to compare another run's to."""
    return [config_value(result, key) for key in STEP_WORK_KEYS]


def model_shape(config):
    """What the initial weights follow beside the configuration a comparison shares: the size flags, --max-len (the
    position embeddings) and --init (the scheme they are drawn by)."""
    return size_label(config), config.get("max_len"), config.get("init", KEY_DEFAULTS.get("init"))


def swept_keys(results):
    """The SWEEP_KEYS whose value differs between the results: what their labels name. Where every run sets
    --block-size, its --max-len (which the block sets) is not named again."""
    keys = tuple(key for key in SWEEP_KEYS
                 if len({config_value(result, key) for result in results}) > 1)
    if "block_size" in keys and all(result["config"].get("block_size") is not None for result in results):
        keys = tuple(key for key in keys if key != "max_len")
    return keys


def sweep_settings(result, keys):
    """[(flag, value)] of the swept `keys` a run set (a key it left unset, such as --max-tokens, is not named)."""
    values = ((key, config_value(result, key)) for key in keys)
    return [(key.replace("_", "-"), value) for key, value in values if value is not None]


def interpreter(result):
    """The Python executable a run ran under (None in results written before it was recorded)."""
    return result["env"].get("python_executable")


def environment_names(paths):
    """{interpreter path: its short name}: the directory of its environment ('venv-old' of venv-old/bin/python),
    with as many parent directories as it takes to tell the given ones apart ('a-.venv', 'b-.venv')."""
    paths = list(dict.fromkeys(paths))

    def parts(path):
        directory = os.path.dirname(path)
        root = os.path.dirname(directory) if os.path.basename(directory) in ("bin", "Scripts") else path
        return [part for part in root.split(os.sep) if part] or [path]

    for depth in range(1, max((len(parts(path)) for path in paths), default=1) + 1):
        names = {path: "-".join(parts(path)[-depth:]) for path in paths}
        if len(set(names.values())) == len(paths):
            return names
    return {path: "-".join(part for part in path.split(os.sep) if part) for path in paths}


def baseline_label(given, labels, named_by="--baseline"):
    """The run --baseline names among `labels`: exactly, or by part of its settings where that names one run of
    its backend and extras: without the `model=NAME` a model family's runs carry (`jax` for `jax:model=gpt`), or
    as --matrix set it where the label names a swept key it left at the shared value (`torch:batch-size=64` for
    `torch:batch-size=64,grad-accum=1`); else a one-line error, saying where the name came from (`named_by`)."""
    if given in labels:
        return given
    run, _, keys = given.partition(":")
    settings = set(filter(None, keys.split(",")))
    named = [label for label in labels if label.partition(":")[0] == run
             and settings <= set(filter(None, label.partition(":")[2].split(",")))]
    if len(named) == 1:
        return named[0]
    # A directory, or a path that names nothing, is no label and no OLD.json: say which --baseline takes, or that
    # the file is missing, rather than list the labels alone.
    if os.path.isdir(given):
        why = "; it is a directory, and a baseline file is a result or compare JSON"
    elif os.sep in given or (os.altsep and os.altsep in given):
        why = "; nor is it a file: no such file or directory"
    else:
        why = ""
    raise MtbenchError(f"{named_by} '{given}' is none of the runs: {', '.join(labels)}{why}")


def comparison_labels(results, swept=None):
    """Each result's label in a comparison: `run_label`, then the swept keys whose value differs between the
    runs (`jax:batch-size=16`; `swept`: these keys instead), then, where the runs ran under different interpreters,
    `python=NAME` of each (`torch:python=venv-old`): the names `--matrix` gives such runs."""
    swept = swept_keys(results) if swept is None else swept
    paths = {path for path in map(interpreter, results) if path}
    names = environment_names(sorted(paths)) if len(paths) > 1 else {}
    labels = []
    for result in results:
        settings = sweep_settings(result, swept)
        if interpreter(result) in names:
            settings.append(("python", names[interpreter(result)]))
        labels.append(run_name(result["backend"], result["extras"], result["config"], run_processes(result),
                               settings))
    return labels


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

    def over_repeats(self, key):
        """Figure `key` over the repeats as a verdict's ratio takes it (`verdicts.figure_point`): the geometric mean
        of each repeat's figure (for tokens/s and the steady step, of its steady windows), so that a ratio of two
        runs' is the verdict's; where that has none (no steady window, a repeat that measured 0), the median of the
        recorded figure."""
        point = stats.figure_point(key, self.results)
        return point if point is not None else self.stat(key).median

    def speed(self):
        """Steady tokens/s over the repeats (`over_repeats`): a speed-up and its verdict are one ratio."""
        return self.over_repeats(stats.SPEED_FIGURE)

    def choice_text(self, text):
        """What `text` (a RUN_CHOICES function) says of the repeats: one text where they agree, else each with the
        repeats it holds for ('cold (0 hits, 18 misses) in #1; warm (18 hits, 0 misses) in #2'), not the first's
        alone beside figures over all of them."""
        held = {}
        for number, result in enumerate(self.results, start=1):
            held.setdefault(text(result), []).append(f"#{number}")
        if len(held) == 1:
            return next(iter(held))
        return "; ".join(f"{said} in {', '.join(numbers)}" for said, numbers in held.items())

    def warnings(self):
        """Every repeat's warnings (`run_warnings`), each named by its repeat where there are several, then what
        their files say of them (`LoadedRun.warnings`), once each."""
        files = list(dict.fromkeys(text for run in self.runs for text in run.warnings))
        if len(self.runs) == 1:
            return run_warnings(self.first) + files
        return [f"#{number}: {text}" for number, result in enumerate(self.results, start=1)
                for text in run_warnings(result)] + files

    def versions(self):
        return versions_text(self.first)


def compile_cache_state(result):
    """Where a run's compiled programs came from: 'warm', 'partly warm' or 'cold' by its cache lookups (else by
    whether the cache held programs as it started), 'off', or 'none' (nothing compiled ahead)."""
    cache = (result.get("timing") or {}).get("compile_cache")
    if not cache:
        return "none"
    return cache.get("programs") or cache["state"]


def with_compile_caches(even, caches):
    """`even` (a BreakEven) with the compile cache states its compile times rest on ({label: state}), said in its
    text where a run's programs came (partly) from a warm cache and its compiling afresh could move the answer:
    not where it is the slower-compiling of a run that is faster at both, which a cold start only slows more."""
    said = ", ".join(f"{label} {state}" for label, state in caches.items())
    warm = {label for label, state in caches.items() if "warm" in state}
    faster_at_both = even.faster_compiling if even.faster_compiling == even.faster_stepping else None
    moves = warm and (faster_at_both is None or faster_at_both in warm)
    return dataclasses.replace(even, compile_caches=caches,
                               text=even.text + (f" (compile caches: {said}; a cold start compiles longer)" if moves
                                                 else ""))


def group_runs(runs, swept=None):
    """Groups repeats, in the order runs first appear. A label is the run's name in the comparison
    (`comparison_labels`: backend, extras, size, the swept keys or `swept`, another interpreter), with the dtype,
    the hardware or the versions added only where runs of the same name differ in them: runs of different versions
    are never repeats of one run."""
    by_key = {}
    for run, label in zip(runs, comparison_labels([run.result for run in runs], swept)):
        key = (label, run_dtype(run.result), hardware(run.result), versions_text(run.result))
        by_key.setdefault(key, []).append(run)
    groups = []
    for key, members in by_key.items():
        namesakes = [k for k in by_key if k[0] == key[0]]
        details = [key[i] for i in (1, 2, 3) if len({k[i] for k in namesakes}) > 1]
        groups.append(RunGroup(f"{key[0]} ({', '.join(details)})" if details else key[0], members))
    return groups


@dataclass
class Comparison:
    groups: list
    baseline: RunGroup
    parity: object  # parity.ParityReport
    swept: tuple = ()  # the SWEEP_KEYS whose value differs between the runs
    noise_floor: dict = None  # the A/A measure a compare recorded (`noise_floor_record`), None where none was
    held_anyway: tuple = ()  # with --force, the configuration differences a comparison would have refused

    @property
    def single(self):
        """Whether the report holds one run (or its repeats) alone: nothing to hold it against, so it reads as one
        run, with its figures' intervals and no speed-up, verdict, ranking or parity against itself."""
        return len(self.groups) == 1

    @cached_property
    def figures(self):
        """The figures the runs' tasks have (`shown_figures`), which the table shows: no BLEU row for a language
        model. JSON and CSV carry every figure (null where a run has none), so their columns never change."""
        return shown_figures([run.result for group in self.groups for run in group.runs])

    def floor(self, key):
        """The noise floor of figure `key` (a fraction), None where no A/A measured it."""
        return (((self.noise_floor or {}).get("figures") or {}).get(key) or {}).get("floor")

    @cached_property
    def verdicts(self):
        """{group label: {figure: Verdict}} of every run but the baseline against the baseline, for the figures
        whose interval counts the windows within runs (tokens/s, steady step time); a figure neither run has is
        left out, as is the steady step of a run whose steps do other work than the baseline's (`step_work`: a
        block of 64 tokens against one of 32 is no slower step)."""
        found = {}
        for group in self.groups:
            if group is self.baseline:
                continue
            same_work = step_work(group.first) == step_work(self.baseline.first)
            for key in (key for key in stats.WINDOW_FIGURES if same_work or key != "step_s_median"):
                held = self._held(key, group, self.baseline)
                if held is not None:
                    found.setdefault(group.label, {})[key] = held
        return found

    def _held(self, key, group, against):
        """`group`'s figure `key` against `against`'s (`verdicts.held_verdict`), paired where their repeats were
        interleaved, held to the noise floor."""
        return stats.held_verdict(key, group.label, group.results, against.label, against.results,
                                  stats.same_session(group.results, against.results), self.floor(key))

    def counterparts(self):
        """[(run, against)] of the runs that train the same way on two backends (`same_way_of_training`), neither
        the baseline, against which every run is held already: a comparison of jax, torch, jax+data-parallel@2 and
        torch+ddp@2 holds the last two against each other. `against` is the run on the baseline's backend where one
        of the two is, else the one given first."""
        pairs = []
        for index, group in enumerate(self.groups):
            for other in self.groups[:index]:
                if self.baseline not in (group, other) and same_way_of_training(group.first, other.first):
                    on_baseline_backend = group.first["backend"] == self.baseline.first["backend"]
                    pairs.append((other, group) if on_baseline_backend else (group, other))
        return pairs

    @cached_property
    def counterpart_verdicts(self):
        """The tokens/s of each run against its counterpart on the other backend (`counterparts`), as Verdicts."""
        held = (self._held(stats.SPEED_FIGURE, run, against) for run, against in self.counterparts())
        return [verdict for verdict in held if verdict is not None]

    def break_even(self, group):
        """After how many steps `group` and the baseline overtake each other (`verdicts.break_even`, from the
        medians over repeats of their compile time and mean steady step), or, where their steps differ in work
        (`step_work`), after how many tokens (from their tokens/s, `RunGroup.speed`); None for the baseline."""
        if group is self.baseline:
            return None
        pair = (group, self.baseline)
        compile_s = {g.label: g.stat("compile_s").median for g in pair}
        if step_work(group.first) == step_work(self.baseline.first):
            # The total time of n steps grows with the mean step, not the median (a skewed run's parts by its tail).
            even = stats.break_even(group.label, self.baseline.label, compile_s,
                                    {g.label: Stat.of([stats.mean_step_s(r) for r in g.results]).median
                                     for g in pair})
            unit = "step"
        else:
            # A step of a larger batch or block trains more tokens: steps are no common unit, a token is, and the
            # total time of n tokens grows by the inverse of the tokens/s the table shows beside it.
            speeds = {g.label: g.speed() for g in pair}
            even = stats.break_even(group.label, self.baseline.label, compile_s,
                                    {label: 1 / speed if speed else None for label, speed in speeds.items()},
                                    unit="token")
            unit = "token"
        # Held to the tokens/s verdict either way: the total time of n steps of the same work grows with the mean
        # step, which tokens/s (tokens over seconds) is the inverse of; the median step may point the other way.
        held = self.verdicts.get(group.label, {}).get(stats.SPEED_FIGURE)
        stepping = held and {"faster": group.label, "slower": self.baseline.label}.get(held.call)
        if even and (even.names_a_point or even.faster_stepping) and stepping != even.faster_stepping:
            # The point where one overtakes the other, or that the faster-compiling never is, rests on which runs
            # faster, which the noise leaves open, or nothing shows (no interval: one timing window each). The
            # interval alone: the verdict's sentence is on its own line.
            ahead = f"{even.faster_compiling} compiles faster, " if not even.names_a_point else ""
            # Repeats that scatter apart may rank by their geometric mean unlike their medians of the mean step.
            why = "no tokens/s interval to rank them by" if held is None else {
                "no difference": "tokens/s within the noise", stats.UNDETERMINED: "tokens/s undetermined"
            }.get(held.call, f"tokens/s favour {stepping}, the median repeat's mean {unit}s the other")
            interval = "" if held is None else f" ({stats.range_text(held.low, held.high)})"
            even = stats.BreakEven(group.label, self.baseline.label, f"undetermined: {ahead}{why}{interval}",
                                   faster_compiling=even.faster_compiling if ahead else None, unit=unit)
        return even and with_compile_caches(even, {g.label: g.choice_text(compile_cache_state) for g in pair})

    def target_time(self, group):
        """(median time to the target quality with compilation, without it) over the repeats that reached it."""
        times = [t for t in map(stats.target_times, group.results) if t is not None]
        if not times:
            return None
        return tuple(float(statistics.median(side)) for side in zip(*times))

    @staticmethod
    def target_reached(group):
        """(how many of `group`'s repeats reached the target quality, how many it has)."""
        return sum(stats.target_times(result) is not None for result in group.results), len(group.results)

    @property
    def config(self):
        """The configuration the runs share (what may differ between them left out; a sweep key the runs share is
        shared configuration). The step each run was asked for, and its compile mode, are left out where the runs
        differ in them (compare trains its torch rows eager or compiled; a compiled twin may capture CUDA graphs):
        the baseline's would be said of every run."""
        configs = [result["config"] for group in self.groups for result in group.results]
        differing = {key for key in (*ASKED_KEYS, "compile_mode")
                     if len({json.dumps(config.get(key)) for config in configs}) > 1}
        # A swept block sets each run's max length, which `swept_keys` leaves unnamed: it is the runs' own too.
        blocks = {"max_len"} if "block_size" in self.swept else set()
        per_run = ((set(COMPARED_KEYS) - set(SWEEP_KEYS)) | set(self.swept) | blocks | set(DERIVED_KEYS) | differing
                   | {"out", "overwrite"})
        return {k: v for k, v in self.baseline.first["config"].items() if k not in per_run}

    def speedup(self, group):
        """Steady tokens/s against the baseline's (`RunGroup.speed`, the verdicts' ratio): above 1 is faster."""
        mine, theirs = group.speed(), self.baseline.speed()
        return mine / theirs if mine is not None and theirs else None

    def scaling(self, group):
        """A run of N processes, or of one over N devices (JAX's), against the run of one process and one device it
        scales (the same backend, train step, extras less those that span the processes or devices, dtype and
        hardware): {'processes', 'devices', 'against', 'ideal_speedup', 'efficiency', 'above_ideal'}, the
        efficiency being the run's tokens/s over `ideal_speedup` x the one's (`RunGroup.speed`); None for a run of
        one process on one device, or without its one-process run in the comparison."""
        count, devices = run_processes(group.first), group.first.get("devices_used") or 1
        if count == 1 and devices == 1:
            return None
        # Every run records the extras that may span processes; in one process, JAX's span its devices.
        spanning = set((group.first.get("processes") or {}).get("spanned_by") or ())
        single = [extra for extra in group.first["extras"] if extra not in spanning]
        for other in self.groups:
            result = other.first
            if (run_processes(result) == 1 and (result.get("devices_used") or 1) == 1
                    and result["backend"] == group.first["backend"]
                    and list(result["extras"]) == single and result.get("train_step") == group.first.get("train_step")
                    and other.dtype == group.dtype
                    and machine_device(result) == machine_device(group.first)
                    and _settings(result, spanning) == _settings(group.first, spanning)):
                mine, theirs = group.speed(), other.speed()
                ideal = ideal_speedup(group.first, result)
                efficiency = mine / (ideal * theirs) if mine is not None and theirs else None
                return {"processes": count, "devices": devices, "against": other.label, "ideal_speedup": ideal,
                        "efficiency": efficiency,
                        "above_ideal": efficiency is not None and round(efficiency, 2) > 1}  # as shown
        return None

    def warnings(self, group):
        """`group`'s warnings (`RunGroup.warnings`), then what the comparison finds of it: a scaling efficiency
        above the ideal, beyond what more devices can give, is a slowed one-process run's rather than scaling."""
        found = group.warnings()
        scaling = self.scaling(group)
        if scaling and scaling["above_ideal"]:
            found.append(f"scaling efficiency above 100 % ({scaling_text(scaling)}): the one-process run was likely "
                         f"slowed (its threads contending for the cores, a loaded machine); distrust the efficiency")
        # Against each run a verdict holds it to: the baseline, and its counterpart on the other backend.
        held_to = ([] if group is self.baseline else [self.baseline]) + [
            against for run, against in self.counterparts() if run is group]
        for against in held_to:
            apart = computed_apart({group.label: group.first, against.label: against.first})
            if apart:
                found.append(f"computes otherwise than {against.label}, though both were asked alike: "
                             f"{'; '.join(apart)}; its verdict against it measures that too, not the backends alone")
        return found

    def ranking(self):
        """The runs by tokens/s (`RunGroup.speed`), fastest first, and whether that order can be trusted: `reason`
        says why not (the fastest is not faster than the next beyond the noise, as the verdicts hold a run to the
        baseline, or either carries a warning), else None."""
        timed = [group for group in self.groups if group.speed() is not None]
        order = sorted(timed, key=lambda group: group.speed(), reverse=True)
        reasons = []
        if len(order) > 1:
            first, second = order[0], order[1]
            held = self._held(stats.SPEED_FIGURE, first, second)  # as the verdicts are: a load named on it
            if not held:
                reasons.append(f"no interval between the tokens/s of {first.label} and {second.label}")
            elif held.call != "faster":
                reasons.append(held.text)
            warned = [group.label for group in (first, second) if self.warnings(group)]
            if warned:
                reasons.append(f"{' and '.join(warned)} carr{'ies' if len(warned) == 1 else 'y'} warnings (see "
                               f"the warnings row)")
        machines = sorted({device_model(group.first) for group in order})
        if len(machines) > 1:  # how many of them a run used may differ (a run of several processes): not the model
            reasons.append(f"the runs ran on different devices ({'; '.join(machines)}): the order ranks the machines "
                           f"as well as the ways to train")
        return {"order": [group.label for group in order], "reliable": not reasons,
                "reason": "; ".join(reasons) or None}

    def shared_hardware(self):
        machines = {group.hardware for group in self.groups}
        return machines.pop() if len(machines) == 1 else None


def computed_apart(runs):
    """What two runs ({label: result}) were asked alike and computed otherwise, each in words ([] where nothing):
    `--attention auto` fusing one's attention (the extra it joined) and not the other's, the attention's dtypes
    where both fused or neither did (`model.attention.arithmetic`), and one `--dtype` trained in two dtypes (auto's
    choice on each device, or an extra's). What the runs were asked to do otherwise (an extra named, a dtype swept)
    is what the comparison holds them to; `--matmul-precision`, a configuration key, differs in no comparison
    without --force, which says so."""
    (name, result), (other_name, other) = runs.items()
    found = []
    attention, theirs = (run["model"].get("attention") or {} for run in (result, other))
    chosen, their_choice = attention.get("chosen") or {}, theirs.get("chosen") or {}
    asked = [(run.get("dtype_chosen") or {}).get("asked", run["config"].get("dtype")) for run in (result, other)]
    # The attention's arithmetic follows the dtype and the extras (tensor-parallel fuses the projections): runs
    # asked otherwise there compute otherwise by what they were asked.
    asked_alike = (asked[0] == asked[1] and chosen.get("asked") == their_choice.get("asked")
                   and sorted(result["config"].get("extras") or []) == sorted(other["config"].get("extras") or []))
    if (chosen and their_choice and chosen.get("asked") == their_choice.get("asked")
            and bool(chosen.get("fused")) != bool(their_choice.get("fused"))):
        (fused, by), (unfused, why) = sorted(
            [(name, chosen), (other_name, their_choice)], key=lambda side: not side[1].get("fused"))
        if by.get("by_extra"):  # auto's choice; a run given the extra was asked otherwise
            found.append(f"--attention {by['asked']} fused the attention of {fused} ({by['by_extra']}), not of "
                         f"{unfused}" + (f" ({why['why_unfused']})" if why.get("why_unfused") else ""))
    elif asked_alike and attention.get("arithmetic") and theirs.get("arithmetic"):
        mine, its = ({**ARITHMETIC_OF_EARLIER_RESULTS, **side["arithmetic"]} for side in (attention, theirs))
        found += [f"the attention's {key.replace('_', ' ')} {mine.get(key)} in {name}, {its.get(key)} in {other_name}"
                  for key in ATTENTION_ARITHMETIC if mine.get(key) != its.get(key)]
    if asked[0] == asked[1] and run_dtype(result) != run_dtype(other):
        found.append(f"--dtype {asked[0]} trained {name} in {run_dtype(result)}, {other_name} in {run_dtype(other)}")
    return found


# How the training attention computes (`model.attention.arithmetic`): its dtypes, and one product or three.
ATTENTION_ARITHMETIC = ("matmul_inputs", "accumulation", "scores", "softmax", "projections")
# What a result written before a key of `model.attention.arithmetic` was recorded ran (docs/results.md).
ARITHMETIC_OF_EARLIER_RESULTS = {"projections": "separate"}


def same_way_of_training(result, other):
    """Whether two results trained the same way on different backends: the same `way_of_training` (how their
    extras lay the training over devices, and the extras both backends serve), on as many devices of one model (in
    one process or several: JAX's users drive a machine's devices from one, torch's from one each), in one dtype,
    size and sweep, on the schedules their extras recorded (a pipeline's GPipe or 1F1B, each backend's default
    where --pipeline-schedule is not given). Results from before `way_of_training` was recorded have no
    counterpart."""
    def way(run):
        return (run.get("way_of_training"), run.get("devices_used") or 1, run_dtype(run), device_model(run),
                _settings(run)[0], recorded_schedules(run))
    return (result["backend"] != other["backend"] and None not in (result.get("way_of_training"),
                                                                  other.get("way_of_training"))
            and way(result) == way(other))


def recorded_schedules(result):
    """[(extra, the schedule it recorded)] of a run's extras that record one (`extras_record[NAME].schedule`)."""
    return sorted((name, record["schedule"]) for name, record in (result.get("extras_record") or {}).items()
                  if isinstance(record, dict) and record.get("schedule"))


def device_model(result):
    """What a run computed on, without how many of it: the CPU's or the accelerator's model."""
    device = result["env"]["device"]
    return f"{device.get('kind')}: {device.get('name')}"


def _settings(result, spanning=()):
    """What else a run of N processes and the one-process run it scales must share: size, sweep keys, Python; not
    the options of the extras in `spanning` (those that span the N processes), which the one-process run has not:
    a GPipe pipeline scales the one-process run as a 1F1B one does."""
    keys = [key for key in (*SIZE_KEYS, *SWEEP_KEYS) if EXTRA_OPTIONS.get(key) not in spanning]
    return ([result["config"].get(key, KEY_DEFAULTS.get(key)) for key in keys], interpreter(result),
            versions_text(result))


# Sweep keys that change how a step is laid out, not what it computes: micro-batches (a step of 2 x 32 rows
# trains as one of 64), the tensor-parallel model axis, what remat keeps, and the pipeline's stages, micro-batches and
# schedule.
LAYOUT_KEYS = ("grad_accum", "tensor_parallel_size", "remat_policy", "pipeline_parallel_size", "pipeline_micro_batches",
               "pipeline_schedule")


def parity_class(result, swept=()):
    """Runs held to the same loss curve: the same dtype policy, the same model size and the same batches (the
    `swept` keys among batch size, max length and max tokens; their values name the class where they vary). Runs
    that differ only in how a step is laid out (`LAYOUT_KEYS`) are held to one curve: with micro-batches swept,
    a batch of --batch-size rows is named by the rows of a whole step."""
    config = result["config"]
    # The dtype policy that ran names the class first: a swept --dtype would name it again, or as asked (`auto`).
    settings = sweep_settings(result, [key for key in swept if key not in LAYOUT_KEYS and key != "dtype"])
    if "grad_accum" in swept:
        micro_batches = config.get("grad_accum") or 1
        if config.get("max_tokens"):
            # --max-tokens rounds each micro-batch's rows down to a multiple of 8 before the micro-batches multiply
            # them (`TrainConfig.rows_for`): N micro-batches of T tokens are not the rows of one batch of N x T.
            if "max_tokens" not in swept:
                settings.insert(0, ("max-tokens", config["max_tokens"]))
            settings.append(("grad-accum", micro_batches))
        else:
            settings = [(flag, value * micro_batches if flag == "batch-size" else value) for flag, value in settings]
            if "batch_size" not in swept:
                settings.insert(0, ("batch-size", config["batch_size"] * micro_batches))
    text = ",".join(f"{flag}={value}" for flag, value in settings)
    return ", ".join(part for part in (run_dtype(result), size_label(result["config"]), text) if part)


def _parity_names(groups):
    return [(group.label if len(group.runs) == 1 else f"{group.label} #{i}", run.result)
            for group in groups for i, run in enumerate(group.runs, start=1)]


def build_comparison(runs, baseline=None, force=False, parity_steps=PARITY_STEPS, parity_tolerance=None,
                     noise_floor=None, baseline_named_by="--baseline"):
    """`baseline`: a group's label, or one of `runs` (compare names its baseline run so, whatever its label), named
    by `baseline_named_by` (the option, or the file that recorded it). `noise_floor`: an A/A measure a compare
    recorded (`compare.noise_floor_record`)."""
    if not force:
        check_comparable(runs)
    held_anyway = tuple(configuration_mismatches(runs)) if force else ()
    groups = group_runs(runs)
    if baseline is None:
        chosen = groups[0]
    elif isinstance(baseline, LoadedRun):
        chosen = next(group for group in groups if any(run is baseline for run in group.runs))
    else:
        chosen = named_group(groups, baseline, baseline_named_by)
    ordered = [chosen] + [group for group in groups if group is not chosen]
    swept = swept_keys([run.result for run in runs])
    parity = check_parity(_parity_names(ordered), lambda result: parity_class(result, swept), steps=parity_steps,
                          tolerance=parity_tolerance)
    return Comparison(groups, chosen, parity, swept, noise_floor, held_anyway)


def named_group(groups, given, named_by):
    """The group `given` names: by its label (`baseline_label`), or by the label the compare JSON gave its runs,
    as --matrix asked them: `torch:dtype=auto` for the run that trained in float32, which compare's --baseline
    named so."""
    labels = [group.label for group in groups]
    asked = [group for group in groups if any(run.asked_as == given for run in group.runs)]
    if given not in labels and len(asked) == 1:
        return asked[0]
    return groups[labels.index(baseline_label(given, labels, named_by))]


def _one_compare_json(paths):
    """The compare JSON `paths` name, where they are one compare's JSON and nothing else (its record then says how
    its runs were held: the baseline, the parity gate); {} otherwise."""
    data = read_json(paths[0], RESULT_FILES) if len(paths) == 1 else None
    return data if isinstance(data, dict) and data.get("kind") == COMPARE_KIND else {}


def recorded_baseline(paths):
    """The baseline a compare JSON among `paths` recorded (its label), where they are one compare's JSON and nothing
    else: `mtbench report C.json` then holds its runs to the baseline the compare did. None otherwise."""
    return _one_compare_json(paths).get("baseline")


def recorded_parity(paths):
    """{'steps', 'tolerance'} of the parity check a compare JSON among `paths` ran, where they are one compare's JSON
    and nothing else (as `recorded_baseline`): its report holds the runs to the gate their compare held them to,
    a tolerance the compare was given among it. {} otherwise, or where it recorded none."""
    parity = _one_compare_json(paths).get("parity")
    return {key: parity[key] for key in ("steps", "tolerance") if isinstance(parity, dict) and key in parity}


def recorded_noise_floor(paths):
    """The noise floor recorded in the compare JSONs among `paths` (`noise_floor`, where `compare --aa` measured
    one): where several did, each figure's widest (one A/A may scatter more in tokens/s, another in step time),
    measured by all of them; None where none did."""
    found = []
    for path in paths:
        data = read_json(path, RESULT_FILES)
        if isinstance(data, dict) and data.get("kind") == COMPARE_KIND and data.get("noise_floor"):
            found.append(data["noise_floor"])
    if len(found) < 2:
        return found[0] if found else None
    figures = {}
    for record in found:
        for key, entry in record["figures"].items():
            if (entry.get("floor") or 0) >= (figures.get(key, {}).get("floor") or 0):
                figures[key] = entry
    measured_by = list(dict.fromkeys(record["measured_by"] for record in found))
    losses = [record["twin_losses"] for record in found if record.get("twin_losses")]
    return {"figures": figures, "measured_by": "; ".join(measured_by) + " (each figure's widest)",
            "twin_losses": max(losses, key=lambda entry: entry["max_relative_difference"], default=None)}


# ---- rendering -------------------------------------------------------------------------------------------------

def _cell(group, figure):
    stat = group.stat(figure.key)
    # Repeats' tokens/s and steady step: the verdicts' centre (the geometric mean over the repeats of each one's
    # windows' figure), which the speed-up row divides; the median of the recorded figures could rank the runs the
    # other way beside it (40,300 against 50,584 tokens/s beside a speed-up of 0.39x).
    several = figure.key in stats.WINDOW_FIGURES and len(group.runs) > 1
    text = figure.text(group.over_repeats(figure.key) if several else stat.median)
    if figure.is_timing and len(group.runs) > 1 and stat.median is not None:
        text += f" ({figure.text(stat.low)}–{figure.text(stat.high)})"
    return text


def _speedup_cell(comparison, group):
    speedup = comparison.speedup(group)
    text = "n/a" if speedup is None else f"{speedup:.2f}x"
    return text + " (baseline)" if group is comparison.baseline else text


def _target_value(target):
    """The target a run aimed at (results before tasks name only `target_bleu`), or None."""
    target = target or {}
    return target.get("target", target.get("target_bleu"))


def _single_run_cell(group, figure):
    """A figure of the one run a report holds: '28,663 (95 % interval 27,910–29,420)' for tokens/s and the steady
    step (`verdicts.figure_interval`, as the verdicts draw theirs), centred on the interval's own value (of one
    repeat its recorded figure, over repeats their geometric mean, as the JSON's `intervals` and a gate take it);
    none where `verdicts.figure_interval_gap` states none, the line below saying why; over repeats a timing's range
    too."""
    stat = group.stat(figure.key)
    said = []
    if figure.is_timing and len(group.runs) > 1 and stat.median is not None:
        said.append(f"range {figure.text(stat.low)}–{figure.text(stat.high)}")
    interval = stats.figure_interval(figure.key, group.results) if figure.key in stats.WINDOW_FIGURES else None
    if interval is None or stat.median is None:
        return figure.text(stat.median) + (f" ({'; '.join(said)})" if said else "")
    value, low, high = interval
    if low is not None:
        said.append(f"95 % interval {figure.text(low)}–{figure.text(high)}")
    else:
        repeats = sum(1 for result in group.results if len(stats.steady_windows(result["history"])))
        said.append(f"95 % interval: too wide to state with {repeats} repeats" if repeats > 1 else
                    "95 % interval: none, too few steady timing windows to resample")
    return figure.text(value) + f" ({'; '.join(said)})"


# A row only where a run of the comparison counted some: the README holds both backends' collectives to each other.
COLLECTIVES_TITLE = "collectives a step"


# Where each backend's extras count a step's collectives, which the counts are not comparable without: JAX's in the
# compiled program (its collective instructions, with the arrays they move where XLA combined several into one; a
# loop's body as often as it runs), torch's as its profiler saw them dispatched in one step (a pipeline's of
# process 0).
COUNTED_WHERE = {"jax": "in the compiled step", "torch": "dispatched, torch's profiler"}


def counted_collectives(result):
    """{extra: text} of the collectives a step that a run's extras counted (`extras_record`): each kind's count and
    where it was counted ('all-reduce 3 (28 arrays) (in the compiled step)': a JAX step's instructions and the arrays
    they move, where they differ, of results that record both; 'all-gather 1, all-reduce 9 (dispatched over gloo,
    torch's profiler)', `COUNTED_WHERE`), a torch pipeline's messages with them, DDP's bucket all-reduces as its
    reducer logged them, or 'not counted' and why where a count was withheld (a step replayed from CUDA graphs), or
    'not counted by extra X' where an extra that spans the processes or devices (`processes.spanned_by`) counts
    none. {} where no extra counted any and none spans."""
    counted = {}
    where = COUNTED_WHERE.get(result.get("backend"))
    records = result.get("extras_record") or {}
    for extra, record in records.items():
        record = record if isinstance(record, dict) else {}
        key = next((key for key in ("collectives_per_step", "messages_per_step") if key in record), None)
        if key and record[key] is None:
            why = record.get("collectives_why_not")
            counted[extra] = "not counted" + (f": {why}" if why else "")
        elif key:
            over = f"over {record['collectives']}" if isinstance(record.get("collectives"), str) else ""
            said = where and where.replace("dispatched", f"dispatched {over}".strip())
            if key == "messages_per_step" and said:
                said = f"process 0's, {said}"
            instructions = record.get("collective_instructions_per_step") or {} if key == "collectives_per_step" \
                else {}
            counted[extra] = (", ".join(collective_count_text(kind, count, instructions.get(kind))
                                        for kind, count in sorted(record[key].items())) or "none") \
                + (f" ({said})" if said else "")
        elif record.get("gradient_buckets") is not None:
            counted[extra] = f"all-reduce {record['gradient_buckets']} (DDP's gradient buckets)"
    if not counted:
        spanning = (result.get("processes") or {}).get("spanned_by") or ()
        counted = {extra: f"not counted by extra '{extra}'" for extra in spanning}
    return counted


def collective_count_text(kind, arrays, instructions=None):
    """'all-reduce 3 (28 arrays)': the collectives of a kind a step ran, with the arrays they moved where XLA combined
    several into one instruction; 'all-reduce 28' where only the arrays were counted (results before 2026-12-07)."""
    if instructions is None:
        return f"{kind} {arrays}"
    return f"{kind} {instructions}" + (f" ({arrays} arrays)" if arrays != instructions else "")


def collectives_text(result):
    """The collectives of a run's step (`counted_collectives`), each extra's named where several counted; 'not
    counted' where none did."""
    counted = counted_collectives(result)
    if len(counted) > 1:
        return "; ".join(f"{extra}: {text}" for extra, text in counted.items())
    return next(iter(counted.values()), "not counted")


DEVICES_TITLE = "devices (processes)"


def devices_text(result):
    """'2 (1 process)', '2 (2 processes)', '1': the devices a run trained on, over its processes (the hardware row
    names a CPU's model and cores alike for a run on one device and one of JAX's simulated two)."""
    devices, processes = result.get("devices_used") or 1, run_processes(result)
    return str(devices) if devices == processes == 1 else f"{devices} ({processes} process{'es' if processes > 1 else ''})"


def table_cells(comparison):
    """(header, rows) of the comparison table: one column per run, one row per figure. Timings of repeated runs
    read 'median (min–max)'. One run (`Comparison.single`) has its figures' intervals instead of verdicts."""
    groups = comparison.groups
    header = ["figure", *(group.label for group in groups)]
    # An extra that counts none is said only beside a run that counted some.
    counting = any(not text.startswith("not counted by extra") for group in groups for result in group.results
                   for text in counted_collectives(result).values())
    rows = [
        ["dtype", *(group.dtype for group in groups)],
        ["hardware", *(group.hardware for group in groups)],
        ["versions", *(group.versions() for group in groups)],
        *([title, *(group.choice_text(text) for group in groups)] for _, title, text in RUN_CHOICES),
        *([[COLLECTIVES_TITLE, *(group.choice_text(collectives_text) for group in groups)]] if counting else []),
        *([[DEVICES_TITLE, *(devices_text(group.first) for group in groups)]]
          if any(devices_text(group.first) != "1" for group in groups) else []),
        ["runs (repeats)", *(str(len(group.runs)) for group in groups)],
        ["warnings", *("\n".join(comparison.warnings(group)) or "none" for group in groups)],
    ]
    if comparison.single:
        # Nothing to hold one run against: no speed-up, verdict or break-even, but its own intervals and target.
        rows += [[figure.title, _single_run_cell(groups[0], figure)] for figure in comparison.figures]
        return header, rows + target_rows(comparison)
    # The quality figures of the runs' task (no BLEU rows for a language model or a classifier, no perplexity rows
    # for translation); the JSON and CSV summaries keep every figure.
    rows += [[figure.title, *(_cell(group, figure) for group in groups)] for figure in comparison.figures]
    # The verdicts' ratio (the windows' geometric means over the repeats); the verdict rows below give its interval.
    rows.append([f"tokens/s vs {comparison.baseline.label} (geometric means over repeats)",
                 *(_speedup_cell(comparison, group) for group in groups)])
    if any(comparison.scaling(group) for group in groups):
        rows.append([SCALING_TITLE, *(_scaling_cell(comparison, group) for group in groups)])
    rows += verdict_rows(comparison)
    return header, rows


# The ideal is the one-process run's tokens/s times the ratio of the devices peaks count (`ideal_speedup`), not the
# processes': 2 processes sharing one machine's CPU ideally train as fast as 1.
SCALING_TITLE = "scaling efficiency (of the one-process run's tokens/s x the ratio of devices)"
VERDICT_TITLES = {"tokens_per_s": "tokens/s vs {} (95 % interval)", "step_s_median": "steady step vs {} (95 % interval)"}


def verdict_rows(comparison):
    """The rows of the verdicts: each speed figure against the baseline with its interval, the break-even with
    compilation, and the time to the target quality with and without compilation where a run reached it
    (`target_rows`)."""
    groups, baseline = comparison.groups, comparison.baseline

    def cell(group, text):
        return "(baseline)" if group is baseline else text

    rows = []
    for key, title in VERDICT_TITLES.items():
        found = [comparison.verdicts.get(group.label, {}).get(key) for group in groups]
        if any(found):
            rows.append([title.format(baseline.label), *(cell(group, verdict.cell() if verdict else "n/a")
                                                          for group, verdict in zip(groups, found))])
    evens = [comparison.break_even(group) for group in groups]
    if any(evens):
        # Runs whose steps differ in work from the baseline's are counted in tokens (`Comparison.break_even`).
        counted = {even.unit for even in evens if even}
        units = " or ".join(f"{unit}s" for unit in ("step", "token") if unit in counted)
        rows.append([f"break-even vs {baseline.label} (compile + {units})",
                     *(cell(group, even.text if even else "n/a") for group, even in zip(groups, evens))])
    return rows + target_rows(comparison)


def target_rows(comparison):
    """The time to the target quality with and without compilation, where a run reached it."""
    rows, groups = [], comparison.groups
    targets = [comparison.target_time(group) for group in groups]
    if any(targets):
        figure = FIGURES_BY_KEY["train_s"]

        reached = [comparison.target_reached(group) for group in groups]

        def target_cell(target, index, reached, repeats):
            if not target:
                return "n/a"
            # A median of the lucky repeats says so.
            return figure.text(target[index]) + (f" ({reached} of {repeats} reached it)" if reached < repeats else "")
        for index, title in enumerate(("time to target, with compilation (s)",
                                       "time to target, without compilation (s)")):
            rows.append([title, *(target_cell(target, index, *counts) for target, counts in zip(targets, reached))])
    return rows


def verdict_lines(comparison):
    """The noise floor, every verdict in words, why an interval may be too narrow, and every break-even."""
    lines = [stats.noise_floor_line(comparison.noise_floor)] if comparison.noise_floor or comparison.verdicts else []
    found = [verdict for by_figure in comparison.verdicts.values() for verdict in by_figure.values()]
    # Where every run trained loaded, the load is said once, not on each of a dozen lines; where some did, each
    # verdict names its own.
    labels = tuple(group.label for group in comparison.groups)
    every = stats.loaded_runs({group.label: group.results for group in comparison.groups}) == labels and found
    if every:
        lines.append("every run of this comparison trained on a loaded machine (its warnings say how): its verdicts "
                     "are not reliable")

    def said(verdict):
        return verdict.unqualified_text() if every else verdict.text
    lines += [said(verdict) for verdict in found]
    # Each way of training on one backend against the same way on the other: the verdict between the frameworks
    # that the baseline's alone, held to one backend's run, does not give.
    lines += [f"the same way on each backend: {said(verdict)}" for verdict in comparison.counterpart_verdicts]
    found += comparison.counterpart_verdicts
    lines += [f"interval warning: {text}" for text in dict.fromkeys(w for verdict in found for w in verdict.warnings)]
    lines += [f"break-even: {even.text}" for even in map(comparison.break_even, comparison.groups)
              if even and even.names_a_point]
    return lines


def ideal_speedup(result, single):
    """How many times the one-process run `single` the run `result` would train at perfect scaling: the ratio of
    the devices whose peak MFU divides by (`utilization.peak_devices`: a CPU counts one a machine, as its processes
    share the machine's cores). Results before that was recorded: `devices_used` and `processes.machines` by the
    same rule; before those, the process count."""
    def devices(run):
        recorded = (run.get("utilization") or {}).get("peak_devices")
        if recorded:
            return recorded
        if ((run.get("env") or {}).get("device") or {}).get("kind") == "cpu":
            return (run.get("processes") or {}).get("machines")
        return run.get("devices_used")
    mine, theirs = devices(result), devices(single)
    return mine / theirs if mine and theirs else run_processes(result)


def _scaling_cell(comparison, group):
    scaling = comparison.scaling(group)
    if scaling is None:
        return ""
    return scaling_text(scaling) + (": above the ideal, distrust it (see the warnings row)" if scaling["above_ideal"]
                                    else "")


def scaling_text(scaling):
    """'75% of 2x torch': a scaling efficiency (`Comparison.scaling`) and the ideal it is a share of."""
    efficiency = scaling["efficiency"]
    ideal = scaling.get("ideal_speedup", scaling["processes"])
    return ("n/a" if efficiency is None else f"{efficiency:.0%}") + f" of {ideal:g}x {scaling['against']}"


def describe_configuration(comparison):
    """The runs' shared configuration in one line: the data they read (`data.corpus`: a plugin's task may read
    data of its own, whatever --dataset says) and the settings of their task; a swept batch size, max length or
    block (absent from a comparison's shared configuration) reads 'per run'."""
    config, task = comparison.config, result_task(comparison.baseline.first)
    count, unit = (config["steps"], "step") if config.get("epochs") is None else (config["epochs"], "epoch")
    length = f"{count} {unit}{'s' * (count != 1)}"
    # A checkpoint's shape is its own, whatever --preset says (which then sets only defaults the line names itself).
    model = per_run_text(comparison, "checkpoint", checkpoint_text) if comparison.baseline.first["model"].get("path") \
        else f"preset {config['preset']}"
    parts = [corpus_of(comparison.baseline.first), model, f"{length} x batch {batch_text(config)}"]
    if task == "language-modelling":
        parts.append(f"block {config.get('max_len', 'per run')}")
    elif task == "translation":  # a plugin's task may have no lengths
        parts.append(f"max-len {config.get('max_len', 'per run')}")
    if task == "translation":
        parts.append(f"max-pairs {config.get('max_pairs') or 'all'}")
    if task in ("translation", "language-modelling"):  # a plugin's task may read no tokens (a classifier)
        parts += tokens_text(comparison)
    parts.append(f"seed {config['seed']}")
    if task == "translation" and not config.get("measure_only"):  # a measure-only run decodes nothing
        parts.append(f"{decoding_name(config.get('beam', 1), config.get('length_penalty', 0.6))} decoding")
    return ", ".join(parts)


def checkpoint_text(result):
    """'opus-mt-en-de (6 encoder and 6 decoder layers, d-model 512, 74,410,496 parameters)': a pretrained model
    family's checkpoint (`model.path`, as the single-run table names it) and the shape it built."""
    model = result["model"]
    if not model.get("path"):  # beside a checkpoint's run only where held with --force
        return f"none (preset {result['config']['preset']})"
    encoder, decoder = model.get("encoder_layers"), model.get("decoder_layers")
    layers = f"{encoder} encoder and {decoder} decoder layers" if encoder else f"{decoder} layers"
    return (f"{os.path.basename(os.path.normpath(model['path']))} ({layers}, d-model {model.get('d_model')}, "
            f"{model['parameters']:,} parameters)")


def per_run_text(comparison, name, text):
    """'NAME VALUE' where every run's `text(result)` is VALUE, else 'NAME per run (LABEL VALUE; ...)': a setting
    no label names, which runs held together with --force (or a sweep that moves it) may not share."""
    said = {group.label: group.choice_text(text) for group in comparison.groups}
    if len(set(said.values())) == 1:
        return f"{name} {next(iter(said.values()))}"
    return f"{name} per run ({'; '.join(f'{label} {value}' for label, value in said.items())})"


# How each clipping of the recipe (`recipe.CLIP_CHOICES`) reads after 'clip', given the norm.
CLIP_TEXTS = {"global": "global norm {:g}", "per-variable": "each gradient to norm {:g}", "none": "none"}


def training_settings(result):
    """{name: text} of what a run trained with beyond its data, length and steps: the optimizer recipe it recorded
    (`compile_options.optimizer_recipe`, the model family's under the user's options, as it trained: a warm-up
    longer than the run cut to its steps) and the dropout of the model it built (a preset's own: `char`'s 0.2)."""
    recipe = (result.get("compile_options") or {}).get("optimizer_recipe")
    if not recipe:  # results from before the recipe was recorded
        settings = {"AdamW peak learning rate": f"{config_value(result, 'learning_rate'):g}",
                    "optimizer recipe": "not recorded"}
    else:
        decay_steps, warmup_steps = recipe["decay_steps"], recipe["warmup_steps"]
        clip = CLIP_TEXTS.get(recipe["clip"], recipe["clip"] + " {:g}")
        steps = last_step(result)
        # A schedule longer than the run (a warm-up cut to its steps leaves the decay after the last update) is
        # said as far as it ran: the share of the peak the last update applied.
        last = last_rate_share(result, recipe)
        settings = {"AdamW peak learning rate": f"{recipe['learning_rate']:g}",
                    "warm-up": f"{warmup_steps}{f' of {steps}' if steps else ''} "
                               f"step{'s' * ((steps or warmup_steps) != 1)}",
                    "cosine decay": f"to {recipe['min_lr_ratio']:g} of the peak over {decay_steps} "
                                    f"step{'s' * (decay_steps != 1)}"
                                    + decay_reached_text(steps, warmup_steps, last),
                    "betas": f"{recipe['beta_1']:g}/{recipe['beta_2']:g}", "epsilon": f"{recipe['epsilon']:g}",
                    "weight decay": f"{recipe['weight_decay']:g} on "
                                    f"{'every weight' if recipe['decay'] == 'all' else recipe['decay']}",
                    "clip": clip.format(recipe["clip_norm"]) if recipe["clip_norm"] is not None else clip}
    dropout = result["model"].get("dropout")
    if dropout is not None:  # a plugin's model family may have none
        settings["dropout"] = f"{dropout:g}"
    return settings


def decay_reached_text(steps, warmup_steps, last):
    """' (reaching 0.55 of the peak)': how far the decay went by a run's last step (`last_rate_share`), or that it
    never began (its update `warmup_steps` + 1 applies the peak, the decay's first)."""
    if last is None:
        return ""
    share = "the peak" if round(last, 2) == 1 else f"{last:.2g} of the peak"
    if steps - 1 <= warmup_steps:
        return f" (not begun: the last step at {share})"
    return f" (reaching {share})"


def last_rate_share(result, recipe):
    """The learning rate of a run's last update as a share of the recipe's peak: the history's where it records the
    rate (`learning_rate`), else the recipe's warm-up and cosine decay at that update, as
    `keras_models.schedules.cosine_decay` computes it (not imported: the report process never imports Keras).
    None where the run has no steps."""
    last = (result.get("history") or [{}])[-1]
    if not recipe.get("learning_rate") or last.get("step") is None:
        return None
    if is_number(last.get("learning_rate")):
        return last["learning_rate"] / recipe["learning_rate"]
    warmup, decay = recipe["warmup_steps"], recipe["decay_steps"]
    update = min(last["step"] - 1, warmup + decay)  # the optimizer's iterations before the last update
    if update < warmup:
        return update / warmup
    cosine = 0.5 * (1 + math.cos(math.pi * (update - warmup) / decay)) if decay else 1.0
    return (1 - recipe["min_lr_ratio"]) * cosine + recipe["min_lr_ratio"]


def training_text(comparison):
    """The settings of `training_settings` in the configuration line's words, each run's where they differ."""
    names = dict.fromkeys(name for group in comparison.groups for result in group.results
                          for name in training_settings(result))
    return ", ".join(per_run_text(comparison, name, lambda result, name=name: training_settings(result).get(
        name, "not recorded")) for name in names)


# What a token is where '<kind> tokens' does not read (token files' ids: `TokenIds.kind`).
TOKEN_KINDS = {"token-ids": "tokens as token files' ids"}


def tokens_text(comparison):
    """['byte tokens (vocabulary 256)']: what a token is to every run, without which neither tokens/s nor
    perplexity reads (a run of bytes and one of sentencepiece pieces, held with --force: 'tokens per run')."""
    tokenizers = {tuple(((result.get("data") or {}).get("tokenizer") or {}).get(key)
                        for key in ("type", "vocab_size", "fingerprint"))
                  for group in comparison.groups for result in group.results}
    if len(tokenizers) > 1:
        return ["tokens per run"]
    kind, size, _ = tokenizers.pop() if tokenizers else (None, None, None)
    if not kind:  # a plugin's task may keep no tokenizer
        return []
    return [f"{TOKEN_KINDS.get(kind, f'{kind} tokens')}" + (f" (vocabulary {size:,})" if size else "")]


def context_lines(comparison):
    ranking = comparison.ranking()
    # One run's repeats are held to each other's losses; one run alone has nothing to be held to.
    parity = comparison.parity.lines() if comparison.parity.pairs or not comparison.single else []
    return [f"configuration: {describe_configuration(comparison)}, {training_text(comparison)}",
            *(f"held anyway (--force): {why}" for why in comparison.held_anyway),
            *scored_sentences_lines(comparison), *split_scored_lines(comparison),
            *signature_lines(comparison),
            *([f"ranking not reliable: {ranking['reason']}"] if ranking["reason"] else []),
            *parity, *energy_and_cost_lines(comparison),
            *(interval_lines(comparison) if comparison.single else verdict_lines(comparison)),
            *profile_lines(comparison)]


def said_once_or_each(comparison, text):
    """[(run label, what `text` says of its results)], or [(None, it)] where every run's is the same."""
    said = {group.label: group.choice_text(text) for group in comparison.groups}
    said = {label: said_of_run for label, said_of_run in said.items() if said_of_run}
    return [(None, next(iter(said.values())))] if len(set(said.values())) == 1 else list(said.items())


def scored_sentences_lines(comparison):
    """'test sentences scored: 370 of 500 (130 longer than --max-len 48)' (`scored_sentences_text`), once where
    every run's is the same, else once a run and why their quality figures are not held to each other's (runs of
    other lengths translate other sentences)."""
    said = said_once_or_each(comparison, scored_sentences_text)
    lines = [f"test sentences scored{f' of {label}' if label else ''}: {text}" for label, text in said]
    if len(said) > 1:
        lines.append("the runs scored different test sentences: their test figures (BLEU, chrF, loss) are not of "
                     "the same text")
    return lines


def split_scored_lines(comparison):
    """'test bytes scored: 512 of 201,451 (0.25 %); ...' (`split_scored_text`), once where every run's is the same,
    else once a run, as `signature_lines` says the signatures."""
    return [f"test {text.replace(' scored: ', f' scored of {label}: ', 1) if label else text}"
            for label, text in said_once_or_each(comparison, split_scored_text)]


def interval_lines(comparison):
    """How the intervals of one run's figures (`_single_run_cell`) were drawn, or why none is stated
    (`verdicts.figure_interval_gap`), and what may make them too narrow, in the verdicts' words
    (`verdicts.repeat_warnings`)."""
    # The repeats that have a steady window, as `verdicts.figure_interval` takes them.
    counts = (len(stats.steady_windows(result["history"])) for result in comparison.baseline.results)
    windows = [count for count in counts if count]
    # A compare --aa of one configuration: what its twin measured of the machine is said as beside verdicts.
    floor = [stats.noise_floor_line(comparison.noise_floor)] if comparison.noise_floor else []
    if not windows:
        return floor  # no steady window: no figure to hold an interval
    gap = stats.figure_interval_gap(comparison.baseline.results)
    if gap is not None:
        return [*floor, f"95 % intervals: none: {gap}"]
    repeats = len(windows)
    how = (f"Student's t over the logs of its {repeats} repeats' figures" if repeats > 1 else
           f"a bootstrap of the run's {windows[0]} steady timing windows")
    drawn = stats.Interval(stats.SPEED_FIGURE, 1.0, 1.0, 1.0, (repeats,), False, None, how)
    return [*floor, f"95 % intervals: {how}",
            *(f"interval warning: {text}" for text in stats.repeat_warnings(drawn))]


# The scores the table shows whose figure says little without sacrebleu's signature (its tokenizer, smoothing and
# version change the number): (figure key, name); a result keeps each in `metrics[key + '_signature']`.
SIGNED_SCORES = (("bleu", "BLEU"), ("chrf", "chrF"))


def signature_lines(comparison):
    """sacrebleu's signature of each score the table shows: once where every run's is the same, else once per run
    (the table's cells would not compare)."""
    shown = {figure.key for figure in comparison.figures}
    lines = []
    for key, name in SIGNED_SCORES:
        scored = any((result.get("metrics") or {}).get(key) is not None
                     for group in comparison.groups for result in group.results)
        if key not in shown or not scored:  # a measure-only comparison decoded nothing: no signature to name
            continue
        signatures = {group.label: group.choice_text(
            lambda result: (result.get("metrics") or {}).get(f"{key}_signature") or "not recorded")
            for group in comparison.groups}
        if len(set(signatures.values())) == 1:
            lines.append(f"{name} signature: {next(iter(signatures.values()))}")
        else:
            lines += [f"{name} signature of {label}: {signature}" for label, signature in signatures.items()]
    return lines


def profile_lines(comparison):
    """Where each run's --profile trace is and where its profiled steps' time went (its first repeat's; each
    repeat's is beside its own result)."""
    lines = []
    for group in comparison.groups:
        profile = group.first.get("profile") or {}
        if profile.get("steps"):
            lines.append(f"profile of {group.label}: steps {profile['steps'][0]}-{profile['steps'][-1]} in "
                         f"{profile['directory']}")
            operations = profile_operations_text(group.first)
            if operations:
                lines.append(f"  {operations}")
            against = None if group is comparison.baseline else \
                kinds_against_text(group.first, comparison.baseline.first)
            if against:
                lines.append(f"  against {comparison.baseline.label}, kernels a step by kind: {against}")
    return lines


def energy_and_cost_lines(comparison):
    """Why energy is missing where it is, and the cheapest run to the target quality where runs were priced."""
    missing = {group.label: reason for group in comparison.groups
               for reason in {(result.get("energy") or {}).get("reason") for result in group.results} if reason}
    if missing and len(set(missing.values())) == 1 and len(missing) == len(comparison.groups):
        lines = [f"energy: not measured, {next(iter(missing.values()))}"]
    else:
        lines = [f"energy of {label}: not measured, {reason}" for label, reason in missing.items()]
    lines += energy_scope_lines(comparison)
    if comparison.single:  # the cheapest of one run says nothing the table's cost row does not
        return lines
    priced = [group for group in comparison.groups if group.stat("usd_to_target").median is not None]
    # A run that reached the target in some repeats only is not ranked on the cost of those.
    reached = {group.label: comparison.target_reached(group) for group in priced}
    partly = [group for group in priced if reached[group.label][0] < reached[group.label][1]]
    lines += [f"cost to the target quality of {group.label}: {reached[group.label][0]} of {reached[group.label][1]} "
              f"repeats reached it, not ranked" for group in partly]
    priced = [group for group in priced if group not in partly]
    if priced:
        cheapest = min(priced, key=lambda group: group.stat("usd_to_target").median)
        figure = FIGURES_BY_KEY["usd_to_target"]
        lines.append(f"cheapest to the target quality: {cheapest.label}, {figure.text(cheapest.stat('usd_to_target').median)}"
                     f" USD (at {cheapest.first['cost']['price_per_hour']:g} USD/h)")
    elif not partly and any((group.first.get("cost") or {}).get("price_per_hour") is not None
                            for group in comparison.groups) \
            and any(_target_value(group.first.get("target")) for group in comparison.groups):
        lines.append("cheapest to the target quality: no run reached it")
    return lines


def energy_scope_lines(comparison):
    """What each measured run's joules hold (a GPU's counter leaves the host out): once where every run's counter
    counts the same, else a line per run whose counter differs from the first's. Results before 2026-12-02 did not
    say."""
    scopes = {group.label: f"({energy['source']}) counts {energy['counts']}" for group in comparison.groups
              for energy in [group.first.get("energy") or {}] if energy.get("source") and energy.get("counts")}
    if len(set(scopes.values())) == 1:
        return [f"energy {next(iter(scopes.values()))}"]
    return [f"energy of {label} {scope}" for label, scope in scopes.items()]


def rich_table(comparison, title=None):
    header, rows = table_cells(comparison)
    default = f"mtbench report: {comparison.baseline.label}" if comparison.single else "mtbench comparison"
    table = Table(title=Text(title or default))  # a label is no markup: 'jax:python=[venv]' as typed
    table.add_column(header[0])
    for label in header[1:]:
        table.add_column(label, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def to_markdown(comparison):
    header, rows = table_cells(comparison)

    def line(cells):
        return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", "<br>") for cell in cells) + " |"

    lines = [line(header), "|" + "---|" + "---:|" * (len(header) - 1)]
    lines += [line(row) for row in rows]
    lines += [""] + [f"- {text}" for text in context_lines(comparison)]
    return "\n".join(lines) + "\n"


def group_configuration(group):
    """`run_configuration` of a run's repeats: each key's value where they agree, else each repeat's in a list (runs
    held together with --force)."""
    configs = [run_configuration(result) for result in group.results]
    return {key: configs[0][key] if all(config[key] == configs[0][key] for config in configs)
            else [config[key] for config in configs] for key in RUN_CONFIG_KEYS}


def figure_intervals(group):
    """{window figure: {value, low, high}} of a run's repeats (`verdicts.figure_interval`, the interval a single
    run's table shows), None where it has no steady window; low and high None where it has one alone."""
    found = {}
    for key in stats.WINDOW_FIGURES:
        interval = stats.figure_interval(key, group.results)
        found[key] = None if interval is None else dict(zip(("value", "low", "high"), interval))
    return found


def summary(comparison):
    """Per run: its identity, its configuration, and every figure as median/min/max of the raw values (JSON and CSV
    carry these)."""
    entries = []
    for group in comparison.groups:
        entries.append({
            "label": group.label,
            "backend": group.first["backend"],
            "extras": list(group.first["extras"]),
            "dtype": group.dtype,
            "config": group_configuration(group),
            "hardware": group.hardware,
            "versions": group.versions(),
            "energy_counter": group.choice_text(energy_counter_text),
            **{key: group.choice_text(text) for key, _, text in RUN_CHOICES},
            "collectives": group.choice_text(collectives_text),
            "repeats": len(group.runs),
            "warnings": comparison.warnings(group),
            "sources": [run.source for run in group.runs],
            "figures": {figure.key: asdict(group.stat(figure.key)) for figure in FIGURES},
            "intervals": figure_intervals(group),
            "speedup": comparison.speedup(group),
            "processes": run_processes(group.first),
            "devices": group.first.get("devices_used") or 1,
            "scaling": comparison.scaling(group),
            "verdicts": {key: verdict.to_dict() for key, verdict in comparison.verdicts.get(group.label, {}).items()},
            "break_even": _as_dict(comparison.break_even(group)),
            "time_to_target": _target_dict(comparison.target_time(group), comparison.target_reached(group)),
        })
    return entries


def _as_dict(value):
    return None if value is None else value.to_dict()


def _target_dict(times, reached):
    return None if times is None else {"with_compilation_s": times[0], "without_compilation_s": times[1],
                                       "repeats_reached": reached[0], "repeats": reached[1]}


# What holds runs against each other: a single run's JSON (`Comparison.single`) leaves these out, as its table does,
# its summary entry the per-run ones; the parity stays where its repeats were held to each other's losses, an A/A
# noise floor where one was measured.
COMPARING_KEYS = ("baseline", "speedups", "scaling", "parity", "ranking", "noise_floor", "held_anyway", "verdicts",
                  "counterpart_verdicts", "break_even")
COMPARING_SUMMARY_KEYS = ("speedup", "scaling", "verdicts", "break_even")


def to_json_dict(comparison, whole=False):
    """The report's JSON; a single run's leaves out what compares (`COMPARING_KEYS`) unless `whole` (a compare
    JSON keeps its layout whatever number of runs it ended with)."""
    found = {
        "kind": REPORT_KIND,
        "baseline": comparison.baseline.label,
        "config": comparison.config,
        "summary": summary(comparison),
        "speedups": {group.label: comparison.speedup(group) for group in comparison.groups},
        "scaling": {label: scaling for label, scaling in
                    ((group.label, comparison.scaling(group)) for group in comparison.groups) if scaling is not None},
        "parity": comparison.parity.to_dict(),
        "ranking": comparison.ranking(),
        "noise_floor": comparison.noise_floor,
        "held_anyway": list(comparison.held_anyway),
        "verdicts": [verdict.to_dict() for by_figure in comparison.verdicts.values() for verdict in by_figure.values()],
        "counterpart_verdicts": [verdict.to_dict() for verdict in comparison.counterpart_verdicts],
        "break_even": [even.to_dict() for even in map(comparison.break_even, comparison.groups) if even],
    }
    if comparison.single and not whole:
        kept = {key for key, held in (("parity", comparison.parity.pairs), ("noise_floor", comparison.noise_floor),
                                      ("held_anyway", comparison.held_anyway)) if held}
        found = {key: value for key, value in found.items() if key not in COMPARING_KEYS or key in kept}
        for entry in found["summary"]:
            for key in COMPARING_SUMMARY_KEYS:
                del entry[key]
    return found


def to_json(comparison):
    return json.dumps(to_json_dict(comparison), indent=2) + "\n"


CSV_IDENTITY = ("label", "backend", "extras", "dtype", "hardware", "versions", "energy_counter",
                *(key for key, _, _ in RUN_CHOICES), "collectives", "repeats", "warnings")


def to_csv(comparison):
    """One row per run: what ran, its configuration (`RUN_CONFIG_KEYS`, a column each, so that a sweep's rows sort
    and filter in a spreadsheet), its figures. A timing has its median and its min and max over repeats, a window
    figure its 95 % interval too; other figures one value."""
    identity = CSV_IDENTITY[:CSV_IDENTITY.index("dtype") + 1]
    columns = [*identity, *RUN_CONFIG_KEYS, *CSV_IDENTITY[len(identity):]]
    for figure in FIGURES:
        columns += [figure.key, f"{figure.key}_min", f"{figure.key}_max"] if figure.is_timing else [figure.key]
        if figure.key in stats.WINDOW_FIGURES:
            # the interval's own centre (the table's and the verdicts'), which the median may lie outside
            columns += [f"{figure.key}_interval_value", f"{figure.key}_interval_low", f"{figure.key}_interval_high"]
    columns += ["speedup", "processes", "devices", "scaling_efficiency", "scaling_ideal_speedup", "scaling_above_ideal"]
    for key in stats.WINDOW_FIGURES:
        # A verdict's call stays the interval's; `_verdict_loaded` names the runs whose load makes it unreliable.
        columns += [f"{key}_ratio", f"{key}_ratio_low", f"{key}_ratio_high", f"{key}_verdict", f"{key}_verdict_loaded"]
    columns += ["break_even_steps", "break_even_tokens", "break_even_s", "time_to_target_s",
                "time_to_target_without_compile_s"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for entry in summary(comparison):
        row = {key: entry[key] for key in CSV_IDENTITY}
        row["extras"] = "+".join(entry["extras"])
        row.update({key: "; ".join(map(str, value)) if isinstance(value, list) else value
                    for key, value in entry["config"].items()})
        row["warnings"] = "; ".join(entry["warnings"])
        for figure in FIGURES:
            stat = entry["figures"][figure.key]
            row[figure.key] = stat["median"]
            if figure.is_timing:
                row[f"{figure.key}_min"], row[f"{figure.key}_max"] = stat["low"], stat["high"]
            if figure.key in stats.WINDOW_FIGURES:
                interval = entry["intervals"][figure.key] or {}
                row[f"{figure.key}_interval_value"] = interval.get("value")
                row[f"{figure.key}_interval_low"], row[f"{figure.key}_interval_high"] = \
                    interval.get("low"), interval.get("high")
        row["speedup"], row["processes"] = entry["speedup"], entry["processes"]
        row["devices"] = entry["devices"]
        scaling = entry["scaling"] or {}
        row["scaling_efficiency"], row["scaling_ideal_speedup"], row["scaling_above_ideal"] = \
            scaling.get("efficiency"), scaling.get("ideal_speedup"), scaling.get("above_ideal")
        for key, verdict in entry["verdicts"].items():
            row[f"{key}_ratio"], row[f"{key}_ratio_low"], row[f"{key}_ratio_high"], row[f"{key}_verdict"] = \
                verdict["ratio"], verdict["low"], verdict["high"], verdict["call"]
            row[f"{key}_verdict_loaded"] = "; ".join(verdict["loaded"])
        even, target = entry["break_even"] or {}, entry["time_to_target"] or {}
        row["break_even_steps"], row["break_even_tokens"], row["break_even_s"] = \
            even.get("steps"), even.get("tokens"), even.get("seconds")
        row["time_to_target_s"] = target.get("with_compilation_s")
        row["time_to_target_without_compile_s"] = target.get("without_compilation_s")
        writer.writerow({key: "" if value is None else value for key, value in row.items()})
    return buffer.getvalue()
