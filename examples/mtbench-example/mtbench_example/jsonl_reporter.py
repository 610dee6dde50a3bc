"""The reporter `example-jsonl`: one JSON line per result, appended to the file named by MTBENCH_EXAMPLE_LOG,
or printed on the console when it is not set."""

import json
import os

from mtbench import Reporter
from mtbench.figures import FIGURES, hardware, run_dtype, run_label

LOG_ENV = "MTBENCH_EXAMPLE_LOG"


def log_path():
    return os.environ.get(LOG_ENV) or None


def append_line(path, record):
    """Appends `record` to `path` as one JSON line (one write per line, so lines never interleave)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


class JsonlReporter(Reporter):
    name = "example-jsonl"
    description = f"one JSON line per result, appended to ${LOG_ENV} (else printed)"

    def report(self, result, console, complete):
        # `complete` is False for a partial result (training diverged or was interrupted): the evaluation's
        # figures are null then, and result["status"] says why.
        record = {
            "kind": "result",
            "complete": complete,
            "status": result["status"],
            "run": run_label(result),          # "jax+loss-log", as every mtbench output names the run
            "dtype": run_dtype(result),
            "hardware": hardware(result),
            "train_step": result["train_step"],
            "figures": {figure.key: figure.value(result) for figure in FIGURES},  # raw values, as in CSV/JSON
        }
        path = log_path()
        if path is None:
            console.print(json.dumps(record), markup=False, highlight=False, soft_wrap=True)
        else:
            append_line(path, {**record, "result": result})  # the file keeps the whole result too
