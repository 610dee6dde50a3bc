"""The runs a comparison trains: `--backends` and `--extra`, or `--matrix`, parsed into `RunSpec`s (a backend, its
extras, the flags it sets over the shared ones, its processes and interpreter), each given the step it trains with
and, on a CUDA GPU, torch's compiled twin beside its eager run."""

import dataclasses
import json
import os
import sys
from dataclasses import dataclass

from mtbench.errors import MtbenchError
from mtbench.figures import SIZE_KEYS, run_name, size_label
from mtbench.plugins import manager as plugins
from mtbench.plugins.api import Launch
from mtbench.runner.choices import auto_dtype, conflicting_extras, dtype_refusal, joined
from mtbench.runner.config import FUSED_ATTENTION_EXTRA, INIT_SCHEMES, TrainConfig, comma_separated
from mtbench.runner.orchestration.environments import (check_interpreters, check_runs, check_same_hardware,
                                                       probe_devices, runs_to_preflight)
from mtbench.runner.results.report import SWEEP_KEYS, TORCH_COMPILED, environment_names, sweep_settings, swept_keys
from mtbench.runner.setup import (check_extra_options, check_launch, check_options_against_extras, check_trackers,
                                  choose_plugins, drawn_init, resolve_model, resolve_reporters, resolve_task)

# The flags a --matrix entry may set, and how their values are read (as the configuration types them): the
# model's size, and what a sweep varies beside it (batch size, max length, max tokens).
FIELD_TYPES = {field.name: field.type for field in dataclasses.fields(TrainConfig)}
SETTING_TYPES = {name: FIELD_TYPES[name] for name in (*SIZE_KEYS, *SWEEP_KEYS)}
# What the initial weights follow: the model's size, --max-len or --block-size (the positions), and --init.
SHAPE_KEYS = (*SIZE_KEYS, "max_len", "block_size", "init")
# The --matrix key that runs an entry with another environment's interpreter.
PYTHON_KEY = "python"


@dataclass(frozen=True)
class RunSpec:
    backend: str
    extras: tuple = ()
    sizes: tuple = ()  # ((configuration key, value), ...): the flags this run sets over the shared ones (size and
    # sweep flags; --compile-mode, `with_compile_mode`)
    processes: int = 1  # processes on this machine, started by torchrun
    python: str = None  # the interpreter it runs under (absolute), where an entry names another environment's
    python_name: str = None  # the interpreter's name in the label (`environment_names`)
    model: str = "transformer"  # --model of the comparison (every run's), as its label names it
    twin: bool = False  # the baseline's A/A twin (--aa): the same run again, measuring the noise floor
    named: tuple = None  # ((flag, value), ...): the sweep settings its label names (`named_as_results`); None: those
    # it sets

    @property
    def label(self):
        """The run's name, as `comparison_labels` names its result once the plan has named the settings the runs
        differ in (`named_as_results`)."""
        settings = list(self.named) if self.named is not None else [
            (key.replace("_", "-"), value) for key, value in self.sizes if key in SWEEP_KEYS]
        if self.python:
            settings.append((PYTHON_KEY, self.python_name or environment_names([self.python])[self.python]))
        return run_name(self.backend, self.extras, {**dict(self.sizes), "model_name": self.model}, self.processes,
                        settings)

    @property
    def shape(self):
        """The settings its initial weights follow: one weights file per shape."""
        return tuple((key, value) for key, value in self.sizes if key in SHAPE_KEYS)

    @property
    def interpreter(self):
        return self.python or sys.executable

    @property
    def foreign(self):
        """Whether it runs under another interpreter than this process's."""
        return self.interpreter != sys.executable

    def size_arguments(self):
        return [text for key, value in self.sizes
                for text in (f"--{key.replace('_', '-')}", f"{value:g}" if isinstance(value, float) else str(value))]


def shape_label(shape):
    """'d-model=128,heads=4,max-len=64' of a RunSpec.shape (a block, `block-size=64`); '' for the shared shape."""
    settings = dict(shape)
    length = ",".join(f"{key.replace('_', '-')}={settings[key]}" for key in ("max_len", "block_size")
                      if key in settings)
    init = f"init={settings['init']}" if "init" in settings else ""
    return ",".join(part for part in (size_label(settings), length, init) if part)


