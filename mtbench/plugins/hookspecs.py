"""The hooks a plugin may implement. Built-in plugins use them exactly as third-party ones do.

A plugin is a module (or object) with functions decorated by `mtbench.hookimpl`, registered through the
`mtbench` entry-point group (built-in plugins are registered the same way, by module). The `register_*` hooks are called once per process with a `register` callable;
a plugin calls it with each thing it provides. Plugin modules are imported in every process before a backend
is chosen, so they must not import keras, jax or torch at module level: do that inside methods.
"""

from pluggy import HookimplMarker, HookspecMarker

hookspec = HookspecMarker("mtbench")
hookimpl = HookimplMarker("mtbench")


@hookspec
def mtbench_register_backends(register):
    """Register backends: call `register(backend)` with instances of `mtbench.Backend`.

    A backend names the Keras backend it runs on, sets the process up before keras is imported, and answers
    the questions timing needs (synchronise the device, peak device memory, versions, device name)."""


@hookspec
def mtbench_register_extras(register):
    """Register extras: call `register(extra)` with instances of `mtbench.Extra`.

    An extra changes how a backend trains (a fused kernel, a compiler, data parallelism, a dtype policy).
    It declares the backends it serves and the extras it conflicts with, says why it cannot run on this
    machine, and records what it really did in the result JSON."""


@hookspec
def mtbench_register_datasets(register):
    """Register datasets: call `register(dataset)` with instances of `mtbench.Dataset`.

    A dataset yields (source, target) sentence pairs from local files or installed packages; it never
    downloads."""


@hookspec
def mtbench_register_models(register):
    """Register model families: call `register(family)` with instances of `mtbench.ModelFamily`.

    A family is what `--model NAME[:PATH]` names: it builds the Keras model a run trains (with keras and
    keras.ops only, so every backend runs it), and may bring pretrained weights and its own tokenizer."""


@hookspec
def mtbench_register_tasks(register):
    """Register tasks: call `register(task)` with instances of `mtbench.Task`.

    A task is what a run trains on and how it is scored (translation: sentence pairs, BLEU; language modelling: a
    token stream, perplexity): a model family names it (`ModelFamily.task`)."""


@hookspec
def mtbench_register_reporters(register):
    """Register reporters: call `register(reporter)` with instances of `mtbench.Reporter`.

    A reporter is handed every result a command writes (a dict in the result-JSON schema, docs/results.md),
    complete or partial, once it is on disk: by `train`, `compare` and `report` when the user names it."""


@hookspec
def mtbench_keras_callbacks(config):
    """Return a list of `keras.callbacks.Callback` to run during training, or None.

    Called after the backend is set, so keras may be imported here. The training loop calls
    on_train_begin/end and on_train_batch_begin/end; `logs` carries `loss` and `accuracy`."""
