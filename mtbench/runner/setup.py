"""Setting a run up: the plugins it uses (checked before anything is imported), the process (keras on the chosen
backend, the device, the extras that can run there), and the model with its optimizer and train step."""

import contextlib
import copy
import dataclasses
import numbers
import os
import sys
from dataclasses import dataclass

from mtbench.errors import MtbenchError, RunFailure
from mtbench.plugins.api import (Backend, Extra, KerasTrainStep, Reporter, RunContext, TrainStep, WrappingStep,
                                 uneven_split_reason)
from mtbench.plugins.manager import A_DICT, A_REASON
from mtbench.runner.choices import (choose_compiled_step, choose_dtype, choose_fused_attention, dtype_refusal,
                                    step_compiling_extra)
from mtbench.runner.config import EXTRA_OPTIONS
from mtbench.runner.data.weights_file import PRETRAINED, drawn_scheme
from mtbench.runner.launch import devices_spanned, share_cores
from mtbench.runner.loop.recipe import optimizer_recipe
from mtbench.runner.measurement.flops import StepFlops


@dataclass
class RunPlugins:
    """The backend, extras, reporters and model family a run uses, looked up in the registry."""
    backend: object
    extras: list
    reporters: list
    registry: object
    model: object = None       # the ModelFamily of --model
    model_path: str = None     # its PATH, for a family that takes one
    task: object = None        # the Task the family trains on (`ModelFamily.task`)

    def task_code(self):
        """A block running the task's own code: its errors name the task."""
        return self.registry.plugin_code("tasks", self.task.name)

    def model_code(self):
        """A block running the model family's own code: its errors name the family."""
        return self.registry.plugin_code("models", self.model.name)

    def extra_code(self, extra):
        """A block running an extra's own code: its errors name the extra (and its plugin, for a crash)."""
        return self.registry.plugin_code("extras", extra.name)

    def ask_extras(self, method, *args):
        """[(extra, what its `method(*args)` returned)] for every extra of the run, in the order given, each in
        its own code's block: the one place the extras' hooks are called from."""
        answers = []
        for extra in self.extras:
            with self.extra_code(extra):
                answers.append((extra, self.registry.call("extras", extra, method, *args)))
        return answers


def resolve_backend(name, registry):
    backend = registry.lookup("backends", name)
    reason = (registry.answer("backends", backend, "missing_framework", expect=A_REASON)
              or registry.unimplemented_refusal("backends", backend))
    if reason:
        raise MtbenchError(reason)
    return backend


def resolve_extras(names, backend, registry):
    """The requested extras, checked for existence, backend and conflicts before anything is imported."""
    extras = []
    for name in names:
        extra = registry.lookup("extras", name)
        if backend.name not in extra.backends:
            raise MtbenchError(f"extra '{name}' serves the {', '.join(extra.backends)} backend(s), "
                               f"not '{backend.name}'")
        extras.append(extra)
    for extra in extras:
        clash = [other for other in names if other in extra.conflicts]
        if clash:
            raise MtbenchError(f"extra '{extra.name}' cannot run together with '{clash[0]}'")
    return extras


def resolve_reporters(names, registry):
    """The reporters named (once each), checked to run here (a tracker's library installed)."""
    reporters = []
    for name in dict.fromkeys(names):
        reporter = registry.lookup("reporters", name)
        with registry.plugin_code("reporters", name):
            reason = reporter.missing_reason()
        if reason:
            raise MtbenchError(f"reporter '{name}': {reason}")
        reporters.append(reporter)
    return reporters


def resolve_model(config, registry):
    """The model family of --model NAME[:PATH] and its path, checked (files present, options it takes) before
    anything is imported."""
    name, path = config.model_family
    family = registry.lookup("models", name)
    if family.takes_path and not path:
        raise MtbenchError(f"--model {name} needs the model's directory: --model {name}:DIR")
    if path and not family.takes_path:
        raise MtbenchError(f"--model {name} takes no path (got '{config.model_name}')")
    if config.init and family.pretrained:
        raise MtbenchError(f"--init {config.init}: --model {name} starts from its checkpoint's weights")
    with registry.plugin_code("models", name):
        family.check(path, config)
    return family, path


