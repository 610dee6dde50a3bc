"""The plugin API's version, and the rule by which it changes (docs/plugins.md, "Compatibility").

`PLUGIN_API_VERSION` is "MAJOR.MINOR". MINOR grows when the API gains something a plugin written for the version
before it need not know about: a new method or attribute with a working default in the base class, a new export,
a new argument appended to a method mtbench calls. MAJOR grows only when a form that was deprecated stops working.

A plugin method written in an older form, one taking fewer of the trailing arguments than mtbench now passes, is
called with the arguments it takes (as pluggy calls a hook implementation with the arguments it names) and named
once per process in a deprecation warning with the form mtbench now calls. Such forms keep working for the rest
of their MAJOR version.

1.0: the first numbered version. It accepts the earlier documented forms `Reporter.report(result, console)` (before
`complete`) and `Extra.make_train_step(run, model)` (before `step`), deprecated; 2.0 may drop them.
1.1: `ProcessGroup.alone()`, where process 0 works by itself (checkpoints, the saved model) while the others go on;
`cores_text`, the cores and threads each process computed on, among `RUN_CHOICES`.
1.2: tasks (`Task`, `TaskData`, `Evaluator`, the hook `mtbench_register_tasks`, `ModelFamily.task`, default
'translation'); `Batch.inputs` (a decoder-only batch has no source); `Backend.host_sync_counter()`, with
`host_syncs_text` among `RUN_CHOICES`; `shown_figures`; `RunContext.attention_kinds` and `RunContext.task`.
1.3: `TrainStep.warmup_calls`; `ProcessGroup.sum(values)`; `Backend.reset_peak_device_bytes` deprecated (no longer
called: peaks count from the process's start on every backend).
1.4: the figures and their formatting (`FIGURES`, `run_label`...) move to `mtbench.figures`; their names in `mtbench`
and `mtbench.plugins.api` are deprecated.
1.5: `ModelFamily.optimizer_recipe(config)`, the family's AdamW recipe over mtbench's; `RunContext.attention_choice`.
1.6: `RunContext.step_choice`, what `--step` asked and chose.
1.7: `Extra.wraps_step`: an extra that wraps any step it is given, placed after one that joins by mtbench's choice;
`RunContext.dtype_choice`, what `--dtype` asked and chose; `device_info()`'s 'bfloat16'; `native_bfloat16`.
1.8: `Figure.task`, the task whose runs alone have a figure (`shown_figures` leaves it out of other tasks' tables).
1.9: `native_bfloat16` reads a compute capability as text too (JAX's '8.6', an AMD GPU's 'gfx942');
`accelerator_environment()`'s 'rocm_version'.
1.10: `Backend.step_profiler(directory)`, the backend's profiler of train steps (`--profile`).
1.11: the step profiler's optional `operations()`, where the trace's time went (the result's `profile.operations`).
1.12: `operations()`'s optional `kinds`, a device's kernels by kind; `kinds_per_step` and `kinds_against_text` in
`mtbench.figures`.
1.13: `ModelFamily.initialization(config)`, the scheme a family's fresh models are drawn with (`--init`).
1.14: `TokenStream`, and the tokenizer a language model's family brings (`stream`, `encode_text`, `decode_text`).
1.15: that tokenizer's optional `bytes_per_id()`, the bytes of text each id stands for (bits per byte on token files);
`ModelFamily.presets` and `default_steps`, the sizes --preset names for a family and their steps.
1.16: `ModelFamily.attention_dropout`, a model that drops attention probabilities at the run's dropout;
`RunContext.attention_dropout`, the share it drops.
1.17: `Backend.random_generator_state()` and `restore_random_generator_state(state)`, the framework's own generators
that a checkpoint keeps; `ProcessGroup.gather_bytes(data)`; `ModelFamily.recomputes_blocks`, a family whose blocks
recompute their activations when `model_options["remat"]` asks, and `RunContext.model_recomputes_blocks`.
1.18: `Extra.keeps_random_draws`, an extra whose run draws the random numbers the run without it draws;
`model_options["remat"]` may be a function that makes a function recompute (a policy's), in place of True.
1.19: `peak_measurement_text`'s optional `cpus`, how many CPUs a measured peak was measured on.
1.20: `Launch.device_ordinal(visible_devices)`, the device a process of several computes on (SLURM's one GPU a task).
1.21: `loss_scaling_choice_text` (float16's loss scaling, or 'none') among `RUN_CHOICES`; `energy_counter_text`.
1.22: `Backend.inference`, how `compile_inference` runs the model; `inference_text` among `RUN_CHOICES`.
1.23: `TrainStep.numerics()`, how a step computes its layer norms' statistics and its update (passed on by
`WrappingStep`); `layer_norm_text` and `optimizer_update_text` among `RUN_CHOICES`.
1.24: `peak_measurement_text`'s optional `threads`, the framework's threads a measured peak ran on.
1.25: `RunContext.dtype_choice`'s `by_extra`, the extra whose `config_changes` set the dtype; a configuration the
extras changed is checked again for the device.
1.26: `file_sha256` and `unusable_directory`; `Backend.compile_cache_state` records a directory that cannot be made.
1.27: `Backend.attention_kernels(fused, device, run)`, the run whose model's attention a dispatcher that chooses by
its inputs is asked about; the form without `run` is deprecated.
1.28: `framework_env_text` (the environment variables set that change the frameworks' arithmetic or kernels) among
`RUN_CHOICES`.
1.29: `peak_measurement_text`'s optional `other_processes_percent`, the CPUs' time other processes used while a
peak was measured.
1.30: `Launch.launch_dir`, a directory made for the launch's processes on one machine (None: none).
1.31: `ModelFamily.default_block_size(path)`, the block a pretrained checkpoint is read in by default;
`figures.split_scored_text` and `share_text`.
1.32: `Extra.parallelism`, how an extra lays one model's training over devices ('data', 'sharded data', 'tensor',
'pipeline'): runs of two backends laid out alike are held against each other.
1.33: `Extra.record`'s `warning`, a sentence that joins the run's warnings (`figures.run_warnings`).
1.34: `TrainStep.numerics()`'s `rounding_16_bit`, where the step rounds its 16-bit intermediates;
`rounding_16_bit_text` among `RUN_CHOICES`.
"""

PLUGIN_API_VERSION = "1.34"


def next_major(version=PLUGIN_API_VERSION):
    """The version in which the forms deprecated in `version` may stop working."""
    return f"{int(version.split('.')[0]) + 1}.0"
