"""The built-in tasks (`mtbench.Task`): translation and language modelling, registered through the plugin hook
`mtbench_register_tasks` exactly as a third-party task is. They live in the runner because they use its data
readers, tokenizers and decoders; the runner names them to the plugin manager (`manager.add_builtin_plugin`)."""

BUILTIN_TASK_MODULES = ("mtbench.runner.tasks.translation", "mtbench.runner.tasks.language_modelling")
