"""Counts the host waits inside torch train steps: tensors made from host data for the step's device, and device
values read on the host, as a torch dispatch mode sees them (issue 29).

On CUDA each of them holds the host until the device is ready: a tensor built from a Python number or a host
array (`torch.tensor`, `torch.as_tensor`, Keras's `convert_to_tensor`) is copied from pageable memory and the
copy is waited for, and a read (`item`, `float`, `bool`: `aten._local_scalar_dense`, a copy to the host, an
operation whose output size depends on the values) waits for every queued kernel. A device that waits for the
host between steps runs slower than one that only computes; JAX's jitted step does neither.

What is counted, for a step on `device`:

* a tensor made from host data on `device` (`aten.lift_fresh`, which `torch.tensor`/`torch.as_tensor` return
  through, with the tensor already on its device), except the step's own batch arrays (`exempt`): they are
  copied once a step, pinned and without waiting on CUDA (`torch_eager_step.to_device`);
* a copy from the host to a non-CPU `device` that is blocking, or from pageable memory;
* a read: `aten._local_scalar_dense` of a tensor on `device`, a blocking copy from a non-CPU `device` to the
  host, and the operations whose output size depends on values (`nonzero`, `masked_select`, `unique`...,
  `equal`).

On the CPU the step's device is the host: the count is then what the same step would wait for on a GPU (a
tensor made from host data there would be a blocking copy; a read would wait for the device). A tensor's own reads
to the host (`cpu`, `tolist`) dispatch nothing on the CPU, where the tensor is on the host already; on a GPU they
copy it to the host, and wait. On the CPU they are counted where they are called instead (`host_reads`), once a
tensor (`x.cpu().tolist()` is one copy on a GPU). `numpy()` is no read: on a GPU it takes a host tensor only.
Filling a tensor on the device with a Python number (`torch.full`, `arange`, `x * 2.0`) launches a kernel with the
number as an argument: no copy, not counted.

The mode ignores torch.compile's internals (`ignore_compile_internals`): compiling runs without it, and a
compiled graph is counted as it runs (its kernels and what it calls through the dispatcher), not as its eager
equivalent would be.
"""

import collections
import contextlib
import os
import traceback

# Operations whose output size depends on the values: on a GPU the host reads the size back before it can go on.
VALUE_SIZED = {"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
               "unique_dim_consecutive", "equal"}
FROM_HOST = {"lift_fresh", "lift_fresh_copy", "lift"}
COPIES = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"}
# Frames not worth naming as where a sync came from: torch's and Keras's own, and this module.
_INTERNAL = (os.sep + "torch" + os.sep, os.sep + "keras" + os.sep, __file__)


def _data_pointer(array):
    """The address of a numpy array's (or a tensor's) first element, or None."""
    try:
        return array.__array_interface__["data"][0]
    except (AttributeError, KeyError, TypeError):
        return getattr(array, "data_ptr", lambda: None)()


def _caller():
    """'file:line' of the innermost frame outside torch, Keras and this module (where a sync comes from)."""
    for frame in reversed(traceback.extract_stack()):
        if not any(part in frame.filename for part in _INTERNAL):
            return f"{os.path.basename(frame.filename)}:{frame.lineno} ({frame.name})"
    return "?"


def _host_sync_mode():
    """The dispatch mode class (built on first use, so that importing this module does not import torch)."""
    global _Mode
    if _Mode is not None:
        return _Mode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls):
            return True

        def __init__(self, counter):
            super().__init__()
            self.counter = counter

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            kind = self.counter.classify(func.__name__.split(".")[0], args, kwargs, out)
            if kind:
                self.counter.record(kind, str(func))
            return out

    _Mode = Mode
    return Mode


_Mode = None


