"""Keras layers called without `Layer.__call__`'s bookkeeping, for mtbench's torch steps.

On torch every Keras layer call runs tens of microseconds of Python before the layer's `call`: flattening its
arguments, binding them to the call signature, name scopes, build checks, masks, autocast scopes. On a GPU that
is host time the device waits for; under torch.compile it breaks the graph in every layer. `plain_layer_calls`
runs each layer's `call` with what `Layer.__call__` would have given it for an already built model: the `training`
flag of the outermost call where the layer takes one and the caller passed none, floating inputs cast to the
layer's input dtype, and the policy's autocast scope for variables. Build, masks, activity regularizers and
symbolic tracing are what it leaves out; `plain_calls_unsupported` refuses a model that would need them. The
numbers are the same (the eager step's losses equal Keras's `train_on_batch`'s, `tests/plugins/backends`).
"""

import collections
import contextlib
import sys


def plain_calls_unsupported(model):
    """Why `plain_layer_calls` cannot run `model` as Keras would (None when it can)."""
    for layer in model._flatten_layers(include_self=True):
        if not layer.built:
            return f"layer '{layer.name}' is not built"
        if layer.activity_regularizer is not None:
            return f"layer '{layer.name}' has an activity regularizer"
        if layer._call_has_mask_arg or getattr(layer, "mask_zero", False):
            return f"layer '{layer.name}' uses Keras masks (a `mask` argument or `mask_zero`)"
    return None


def _autocast_for(layer, backend):
    """(whether `Layer.__call__` would enter an autocast scope for `layer`, the dtype variables are cast to inside
    it then, None for none: the new scope's dtype, or the current scope's where none is entered). Only the layers
    Keras calls are given a scope (`AutocastScope(dtype)`); a layer kernel casts its own variables. `backend` is
    `keras.src.backend`, imported once by the caller rather than at every layer call."""
    current = backend.get_autocast_scope()
    if current is None:
        if layer.compute_dtype != layer.variable_dtype:
            return True, layer.compute_dtype
        return False, None
    if not layer.autocast or not backend.is_float_dtype(layer.compute_dtype):
        return True, None
    if current.dtype != layer.compute_dtype:
        return True, layer.compute_dtype
    return False, current.dtype


def any_keras_tensor(args=None, kwargs=None):
    """Keras's `any_symbolic_tensors` (is any argument a `KerasTensor`, so that an operation builds a functional
    graph instead of computing?), walking the lists, tuples and dicts its tree utilities would flatten, without
    torch's pytree machinery: every Keras operation asks, and on torch the pytree walk is the largest share of
    an eager step's Python (about a quarter of a tiny model's step)."""
    kinds = _walked_kinds or _load_walked_kinds()
    return bool(args and _holds_keras_tensor(args, kinds)) or \
        bool(kwargs and _holds_keras_tensor(kwargs.values(), kinds))


def _holds_keras_tensor(items, kinds):
    """One check per item: most (tensors, numbers, dtype names) end there."""
    for item in items:
        if isinstance(item, kinds) and (isinstance(item, kinds[0]) or _holds_keras_tensor(
                item.values() if isinstance(item, dict) else item, kinds)):
            return True
    return False


# (KerasTensor, the containers walked into), loaded once: importing KerasTensor at each call took most of an
# `any_keras_tensor` call's time, and this module must not import Keras before a backend is chosen.
_walked_kinds = None


def _load_walked_kinds():
    global _walked_kinds
    from keras.src.backend.common.keras_tensor import KerasTensor
    _walked_kinds = (KerasTensor, list, tuple, collections.deque, dict)
    return _walked_kinds


def _array_like(value):
    """Whether Keras's `convert_input` could change `value`: it returns anything else (flags such as
    `training`, numbers, None) as it is, after a dtype lookup and three type checks."""
    return hasattr(value, "__array__") or hasattr(value, "dtype")


_holders_of_the_symbolic_check = []  # the modules that imported Keras's `any_symbolic_tensors` by name


def _symbolic_check_holders():
    if not _holders_of_the_symbolic_check:
        from keras.src.backend.common import keras_tensor
        original = keras_tensor.any_symbolic_tensors
        _holders_of_the_symbolic_check.extend(
            module for name, module in list(sys.modules.items())
            if name.startswith("keras.src") and getattr(module, "any_symbolic_tensors", None) is original)
    return _holders_of_the_symbolic_check


@contextlib.contextmanager
def plain_layer_calls(training):
    """While inside, calling any Keras layer runs its `call` without `Layer.__call__`'s bookkeeping (see the
    module's docstring), and Keras's operations tell symbolic from eager arguments by `any_keras_tensor`;
    `training` is the flag of the outermost call."""
    import keras
    from keras.src import backend
    from keras.src.backend.common import keras_tensor

    def plain_call(layer, *args, **kwargs):
        enter_scope, autocast_dtype = _autocast_for(layer, backend)
        kernel = kernels.get(type(layer))
        if kernel is not None:
            outputs = kernel(layer, args, kwargs, autocast_dtype)
            if outputs is not NotImplemented:
                return outputs
        if layer._call_has_training_arg and kwargs.get("training") is None:
            kwargs["training"] = training
        if layer._convert_input_args:
            convert, autocast, dtype = layer.dtype_policy.convert_input, layer.autocast, layer.input_dtype
            args = [convert(arg, autocast, dtype) if _array_like(arg) else arg for arg in args]
            kwargs = {name: convert(value, autocast, dtype) if _array_like(value) else value
                      for name, value in kwargs.items()}
        with backend.AutocastScope(autocast_dtype) if enter_scope else contextlib.nullcontext():
            return layer.call(*args, **kwargs)

    from mtbench.plugins.backends.torch_layer_kernels import layer_kernels
    kernels = layer_kernels()
    keras_call, keras_check = keras.layers.Layer.__call__, keras_tensor.any_symbolic_tensors
    holders = _symbolic_check_holders()
    _load_walked_kinds()  # here rather than at a first call that torch.compile may be tracing
    keras.layers.Layer.__call__ = plain_call
    for module in holders:
        module.any_symbolic_tensors = any_keras_tensor
    try:
        yield
    finally:
        keras.layers.Layer.__call__ = keras_call
        for module in holders:
            module.any_symbolic_tensors = keras_check


def called_as_the_step_calls(model, training):
    """A context in which `model` is called as mtbench's torch step calls it: outside Keras's input checks
    (`plain_layer_calls`) where it can be, as tensor-parallel's split layers need (each takes a share of the width
    Keras would check); a check that runs the model before training (a kernel's, a recomputation's) calls it so."""
    return plain_layer_calls(training) if plain_calls_unsupported(model) is None else contextlib.nullcontext()
