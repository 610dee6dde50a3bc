"""float16's loss scaling in mtbench's JAX step (`jax_loss_scaling`): the numbers of Keras's `LossScaleOptimizer`
step for step, overflow and growth included, and no conditional in the step's program lowered for a GPU, where
Keras's own apply branches twice a step (each a host wait there). The torch side: tests/fast_step_probe.py and
test_host_syncs.py."""

import numpy as np

from conftest import keras_on_jax, tiny_jax_gpt


def loss_scaled_optimizer():
    """mtbench's AdamW around which `compile_model` puts Keras's loss scaling for float16, its scale growing after
    2 finite steps."""
    from optimizer_exercise import mtbench_optimizer
    optimizer = mtbench_optimizer("mixed_float16")
    optimizer.dynamic_growth_steps = 2
    return optimizer


def test_apply_if_finite_is_kerass_loss_scaling_step_for_step():
    keras = keras_on_jax()
    import jax
    from keras import ops

    from mtbench.plugins.backends.jax_loss_scaling import apply_if_finite
    from optimizer_exercise import keras_variables, optimizer_exercise
    initial, grads = optimizer_exercise()
    overflowing = {name: grad.copy() for name, grad in grads[0].items()}
    overflowing["clipped"][1, 2] = np.nan
    steps = [*grads, overflowing, grads[1], grads[2]]
    optimizers = {"keras": loss_scaled_optimizer(), "ours": loss_scaled_optimizer()}
    states = {}
    for name, optimizer in optimizers.items():
        variables = list(keras_variables(initial).values())
        optimizer.build(variables)
        states[name] = ([v.value for v in variables], [v.value for v in optimizer.variables])
    applies = {"keras": jax.jit(lambda state, g, w: optimizers["keras"].stateless_apply(state, g, w)),
               "ours": jax.jit(lambda state, g, w: apply_if_finite(optimizers["ours"], state, g, w))}
    scales = []
    for step_grads in steps:
        optimizer = optimizers["keras"]
        scale = float(states["keras"][1][optimizer.variables.index(optimizer.dynamic_scale)])
        scales.append(scale)
        for name, apply in applies.items():
            trainable, optimizer_state = states[name]
            scaled = [ops.convert_to_tensor(step_grads[key] * np.float32(scale)) for key in initial]
            new_trainable, new_state = apply(optimizer_state, scaled, trainable)
            states[name] = (list(new_trainable), list(new_state))
        for ours, theirs in zip(states["ours"][0] + states["ours"][1], states["keras"][0] + states["keras"][1]):
            np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-6, atol=1e-12)
    # Doubled after two finite steps, halved at the overflow, counted again from it.
    assert scales == [32768.0, 32768.0, 65536.0, 65536.0, 32768.0, 32768.0]
    optimizer = optimizers["ours"]
    final = dict(zip([id(v) for v in optimizer.variables], states["ours"][1]))
    assert float(final[id(optimizer.dynamic_scale)]) == 65536.0
    assert int(final[id(optimizer.iterations)]) == 5  # the overflow did not count
    assert keras.backend.backend() == "jax"


def test_the_float16_step_lowered_for_a_gpu_has_no_conditional():
    keras_on_jax()
    import jax

    from mtbench.plugins.backends.jax_host_syncs import runtime_conditionals
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    from optimizer_exercise import keras_variables, optimizer_exercise
    model = tiny_jax_gpt("mixed_float16")
    ids = np.ones((4, 32), np.int32)
    program = JitTrainStep(model).lowered_program((ids,), ids, np.ones((4, 32), np.float32), "cuda")
    assert "f16" in program and runtime_conditionals(program) == 0
    # The counter would see Keras's own loss-scaling apply: a conditional for the overflow, one for the growth.
    optimizer = loss_scaled_optimizer()
    initial, grads = optimizer_exercise()
    variables = list(keras_variables(initial).values())
    optimizer.build(variables)
    keras_apply = jax.jit(lambda state, g, w: optimizer.stateless_apply(state, g, w))
    lowered = keras_apply.trace([v.value for v in optimizer.variables], [grads[0][key] for key in initial],
                                [v.value for v in variables]).lower(lowering_platforms=("cuda",)).as_text()
    assert runtime_conditionals(lowered) == 2
