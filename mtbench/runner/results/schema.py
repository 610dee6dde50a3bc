"""The result JSON: what it holds, how it is checked, and where its sidecar files live."""

import json
import math
import sys

from mtbench.figures import is_number
from mtbench.runner.config import INPUT_FILE_KEYS

# 1: the first schema. 2: `compile_options` says which extras asked for each option and what they applied to
# (`requested_by_extras`, `applies_to`); `env.mtbench_git_commit` is null unless mtbench runs from its own checkout.
# 3: `processes` (the run's processes: world size, launcher, collectives; a result without it is a run of one).
# 4: `config.matmul_precision` and `config.measure_only` (a completed measure-only run has no quality figures);
# `env.matmul_precision` (what each framework reports it set), `model.attention` names the kernel class,
# `train_step_detail`, `memory.training` (per device, training alone), and the compile cache per program.
# Added under 4, as nothing existing changed: `machine_load` (the host's load around training), absent before.
# 5: tasks: `config.task` names it (a result without it is a translation run); `data`, `metrics` and the files
# beside the result are the task's (a language model has perplexity and bits per byte, and no BLEU keys).
# Added under 5: `model.attention.arithmetic` (the dtypes of the attention's matmuls, sums, scores and softmax),
# and its `probability_dropout` (absent: none dropped); `loss_scaling` (float16's, null otherwise) and
# `extras_keeping_draws`, absent before; `utilization.peak_cpus` (how many CPUs a measured peak was measured on);
# `processes.machines` (the machines the processes span, which `cost` counts), absent before;
# `train_step_numerics` (the step's layer-norm statistics and optimizer update, in words), absent before;
# `utilization.peak_threads` (the framework's threads a measured peak ran on), absent before;
# `machine_load.gpu_other_processes` (other processes holding a context on the run's GPUs), absent before;
# `memory.host_child_processes` and `memory.host_bytes_children` (what the child processes hold as the run ends,
# part of the host peak);
# `utilization.peak_other_processes_percent` (the CPUs' time other processes used while a peak was measured);
# `way_of_training` (how the extras lay the training over devices, and the extras several backends serve);
# `train_step_numerics.rounding_16_bit` (where the step rounds its 16-bit intermediates), absent before.
# A result of an earlier version still reads; docs/results.md describes every field.
SCHEMA_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
# The kinds of JSON mtbench's report writes besides results and compare JSONs: `report` refuses them as input by name.
HISTORY_KIND = "mtbench-history"
REGRESSION_KIND = "mtbench-regression"
# The compare JSON's layout (`compare_json.combined_json`); a report refuses a later one, whose runs it may misread.
COMPARE_SCHEMA_VERSION = 1
# completed: every figure exists. interrupted (a signal) and diverged (a NaN or infinite loss) are partial
# results: the figures of the evaluation after training are null, and `status_reason` says why.
STATUSES = ("completed", "interrupted", "diverged", "failed")
PARTIAL_STATUSES = ("interrupted", "diverged", "failed")


def is_evaluation_scores(data):
    """Whether `data` is what `mtbench evaluate --out` writes (`inference.evaluate_translator`'s or `score_text`'s
    scores): a saved model's scores on a test set, BLEU and chrF with their signatures or a language model's loss
    and bits per byte; no run, and no schema_version (`report` refuses it by name)."""
    return (isinstance(data, dict) and "schema_version" not in data and isinstance(data.get("model"), str)
            and "backend" in data and ("bleu_signature" in data or "bits_per_byte" in data))