def parse_run_spec(text):
    """'backend+extra+extra', 'backend+extra@2' (2 processes) or 'backend+extra:d-model=128,batch-size=16' (flags
    of this run), with 'python=PATH' among the flags for another environment's interpreter -> RunSpec."""
    run, colon, size_text = text.strip().partition(":")
    run, at, count = run.partition("@")
    parts = [part.strip() for part in run.split("+")]
    if not all(parts) or (colon and not size_text.strip()):
        raise MtbenchError(f"--matrix: '{text.strip()}' is not of the form backend+extra+extra[@N][:flag=value,...]")
    if at and not (count.strip().isdigit() and int(count) >= 1):
        raise MtbenchError(f"--matrix: '@{count.strip()}' in '{text.strip()}' is not a number of processes")
    sizes, python = {}, None
    for item in filter(None, (item.strip() for item in size_text.split(","))):
        flag, _, value = item.partition("=")
        key = flag.strip().lstrip("-").replace("-", "_")
        if key in sizes or (key == PYTHON_KEY and python is not None):
            raise MtbenchError(f"--matrix: {key.replace('_', '-')} is given twice in '{text.strip()}'; give each "
                               f"flag of a run once")
        if key == PYTHON_KEY and value.strip():
            python = os.path.abspath(os.path.expanduser(value.strip()))
            continue
        if key not in SETTING_TYPES or not value.strip():
            raise MtbenchError(f"--matrix: '{item}' in '{text.strip()}' is not flag=value with a size or sweep flag "
                               f"({', '.join(k.replace('_', '-') for k in SETTING_TYPES)}) or python=PATH")
        if key == "init" and value.strip() not in INIT_SCHEMES:
            raise MtbenchError(f"--matrix: init={value.strip()} in '{text.strip()}' is not one of "
                               f"{', '.join(INIT_SCHEMES)}")
        try:
            sizes[key] = SETTING_TYPES[key](value.strip())
        except ValueError:
            raise MtbenchError(f"--matrix: {flag.strip()}={value.strip()} in '{text.strip()}' is not a number of "
                               f"the flag's kind") from None
    return RunSpec(parts[0], tuple(parts[1:]), tuple(sorted(sizes.items())), int(count) if at else 1,
                   None if python == sys.executable else python)


def name_interpreters(specs):
    """Where an entry runs under another environment's interpreter, every run names its interpreter (the others
    this one's), each by a name of its own: the labels `comparison_labels` gives their results."""
    if not any(spec.python for spec in specs):
        return specs
    names = environment_names(spec.interpreter for spec in specs)
    return [dataclasses.replace(spec, python=spec.interpreter, python_name=names[spec.interpreter]) for spec in specs]


def _matrix_entries(matrix):
    """The entries of --matrix, separated by ';' (or ',' between entries without sizes)."""
    entries = []
    for chunk in matrix.split(";"):
        for token in chunk.split(","):
            if not token.strip():  # a run left out by a slip of the keyboard would go unnoticed in the table
                raise MtbenchError(f"--matrix {matrix!r}: an empty entry (two separators in a row, or one at an "
                                   f"end); give a run between each two")
            if "=" in token and ":" not in token and entries:
                entries[-1] += "," + token  # another flag=value of the entry before
            else:
                entries.append(token)
    return entries


def torch_on_gpu(devices):
    """Whether torch sees a CUDA GPU (`devices`, from `probe_devices`)."""
    return ((devices or {}).get("torch") or {}).get("kind") == "gpu"


def compile_refusal(extras, registry):
    """Why a torch run with `extras` cannot compile its step, as the extras declare it (an extra that conflicts
    with torch-compile, or one torch-compile conflicts with), or None. An unknown extra is `check_runs`' to name."""
    compiling = registry.extras.get(TORCH_COMPILED)
    clash = compiling and conflicting_extras(compiling, [registry.extras[name] for name in extras
                                                         if name in registry.extras])
    return f"extra '{clash[0]}' cannot run together with '{TORCH_COMPILED}'" if clash else None


def compiled_twin(spec, registry):
    """[`spec` with torch's step compiled] for an eager torch run whose extras let it compile; else []."""
    if spec.backend != "torch" or TORCH_COMPILED in spec.extras or compile_refusal(spec.extras, registry):
        return []
    sizes = dict(spec.sizes)
    if "step" in sizes:  # a run `with_steps` has given its step: the twin's is compiled
        sizes["step"] = "compiled"
    return [dataclasses.replace(spec, extras=joined(spec.extras, TORCH_COMPILED, registry),
                                sizes=tuple(sorted(sizes.items())))]