def resolve_task(family, config, registry):
    """The task the model family trains on, checked to take the run's options."""
    task = registry.lookup("tasks", family.task)
    with registry.plugin_code("tasks", task.name):
        task.check(config)
    if config.target is not None and config.target[0] != task.validation_metric:
        raise MtbenchError(f"--target-{config.target[0]}: the {task.name} task validates by "
                           f"{task.validation_metric or 'nothing'}, not {config.target[0]}")
    return task


def check_extra_options(config):
    """An option of an extra (`config.EXTRA_OPTIONS`) given without the extra is refused in one line."""
    for key, extra in EXTRA_OPTIONS.items():
        if getattr(config, key) is not None and extra not in config.extras:
            raise MtbenchError(f"--{key.replace('_', '-')} is an option of --extra {extra}; give the extra too")


def check_trackers(names, registry):
    """--report-to names trackers: reporters that follow the training (`Reporter.start` or `log` of their own). A
    reporter of results alone is refused in words that name the trackers (given there, it reported its table
    beside --report none); an unknown name as `lookup` refuses it. Asked of a command line, not of a configuration
    a run recorded before this check (a resume has no --report-to to change it by)."""
    for name in names:
        if not follows_training(registry.lookup("reporters", name)):
            trackers = sorted(other for other, reporter in registry.reporters.items() if follows_training(reporter))
            raise MtbenchError(f"--report-to {name}: reporter '{name}' reports a result and follows no training (give "
                               f"it to --report); the trackers: {', '.join(trackers) or 'none installed'}")


def follows_training(reporter):
    return type(reporter).start is not Reporter.start or type(reporter).log is not Reporter.log


def choose_plugins(config, registry, reporter_names=()):
    backend = resolve_backend(config.backend, registry)
    family, path = resolve_model(config, registry)
    return RunPlugins(backend, resolve_extras(config.extras, backend, registry),
                      resolve_reporters(reporter_names, registry), registry, family, path,
                      resolve_task(family, config, registry))


# What keras imports at its own import where installed, for what mtbench never asks of it (scikit-learn wrappers,
# pandas inputs to fit, plotting): about a second of every process's start once the test or plot extras put them
# there. keras guards each import, so hiding them gives it its no-such-module path.
KERAS_OPTIONAL_IMPORTS = ("sklearn", "pandas", "matplotlib")


