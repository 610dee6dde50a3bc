"""mtbench's JAX steps compute each layer norm's statistics in one pass over its input (Flax's form), read from the
step's own program, with the numbers and gradients of Keras's `LayerNormalization` to float32's rounding."""

import numpy as np
import pytest

from conftest import keras_on_jax, tiny_jax_gpt


def sub_jaxprs(eqn):
    """The programs an equation calls (a nested `jit`'s body)."""
    found = []
    for value in eqn.params.values():
        body = getattr(value, "jaxpr", None)
        if body is not None and hasattr(body, "eqns"):
            found.append(body)
        elif hasattr(value, "eqns"):
            found.append(value)
    return found


def reductions_over_features(jaxpr, centred_inputs=frozenset()):
    """[(reads a centred value?)] for every sum over the last axis of a rank-3 floating array in `jaxpr` and the
    programs it calls: whether the summed array depends on a subtraction (`x - mean`), within `jaxpr` or through the
    inputs given in `centred_inputs`."""
    centred = {var for index, var in enumerate(jaxpr.invars) if index in centred_inputs}
    found = []
    for eqn in jaxpr.eqns:
        reads_centred = any(not hasattr(var, "val") and var in centred for var in eqn.invars)
        if eqn.primitive.name == "reduce_sum":
            operand = eqn.invars[0].aval
            if operand.ndim == 3 and tuple(eqn.params["axes"]) == (2,) and "float" in str(operand.dtype):
                found.append(reads_centred)
        for body in sub_jaxprs(eqn):
            inner = frozenset(index for index, var in enumerate(eqn.invars)
                              if not hasattr(var, "val") and var in centred)
            found.extend(reductions_over_features(body, inner))
        if reads_centred or eqn.primitive.name == "sub":
            centred.update(eqn.outvars)
    return found


@pytest.fixture(scope="module")
def tiny_gpt_step():
    """(The tiny GPT's JAX train step, its layer norms, one batch), in mixed bfloat16."""
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    from mtbench.plugins.backends.layer_norm_rows import layer_norms
    model = tiny_jax_gpt("mixed_bfloat16")
    ids = np.ones((4, 32), np.int32)
    return JitTrainStep(model), layer_norms(model), ((ids,), ids, np.ones((4, 32), np.float32))


def test_each_layer_norm_of_the_step_reads_its_input_in_one_pass(tiny_gpt_step):
    """Each norm's forward, traced as its own `jit` and run before any gradient, sums the input and its square:
    nothing it sums is centred first, so XLA reads the input once (one multi-output reduction on a GPU). Keras's
    own form sums `x - mean` in a second pass, and fails this."""
    import jax
    step, norms, batch = tiny_gpt_step
    state = tuple([variable.value for variable in variables] for variables in step._keras_state())
    program = jax.make_jaxpr(step._step)(state, *batch, step.schedule_arguments()).jaxpr
    (body,) = sub_jaxprs(program.eqns[0])  # the jitted step
    calls = [eqn for eqn in body.eqns if eqn.params.get("name") == "call"]
    assert len(norms) == 5 and len(calls) == 2 * len(norms)  # each norm's forward, then its backward
    for forward in calls[:len(norms)]:
        (norm,) = sub_jaxprs(forward)
        assert reductions_over_features(norm) == [False, False]


@pytest.mark.filterwarnings("ignore:You passed `rms_scaling=True`")  # deprecated in Keras, still served
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("options", [{}, {"center": False}, {"scale": False}, {"rms_scaling": True},
                                     {"axis": 1}])
