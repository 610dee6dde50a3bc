"""The hooks mtbench calls. Each `mtbench_register_*` hook is called once per process with a `register`
callable; `mtbench_keras_callbacks` once per training run, after keras has been imported on the run's backend."""

from mtbench import hookimpl

from mtbench_example.batch_counter import batch_counter
from mtbench_example.jsonl_reporter import JsonlReporter, log_path
from mtbench_example.loss_log import LossLog
from mtbench_example.tsv_dataset import TsvDataset


@hookimpl
def mtbench_register_extras(register):
    register(LossLog())


@hookimpl
def mtbench_register_datasets(register):
    register(TsvDataset())


@hookimpl
def mtbench_register_reporters(register):
    register(JsonlReporter())


@hookimpl
def mtbench_keras_callbacks(config):
    # Callbacks join every training run while this package is loaded, whatever its backend and extras, so this
    # one is opt-in: without a log file to write to there is nothing to add.
    path = log_path()
    if path is None:
        return None
    return [batch_counter(config, path)]  # imports keras, which mtbench has imported on the run's backend