# Required keys and the types their values may take (None: the figure does not exist in this run, e.g. device
# memory on a CPU, which no framework reports, or a figure a partial result did not get to).
NUMBER = (int, float)
MAYBE_NUMBER = (int, float, type(None))
MAYBE_STR = (str, type(None))
SCHEMA = {
    "schema_version": int,
    "status": str,
    "status_reason": MAYBE_STR,
    "created": str,
    "backend": str,
    "extras": list,
    "extras_record": dict,
    "devices_used": int,
    # The settings a report reads of every run (the whole configuration is the run's TrainConfig).
    "config": {"steps": (int, type(None)), "seed": int, "preset": MAYBE_STR, "batch_size": (int, type(None)),
               "dtype": str},
    "compile_options": dict,
    "train_step": str,
    "env": {"python": str, "keras": str, "jax": (str, type(None)), "torch": (str, type(None)),
            "device": dict, "cpu_model": str, "cpu_count": int, "platform": str,
            "mtbench": str, "mtbench_git_commit": (str, type(None))},
    "data": {},  # the task's own record (`TaskData.record`): a plugin's task holds what it chooses
    "model": {"parameters": int},
    "timing": {"compile_s": MAYBE_NUMBER, "first_steps_s": NUMBER, "shapes_compiled": int,
               "step_s_median": MAYBE_NUMBER, "step_s_p90": MAYBE_NUMBER, "tokens_per_s": MAYBE_NUMBER,
               "train_s": NUMBER, "total_s": NUMBER, "phases_s": dict, "steps": int},
    "utilization": {"model_flops_per_s": MAYBE_NUMBER, "peak_flops_per_s": MAYBE_NUMBER, "mfu": MAYBE_NUMBER},
    "memory": {"peak_host_bytes": int, "peak_device_bytes": (int, type(None))},
    "metrics": {},  # the task's `metrics` (`Evaluator.evaluate`): a plugin's task names its own
    "history": list,
}
# What both built-in tasks record of their data and losses (a plugin's task need not: docs/plugins.md).
BUILTIN_TASK_KEYS = {"data": {"corpus": str, "origin": str, "tokenizer": dict},
                     "metrics": {"train_loss": MAYBE_NUMBER, "val_loss": MAYBE_NUMBER, "test_loss": MAYBE_NUMBER}}
# What each built-in task adds to the schema; a plugin's task is checked by the common keys.
TASK_SCHEMAS = {
    "translation": {
        "data": {**BUILTIN_TASK_KEYS["data"], "pairs": dict, "dropped_too_long": dict},
        "metrics": {**BUILTIN_TASK_KEYS["metrics"], "val_accuracy": MAYBE_NUMBER, "test_accuracy": MAYBE_NUMBER,
                    "bleu": MAYBE_NUMBER, "chrf": MAYBE_NUMBER, "bleu_signature": MAYBE_STR,
                    "chrf_signature": MAYBE_STR},
        "hypotheses_file": MAYBE_STR, "references_file": MAYBE_STR},
    "language-modelling": {
        "data": {**BUILTIN_TASK_KEYS["data"], "bytes": (dict, type(None)), "tokens": dict, "block_size": int},
        "metrics": {**BUILTIN_TASK_KEYS["metrics"],
                    **{name: MAYBE_NUMBER for name in ("val_perplexity", "test_perplexity", "val_bits_per_byte",
                                                       "test_bits_per_byte")}}},
}
# Null only in a partial result (a plugin's task: none, its metrics are its own).
COMPLETED_FIGURES = ("metrics.train_loss", "metrics.val_loss", "metrics.test_loss")
FIGURES_OF_COMPLETED_RUNS = {
    "translation": (*COMPLETED_FIGURES, "metrics.val_accuracy", "metrics.test_accuracy", "metrics.bleu",
                    "metrics.chrf", "metrics.bleu_signature", "metrics.chrf_signature", "hypotheses_file",
                    "references_file"),
    "language-modelling": (*COMPLETED_FIGURES, "metrics.val_perplexity", "metrics.test_perplexity",
                           "metrics.val_bits_per_byte", "metrics.test_bits_per_byte"),
}
# Bits per byte needs the bytes each token stands for, which token files do not tell (their `data.bytes` null).
FIGURES_OF_KNOWN_BYTES = ("metrics.val_bits_per_byte", "metrics.test_bits_per_byte")
# e to a loss past a float's range (a run blown up to a finite loss) is no number: its perplexity is null.
PERPLEXITY_LOSSES = {"metrics.val_perplexity": "metrics.val_loss", "metrics.test_perplexity": "metrics.test_loss"}
LARGEST_EXPONENT = math.log(sys.float_info.max)