def eager_only_lines(specs, devices, registry):
    """One line for each torch run that a CUDA GPU would have trained compiled too, but whose extras refuse it."""
    if not torch_on_gpu(devices):
        return []
    return [f"run '{spec.label}' trains torch eager only (no compiled row beside it): "
            f"{compile_refusal(spec.extras, registry)}"
            for spec in specs if spec.backend == "torch" and compile_refusal(spec.extras, registry)]




def with_compile_mode(specs, mode):
    """`specs` with --compile-mode `mode` set on the runs it applies to (those that compile torch's step) alone."""
    return [dataclasses.replace(spec, sizes=tuple(sorted({**dict(spec.sizes), "compile_mode": mode}.items())))
            if mode and TORCH_COMPILED in spec.extras else spec for spec in specs]


def with_compiled_twins(specs, devices, registry=None):
    """`specs`, each eager torch run followed by its compiled twin (`compiled_twin`) where torch sees a CUDA GPU
    (`devices`, from `probe_devices`)."""
    if not torch_on_gpu(devices):
        return specs
    registry = registry or plugins.registry()
    return [added for spec in specs for added in (spec, *compiled_twin(spec, registry))]


def with_steps(specs, step, registry, named=False):
    """`specs`, each with the --step it trains with: a run of a backend whose step compiles through torch-compile
    compiled where its extras name it, else eager (so that a row named eager is eager on a GPU too); any other
    backend's run `auto` (its own step). `step` is compare's --step: `compiled` first adds torch-compile to those
    runs (refused beside an extra that conflicts with it), `eager` adds nothing and refuses a run that names it (the
    compiled twins are `with_compiled_twins`'s, for `auto`). `named`: the runs --matrix listed, whose extras already say."""
    if named and step != "auto":
        raise MtbenchError(f"--matrix names each run's extras ('{TORCH_COMPILED}' for a compiled torch step); "
                           f"leave --step out")
    extra = registry.extras.get(TORCH_COMPILED)
    served = extra.backends if extra else ()
    if step == "eager" and any(spec.backend in served and TORCH_COMPILED in spec.extras for spec in specs):
        raise MtbenchError(f"--step eager contradicts --extra {TORCH_COMPILED}; give one of them")
    if step == "compiled":
        for spec in specs:
            refusal = spec.backend in served and compile_refusal(spec.extras, registry)
            if refusal:
                raise MtbenchError(f"--step compiled: run '{spec.label}': {refusal}")
        specs = [dataclasses.replace(spec, extras=joined(spec.extras, TORCH_COMPILED, registry))
                 if spec.backend in served and TORCH_COMPILED not in spec.extras else spec for spec in specs]
    chosen = lambda spec: ("auto" if spec.backend not in served
                           else "compiled" if TORCH_COMPILED in spec.extras else "eager")
    return [dataclasses.replace(spec, sizes=tuple(sorted({**dict(spec.sizes), "step": chosen(spec)}.items())))
            for spec in specs]


def with_attention(specs, attention):
    """`specs`, each run that does not name the fused-attention extra pinned to the unfused attention where another
    names it and --attention is `auto`: `auto` would fuse it too on a device with the kernels, and the row named
    without the extra (the unfused baseline asked for) would train as the one named with it, its results grouped
    with that row's."""
    if attention != "auto" or not any(FUSED_ATTENTION_EXTRA in spec.extras for spec in specs):
        return specs
    return [spec if FUSED_ATTENTION_EXTRA in spec.extras
            else dataclasses.replace(spec, sizes=tuple(sorted({**dict(spec.sizes), "attention": "unfused"}.items())))
            for spec in specs]


def plan_runs(backends=None, extras=(), matrix=None, devices=None, model="transformer", registry=None):
    """The runs to compare, all of the model family `model` (--model): each backend of `backends` with every extra
    of `extras`, or the runs that `matrix` lists ('torch;torch+torch-compile;jax'). Where torch sees a CUDA GPU
    (`devices`, from `probe_devices`), `--backends` trains each torch run both eager and compiled (its extras
    plus torch-compile) wherever its extras allow (`compile_refusal`; `registry`: the plugins, by default
    those installed): on a GPU an eager Keras step is bound by Python's dispatch, and a comparison of one XLA
    program with it alone would answer another question."""
    if matrix is not None:
        if backends or extras:
            raise MtbenchError("give --matrix, or --backends with --extra, not both")
        specs = name_interpreters([parse_run_spec(item) for item in _matrix_entries(matrix)])
    else:
        names = comma_separated(backends if backends is not None else "jax,torch", "--backends", "entry", "backend")
        specs = with_compiled_twins([RunSpec(name, tuple(extras)) for name in names], devices, registry)
    if not specs:
        raise MtbenchError("no runs to compare")
    specs = [dataclasses.replace(spec, model=model) for spec in specs]
    refuse_the_same_run_twice(specs)
    return specs