class TorchHostSyncCounter:
    """Counts host waits (see the module's docstring) inside the steps it runs: `count_step(step, x, y, w)` runs
    one train step under the counting mode, its batch arrays exempt. `syncs` is the total, `steps` how many steps
    ran, `events` {'kind op at file:line': count} says where they came from, `per_step()` the mean."""

    def __init__(self, device=None):
        import torch
        if device is None:
            from keras.src.backend.torch.core import get_device
            device = get_device()
        self.device = torch.device(device)
        self.on_host = self.device.type == "cpu"
        self.syncs = 0
        self.steps = 0
        self.events = collections.Counter()
        self._exempt = set()

    def _on_device(self, tensor):
        import torch
        if not isinstance(tensor, torch.Tensor):
            return False
        if self.on_host:
            return tensor.device.type == "cpu"
        return tensor.device.type == self.device.type

    def classify(self, name, args, kwargs, out):
        """The kind of host wait an operation is ('from host', 'to device', 'read'), or None."""
        import torch
        if name in FROM_HOST:
            if not self._on_device(out):
                return None  # made on the host for the host's own use: a copy to the device is counted then
            return None if out.data_ptr() in self._exempt else "from host"
        if name == "_local_scalar_dense":
            return "read" if self._on_device(args[0]) else None
        if name in VALUE_SIZED:
            return "read" if any(self._on_device(a) for a in args) else None
        if name in COPIES and not self.on_host:
            source = args[1] if name == "copy_" else args[0]
            target = args[0] if name == "copy_" else out
            if not (isinstance(source, torch.Tensor) and isinstance(target, torch.Tensor)):
                return None
            non_blocking = bool(kwargs.get("non_blocking", args[2] if name == "copy_" and len(args) > 2 else False))
            if source.device.type == "cpu" and self._on_device(target):
                return None if non_blocking and source.is_pinned() else "to device"
            if self._on_device(source) and target.device.type == "cpu":
                return None if non_blocking else "read"
        return None

    def record(self, kind, op):
        self.syncs += 1
        self.events[f"{kind} {op} at {_caller()}"] += 1

    def exempt(self, *arrays):
        """Host arrays the step may turn into tensors without counting (the batch's own, copied once a step)."""
        self._exempt = {_data_pointer(a) for a in arrays} - {None}

    @contextlib.contextmanager
    def counting(self):
        """The context in which torch operations are counted (enter it around steady steps only)."""
        with host_reads(self) if self.on_host else contextlib.nullcontext(), _host_sync_mode()(self):
            yield

    def count_step(self, step, x, y, sample_weight):
        """Runs `step(x, y, sample_weight)` counting its host waits; returns what the step returns."""
        self.exempt(*x, y, sample_weight)
        try:
            with self.counting():
                logs = step(x, y, sample_weight)
        finally:
            self._exempt = set()
        self.steps += 1
        return logs

    def per_step(self):
        """Host waits per counted step (None before any)."""
        return self.syncs / self.steps if self.steps else None


HOST_READS = ("cpu", "tolist")


@contextlib.contextmanager
def host_reads(counter):
    """While inside, a tensor's first `cpu` or `tolist` is a read for `counter` (on a GPU a copy to the host, which
    the dispatch mode sees; on the CPU nothing is dispatched), unless torch.compile is tracing (a compiled graph is
    counted as it runs)."""
    import torch
    read = {}  # id: tensor, of each tensor read (on the CPU `cpu()` returns the tensor), held to the counting's end

    def reading(name, method):
        def reading_call(tensor, *args, **kwargs):
            if not torch.compiler.is_compiling() and id(tensor) not in read:
                counter.record("read", f"Tensor.{name}")
                read[id(tensor)] = tensor
            return method(tensor, *args, **kwargs)
        return reading_call

    methods = {name: getattr(torch.Tensor, name) for name in HOST_READS}
    own = {name: torch.Tensor.__dict__.get(name) for name in HOST_READS}  # None: inherited from torch's C class
    try:
        for name, method in methods.items():
            setattr(torch.Tensor, name, reading(name, method))
        yield
    finally:
        for name, defined in own.items():
            if defined is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, defined)


def _large_negative_on_device(dtype):
    """Keras's `_get_large_negative` (the additive mask value of its torch `dot_product_attention`: -0.7 times
    the dtype's largest value, float16's largest for float16) filled on the device, where Keras's makes the
    tensor from a Python number, a host copy per masked attention."""
    import torch
    from keras.src import backend
    from keras.src.backend.torch.core import get_device, to_torch_dtype
    dtype = backend.standardize_dtype(dtype)
    value = 65500.0 if dtype == "float16" else 3.38953e38
    return torch.full((), value * -0.7, dtype=to_torch_dtype(dtype), device=get_device())


@contextlib.contextmanager
def keras_constants_on_device():
    """While inside, the constants Keras's torch operations make from Python numbers on every call are filled on
    the device instead (the same values): the large negative value of a masked `dot_product_attention`."""
    from keras.src.backend.torch import nn
    keras_large_negative = nn._get_large_negative
    nn._get_large_negative = _large_negative_on_device
    try:
        yield
    finally:
        nn._get_large_negative = keras_large_negative