@contextlib.contextmanager
def modules_hidden(names):
    """Within the block, `import NAME` fails as if NAME were not installed, for the names not yet imported;
    afterwards they import as before (the mlflow reporter's plots import matplotlib)."""
    hidden = [name for name in names if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def other_frameworks(backend, registry):
    """The modules of the registered backends' frameworks that `backend` does not compute with: keras imports
    some at its own import where installed (JAX, for its Orbax callback: 0.6 s of every torch run's start)."""
    if registry is None:
        return ()
    own = set(backend.framework_modules)
    return tuple(sorted({module for other in registry.backends.values() for module in other.framework_modules
                         if module not in own}))


def import_keras(config, backend, extras_environment=None, registry=None):
    """Sets the environment keras and the framework read at import (the backend's, then the extras'), then
    imports keras, without what it would import of the other backends' frameworks (`registry`'s)."""
    env = {"KERAS_BACKEND": backend.keras_backend, "KERAS_HOME": os.path.join(config.cache_dir, "keras")}
    env.update(backend.prepare_process(config) if registry is None
               else registry.answer("backends", backend, "prepare_process", config, expect=A_DICT))
    env.update(extras_environment or {})
    os.environ.update(env)
    with modules_hidden(KERAS_OPTIONAL_IMPORTS + other_frameworks(backend, registry)):
        import keras
    if keras.backend.backend() != backend.keras_backend:
        by = registry and registry.keras_imported_by
        raise RunFailure(f"keras was already imported with the {keras.backend.backend()} backend in this "
                         + (f"process, by plugin '{by}' as it loaded: the plugin must import keras inside its "
                            f"methods" if by else "process; run each backend in its own process"))
    return keras


def require_extra_spanning_processes(processes, backend, extras, registry):
    """Several processes train one model only through an extra that spans them; else each would train its own."""
    if processes == 1 or any(extra.spans_processes for extra in extras):
        return
    spanning = [extra.name for extra in registry.extras.values()
                if backend.name in extra.backends and extra.spans_processes]
    offer = f" (--extra {' or --extra '.join(spanning)})" if spanning else ""
    raise MtbenchError(f"{processes} processes were launched, but no extra of this run trains one model over "
                       f"them{offer}; without one each process would train its own")


# The extras a step that accumulates gradients runs with: ddp averages the gradients with the last micro-batch
# only, data-parallel's micro-batches are a loop inside its one program, fsdp gathers and reduce-scatters for each
# micro-batch (a loop around JAX's per-device gathering; FSDP2's hooks on torch), tensor-parallel all-reduces each
# micro-batch's activations (as Megatron does); remat recomputes each micro-batch's blocks, no collective; pmap has a
# step of its own.
ACCUMULATING_EXTRAS = ("torch-compile", "flash-attention", "ddp", "data-parallel", "fsdp", "tensor-parallel",
                       "remat")
# Why the others do not, where it is not that their collectives would run at every micro-batch (pmap's).
NOT_ACCUMULATING_BECAUSE = {"pipeline-parallel": "the pipeline's micro-batches are its gradient accumulation: give "
                                                 "--pipeline-micro-batches in its place"}


def check_options_against_extras(config, plugins):
    """What a training run's options ask of its extras, refused in one line before anything is imported: an
    extra's option without the extra, --step eager where no extra compiles the step, --grad-accum N where the run
    could not accumulate, --profile where the backend cannot."""
    check_extra_options(config)
    step_compiling_extra(config, plugins)
    check_gradient_accumulation(config, plugins)
    check_profiling(config, plugins)


def check_profiling(config, plugins):
    """--profile N: refused in one line, before anything is imported, where the backend has no step profiler."""
    if config.profile_steps and type(plugins.backend).step_profiler is Backend.step_profiler:
        raise MtbenchError(f"--profile {config.profile_steps}: backend '{plugins.backend.name}' has no step profiler "
                           f"(Backend.step_profiler)")


def check_gradient_accumulation(config, plugins):
    """--grad-accum N: refused in one line, before anything is imported, where the run could not accumulate."""
    if config.grad_accum == 1:
        return
    others = [extra.name for extra in plugins.extras if extra.name not in ACCUMULATING_EXTRAS]
    if others:
        because = NOT_ACCUMULATING_BECAUSE.get(others[0], "its collectives would run at every micro-batch")
        raise MtbenchError(f"--grad-accum {config.grad_accum} runs with {', '.join(ACCUMULATING_EXTRAS)} only, not "
                           f"with --extra {others[0]} ({because})")
    if plugins.backend.name not in ("jax", "torch"):
        raise MtbenchError(f"--grad-accum {config.grad_accum}: backend '{plugins.backend.name}' has no step that "
                           f"accumulates gradients")


def check_launch(config, plugins, launch):
    """A run of several processes trains one model only through an extra that spans them, and splits every
    batch evenly between them: checked before anything is imported."""
    if launch.num_processes == 1:
        return
    require_extra_spanning_processes(launch.num_processes, plugins.backend, plugins.extras, plugins.registry)
    reason = uneven_split_reason(config, launch.num_processes, "processes")
    if reason:
        raise MtbenchError(reason)


def start_backend(config, plugins, launch):
    """Imports keras on the backend, joins the run's processes (`launch`) and checks that the dtype and every
    extra can run on its device; the extras may then adjust the configuration. Returns (keras, the RunContext
    the plugins see, {configuration key: the extra that changed it})."""
    extras_environment = {}
    for extra, variables in plugins.ask_extras("environment", config):
        variables = {} if variables is None else variables
        if not (isinstance(variables, dict) and all(isinstance(key, str) and isinstance(value, str)
                                                    for key, value in variables.items())):
            raise RunFailure(f"extra '{extra.name}' gives an environment of {variables!r:.80}, not a dict of "
                             f"strings")
        extras_environment.update(variables)
    cpu_share = share_cores(launch)  # before the framework (and its thread pools) starts
    keras = import_keras(config, plugins.backend, extras_environment, plugins.registry)
    processes = plugins.backend.start_processes(launch)  # before the framework computes anything
    with plugins.model_code():
        model_shape = plugins.model.shape(plugins.model_path, config)
    device = plugins.registry.answer("backends", plugins.backend, "device_info", expect=A_DICT)
    # Asked here first, though the result's environment asks again: a mistake names the backend's plugin.
    plugins.registry.answer("backends", plugins.backend, "framework_versions", expect=A_DICT)
    run = RunContext(config=config, backend=plugins.backend, device=device,
                     model_shape=model_shape, processes=processes, cpu_share=cpu_share,
                     task=plugins.task)
    read_model_family(run, plugins.model)
    choose_dtype(run, plugins)  # before any plugin reads the configuration's dtype
    choose_compiled_step(run, plugins)  # before the cache opens: torch's opens for a compiled step alone
    run.compile_cache = plugins.backend.open_compile_cache(run.config)  # before anything compiles
    run.matmul_precision = set_matmul_precision(plugins.backend, config.matmul_precision)
    choose_fused_attention(run, plugins)
    reason = device_refusal(run, plugins.extras, plugins.extra_code, plugins.registry)
    if reason:
        raise MtbenchError(reason)
    run.config, changed_by = configuration_changes(run, plugins)
    check_configuration_changes(run, plugins, changed_by)
    return keras, run, changed_by


# What is chosen before the extras change the configuration (`config_changes`): the plugins, the data, the
# starting weights, the kernels and precision set, the outputs and trackers. An extra that changed one would make
# the result record a run that did not train.
# The data's keys are those the task's `read` takes (the corpus read, cut to --max-pairs and split): it ran before.
FIXED_BEFORE_EXTRAS = ("backend", "extras", "dataset", "data_file", "valid_file", "test_file", "src_col", "tgt_col",
                       "src_lang", "tgt_lang", "valid_size", "test_size", "max_pairs", "preset", "model_name", "seed",
                       "init", "initial_weights", "matmul_precision", "attention", "step", "compile_cache", "cache_dir",
                       "out", "overwrite", "report_to", "logging_dir", "run_group")


def configuration_changes(run, plugins):
    """(the run's configuration with what the extras change (`Extra.config_changes`), {key: the name of the extra
    that changed it last}): a new, checked configuration; `run.config` itself is never written to. An extra of
    plugin API 1.1 or before that changes it in place (`adjust_config`) is still called, on a copy."""
    config, changed_by = run.config, {}
    for extra in plugins.extras:  # each sees the configuration the extras before it made
        with plugins.extra_code(extra):
            changes = plugins.registry.call("extras", extra, "config_changes", run)
        if changes and not isinstance(changes, dict):
            raise RunFailure(f"extra '{extra.name}' gives configuration changes of {type(changes).__name__}, not a "
                             f"dict")
        if changes:
            unknown = sorted(set(map(str, changes)) - {f.name for f in dataclasses.fields(config)})
            if unknown:
                raise RunFailure(f"extra '{extra.name}' changes unknown configuration keys: {', '.join(unknown)}")
            try:
                config, before = dataclasses.replace(config, **changes), config
            except (MtbenchError, TypeError, ValueError) as error:  # its words name an option the user did not give
                settings = ", ".join(f"{key}={value!r}" for key, value in sorted(changes.items()))
                said = mistyped_changes(config, changes) if isinstance(error, TypeError) else None
                raise RunFailure(f"extra '{extra.name}' sets {settings}, which the configuration refuses: "
                                 f"{said or error}") from None
            run = dataclasses.replace(run, config=config)
            changed_by.update(dict.fromkeys(changed_keys(before, config), extra.name))
    in_place = [extra for extra in plugins.extras if type(extra).adjust_config is not Extra.adjust_config]
    if in_place:
        config = copy.deepcopy(config)
        run = dataclasses.replace(run, config=config)
        for extra in in_place:
            before = copy.deepcopy(config)
            with plugins.extra_code(extra):
                plugins.registry.call_replaced("extras", extra, "adjust_config", run)
            changed_by.update(dict.fromkeys(changed_keys(before, config), extra.name))
    fixed = [key for key in FIXED_BEFORE_EXTRAS if key in changed_by]
    if fixed:
        name = changed_by[fixed[0]]
        raise RunFailure(f"extra '{name}' changes {', '.join(key for key in fixed if changed_by[key] == name)}, chosen "
                         f"before the extras change the configuration (the plugins, data, weights and outputs of the "
                         f"run)")
    return config, changed_by


def mistyped_changes(config, changes):
    """'learning_rate takes a float, not a str' for each change of another kind than the value it replaces (a
    comparison's TypeError names neither the key nor the kind), or None where none is."""
    said = []
    for key, value in sorted(changes.items()):
        current = getattr(config, key, None)
        numbers = isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool)
        if current is not None and value is not None and not numbers and not isinstance(value, type(current)):
            said.append(f"{key} takes {'an' if type(current).__name__[0] in 'aeiou' else 'a'} "
                        f"{type(current).__name__}, not {type(value).__name__} {value!r}")
    return "; ".join(said) or None