def refuse_the_same_run_twice(specs):
    labels = [spec.label for spec in specs]
    twice = next((label for i, label in enumerate(labels) if label in labels[:i]), None)
    if twice:
        raise MtbenchError(f"run '{twice}' is listed twice; use --repeats to run it again")


def refuse_the_same_configuration_twice(specs, configs, shapes, resolved=None):
    """Two entries whose flags differ but train the same model the same way (`jax;jax:d-model=64` where the
    preset is 64 wide) would train one run twice under two names, each held against the other. `configs`: each
    run's configuration as a dict; `shapes`: its model (`TrainConfig.model`, the preset under the size flags);
    `resolved`: {run label: what its `auto` trains here, in words}, where `configs` hold what it resolved to
    (`dtypes_trained`)."""
    seen, resolved = {}, resolved or {}
    for spec, config, shape in zip(specs, configs, shapes):
        options = {key: value for key, value in config.items() if key not in SIZE_KEYS}
        key = (json.dumps(options, sort_keys=True, default=str), repr(shape), spec.processes, spec.interpreter)
        if key in seen:
            first = seen[key]
            settings = ", ".join(f"{name.replace('_', '-')}={value:g}" if isinstance(value, float)
                                 else f"{name.replace('_', '-')}={value}"
                                 for name, value in sorted(set(first.sizes) ^ set(spec.sizes)))
            extras = ", ".join(f"'{extra}'" for extra in sorted(set(first.extras) ^ set(spec.extras)))
            said = [resolved[label] for label in (first.label, spec.label) if label in resolved]
            why = (f" ({said[0]})" if said else f" ({settings} is what both train)" if settings
                   else f" (the options they share give both {extras})" if extras else "")
            raise MtbenchError(f"runs '{first.label}' and '{spec.label}' train the same configuration{why}; list it "
                               f"once, or use --repeats to run it again")
        seen[key] = spec


def named_as_results(specs, configs):
    """`specs`, each named by the sweep settings whose value differs between the runs' `configs` (each run's
    configuration as a dict: the shared options, the defaults and what the run sets), as `comparison_labels`
    will name their results: a setting every run shares names none, and a run that leaves a swept setting at the
    shared value is named by it too, so the progress lines, the files, --baseline and the table say the same."""
    results = [{"config": config} for config in configs]
    swept = swept_keys(results)
    specs = [dataclasses.replace(spec, named=tuple(sweep_settings(result, swept)))
             for spec, result in zip(specs, results)]
    refuse_the_same_run_twice(specs)
    return specs


def dtypes_trained(specs, configs, devices, registry):
    """(each run's configuration with the dtype it trains in where it asks `auto`, {run label: that in words}):
    `auto` is each run's to choose on its device (`choices.auto_dtype`), so `jax:dtype=auto;jax:dtype=float32`
    on a CPU trains float32 twice, whose results, alike, were grouped as repeats of one run under one name. A run
    under another interpreter, or of a backend not found here, keeps `auto` (`check_runs` names the latter)."""
    trained, said = [], {}
    for (spec, backend, device), config in zip(backends_here(specs, devices, registry), configs):
        if config.get("dtype") != "auto" or backend is None:
            trained.append(config)
            continue
        dtype, why = auto_dtype(backend, device, registry)
        said[spec.label] = f"dtype=auto trains {dtype} on this {device.get('kind', 'device')}" + (
            f": {why}" if why else "")
        trained.append({**config, "dtype": dtype})
    return trained, said


def check_dtype(specs, dtype, devices, registry):
    """A dtype a run's backend refuses on its device (float16 on torch) is refused before any run starts, as the
    run would refuse it; a run under another interpreter, or of a backend not found here, is left to
    `check_runs`. `auto` is each run's to choose on its device, never a dtype its backend refuses
    (`choices.auto_dtype`)."""
    if dtype == "auto":
        return
    for spec, backend, device in backends_here(specs, devices, registry):
        reason = backend and dtype_refusal(backend, dtype, device, registry)
        if reason:
            raise MtbenchError(f"run '{spec.label}': {reason}")


def backends_here(specs, devices, registry):
    """(spec, its backend plugin, the device the probe found for it) of each run, the backend None for a run under
    another interpreter or of a backend not found here (`check_runs` names the latter)."""
    for spec in specs:
        backend = None if spec.foreign else registry.backends.get(spec.backend)
        yield spec, backend, (devices or {}).get(spec.backend) or {}


