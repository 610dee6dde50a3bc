"""`mtbench train --run-file RUN.json`: a run's whole configuration in one file, as `compare` and `rerun` hand it
to the process that trains it, instead of rebuilding a command line. The file names its format; a key this
mtbench does not know is refused in one line, so no mtbench trains a configuration it would read otherwise."""

from mtbench.errors import MtbenchError
from mtbench.runner.config import TrainConfig
from mtbench.runner.files import read_json, write_json_atomic

RUN_FILE_FORMAT = 1
WHAT = "an mtbench run file"
# Its `kind`, as results, compare and report JSONs name theirs, so that a reader of a folder of JSON files (`report
# --history` over a compare's `.runs`) tells it from a result; files written before it carried one are told by
# their format key (`is_run_file`).
RUN_FILE_KIND = "mtbench-run-file"


def write_run_file(path, config):
    write_json_atomic(path, {"kind": RUN_FILE_KIND, "mtbench_run_file": RUN_FILE_FORMAT, "config": config.to_dict()})


def is_run_file(data):
    return isinstance(data, dict) and (data.get("kind") == RUN_FILE_KIND or "mtbench_run_file" in data)


def read_run_file(path):
    """The TrainConfig of the run file at `path`."""
    data = read_json(path, WHAT)
    if not isinstance(data, dict) or "mtbench_run_file" not in data or not isinstance(data.get("config"), dict):
        raise MtbenchError(f"{path}: not {WHAT}")
    if data["mtbench_run_file"] != RUN_FILE_FORMAT:
        raise MtbenchError(f"{path}: a run file of format {data['mtbench_run_file']!r}; this mtbench reads format "
                           f"{RUN_FILE_FORMAT}")
    return TrainConfig.recorded_in(path, data["config"])
