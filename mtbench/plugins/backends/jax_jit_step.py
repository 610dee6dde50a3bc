"""mtbench's default train step on JAX: the Keras model and optimizer, stateless, inside one `jax.jit`.

Keras's `train_on_batch` runs a jitted step too, but around it, on every call, it re-checks the build, resets
and re-syncs metric variables, assigns every model and optimizer variable back through Keras, and converts the
logs. This step keeps the same mathematics (the model's `stateless_call`, the compiled loss, the optimizer's
`stateless_apply`, with loss scaling when the optimizer scales) and carries the state from one step to the next
itself, with donated buffers so XLA updates it in place: the Keras variables' own, so that the state is held
once. The Keras variables are only written back in `finalize`. The loss `compile_model` sets is computed in JAX's own formulation (`compiled_loss`).

While the step is traced, every LayerNormalization runs inside its own `jax.jit`. Without that boundary, XLA on
the CPU fuses the layer-norm backward of every later layer into each transposed copy that feeds a kernel
gradient, recomputing the residual stream's gradient chain dozens of times (about a fifth of the step on the
`small` preset); with it, the chain is materialised once, as it is for the Flax baseline's layer norm. The
numbers are the same; only XLA's fusion changes.
"""

import contextlib
import functools

from mtbench import TrainStep
from mtbench.plugins.backends.compiled_loss import is_token_mean_cross_entropy


def token_cross_entropy(labels, logits):
    """Each token's cross-entropy as log-sum-exp minus the label's logit: its backward is one softmax pass,
    where Keras's one-hot formulation materialises a second vocabulary-sized array (a twentieth of a step on the
    `small` preset)."""
    import jax
    import jax.numpy as jnp
    label_logits = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jax.nn.logsumexp(logits, axis=-1) - label_logits


def token_mean_cross_entropy(labels, logits, weight):
    """The loss `compile_model` sets: the mean cross-entropy over real (weighted) target tokens."""
    import jax.numpy as jnp
    return jnp.sum(token_cross_entropy(labels, logits) * weight) / jnp.sum(weight)


def correct_tokens(labels, logits, weight):
    """Weighted count of tokens whose label has the largest logit. XLA on the CPU runs `argmax` as a two-output
    reduction that is not vectorised (a tenth of a step on the `small` preset); a max and a comparison are
    one fast reduction. The count differs from argmax's only on an exact tie with the label's logit."""
    import jax.numpy as jnp
    label_logits = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.sum((label_logits >= jnp.max(logits, axis=-1)) * weight)


@contextlib.contextmanager
def traced_separately(layers):
    """While inside, each of `layers` is traced as its own `jax.jit` (XLA inlines it again, but fuses it on its
    own terms)."""
    import jax

    def separately(call):
        return lambda *args, **kwargs: jax.jit(functools.partial(call, **kwargs))(*args)

    for layer in layers:
        layer.call = separately(layer.call)
    try:
        yield
    finally:
        for layer in layers:
            del layer.call  # the class's own `call` again


class JitTrainStep(TrainStep):
    """Under a `keras.distribution` (data-parallel over a mesh of one process's devices or of several
    processes', the TPU strategy) the same step runs as one program over the mesh: the state is what the
    distribution laid the Keras variables out as, each batch is placed by the distribution's data layout (this
    process's rows of the global batch, `jax.make_array_from_process_local_data`), and XLA partitions the step
    (GSPMD), so the loss is the global batch's token mean, as on one device."""
    name = "jax-jit-stateless"

    def __init__(self, model, distribution=None):
        import jax
        import jax.numpy as jnp
        import keras

        self.model = model
        self.distribution = distribution
        optimizer = model.optimizer
        optimizer.build(model.trainable_variables)
        loss_object = model.loss
        native_loss = is_token_mean_cross_entropy(loss_object)
        layer_norms = [layer for layer in model._flatten_layers()
                       if isinstance(layer, keras.layers.LayerNormalization)]
        # Under a distribution each gradient is held to its weight's layout: sharded weights (fsdp) get sharded
        # gradients, never a replicated copy XLA might otherwise choose.
        layouts = None if distribution is None else [v.value.sharding for v in model.trainable_variables]

        def step(state, x, y, weight):
            trainable, non_trainable, optimizer_state = state

            def loss_of(trainable):
                with traced_separately(layer_norms):
                    logits, new_non_trainable, losses = model.stateless_call(
                        trainable, non_trainable, x, training=True, return_losses=True)
                loss = token_mean_cross_entropy(y, logits, weight) if native_loss else \
                    loss_object(y, logits, sample_weight=weight)
                if losses:
                    loss = loss + sum(losses)
                with keras.StatelessScope(state_mapping=list(zip(optimizer.variables, optimizer_state))):
                    scaled = optimizer.scale_loss(loss)  # the identity unless the optimizer scales losses
                return scaled, (loss, logits, new_non_trainable)

            (_, (loss, logits, non_trainable)), grads = jax.value_and_grad(loss_of, has_aux=True)(trainable)
            if layouts is not None:
                grads = jax.lax.with_sharding_constraint(grads, layouts)
            trainable, optimizer_state = optimizer.stateless_apply(optimizer_state, grads, trainable)
            correct = correct_tokens(y, logits, weight)
            logs = {"loss": loss, "accuracy": correct / jnp.sum(weight)}
            return (trainable, non_trainable, optimizer_state), logs

        self._step = jax.jit(step, donate_argnums=0)
        self.state = None

    def _keras_state(self):
        model = self.model
        return model.trainable_variables, model.non_trainable_variables, model.optimizer.variables

    def __call__(self, x, y, sample_weight):
        if self.state is None:
            # The Keras variables' own buffers, donated to the first call: a copy would hold the parameters and
            # the optimizer state twice on the device, which torch's step does not. Until `finalize` writes
            # the state back, the Keras variables hold deleted arrays (nothing reads them during training:
            # validation and checkpoints finalize first).
            self.state = tuple([v.value for v in variables] for variables in self._keras_state())
        if self.distribution is not None:
            x, y, sample_weight = self._distribute(x), self._distribute(y), self._distribute(sample_weight)
        self.state, logs = self._step(self.state, x, y, sample_weight)
        return logs  # device scalars: the loop reads them at the edge of its timing window

    def _distribute(self, arrays):
        """This process's rows of a batch array (or a tuple of them) as global arrays laid out over the mesh."""
        from keras.src.backend.jax.distribution_lib import distribute_data_input
        if isinstance(arrays, tuple):
            return tuple(self._distribute(array) for array in arrays)
        layout = self.distribution.get_data_layout(arrays.shape)
        return distribute_data_input(arrays, layout, self.distribution.batch_dim_name)

    def description(self):
        if self.distribution is None:
            return ""
        mesh = self.distribution.device_mesh
        shape = " x ".join(f"{size} {name}" for size, name in zip(mesh.shape, mesh.axis_names))
        return f"{type(self.distribution).__name__} over a mesh of {shape}"

    def block(self):
        # The Keras variables are stale until `finalize`, so the backend's synchronize cannot see this step's
        # work: the loop waits on the step's own state before it reads its clock.
        import jax
        if self.state is not None:
            jax.block_until_ready(self.state)

    def finalize(self):
        if self.state is None:  # nothing trained since the last finalize (or at all)
            return
        for variables, values in zip(self._keras_state(), self.state):
            for variable, value in zip(variables, values):
                variable.assign(value)
        self.state = None  # the Keras variables own these buffers now
