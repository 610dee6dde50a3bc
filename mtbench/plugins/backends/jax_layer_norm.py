"""Keras's `LayerNormalization` in mtbench's JAX train steps, as JAX's best users compute it: the variance from the
mean and the mean of squares of the input (Flax's `LayerNorm`, `use_fast_variance`, its default), where Keras's
`ops.layer_normalization` on JAX takes it from a second pass over the centred input (`jnp.var`).

Both read the input in float32 whatever the compute dtype; the one-pass form reads the input once. They give the
same numbers to float32's rounding where an input's mean is not large against its spread; where it is, the mean of
squares less the squared mean loses digits that the centred form and torch's Welford keep (Flax's users take that
trade). Compiled for an H100 (`benchmarks/program_cost.py --rows 16 --block-size 1024
--target h100`), GPT-2 small's step names 1.2 GB less a step in 48 fewer kernels, the bytes the best-by-hand JAX
step's kernels name. torch computes the same statistics in one pass too (`F.layer_norm` and inductor's generated
norm, Welford's).

Each layer norm is traced as its own `jax.jit` (XLA inlines it again, but fuses it on its own terms). Without that
boundary, XLA on the CPU fuses the layer-norm backward of every later layer into each transposed copy that feeds
a kernel gradient, recomputing the residual stream's gradient chain dozens of times (about a fifth of the step
on the `small` preset); with it, the chain is materialised once, as it is for the Flax baseline's layer norm.

Only the exact Keras class in its plain configuration (the last axis, no RMS scaling) takes the one-pass form;
anything else (a subclass may override `call`) keeps its own `call`, traced the same way.
"""

import contextlib
import functools

from mtbench.plugins.backends.layer_norm_rows import forms_text


class TracedForms:
    """Which layer norms a step's program computes in one pass and which by their own `call`, as it was traced:
    what the step ran, not what it was set up to run (a norm the model never calls is in neither)."""

    def __init__(self, layers):
        self.ids = [id(layer) for layer in layers]
        self.one_pass, self.own_call = set(), set()
        # {id of a norm: id of the norm whose call computes it}: a pipeline's later stages, stacked under the first's
        self.stand_ins = {}

    def stand_in(self, layer, by):
        """`layer` is computed by `by`'s call (with its own weights), and takes the form `by` was traced in."""
        self.stand_ins[id(layer)] = id(by)

    def text(self):
        """The step's layer-norm statistics in a few words, for `TrainStep.numerics`."""
        total = len(self.ids)
        if total and not (self.one_pass or self.own_call):
            return f"none traced ({total} layer norms in the model)"
        computed_by = [self.stand_ins.get(layer, layer) for layer in self.ids]
        one_pass = sum(layer in self.one_pass for layer in computed_by)
        own_call = sum(layer in self.own_call for layer in computed_by)
        return forms_text("one pass: the variance as the mean of squares less the squared mean, in float32 or wider",
                          one_pass, own_call, total, total - one_pass - own_call)


def one_pass_call(layer, traced=None):
    """`layer.call` with the variance from the mean of squares (the last axis, in at least float32), cast back
    to the input's and then the layer's dtype, as Keras's; the layer's own `call` for any other axis, RMS scaling
    or a subclass. `traced` (a `TracedForms`) learns which of the two each trace took."""
    import jax
    import jax.numpy as jnp
    import keras

    keras_call = layer.call
    traced = traced or TracedForms([layer])

    def own_call(*args, **kwargs):
        traced.own_call.add(id(layer))
        return keras_call(*args, **kwargs)

    if type(layer) is not keras.layers.LayerNormalization:
        return own_call

    def call(inputs):
        axes = [axis % inputs.ndim for axis in (layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis])]
        if layer.rms_scaling or axes != [inputs.ndim - 1]:
            return own_call(inputs)
        traced.one_pass.add(id(layer))
        x = inputs.astype(jnp.promote_types(inputs.dtype, jnp.float32))
        mean = jnp.mean(x, axis=-1, keepdims=True)
        variance = jnp.maximum(jnp.mean(jnp.square(x), axis=-1, keepdims=True) - jnp.square(mean), 0.0)
        scale = jax.lax.rsqrt(variance + layer.epsilon)
        if layer.gamma is not None:
            scale = scale * layer.gamma.value.astype(x.dtype)
        outputs = (x - mean) * scale
        if layer.beta is not None:
            outputs = outputs + layer.beta.value.astype(x.dtype)
        return outputs.astype(inputs.dtype).astype(layer.compute_dtype)

    return call


@contextlib.contextmanager
def one_pass_layer_norms(layers, traced=None):
    """While inside, each of `layers` computes its statistics in one pass (`one_pass_call`), traced as its own
    `jax.jit`; `traced` (a `TracedForms` of `layers`) learns which form each trace took."""
    import jax

    def separately(call):
        return lambda *args, **kwargs: jax.jit(functools.partial(call, **kwargs))(*args)

    for layer in layers:
        layer.call = separately(one_pass_call(layer, traced))
    try:
        yield
    finally:
        for layer in layers:
            del layer.call  # the class's own `call` again