@dataclass
class PlannedRuns:
    """The runs of a comparison, checked before any trains, and what was chosen for them."""
    specs: list
    interpreters: dict  # `check_interpreters`' answer: the other environments an entry names
    compile_mode: str   # --compile-mode of the runs that compile torch's step, or None for the default
    lines: list         # what to tell before the runs start: torch's compiled rows added, the runs that stay eager


def plan_comparison(backends, extras, matrix, options, registry, probe=probe_devices):
    """The runs `mtbench compare` trains (`plan_runs`), each with its step (`with_steps`) and on a CUDA GPU torch's
    compiled twins, checked: the plan, its plugins and every run's options before the devices are asked (`probe`,
    a child process that imports the frameworks: seconds), so that a mistyped command fails at once; then the
    hardware and the dtype against the devices. `options`: the shared train options by name."""
    step, asked_compile_mode = options["step"], options.get("compile_mode")
    options = {key: value for key, value in options.items() if key != "compile_mode"}  # the compiling runs' alone
    specs = with_steps(plan_runs(backends, extras, matrix, None, options["model_name"], registry), step, registry,
                       named=matrix is not None)
    specs = with_attention(specs, options.get("attention", "auto"))
    interpreters = check_interpreters(specs)  # other environments' (python=PATH): checked before any run
    check_runs(specs, registry, interpreters)
    shared = TrainConfig.from_options(**{**options, "backend": specs[0].backend})
    check_trackers(shared.report_to, registry)  # trackers follow each run in its process: checked here first
    resolve_reporters(shared.report_to, registry)
    resolve_task(resolve_model(shared, registry)[0], shared, registry)  # the options every run shares, named so
    configs = []
    for spec in specs:  # bad options and impossible sizes fail here, before any process starts
        try:
            config = TrainConfig.from_options(**{**options, "backend": spec.backend, "extras": spec.extras,
                                                 **dict(spec.sizes)})
            check_extra_options(config)
            family, _ = resolve_model(config, registry)
            resolve_task(family, config, registry)  # its options (a language model takes no --beam) too
            with registry.plugin_code("models", config.model_family[0]):  # named by the scheme each result records
                configs.append(drawn_init(config, family))
        except MtbenchError as error:
            raise MtbenchError(f"run '{spec.label}': {error}" if spec.sizes else str(error)) from None
        try:  # what `train` refuses before it imports a framework, refused before any run trains
            chosen = choose_plugins(configs[-1], registry)
            check_launch(configs[-1], chosen, Launch(num_processes=spec.processes))
            check_options_against_extras(configs[-1], chosen)
        except MtbenchError as error:
            raise MtbenchError(f"run '{spec.label}': {error}") from None
    shapes = [config.model for config in configs]
    configs = [config.to_dict() for config in configs]
    specs = named_as_results(specs, configs)
    refuse_the_same_configuration_twice(specs, configs, shapes)
    devices = probe(runs_to_preflight(specs, configs))
    trained, said = dtypes_trained(specs, configs, devices, registry)  # (before the compiled twins join them)
    refuse_the_same_configuration_twice(specs, trained, shapes, said)
    twins = matrix is None and step == "auto" and TORCH_COMPILED not in extras
    if twins:
        specs = with_compiled_twins(specs, devices, registry)
    check_same_hardware(specs, devices, interpreters)
    check_dtype(specs, options["dtype"], devices, registry)
    compiled_added = twins and any(TORCH_COMPILED in spec.extras for spec in specs)
    if asked_compile_mode and not any(TORCH_COMPILED in spec.extras for spec in specs):
        raise MtbenchError(f"--compile-mode {asked_compile_mode}: no run compiles torch's step (on a CPU, name "
                           f"'{TORCH_COMPILED}' in --matrix or give --step compiled); leave --compile-mode out")
    # --compile-mode is given to the runs that compile torch's step alone (the others' configuration keeps the
    # default): reduce-overhead (CUDA graphs) for those compare adds.
    compile_mode = asked_compile_mode or ("reduce-overhead" if compiled_added else None)
    lines = [f"torch sees a CUDA GPU: each torch run trains eager and compiled ({TORCH_COMPILED}, --compile-mode "
             f"{compile_mode}), two rows; --matrix names the runs exactly"] if compiled_added else []
    return PlannedRuns(with_compile_mode(specs, compile_mode), interpreters, compile_mode,
                       lines + eager_only_lines(specs, devices, registry))
