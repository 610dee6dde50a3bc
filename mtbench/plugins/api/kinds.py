"""What plugins provide: backends, extras, datasets and reporters. Subclass these and register instances from
the matching `mtbench_register_*` hook (see `hookspecs.py`). For a problem the user can fix (a bad option, a
missing file), raise `mtbench.MtbenchError` with one line that says what to do: mtbench prints it as it is.
Any other exception is reported as a failure of the plugin, with the plugin's name."""

import importlib.util
from dataclasses import dataclass, field

from mtbench.errors import MtbenchError
from mtbench.plugins.api.host import unusable_directory
from mtbench.plugins.api.processes import Launch, ProcessGroup


@dataclass
class RunContext:
    """What a plugin may look at while a run is set up: the configuration, the backend, (once the framework is
    imported) the device, and the shape of the model the family will build (`ModelShape`: heads, dimensions).
    Extras may add keyword arguments for the model's builder to `model_options` (for example
    `flash_attention`), and keep what they learn in `extras_state[name]`."""
    config: object
    backend: "Backend"
    device: dict = field(default_factory=dict)
    model_shape: object = None
    model_options: dict = field(default_factory=dict)
    extras_state: dict = field(default_factory=dict)
    compile_cache: dict = None  # the persistent compilation cache as the run started (`Backend.open_compile_cache`)
    processes: ProcessGroup = field(default_factory=lambda: ProcessGroup(Launch()))  # `Backend.start_processes`
    matmul_precision: dict = None  # {'requested': ..., what the framework reports}: `Backend.set_matmul_precision`
    attention: dict = None         # what each kind of attention runs, once the model is built (see `attention_kernels`)
    cpu_share: dict = None         # this process's CPUs and threads beside the machine's other processes, or None
    # The kinds of attention the model family's model runs (`ModelFamily.attention_kinds`).
    attention_kinds: tuple = ("causal", "masked", "decoding")
    # The share of attention probabilities the model will drop while it trains (`ModelFamily.attention_dropout`):
    # 0.0 where it drops none. Above 0, the fused kernels cannot run it.
    attention_dropout: float = 0.0
    # Whether the model family builds blocks that recompute their activations when asked
    # (`ModelFamily.recomputes_blocks`, `model_options["remat"]`).
    model_recomputes_blocks: bool = False
    task: object = None            # the run's `Task` (`ModelFamily.task` names it)
    # --attention and what it chose: {'asked': auto/fused/unfused, 'fused': bool, 'why_unfused' or 'by_extra'}.
    attention_choice: dict = None
    # --step and what it chose: {'asked': auto/compiled/eager, 'by_extra': the extra compiling the step or None,
    # 'why_not' where none does}.
    step_choice: dict = None
    # --dtype and what it chose: {'asked': auto or a dtype, 'dtype': the policy the run trains in, 'why_float32'
    # where auto kept float32, or 'by_extra' where an extra's `config_changes` set it}. `config.dtype` is the dtype
    # chosen.
    dtype_choice: dict = None

    @property
    def device_kind(self):
        return self.device.get("kind", "unknown")


