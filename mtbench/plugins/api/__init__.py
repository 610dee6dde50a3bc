"""The public plugin API: what a plugin (built-in or third-party) may use. `mtbench` re-exports all of it.

- `kinds`: the things plugins register (Backend, Extra, Dataset, Reporter) and the RunContext they see;
- `models`: model families (`--model`), the tokenizers they bring and the special token ids;
- `processes`: where a process stands among the run's processes (`Launch`) and what joins them (`ProcessGroup`);
- `tasks`: what a run trains on and how it is scored (`Task`), the data a task prepares and its evaluator;
- `steps`: the train-step interface, Keras's own step, a base for wrapping steps, and the Batch a step and
  `Extra.verify` receive;
- `figures`: the figures of a result as every mtbench output shows them, for reporters;
- `host`: facts about the host and a timing helper, for backends;
- `versioning`: `PLUGIN_API_VERSION` and the rule by which it changes.
"""

from mtbench.errors import MtbenchError, RunFailure
from mtbench.plugins.api.figures import (FIGURES, FIGURES_BY_KEY, OTHERS_BOUND, RUN_CHOICES, SCATTER_BOUND, SIZE_KEYS,
                                         STEAL_BOUND, Figure, attention_text, compile_cache_text, cores_text,
                                         figure_text, hardware, host_syncs_text, matmul_precision_text, peak_measurement_text, run_dtype,
                                         run_label, run_name, run_processes, run_warnings, scored_sentences_text,
                                         shown_figures, size_label, train_step_text, training_peak_bytes)
from mtbench.plugins.api.host import cpu_count, cpu_model, cudnn_version_text, median_flops_per_s, peak_host_bytes
from mtbench.plugins.api.kinds import Backend, Dataset, Extra, Reporter, RunContext, TrackedRun
from mtbench.plugins.api.processes import Launch, ProcessGroup
from mtbench.plugins.api.models import ModelFamily, ModelShape, SpecialTokens, Tokenizer
from mtbench.plugins.api.tasks import Evaluator, Task, TaskData
from mtbench.plugins.api.steps import Batch, KerasTrainStep, TrainStep, WrappingStep, uneven_split_reason
from mtbench.plugins.api.versioning import PLUGIN_API_VERSION
from mtbench.plugins.hookspecs import hookimpl

__all__ = [
    "Backend", "Extra", "Dataset", "Reporter", "RunContext", "TrackedRun",
    "ModelFamily", "ModelShape", "SpecialTokens", "Tokenizer",
    "Task", "TaskData", "Evaluator",
    "TrainStep", "KerasTrainStep", "WrappingStep", "Batch", "uneven_split_reason", "Launch", "ProcessGroup",
    "Figure", "FIGURES", "FIGURES_BY_KEY", "shown_figures", "RUN_CHOICES", "figure_text", "train_step_text", "host_syncs_text", "attention_text",
    "matmul_precision_text", "compile_cache_text", "cores_text", "peak_measurement_text", "scored_sentences_text",
    "run_warnings", "SCATTER_BOUND", "OTHERS_BOUND", "STEAL_BOUND", "training_peak_bytes", "hardware", "run_dtype", "run_label", "run_name", "run_processes", "size_label", "SIZE_KEYS",
    "cpu_count", "cpu_model", "cudnn_version_text", "median_flops_per_s", "peak_host_bytes",
    "MtbenchError", "RunFailure", "hookimpl", "PLUGIN_API_VERSION",
]