def changed_keys(before, after):
    """The names of the configuration fields whose values differ between `before` and `after`."""
    return [field.name for field in dataclasses.fields(before)
            if getattr(before, field.name) != getattr(after, field.name)]


def check_configuration_changes(run, plugins, changed_by):
    """Once the extras have changed the configuration (`changed_by`: {key: extra}), the run is checked again as
    it will train: the dtype and every extra must still run on the device (a refusal names the change), and
    `run.dtype_choice` records a dtype an extra chose (the TPU strategy's bfloat16), so that the result says what
    trained, not what `--dtype` chose before."""
    if not changed_by:
        return
    reason = device_refusal(run, plugins.extras, plugins.extra_code, plugins.registry)
    if reason:
        changes = "; ".join(f"extra '{name}' set " + ", ".join(f"{key}={getattr(run.config, key)!r}"
                                                               for key in sorted(changed_by) if changed_by[key] == name)
                            for name in dict.fromkeys(changed_by.values()))
        raise MtbenchError(f"{reason} (once {changes})")
    if "dtype" in changed_by and run.config.dtype != run.dtype_choice["dtype"]:
        run.dtype_choice = {"asked": run.dtype_choice["asked"], "dtype": run.config.dtype,
                            "by_extra": changed_by["dtype"]}