def test_a_layer_norm_in_one_pass_gives_keras_numbers_and_gradients(policy, options):
    """Against Keras's own `call`, on inputs off centre (a mean of 0.5, a spread of 3): outputs and the gradients
    of the input, the scale and the offset to float32's rounding, in the layer's dtype. RMS scaling and a norm
    over another axis are Keras's own call, bit for bit."""
    keras = keras_on_jax()
    import jax
    import jax.numpy as jnp

    from mtbench.plugins.backends.jax_layer_norm import one_pass_layer_norms
    keras.config.set_dtype_policy(policy)
    layer = keras.layers.LayerNormalization(epsilon=1e-5, **options)
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(4, 32, 64)) * 3 + 0.5).astype(np.float32)
    layer.build(x.shape)
    for variable in layer.trainable_variables:
        variable.assign(rng.normal(size=variable.shape).astype(np.float32))
    weights = [variable.value for variable in layer.trainable_variables]
    projection = jnp.asarray(rng.normal(size=64), jnp.float32)

    def loss(weights, x, one_pass):
        if one_pass:
            with one_pass_layer_norms([layer]):
                outputs, _ = layer.stateless_call(weights, [], x)
        else:
            outputs, _ = layer.stateless_call(weights, [], x)
        return jnp.sum(outputs.astype(jnp.float32) * projection), outputs

    results = {one_pass: jax.jit(jax.value_and_grad(lambda w, x: loss(w, x, one_pass), (0, 1), has_aux=True))(
        weights, x) for one_pass in (False, True)}
    (_, keras_outputs), keras_gradients = results[False]
    (_, outputs), gradients = results[True]
    assert outputs.dtype == keras_outputs.dtype == jnp.dtype(layer.compute_dtype)
    pairs = [(outputs, keras_outputs)] + list(zip(jax.tree.leaves(gradients), jax.tree.leaves(keras_gradients)))
    assert len(pairs) == 2 + len(weights)
    exact = "rms_scaling" in options or "axis" in options
    for index, (ours, theirs) in enumerate(pairs):
        ours, theirs = np.asarray(ours, np.float32), np.asarray(theirs, np.float32)
        if exact:
            np.testing.assert_array_equal(ours, theirs)
        else:
            tolerance = 1e-2 if index == 0 and policy != "float32" else 1e-5  # a bfloat16 output's last bit
            np.testing.assert_allclose(ours, theirs, rtol=tolerance, atol=tolerance * np.abs(theirs).max())


def test_a_subclass_of_layer_normalization_keeps_its_own_call():
    keras = keras_on_jax()
    import jax.numpy as jnp

    from mtbench.plugins.backends.jax_layer_norm import TracedForms, one_pass_layer_norms
    from mtbench.plugins.backends.layer_norm_rows import layer_norms

    class Doubled(keras.layers.LayerNormalization):
        def call(self, inputs):
            return 2 * super().call(inputs)

    model = keras.Sequential([keras.Input((4, 8)), Doubled(), keras.layers.LayerNormalization(),
                              keras.layers.LayerNormalization(axis=1)])
    norms = layer_norms(model)
    assert [type(norm) for norm in norms] == [Doubled, *[keras.layers.LayerNormalization] * 2]
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4, 8)), jnp.float32)
    expected = norms[0](x)  # twice a norm: the one-pass form would give it once
    traced = TracedForms(norms)
    assert traced.text() == "none traced (3 layer norms in the model)"
    with one_pass_layer_norms(norms, traced):
        np.testing.assert_allclose(norms[0](x), expected, rtol=1e-6, atol=1e-6)  # jitted, as Keras's in a step
        assert traced.text() == ("1 of 3 by their own `call` (Keras's: two passes); 2 of 3 not called by the traced "
                                 "program")
        model(x)
    # The subclass and the norm over another axis than the last kept their own call; only one took the one pass.
    assert traced.text() == ("one pass: the variance as the mean of squares less the squared mean, in float32 or "
                             "wider (1 of 3 layer norms); 2 of 3 by their own `call` (Keras's: two passes)")
    assert TracedForms([]).text() == "none in the model"


def test_the_steps_layer_norm_row_counts_the_norms_its_program_computes_in_one_pass(tiny_gpt_step):
    """The layer-norm statistics a JAX step reports are those of its traced program: as many norms in one pass as
    the program has forwards that sum nothing centred. Its update is Keras's AdamW inside the step."""
    import jax

    from mtbench.plugins.backends.rounding_16_bit import XLA_EXCESS_PRECISION, XLA_ROUNDED
    step, norms, batch = tiny_gpt_step
    state = tuple([variable.value for variable in variables] for variables in step._keras_state())
    program = jax.make_jaxpr(step._step)(state, *batch, step.schedule_arguments()).jaxpr
    (body,) = sub_jaxprs(program.eqns[0])
    forwards = [eqn for eqn in body.eqns if eqn.params.get("name") == "call"][:len(norms)]
    one_pass = sum(reductions_over_features(sub_jaxprs(forward)[0]) == [False, False] for forward in forwards)
    assert one_pass == len(norms) == 5
    numerics = step.numerics()
    # Where XLA rounds bfloat16 values, as XLA_FLAGS set it: test_jax_step_program.py counts it.
    assert numerics.pop("rounding_16_bit") in (XLA_EXCESS_PRECISION, XLA_ROUNDED)
    assert numerics == {
        "layer_norm": "one pass: the variance as the mean of squares less the squared mean, in float32 or wider "
                      f"({one_pass} of {len(norms)} layer norms)",
        "optimizer_update": "Keras's AdamW (`stateless_apply`), compiled into the step"}