class Backend:
    """One framework under Keras. One process runs one backend: keras reads its backend once, at import."""
    name = ""
    keras_backend = ""
    framework_modules = ()  # importable modules the backend needs; checked before anything is imported
    description = ""
    # (since 1.22) How `compile_inference` runs the model, in words (the result's `model.inference`, the `inference`
    # row beside the figures): decoding's loop compiled into one program or run step by step from Python is other
    # work. None: a backend that compiles inference its own way and does not say how.
    inference = None

    def missing_framework(self):
        """A reason the framework cannot be imported here, or None."""
        missing = [m for m in self.framework_modules if importlib.util.find_spec(m) is None]
        if missing:
            return (f"backend '{self.name}' needs {', '.join(missing)}, which is not installed "
                    f"(pip install 'mtbench[{self.name}]')")
        return None

    def prepare_process(self, config):
        """Environment variables to set before keras (and the framework) is imported."""
        return {}

    def unsupported_dtype_reason(self, dtype, device):
        """Why this backend cannot train in `dtype` (a Keras dtype policy name) on `device`, or None."""
        return None

    def start_processes(self, launch):
        """Joins this process to the run's other processes (`launch`, a `Launch`) through the framework's
        collectives and returns the `ProcessGroup`. Called once keras is imported, before the framework computes
        anything. The default serves a run of one process."""
        if launch.num_processes > 1:
            raise MtbenchError(f"backend '{self.name}' trains in one process only; this launch started "
                               f"{launch.num_processes}")
        return ProcessGroup(launch)

    def framework_versions(self):
        """{package: version} of the framework packages."""
        return {}

    def accelerator_environment(self):
        """What the framework reports of the accelerator software it runs on and of its float32 arithmetic:
        {'cuda_version': str or None (the CUDA runtime it uses, '12.8'), 'rocm_version': str or None (ROCm's,
        '6.4.43482'), 'cudnn_version': str or None ('9.8.0'), 'float32_matmul': {setting: value} as the framework
        reports it now (TF32 switches, matmul precision)}. None for what the framework's build lacks (a CPU-only
        build has no CUDA); never raises.
        Called with the framework imported, keras perhaps not. The default reports nothing."""
        return {}

    def device_info(self):
        """{'kind': 'cpu'|'gpu'|'tpu', 'name': str, 'count': int, ...} of the devices the run uses; 'bfloat16':
        True where they compute bfloat16 natively (a CUDA GPU of compute capability 8.0 or more, an AMD MI100 or
        later, a TPU), which `--dtype auto` reads (absent or False: auto trains float32)."""
        raise NotImplementedError(f"backend '{self.name}' ({type(self).__name__}) does not implement device_info, "
                                  f"which every backend must")

    def synchronize(self, model=None):
        """Blocks until the device has finished all queued work (at least every variable of `model`), so a
        clock read after it is honest."""
        raise NotImplementedError(f"backend '{self.name}' ({type(self).__name__}) does not implement synchronize, "
                                  f"which every backend must")

    def random_generator_state(self):
        """The state of the framework's own random generators that the model's random layers draw from, as a 1-D
        numpy uint8 array of the same length in every process of the run, or None where every draw comes from the
        model's variables (the default: Keras's seed-generator states, which a checkpoint keeps with the weights).
        A checkpoint keeps it for each process, so that a resumed run draws the masks an uninterrupted one would."""
        return None

    def restore_random_generator_state(self, state):
        """Puts back what `random_generator_state` returned, in this process, before a resumed run's first step."""

    def peak_device_bytes(self):
        """Peak memory in bytes of the largest device this process computes on, since the process started, as the
        framework reports it, or None where it reports none."""
        return None

    def reset_peak_device_bytes(self):
        """Deprecated, no longer called: every backend's peaks count from the process's start, the one scope
        JAX's allocators offer, so that both backends' peaks hold the same work. (It was called as training
        started, to start the peak of `device_memory` afresh.)"""
        return False

    def device_memory(self):
        """[{'device': name, 'index': int, 'peak_bytes': int, 'in_use_bytes': int}] for each device this process
        computes on (index: the framework's number for it), as the framework's allocator counts them (bytes held by
        live arrays or tensors, not what the allocator reserved from the driver); None where the framework reports
        none (CPUs)."""
        return None

    def matmul_flops_per_s(self, dtype, size):
        """Measured FLOP/s of a square `size` matmul in `dtype` on the run's device (the peak for MFU on
        devices without a datasheet figure). Median of several synchronised repeats after a warm-up."""
        raise NotImplementedError

    def compilations(self):
        """A running count of programs the framework has compiled in this process, or None where it does not
        compile ahead of running."""
        return None

    def open_compile_cache(self, config):
        """Called once in a training process (and in one that runs a saved model or draws initial weights), after
        the framework is imported and before it compiles anything: points the framework's persistent compilation
        caches at this backend's directory under `config.cache_dir`, or, when `config.compile_cache` is false,
        keeps nothing of earlier processes. Returns `compile_cache_state(...)`: whether the run starts cold or warm,
        or why the cache is off; None where the backend has no compiler whose work a cache could keep."""
        return None

    def compile_cache_entries(self, directory):
        """How many compiled programs the cache in `directory` holds now."""
        return None

    def compile_cache_hits(self):
        """{'hits': N, 'misses': N}: lookups of compiled programs in the persistent cache by this process so
        far, or None where the framework does not count them."""
        return None

    def compile_cache_state(self, directory, off_reason=None):
        """The record of the cache as a run starts: 'off' without a `directory` (`off_reason` says why) or where
        `directory` cannot be made (since 1.26; its reason says why), else 'warm' when it already holds programs
        compiled by earlier processes, 'cold' when it holds none."""
        problem = directory and unusable_directory(directory)
        if problem:
            return {"dir": None, "state": "off", "reason": problem, "entries_before": None, "unusable_dir": directory}
        if directory is None:
            return {"dir": None, "state": "off", "reason": off_reason, "entries_before": None}
        entries = self.compile_cache_entries(directory)
        return {"dir": directory, "state": "warm" if entries else "cold", "reason": None, "entries_before": entries}

    def set_matmul_precision(self, precision):
        """Called once keras is imported, before the model is built: makes float32 matmuls run in `precision`,
        'highest' (true float32) or 'high' (TF32 where the device has it), and returns what the framework then
        reports, {setting: value} read back from it (not the values asked for). None: this backend cannot set it
        (a run asking for 'high' then stops; 'highest' is recorded as not reported)."""
        return None

    def attention_kernels(self, fused, device, run):
        """Called once before the model is built with whether an extra asked for fused attention kernels: may
        restrict the framework's attention in this process to that class of kernel (so that no dispatcher picks
        another behind the run's back), and returns {'causal', 'masked', 'decoding': the implementation each
        kind of attention runs}. None: nothing to restrict; each kind is then named by
        `attention_implementation`. `run` (since 1.27) is the `RunContext`, where a dispatcher that chooses by
        the inputs finds what the model will attend over: `run.model_shape` (None where its family knows it only
        once built), `run.config.max_len` and `run.config.dtype`."""
        return None

    def attention_implementation(self, fused, device):
        """What `keras.ops.dot_product_attention` runs on `device` (`device_info()`) with `flash_attention=fused`
        (mtbench always says True or False, never leaving Keras to choose)."""
        return "fused" if fused else "plain"

    def host_sync_counter(self):
        """A counter of the host waits inside a train step (tensors made from host data for the device, device
        values read on the host), or None where the backend cannot count them. It has `count_step(step, x, y,
        sample_weight)` (runs one step counting, returns the step's logs), `per_step()` (waits per counted step,
        None where it could not see them) and `events` ({'what, where': count}). Called once keras is imported;
        the loop counts one steady step of every run, timed apart from the steady figures."""
        return None

    def step_profiler(self, directory):
        """A profiler of train steps that writes its trace under `directory`, or None where this backend has none
        (`--profile` is then refused before the framework is imported). It has `start()`, `step(number)` (a
        context manager around one step, which the trace names "mtbench train step N") and `stop()` (ends the trace,
        writes it and returns the files written); optionally (since 1.11) `operations()`, where the trace's time went
        (`on`, `units`, `busy_s`, `total_s`, `top` and, since 1.12, optionally `kinds`: the result's
        `profile.operations`). Called once keras is imported; the loop profiles steady steps in a timing window of
        their own, timed apart from the steady figures."""
        return None

    def compile_inference(self, fn, model):
        """Returns a callable equivalent to `fn(*arrays)` (which calls `model` layers) compiled the way this
        backend runs inference fastest. The default runs it eagerly."""
        return fn

    def make_train_step(self, run, model):
        """Optionally return the `TrainStep` this backend trains with by default: the same mathematics as
        Keras's `train_on_batch`, without its per-call overhead. None keeps `KerasTrainStep(model)`. Extras may
        then wrap or replace it (`Extra.make_train_step`)."""
        return None