def result_task(result):
    """The task a result's run trained on: `config.task`, or translation for results before schema 5."""
    config = result.get("config")
    task = config.get("task") if isinstance(config, dict) else None
    return task if isinstance(task, str) and task else "translation"


# Lists whose items a report reads as objects or names.
LIST_ITEMS = {"history": dict, "extras": str}
# What a report reads of every step of `history`.
HISTORY_ITEM = {"step": int, "loss": MAYBE_NUMBER}
# Values a report and a rerun read as counts or paths (the files a run reads), which a result of an earlier version
# may lack: where present, of their kind (a result edited to 'two' processes ended in a TypeError deep inside
# `report`).
OPTIONAL_COUNTS = ("processes.world_size", "processes.processes", "processes.devices_per_process",
                   "processes.machines")
OPTIONAL_PATHS = tuple(f"config.{key}" for key in INPUT_FILE_KEYS)
# Sections a result of an earlier version may lack, or hold null: where present, objects.
OPTIONAL_OBJECTS = ("machine_load", "processes", "cost", "energy", "host_syncs", "target", "loss_scaling",
                    "model.attention", "memory.training", "train_step_chosen")


def _value_at(result, path):
    """The value at a dotted `path` of `result`, None where any part of it is missing (or `path` is None)."""
    if path is None:
        return None
    value = result
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _timing_errors(item, number):
    """What the figures divide by and take logarithms of, held to what a run writes: a step's seconds finite and
    above 0 (or null), its tokens not below 0, its window's steps at least 1 (a window of 0 steps made an interval
    of no data, and the gate passed it)."""
    seconds, tokens, window = item.get("seconds"), item.get("tokens"), item.get("window_steps")
    errors = []
    if seconds is not None and not (is_number(seconds) and 0 < seconds < math.inf):
        errors.append(f"history[{number}].seconds: {seconds!r} is not a time above 0")
    if tokens is not None and not (is_number(tokens) and tokens >= 0):
        errors.append(f"history[{number}].tokens: {tokens!r} is not a count")
    if window is not None and not (isinstance(window, int) and not isinstance(window, bool) and window >= 1):
        errors.append(f"history[{number}].window_steps: {window!r} is not a count of steps (at least 1)")
    return errors


