"""Keras's most called layers (`Dense`, `LayerNormalization`, `Embedding`, and mtbench's float32 `Embedding`) as
the torch operations their `call` reaches on the torch backend, for mtbench's torch steps.

Each Keras operation on torch costs several microseconds of Python before its kernel (converting and checking
every argument, resolving dtypes, reading the device), and a `Dense` layer makes three: with `Layer.__call__`'s
bookkeeping already gone (`torch_plain_calls`), a `Dense` call still took 85 us against 16 for `nn.Linear`, and a
`LayerNormalization` 67 against 11, the largest part of the gap between mtbench's eager step and a hand-written
one (benchmarks/host_overhead.py). A kernel here runs the same torch operations on the same tensors in the same
dtypes (the variables cast as the layer's autocast scope casts them, the input as `convert_input` casts it), so
every number and gradient is Keras's; it serves only the exact built-in class in its plain configuration (no
LoRA, no quantization, an activation it knows: linear, ReLU, exact GELU) and returns `NotImplemented` for
anything else, which is then called as Keras calls it. `tests/plugins/backends/test_torch_layer_kernels.py`
checks outputs and gradients bit for bit against Keras's own `call`.
"""

import torch
import torch.nn.functional as F

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                 "float64": torch.float64}


def _variable(variable, autocast_dtype):
    """The tensor Keras's `variable.value` gives inside an autocast scope of `autocast_dtype` (None: no cast)."""
    value = variable._value
    if autocast_dtype is not None and variable._autocast and value.is_floating_point():
        dtype = _TORCH_DTYPES[autocast_dtype]
        return value if value.dtype == dtype else value.to(dtype)
    return value


def _floating_input(layer, x):
    """`x` as `dtype_policy.convert_input` gives it to `call` (floating inputs cast to the layer's input dtype
    when the layer autocasts), or None where that is not a plain floating tensor."""
    if type(x) is not torch.Tensor or not x.is_floating_point():
        return None
    dtype = _TORCH_DTYPES.get(layer.input_dtype)
    if dtype is None:
        return None
    return x.to(dtype) if layer.autocast and x.dtype != dtype else x


def _identity(x):
    return x


def _exact_gelu(x):
    """`keras.activations.gelu` (`approximate=False`, what `activation="gelu"` gives) on torch."""
    return F.gelu(x)


# Keras's activation functions that `dense` runs as the one torch function Keras's torch backend calls, filled by
# `layer_kernels` (outside any torch.compile trace, which would guard on the filling).
_KNOWN_ACTIVATIONS = {}


def dense(layer, args, kwargs, autocast_dtype):
    """`keras.layers.Dense.call`: `matmul(x, kernel)`, `add(bias)`, the activation."""
    if len(args) != 1 or kwargs.keys() - {"training"} or layer.lora_enabled or layer.quantization_mode:
        return NotImplemented
    activation = _identity if layer.activation is None else _KNOWN_ACTIVATIONS.get(layer.activation)
    x = _floating_input(layer, args[0])
    if activation is None or x is None:
        return NotImplemented
    kernel = _variable(layer._kernel, autocast_dtype)
    if kernel.dtype != x.dtype or kernel.device != x.device:
        return NotImplemented  # Keras would find a common dtype (and move a host input to the device) first
    y = torch.matmul(x, kernel)
    if layer.bias is not None:
        bias = _variable(layer.bias, autocast_dtype)
        if bias.dtype != y.dtype:
            return NotImplemented
        y = torch.add(y, bias)
    return activation(y)


def layer_normalization(layer, args, kwargs, autocast_dtype):
    """`keras.layers.LayerNormalization.call` over the last axis: computed in (at least) float32 by
    `F.layer_norm`, as `keras.ops.layer_normalization` does on torch, cast back to the input's and then the
    layer's dtype."""
    if len(args) != 1 or kwargs or layer.rms_scaling or getattr(layer, "quantization_mode", None):
        return NotImplemented
    x = _floating_input(layer, args[0])
    if x is None or list(layer.axis) not in ([-1], [x.ndim - 1]):
        return NotImplemented
    if any(weight is not None and weight._value.device != x.device for weight in (layer.gamma, layer.beta)):
        return NotImplemented
    original = x.dtype
    normalized = x if x.dtype in (torch.float32, torch.float64) else x.to(torch.float32)
    gamma = None if layer.gamma is None else _variable(layer.gamma, autocast_dtype).to(normalized.dtype)
    beta = None if layer.beta is None else _variable(layer.beta, autocast_dtype).to(normalized.dtype)
    outputs = F.layer_norm(normalized, (x.shape[-1],), gamma, beta, layer.epsilon).to(original)
    return outputs.to(_TORCH_DTYPES[layer.compute_dtype])


def _take_rows(layer, ids, variable, autocast_dtype, ids_through_int32=False):
    """`take(table, ids, axis=0)` as Keras's torch backend computes it (negative ids counted from the end), cast to
    the layer's dtype; NotImplemented unless `ids` is a tensor of integers on the table's device (host ids: Keras's
    `take` moves them to the device)."""
    if type(ids) is not torch.Tensor or ids.dtype not in (torch.int32, torch.int64):
        return NotImplemented
    table = _variable(variable, autocast_dtype)
    if ids.device != table.device:
        return NotImplemented
    ids = (ids.to(torch.int32) if ids_through_int32 else ids).long()
    ids = torch.where(ids < 0, ids + table.shape[0], ids)
    return F.embedding(ids, table).to(_TORCH_DTYPES[layer.compute_dtype])


def embedding(layer, args, kwargs, autocast_dtype):
    """`keras.layers.Embedding.call`: `take(embeddings, ids, axis=0)`, cast to the layer's dtype."""
    if len(args) != 1 or kwargs or layer.lora_enabled or layer.quantization_mode:
        return NotImplemented
    return _take_rows(layer, args[0], layer._embeddings, autocast_dtype)


def float32_embedding(layer, args, kwargs, autocast_dtype):
    """`mtbench.keras_models.transformer.Embedding.call`: ids cast to int32, `take` from the float32 table (never
    autocast), cast to the layer's dtype."""
    if len(args) != 1 or kwargs:
        return NotImplemented
    return _take_rows(layer, args[0], layer.embeddings, None, ids_through_int32=True)


def layer_kernels():
    """{Keras layer class: its kernel}: only these exact classes (a subclass may override `call`)."""
    from keras import activations, layers

    from mtbench.keras_models.transformer import Embedding
    _KNOWN_ACTIVATIONS.update({activations.linear: _identity, activations.relu: F.relu, activations.gelu: _exact_gelu})
    return {layers.Dense: dense, layers.LayerNormalization: layer_normalization, layers.Embedding: embedding,
            Embedding: float32_embedding}