class Extra:
    """An optional way of training: fused attention, a compiler, data parallelism, a dtype policy.

    Never degrade silently: `unavailable_reason` must explain why the extra cannot run, and `record` must
    report only what really happened. The hooks are called in this order, in the process that trains:
    `environment` (before the framework is imported), `unavailable_reason`, `config_changes`, `before_model`,
    `compile_options`, `make_train_step`, `verify`, then training, then `record`."""
    name = ""
    description = ""
    backends = ()   # backend names the extra serves
    conflicts = ()  # names of extras that cannot run beside this one
    # Whether the extra trains one model over all the run's processes (their gradients combined): a run of
    # several processes needs one, or each process would train a model of its own.
    spans_processes = False
    # Whether `make_train_step` wraps whatever step it is given (a `WrappingStep` that calls it) rather than
    # making its own: an extra that joins the run by mtbench's choice (torch-compile under `--step`, fused
    # attention under `--attention`) is then placed before this one, so that this one wraps the compiled step.
    wraps_step = False
    # Whether a run with this extra draws every random number (dropout masks) that the run without it draws, in the
    # same order (remat: the recomputation draws the forward pass's masks again; tensor-parallel: each device of the
    # model axis draws the whole batch's). Runs that differ only by such
    # extras follow one loss curve with dropout too, and compare's parity check holds them to it. Plugin API 1.18.
    keeps_random_draws = False
    # How the extra lays one model's training over devices, in words the field uses ('data', 'sharded data',
    # 'tensor', 'pipeline'), or None for an extra that lays out nothing. Extras of other backends with the same
    # parallelism train the same way: a comparison holds jax+data-parallel@2 against torch+ddp@2 (`counterparts`).
    # Plugin API 1.32.
    parallelism = None

    def environment(self, config):
        """Environment variables to set before the framework is imported."""
        return {}

    def config_changes(self, run):
        """Called before the data is batched: {configuration key: new value} this extra needs (a TPU's batch size),
        or {}. mtbench makes the run's configuration anew with them (checked as the command line's are); the
        result's config shows them. Plugin API 1.2; it replaces `adjust_config`."""
        return {}

    def adjust_config(self, run):
        """Deprecated in plugin API 1.2 for `config_changes`: an extra that implements it may still change
        `run.config` in place (on a copy mtbench then uses)."""

    def unavailable_reason(self, run):
        """Why this extra cannot run in this run (device, dtype, devices), or None when it can. Say it without
        the extra's name, which mtbench puts in front: 'needs a CUDA GPU; this run has cpu/float32'."""
        return None

    def before_model(self, run):
        """Called after keras is imported and before the model is built (dtype policies, distribution)."""

    def compile_options(self, run):
        """Keyword arguments merged into `model.compile` (for example `jit_compile`). They govern Keras's own
        compiled functions: evaluation always, training only when the run trains with a step that calls them
        (`TrainStep.uses_compile_options`, true of `KerasTrainStep`). A run whose train step would ignore them
        stops with an error rather than record options that did not apply to training."""
        return {}

    def make_train_step(self, run, model, step):
        """Optionally return the `TrainStep` to train with instead of `step`, the one chosen so far (the
        backend's fast step, `KerasTrainStep`, or an earlier extra's). Wrap `step` to observe or change each
        call; return a new step to replace it. None keeps `step`."""
        return None

    def verify(self, run, model, batch):
        """Called once before training with the model and the run's first `Batch`: check that the extra takes
        effect (a fused kernel is in the compiled program, ...). Return a reason when it does not (without the
        extra's name); the run stops rather than measure something other than what it claims."""
        return None

    def record(self, run):
        """What the extra did, for the result JSON (verified facts, not intentions). By default, what it kept in
        `run.extras_state[self.name]`."""
        return dict(run.extras_state.get(self.name, {}))