def schema_errors(result):
    """Every way `result` departs from the schema, as 'key: problem' strings (empty when it conforms)."""
    task = result_task(result)
    errors = _type_errors(result, SCHEMA, "") + _type_errors(result, TASK_SCHEMAS.get(task, {}), "")
    for key, item_type in LIST_ITEMS.items():
        items = result.get(key)
        if isinstance(items, list) and not all(isinstance(item, item_type) for item in items):
            errors.append(f"{key}: an item is not {'an object' if item_type is dict else 'a string'}")
    for number, item in enumerate(result.get("history") if isinstance(result.get("history"), list) else ()):
        problems = ((_type_errors(item, HISTORY_ITEM, f"history[{number}].") or _timing_errors(item, number))
                    if isinstance(item, dict) else [])
        errors += problems[:1]
        if problems:
            break
    timing = result.get("timing") if isinstance(result.get("timing"), dict) else {}
    for key in SCHEMA["timing"]:  # a run measures each, or writes null: NaN showed as 'nan (nan–nan)' in a table
        value = timing.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            errors.append(f"timing.{key}: {value!r} is not a measured time or rate")
    for path in OPTIONAL_OBJECTS:
        value = _value_at(result, path)
        if value is not None and not isinstance(value, dict):
            errors.append(f"{path}: {type(value).__name__} is not an object")
    for path in OPTIONAL_COUNTS:
        value = _value_at(result, path)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            errors.append(f"{path}: {value!r} is not a count (at least 1)")
    for path in OPTIONAL_PATHS:
        value = _value_at(result, path)
        if value is not None and not isinstance(value, str):
            errors.append(f"{path}: {type(value).__name__} is not a path")
    version = result.get("schema_version")
    if isinstance(version, int) and version not in READABLE_VERSIONS:
        who = "a newer mtbench wrote it" if version > max(READABLE_VERSIONS) else "no mtbench writes it"
        errors.insert(0, f"schema_version: {version} is not one this mtbench reads "
                         f"({', '.join(map(str, READABLE_VERSIONS))}); {who}")
    status = result.get("status")
    if status not in STATUSES:
        errors.append(f"status: {status!r} is not one of {', '.join(STATUSES)}")
    elif status == "completed" and isinstance(result.get("config"), dict) and not result["config"].get("measure_only") \
            and not (isinstance(result.get("metrics"), dict) and result["metrics"].get("skipped")):  # stopped late
        data = result.get("data")
        bytes_unknown = isinstance(data, dict) and data.get("bytes", {}) is None
        for path in FIGURES_OF_COMPLETED_RUNS.get(task, ()):
            if bytes_unknown and path in FIGURES_OF_KNOWN_BYTES:
                continue
            loss = _value_at(result, PERPLEXITY_LOSSES.get(path))
            if _value_at(result, path) is None and not (isinstance(loss, (int, float)) and loss > LARGEST_EXPONENT):
                errors.append(f"{path}: null in a completed result")
    return errors


def read_status(path):
    """The status of the result file at `path`, or None when it is not a readable mtbench result."""
    result = _read_result(path)
    return result.get("status") if result else None


def resumable(path):
    """Whether the result file at `path` is of a run `--resume` continues: a partial one, or one whose training
    completed and whose evaluation a signal stopped, its trained weights checkpointed (`unevaluated_checkpoint`)."""
    result = _read_result(path)
    return bool(result) and (result.get("status") in PARTIAL_STATUSES
                             or bool((result.get("metrics") or {}).get("unevaluated_checkpoint")))


def _read_result(path):
    try:
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def _type_errors(result, schema, prefix):
    errors = []
    for key, expected in schema.items():
        name = f"{prefix}{key}"
        if key not in result:
            errors.append(f"{name}: missing")
        elif isinstance(expected, dict):
            if isinstance(result[key], dict):
                errors.extend(_type_errors(result[key], expected, f"{name}."))
            else:
                errors.append(f"{name}: expected an object")
        elif isinstance(result[key], bool) or not isinstance(result[key], expected):
            errors.append(f"{name}: {type(result[key]).__name__} is not {_kind_words(expected)}")
    return errors


# What a JSON reader calls the Python types the schema expects.
JSON_KIND_WORDS = {int: "an integer", float: "a number", str: "a string", list: "a list", type(None): "null"}


def _kind_words(expected):
    """'a number', 'a string or null': the kinds of `expected` (a type or a tuple of them) as JSON names them."""
    kinds = expected if isinstance(expected, tuple) else (expected,)
    if int in kinds and float in kinds:  # JSON has numbers, not Python's two
        kinds = ("number", *(kind for kind in kinds if kind not in (int, float)))
    words = list(dict.fromkeys("a number" if kind == "number" else JSON_KIND_WORDS.get(kind, kind.__name__)
                               for kind in kinds))
    return " or ".join(words)


def result_stem(result_path):
    """A result file's path without its `.json`: what the files beside it (sidecars, logs, folders) are named by."""
    return result_path.removesuffix(".json")


def sidecar_paths(result_path):
    """Where the hypotheses and references of a result file live: beside it, one sentence a line."""
    stem = result_stem(result_path)
    return f"{stem}.hyp.txt", f"{stem}.ref.txt"