def read_model_family(run, family):
    """What the model family tells the run of its model before it is built: the kinds of attention it runs, the
    share of attention probabilities it drops while training, whether its blocks can recompute their
    activations."""
    if family.attention_kinds:  # a family that names none keeps every kind (plugin API 1.1's behaviour)
        run.attention_kinds = tuple(family.attention_kinds)
    if family.attention_dropout:
        run.attention_dropout = run.config.model.dropout or 0.0
    run.model_recomputes_blocks = bool(family.recomputes_blocks)


def device_refusal(run, extras, extra_code=None, registry=None):
    """Why the run's dtype or one of `extras` cannot run on its device (`run`: the RunContext), in one line, or
    None. `extra_code(extra)`: the block an extra's own code runs in (`RunPlugins.extra_code`); `registry`: the
    plugins', which names the backend's plugin where its code fails."""
    reason = dtype_refusal(run.backend, run.config.dtype, run.device, registry)
    if reason:
        return reason
    for extra in extras:
        with extra_code(extra) if extra_code else contextlib.nullcontext():
            reason = extra.unavailable_reason(run)
        if reason:
            return f"extra '{extra.name}' cannot run here: {reason}"
    return None


def set_matmul_precision(backend, precision):
    """Sets the float32 matmul arithmetic on the backend's framework; the record of what it reports."""
    reported = backend.set_matmul_precision(precision)
    if reported is None and precision != "highest":
        raise MtbenchError(f"--matmul-precision {precision}: backend '{backend.name}' cannot set its matmul "
                           f"precision")
    return {"requested": precision, "reported": reported}


def choose_attention_kernels(run, plugins):
    """Holds the backend to the class of attention kernel the extras asked for (fused or not), before the model
    is built; what each kind of attention then runs. An option set to None asks for a fused kernel too, the one
    the backend's own dispatcher picks among those it is held to (Keras is not asked for one)."""
    options = run.model_options
    fused = any(key in options and options[key] is not False for key in ("flash_attention", "flash_attention_masked"))
    kernels = plugins.registry.call("backends", plugins.backend, "attention_kernels", fused, run.device, run)
    if kernels is None:
        name = lambda asked: plugins.backend.attention_implementation(asked is True, run.device)
        kernels = {"causal": name(options.get("flash_attention")), "masked": name(options.get("flash_attention_masked")),
                   "decoding": name(False)}
    return kernels