class Dataset:
    """A parallel corpus available without a network."""
    name = ""
    description = ""
    source_lang = ""
    target_lang = ""

    def missing_reason(self):
        """Why the data cannot be read here (a package not installed), or None."""
        return None

    def read_pairs(self, progress):
        """Yields (source, target) pairs, cleaned, each sentence one line without tabs. `progress(done, total)` may
        be called to report progress."""
        raise NotImplementedError(f"dataset '{self.name}' ({type(self).__name__}) does not implement read_pairs, "
                                  f"which every dataset must")

    def fingerprint(self):
        """A string that changes whenever `read_pairs` would yield other pairs (used to key caches)."""
        return self.name


@dataclass
class TrackedRun:
    """A run as an experiment tracker sees it when it starts (`Reporter.start`)."""
    name: str            # the run's label: backend+extras[:size flags]
    result_path: str     # where the result JSON will be written
    directory: str       # the run's directory (beside the result), for a tracker's local files
    logging_dir: str     # --logging-dir, or None: the tracker's own default under `directory`
    group: str           # the compare this run belongs to (--run-group), or None
    config: dict         # the full configuration, as the result's `config` will hold it
    tags: dict           # {name: str}: backend, extras, dtype, preset, device, versions: what to filter runs by


class Reporter:
    """Presents a result once it is written: every result a command writes, complete or partial. An experiment
    tracker also follows the run while it trains (`start`, `log`), when named by `--report-to`."""
    name = ""
    description = ""
    needs = ()         # importable modules the reporter needs (a tracker's library), checked before a run starts
    install_hint = ""  # how to install them: "pip install 'mtbench[tensorboard]'"

    def missing_reason(self):
        """Why this reporter cannot run here, or None. By default: a module of `needs` is not installed."""
        missing = [module for module in self.needs if importlib.util.find_spec(module) is None]
        if missing:
            return f"{', '.join(missing)} is not installed" + (f" ({self.install_hint})" if self.install_hint else "")
        return None

    def start(self, run):
        """The run (a `TrackedRun`) is set up and about to train. Called in the training process."""

    def log(self, metrics, step):
        """Figures of the run so far, {name: number} at the global `step`: `train_loss` every step,
        `tokens_per_s` every 10 steps (the steps since the last), `val_bleu` and `val_chrf` at each validation."""

    def report(self, result, console, complete):
        """`result` is the dict written to the result JSON (see docs/results.md); `console` a
        `rich.console.Console`; `complete` is False for a partial result (a run that diverged or was
        interrupted: `result["status"]` says which, and the figures of the evaluation are null). A reporter
        that raises is named on the command's last line, which exits with code 3; the other reporters still run
        and the result file is kept."""
        raise NotImplementedError(f"reporter '{self.name}' ({type(self).__name__}) does not implement report, "
                                  f"which every reporter must")
