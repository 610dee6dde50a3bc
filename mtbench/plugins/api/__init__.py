"""The public plugin API: what a plugin (built-in or third-party) may use. `mtbench` re-exports all of it.

- `kinds`: the things plugins register (Backend, Extra, Dataset, Reporter) and the RunContext they see;
- `models`: model families (`--model`), the tokenizers they bring and the special token ids;
- `processes`: where a process stands among the run's processes (`Launch`) and what joins them (`ProcessGroup`);
- `tasks`: what a run trains on and how it is scored (`Task`), the data a task prepares and its evaluator;
- `steps`: the train-step interface, Keras's own step, a base for wrapping steps, and the Batch a step and
  `Extra.verify` receive;
- `host`: facts about the host and a timing helper, for backends;
- `versioning`: `PLUGIN_API_VERSION` and the rule by which it changes.

The figures and their formatting (`FIGURES`, `run_label`...) are in `mtbench.figures`; their old names here and
in `mtbench` still work, deprecated since 1.4.
"""

import warnings

from mtbench.errors import MtbenchError, RunFailure
from mtbench.plugins.api.host import (cpu_count, cpu_model, cudnn_version_text, file_sha256, median_flops_per_s,
                                      native_bfloat16, peak_host_bytes, unusable_directory)
from mtbench.plugins.api.kinds import Backend, Dataset, Extra, Reporter, RunContext, TrackedRun
from mtbench.plugins.api.processes import Launch, ProcessGroup
from mtbench.plugins.api.models import ModelFamily, ModelShape, SpecialTokens, Tokenizer, TokenStream
from mtbench.plugins.api.tasks import Evaluator, Task, TaskData
from mtbench.plugins.api.steps import Batch, KerasTrainStep, TrainStep, WrappingStep, uneven_split_reason
from mtbench.plugins.api.versioning import PLUGIN_API_VERSION
from mtbench.plugins.hookspecs import hookimpl

__all__ = [
    "Backend", "Extra", "Dataset", "Reporter", "RunContext", "TrackedRun",
    "ModelFamily", "ModelShape", "SpecialTokens", "Tokenizer", "TokenStream",
    "Task", "TaskData", "Evaluator",
    "TrainStep", "KerasTrainStep", "WrappingStep", "Batch", "uneven_split_reason", "Launch", "ProcessGroup",
    "cpu_count", "cpu_model", "cudnn_version_text", "median_flops_per_s", "native_bfloat16", "peak_host_bytes",
    "file_sha256", "unusable_directory", "MtbenchError", "RunFailure", "hookimpl", "PLUGIN_API_VERSION",
]

# The names that moved to mtbench.figures in 1.4, still served here (and by `mtbench`) with a warning.
MOVED_TO_FIGURES = frozenset({
    "Figure", "FIGURES", "FIGURES_BY_KEY", "shown_figures", "RUN_CHOICES", "figure_text", "train_step_text",
    "host_syncs_text", "attention_text", "matmul_precision_text", "compile_cache_text", "cores_text",
    "peak_measurement_text", "scored_sentences_text", "run_warnings", "SCATTER_BOUND", "OTHERS_BOUND", "STEAL_BOUND",
    "training_peak_bytes", "hardware", "run_dtype", "run_label", "run_name", "run_processes", "size_label",
    "SIZE_KEYS",
})


def moved_names_of(module_name):
    """A module `__getattr__` serving the names that moved to `mtbench.figures`, each with a DeprecationWarning."""
    def __getattr__(name):
        if name not in MOVED_TO_FIGURES:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        from mtbench import figures
        warnings.warn(f"mtbench.{name} moved to mtbench.figures.{name}; the old name is deprecated since plugin API "
                      "1.4", DeprecationWarning, stacklevel=2)
        return getattr(figures, name)
    return __getattr__


__getattr__ = moved_names_of(__name__)