def local_devices(run):
    """Ordinals of the devices this process computes on, as it numbers the devices it sees: the extras say over
    how many devices the run spans (`extras_state[name]['devices']`, all processes together); a process of
    several with one device each computes on its own (`Launch.device_ordinal`)."""
    per_process = max(devices_spanned(run.extras_state.values()) // run.processes.world_size, 1)
    first = run.processes.launch.device_ordinal() if per_process == 1 else 0
    return list(range(first, first + per_process))


def build_model(run, plugins, tokenizer):
    """(model, ModelShape) of the run's model family, its vocabulary that of the tokenizer (a small corpus may
    support fewer pieces than asked for); `run.model_options` are those extras set (flash attention)."""
    with plugins.model_code():
        built = plugins.model.build(run, plugins.model_path, tokenizer, run.config.max_len)
    # A family may describe its shape in a class of its own (the classification example's): what mtbench reads of
    # it is `to_dict`.
    if not (isinstance(built, tuple) and len(built) == 2 and callable(getattr(built[1], "to_dict", None))):
        raise RunFailure(f"model family '{plugins.model.name}' built {type(built).__name__}, not (model, shape): "
                         f"a model and its ModelShape")
    return built


def step_flops(plugins, model_shape, data):
    """The `StepFlops` of training steps, as the model family counts them (`ModelFamily.training_flops`; None: it
    counts none); `data`: the task's `TaskData`, whose tokenizer's padding tells a source's real tokens."""
    special = getattr(data.tokenizer, "special", None)
    def count(rows, source_length, target_length):
        with plugins.model_code():
            flops = plugins.model.training_flops(model_shape, rows, source_length, target_length)
            if flops is not None and (isinstance(flops, bool) or not isinstance(flops, numbers.Real)):
                raise TypeError(f"training_flops returned a {type(flops).__name__}, not a number or None")
        return flops
    return StepFlops(count, special and special.pad)


def drawn_init(config, family, weights_file=None):
    """`config` with `init` the scheme its starting weights are drawn by, as its result records it: --init; else
    the weights file's own (None where it names none, a trained model's, or holds a checkpoint's); else None for a
    pretrained family's checkpoint; else the family's (`ModelFamily.initialization`). Call it in the family's plugin code."""
    from mtbench.keras_models.initialization import INIT_SCHEMES
    if config.init:
        return config
    if weights_file is not None or family.pretrained:
        return dataclasses.replace(config, init=drawn_scheme(weights_file.init) if weights_file is not None else None)
    scheme = family.initialization(config)
    if scheme not in INIT_SCHEMES:
        raise RunFailure(f"model family '{family.name}' chose the initialisation {scheme!r}, not one of "
                         f"{', '.join(INIT_SCHEMES)}")
    return dataclasses.replace(config, init=scheme)


def initial_values(config, plugins, model):
    """(the weights a run starts from without --initial-weights, how they were drawn): the family's pretrained
    ones (PRETRAINED), or mtbench's numpy draw from the seed by `drawn_init`'s scheme."""
    from mtbench.keras_models.initialization import initial_weights
    with plugins.model_code():
        pretrained = plugins.model.pretrained_weights(plugins.model_path, model)
        if pretrained is not None:
            return pretrained, PRETRAINED
        scheme = drawn_init(config, plugins.model).init
    with plugins.model_code():  # a variable the draw knows no rule for: the family's model, not the user's run
        try:
            return initial_weights(model, config.seed, scheme), scheme
        except ValueError as error:
            raise ValueError(f"it built a model whose weights mtbench cannot draw: {error} (the draw knows variables "
                             f"named kernel, bias, embeddings, gamma and beta; a family gives others from "
                             f"pretrained_weights)") from None


def starting_weights(config, plugins, model, weights_file):
    """Sets the model's initial weights: those of the weights file when one was given, else `initial_values`;
    returns how they were drawn (a scheme, 'pretrained', or None: a file that does not say)."""
    from mtbench.keras_models.initialization import assign_weights
    weights, init = (weights_file, weights_file.init) if weights_file is not None else \
        initial_values(config, plugins, model)
    try:
        assign_weights(model, weights)
    except ValueError as error:
        source = config.initial_weights or f"--model {config.model_name}"
        raise MtbenchError(f"{source}: {error}") from None
    return init


def compile_model(keras, model, config, total_steps, compile_options, family=None):
    """Compiles `model` with AdamW as the run's recipe says (`optimizer_recipe`, the model family's under the
    user's options; `family`: the run's ModelFamily, default the registry's for `config`)."""
    from mtbench.keras_models.schedules import schedule_of_recipe
    recipe = optimizer_recipe(config, total_steps, family)
    clipping = {"per-variable": {"clipnorm": recipe["clip_norm"]}, "global": {"global_clipnorm": recipe["clip_norm"]},
                "none": {}}[recipe["clip"]]
    optimizer = keras.optimizers.AdamW(learning_rate=schedule_of_recipe(recipe), weight_decay=recipe["weight_decay"],
                                       beta_1=recipe["beta_1"], beta_2=recipe["beta_2"], epsilon=recipe["epsilon"],
                                       **clipping)
    if recipe["decay"] == "matrices":  # biases, norms' scales and offsets: vectors
        optimizer.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    if config.dtype in ("float16", "mixed_float16"):
        # float16 gradients underflow without loss scaling; Keras's optimizer wrapper scales dynamically.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    # The loss and accuracy are means over real target tokens: the batch's weights are 0 on padding.
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
    options = {"jit_compile": "auto"}
    options.update(compile_options)
    model.compile(optimizer=optimizer, loss=loss,
                  weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")], **options)
    return {"jit_compile": model.jit_compile, "optimizer": type(model.optimizer).__name__,
            "dtype_policy": model.dtype_policy.name, "optimizer_recipe": recipe}


def extras_compile_options(run, plugins):
    """The `model.compile` options the extras ask for, each with the extra that asked."""
    options, asked_by = {}, {}
    for extra, asked in plugins.ask_extras("compile_options", run):
        asked = asked or {}
        with plugins.extra_code(extra):
            if not isinstance(asked, dict):
                raise TypeError(f"compile_options returned a {type(asked).__name__}, not a dict of model.compile's "
                                f"options")
        for key, value in asked.items():
            options[key] = value
            asked_by[key] = extra.name
    return options, asked_by


def choose_train_step(run, model, plugins):
    """The backend's fast step (or Keras's own), then each extra's wrapper or replacement, in the order given."""
    made = plugins.registry.answer("backends", plugins.backend, "make_train_step", run, model,
                                   expect=((TrainStep, type(None)), "a mtbench.TrainStep or None"))
    step = made or KerasTrainStep(model)
    step.made_by = f"backend '{plugins.backend.name}'"
    for extra in plugins.extras:
        with plugins.extra_code(extra):
            made = plugins.registry.call("extras", extra, "make_train_step", run, model, step)
            if made is not None and not isinstance(made, TrainStep):
                raise TypeError(f"make_train_step returned a {type(made).__name__}, not a mtbench.TrainStep "
                                f"(subclass it, or mtbench.WrappingStep to wrap the step it was given)")
            if isinstance(made, WrappingStep) and not isinstance(made.inner, TrainStep):  # the deprecated (run, model)
                raise TypeError(f"make_train_step returned a step wrapping a {type(made.inner).__name__}, not the "
                                f"train step it was given: mtbench calls make_train_step(run, model, step)")
        if made is not None:
            made.made_by = plugins.registry.item_label("extras", extra.name)
            step = made
    return step


def check_compile_options_apply(asked, asked_by, train_step):
    """An extra's `model.compile` options that the train step would ignore are an error, not a record: the
    result would claim a training that did not happen."""
    if asked and not train_step.uses_compile_options:
        first = next(iter(asked))
        raise MtbenchError(
            f"extra '{asked_by[first]}' sets model.compile options {asked}, but the run trains with the "
            f"'{train_step.name}' step, which does not run Keras's compiled train function, so they would "
            f"change evaluation only; return a step built on mtbench.KerasTrainStep from make_train_step to "
            f"train with them")
