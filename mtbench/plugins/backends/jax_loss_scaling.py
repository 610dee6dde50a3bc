"""Keras's dynamic loss scaling (`LossScaleOptimizer`, which float16 trains through) inside the jitted JAX step
without a branch that runs on the device.

Keras's `stateless_apply` picks between applying the update and halving the scale with `ops.cond`, and between
growing the scale and counting with another: XLA conditionals, whose branch index a GPU copies to the host and
waits for before it runs a branch, twice a step (`jax_host_syncs` counts them). `apply_if_finite` computes the
same numbers with selects, as optax's `apply_if_finite` does: the update is computed every step and each weight and
optimizer variable takes its new value only if every gradient is finite (XLA fuses the select into the update);
the scale halves on an overflow, doubles after `dynamic_growth_steps` finite steps in a row, and the growth count
restarts at either, Keras's rule to the step. The torch step carries out the same rule with torch's kernels
(`torch_fused_adamw.DynamicLossScale`).
"""


def apply_if_finite(optimizer, optimizer_state, grads, trainable):
    """`optimizer.stateless_apply(optimizer_state, grads, trainable)` of a `LossScaleOptimizer`, branch-free:
    (new trainable values, new optimizer state), the state in `optimizer.variables`' order."""
    import jax.numpy as jnp
    inner = optimizer.inner_optimizer
    values = {id(variable): value for variable, value in zip(optimizer.variables, optimizer_state)}
    scale, count = values[id(optimizer.dynamic_scale)], values[id(optimizer.step_counter)]
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(grad)) for grad in grads]))
    unscaled = [grad / scale for grad in grads]  # in float32 for float16 gradients, as Keras's divide
    inner_state = [values[id(variable)] for variable in inner.variables]
    new_trainable, new_inner_state = inner.stateless_apply(inner_state, unscaled, trainable)

    def if_finite(new, old):
        return jnp.where(finite, new, old)

    new_trainable = [if_finite(new, old) for new, old in zip(new_trainable, trainable)]
    for variable, new, old in zip(inner.variables, new_inner_state, inner_state):
        values[id(variable)] = if_finite(new, old)
    grows = finite & (count == optimizer.dynamic_growth_steps - 1)
    values[id(optimizer.dynamic_scale)] = jnp.where(finite, jnp.where(grows, scale * 2.0, scale), scale * 0.5)
    values[id(optimizer.step_counter)] = jnp.where(finite & ~grows, count + 1, jnp.zeros_like(count))
    return new_trainable, [values[id(variable)] for variable in optimizer.variables]
