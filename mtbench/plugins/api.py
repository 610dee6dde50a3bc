"""What plugins provide: backends, extras, datasets and reporters. Subclass these and register instances from
the matching `mtbench_register_*` hook (see `hookspecs.py`)."""

import importlib.util
from dataclasses import dataclass, field


@dataclass
class RunContext:
    """What a plugin may look at while a run is set up: the configuration, the backend, and (once the
    framework is imported) the device. Extras may add keyword arguments for `build_transformer` to
    `model_options` (for example `flash_attention`), and keep what they learn in `extras_state[name]`."""
    config: object
    backend: "Backend"
    device: dict = field(default_factory=dict)
    model_options: dict = field(default_factory=dict)
    extras_state: dict = field(default_factory=dict)

    @property
    def device_kind(self):
        return self.device.get("kind", "unknown")


class Backend:
    """One framework under Keras. One process runs one backend: keras reads its backend once, at import."""
    name = ""
    keras_backend = ""
    framework_modules = ()  # importable modules the backend needs; checked before anything is imported
    description = ""

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

    def framework_versions(self):
        """{package: version} of the framework packages."""
        return {}

    def device_info(self):
        """{'kind': 'cpu'|'gpu'|'tpu', 'name': str, 'count': int, ...} of the devices the run uses."""
        raise NotImplementedError

    def synchronize(self, model=None):
        """Blocks until the device has finished all queued work (at least every variable of `model`), so a
        clock read after it is honest."""
        raise NotImplementedError

    def peak_device_bytes(self):
        """Peak device memory in bytes as the framework reports it, or None where it reports none."""
        return None

    def matmul_flops_per_s(self, dtype, size):
        """Measured FLOP/s of a square `size` matmul in `dtype` on the run's device (the peak for MFU on
        devices without a datasheet figure). Median of several synchronised repeats after a warm-up."""
        raise NotImplementedError

    def compilations(self):
        """A running count of programs the framework has compiled in this process, or None where it does not
        compile ahead of running."""
        return None

    def compile_inference(self, fn, model):
        """Returns a callable equivalent to `fn(*arrays)` (which calls `model` layers) compiled the way this
        backend runs inference fastest. The default runs it eagerly."""
        return fn

    def make_train_step(self, run, model):
        """Optionally return the `TrainStep` this backend trains with by default: the same mathematics as
        Keras's `train_on_batch`, without its per-call overhead. None keeps `train_on_batch`. An extra's
        `make_train_step` still replaces it."""
        return None


class Extra:
    """An optional way of training: fused attention, a compiler, data parallelism, a dtype policy.

    Never degrade silently: `unavailable_reason` must explain why the extra cannot run, and `record` must
    report only what really happened."""
    name = ""
    description = ""
    backends = ()   # backend names the extra serves
    conflicts = ()  # names of extras that cannot run beside this one

    def environment(self, config):
        """Environment variables to set before the framework is imported."""
        return {}

    def adjust_config(self, run):
        """Called before the data is batched: may change `run.config` (batch size, bucket step). Whatever it
        changes is what the result's config shows."""

    def unavailable_reason(self, run):
        """Why this extra cannot run in this run (device, dtype, devices), or None when it can."""
        return None

    def before_model(self, run):
        """Called after keras is imported and before the model is built (dtype policies, distribution)."""

    def compile_options(self, run):
        """Keyword arguments merged into `model.compile` (for example `jit_compile`)."""
        return {}

    def make_train_step(self, run, model):
        """Optionally return a `TrainStep` that replaces Keras's own (`model.train_on_batch`); None keeps it."""
        return None

    def verify(self, run, model, batch):
        """Called once before training with the model and a real batch: check that the extra takes effect
        (a fused kernel is in the compiled program, ...). Return a reason when it does not; the run stops
        rather than measure something other than what it claims."""
        return None

    def record(self, run):
        """What the extra did, for the result JSON (verified facts, not intentions). By default, what it kept in
        `run.extras_state[self.name]`."""
        return dict(run.extras_state.get(self.name, {}))


class TrainStep:
    """One optimisation step on a batch. `finalize` writes any state the step keeps outside the model (replicated
    parameters, optimizer slots) back into the Keras variables, so that evaluation sees the trained weights.
    A step whose work may still be running when it returns must wait for it: the caller reads its clock then."""
    name = ""  # recorded in the result as `train_step`

    def __call__(self, x, y, sample_weight):
        """Returns {'loss': float, 'accuracy': float} of the batch, computed before the update."""
        raise NotImplementedError

    def finalize(self):
        pass


class KerasTrainStep(TrainStep):
    """Keras's own compiled train step."""
    name = "keras-train-on-batch"

    def __init__(self, model):
        self.model = model

    def __call__(self, x, y, sample_weight):
        return self.model.train_on_batch(x, y, sample_weight=sample_weight, return_dict=True)


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
        """Yields (source, target) pairs, cleaned. `progress(done, total)` may be called to report progress."""
        raise NotImplementedError

    def fingerprint(self):
        """A string that changes whenever `read_pairs` would yield other pairs (used to key caches)."""
        return self.name


class Reporter:
    """Presents a finished result."""
    name = ""
    description = ""

    def report(self, result, console):
        """`result` is the dict written to the result JSON; `console` a `rich.console.Console`."""
        raise NotImplementedError
