"""mtbench's default train step on JAX: the Keras model and optimizer, stateless, inside one `jax.jit`.

Keras's `train_on_batch` runs a jitted step too, but around it, on every call, it re-checks the build, resets
and re-syncs metric variables, assigns every model and optimizer variable back through Keras, and converts the
logs. This step keeps the same mathematics (the model's `stateless_call`, the compiled loss, the optimizer's
`stateless_apply`, with loss scaling when the optimizer scales: `jax_loss_scaling`) and carries the state from one
step to the next itself, with donated buffers so XLA updates it in place: the Keras variables' own, so that the
state is held once. The Keras variables are only written back in `finalize`. The loss `compile_model` sets is computed in JAX's own formulation (`compiled_loss`).

While the step is traced, every LayerNormalization computes its statistics in one pass, inside its own
`jax.jit` (`jax_layer_norm`).
"""

import contextlib
import itertools

from mtbench import TrainStep
from mtbench.plugins.backends.compiled_loss import is_token_mean_cross_entropy, refuse_accumulating_other_losses
from mtbench.plugins.backends.jax_layer_norm import TracedForms, one_pass_layer_norms
from mtbench.plugins.backends.jax_loss_scaling import apply_if_finite
from mtbench.plugins.backends.keras_optimizer import inner_optimizer, scales_losses
from mtbench.plugins.backends.layer_norm_rows import layer_norms
from mtbench.plugins.backends.rounding_16_bit import xla_rounding_text


def token_cross_entropy(labels, logits):
    """Each token's cross-entropy as log-sum-exp minus the label's logit: its backward is one softmax pass,
    where Keras's one-hot formulation materialises a second vocabulary-sized array (a twentieth of a step on the
    `small` preset). The label's logit is read as each platform's XLA serves best (`label_logits`)."""
    import jax
    import jax.numpy as jnp
    labels = labels.astype(jnp.int32)
    return jax.nn.logsumexp(logits, axis=-1) - label_logits(labels, logits)


def label_logits(labels, logits):
    """The logit of each token's label. On a CPU a gather. Elsewhere (GPU, TPU) a sum over the vocabulary masked
    by `label == iota`: its gradient is then element-wise, and XLA computes the logits' whole gradient in one
    pass, as inductor does for `F.cross_entropy`. A gather's gradient is a scatter, which XLA's GPU program runs
    between two vocabulary-sized float32 passes; for GPT-2 small in bfloat16 (16 x 1,024 tokens, 50,304 entries)
    the masked sum moves about 5 GB less a step, 1.5 ms at the H100's bandwidth (`benchmarks/program_cost.py
    --target h100`). On a CPU XLA writes the masked logits out, and the masked sum is the slower (by about 8 % of
    the `small` translation step). The platform is the one the step is compiled for
    (`jax.lax.platform_dependent`); the values are the same."""
    import jax
    return jax.lax.platform_dependent(labels, logits, cpu=gathered_label_logits, default=masked_label_logits)


def gathered_label_logits(labels, logits):
    import jax.numpy as jnp
    return jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]


def masked_label_logits(labels, logits):
    import jax
    import jax.numpy as jnp
    vocabulary = jax.lax.broadcasted_iota(labels.dtype, logits.shape, logits.ndim - 1)
    return jnp.sum(jnp.where(labels[..., None] == vocabulary, logits, 0), axis=-1)


def correct_tokens(labels, logits, weight):
    """Weighted count of tokens whose label has the largest logit. XLA on the CPU runs `argmax` as a two-output
    reduction that is not vectorised (a tenth of a step on the `small` preset); a max and a comparison are
    one fast reduction. The count differs from argmax's only on an exact tie with the label's logit."""
    import jax.numpy as jnp
    labelled = gathered_label_logits(labels.astype(jnp.int32), logits)
    return jnp.sum((labelled >= jnp.max(logits, axis=-1)) * weight)


SEED_STATE = "seed_generator_state"  # the name of a keras.random.SeedGenerator's variable


def gradient_shards(model, distribution, native_loss):
    """How many batch shards a data-parallel step can differentiate one by one (`shard_gradients`): the devices of a
    `DataParallel` mesh, or 0 where only XLA's own reduction serves (models whose non-trainable state is more than
    dropout seeds, a batch norm's statistics wanting the whole batch; losses other than the token mean)."""
    import keras
    if not native_loss or not isinstance(distribution, keras.distribution.DataParallel):
        return 0
    devices = distribution.device_mesh.backend_mesh.devices.flatten()
    if len(devices) < 2 or any(variable.name != SEED_STATE for variable in model.non_trainable_variables):
        return 0
    return len(devices)


def flat_gradient_shards(shards, distribution):
    """How many of the batch's `shards` (`gradient_shards`) the data-parallel step sums as one flat buffer, or 0
    where XLA's own reduction serves.

    XLA combines the gradients' all-reduces into one of a tuple, but XLA:CPU runs that as one gloo collective per
    buffer: 41 for the tiny Transformer, together 19 ms a step between two processes, and 166 ms when each
    process has a core of its own (each collective then waits for a scheduler tick, about 4 ms, where one flat
    buffer takes 4 ms in all). So on CPUs the step takes each shard's gradients apart (`summed_over_shards`) and
    sums them in one all-reduce, as DDP sums a bucket. On GPUs and TPUs XLA's collectives take the tuple at once
    and overlap it with the backward pass: GSPMD's reduction stays."""
    if not shards or distribution.device_mesh.backend_mesh.devices.flatten()[0].platform != "cpu":
        return 0
    return shards


def _by_shard(distribution):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec
    mesh = distribution.device_mesh.backend_mesh
    return (NamedSharding(mesh, PartitionSpec(distribution.batch_dim_name)), NamedSharding(mesh, PartitionSpec()),
            jax.lax.with_sharding_constraint)


def shard_axis_layouts(distribution, layouts):
    """Each of `layouts` (NamedShardings over the distribution's mesh) with a leading axis over the batch's mesh
    axis: the layout of a weight's gradients carried one per batch shard."""
    from jax.sharding import NamedSharding, PartitionSpec
    mesh = distribution.device_mesh.backend_mesh
    return [NamedSharding(mesh, PartitionSpec(distribution.batch_dim_name, *layout.spec)) for layout in layouts]


def shard_seeds(non_trainable, shards, distribution):
    """Each shard's dropout seeds (a leading shard axis): the seeds' first word offset by the shard's index, so that
    each shard draws its masks from its own stream, as DDP's processes draw theirs; shard 0's are the seeds' own.
    A seed array may hold several generators' seeds (a pipeline's stacked stages: leading axes before the 2 words)."""
    import jax.numpy as jnp
    by_shard, _, constrain = _by_shard(distribution)
    offsets = jnp.stack([jnp.arange(shards, dtype="uint32"), jnp.zeros(shards, dtype="uint32")], axis=1)
    return [constrain(state[None] + offsets.reshape(shards, *[1] * (state.ndim - 1), 2), by_shard)
            for state in non_trainable]


def shard_gradients(loss_of, shards, distribution, trainable, seeds, optimizer_state, x, y, weight, tokens, share):
    """Each shard's gradients, loss and correct tokens, and its seeds after (`seeds`: `shard_seeds`'), each with a
    leading shard axis: a `jax.vmap` over the batch split into `shards` rows of the mesh, so each device computes
    its own and nothing is summed or moved. `tokens` are the whole batch's; `share` is a shard's share of the
    model's own losses."""
    import jax
    by_shard, _, constrain = _by_shard(distribution)
    split = lambda array: constrain(array.reshape((shards, array.shape[0] // shards) + array.shape[1:]), by_shard)
    x, y, weight = jax.tree_util.tree_map(split, (x, y, weight))

    def one_shard(seeds, x, y, weight):
        (_, (loss, logits, seeds)), grads = jax.value_and_grad(loss_of, has_aux=True)(
            trainable, seeds, optimizer_state, x, y, weight, tokens, share)
        return grads, loss, correct_tokens(y, logits, weight), seeds

    return jax.vmap(one_shard)(seeds, x, y, weight)


def summed_shards(grads, loss, correct, distribution, flat=True, layouts=None):
    """(grads, loss, correct) of `shard_gradients`' form summed over their shard axis as one flat buffer: one
    all-reduce. `flat=False`: each summed on its own, which XLA combines into one all-reduce of a tuple (on GPUs
    and TPUs, where a collective takes the tuple at once, without a copy of every gradient into one buffer); with
    `layouts`, each sum in its weight's layout (one buffer of every gradient would gather the split ones whole)."""
    import jax.numpy as jnp
    _, whole, constrain = _by_shard(distribution)
    if layouts is not None:
        return ([constrain(jnp.sum(g, axis=0), layout) for g, layout in zip(grads, layouts)],
                *constrain((jnp.sum(loss), jnp.sum(correct)), whole))
    if not flat:
        return constrain(([jnp.sum(g, axis=0) for g in grads], jnp.sum(loss), jnp.sum(correct)), whole)
    shards = loss.shape[0]
    pieces = [g.reshape(shards, -1) for g in grads] + [loss[:, None], correct[:, None]]
    dtype = jnp.result_type(*pieces)
    summed = constrain(jnp.sum(jnp.concatenate([piece.astype(dtype) for piece in pieces], axis=1), axis=0), whole)
    ends = list(itertools.accumulate((g.size // shards for g in grads), initial=0))
    grads = [summed[start:end].reshape(g.shape[1:]).astype(g.dtype) for g, start, end in zip(grads, ends, ends[1:])]
    return grads, summed[-2], summed[-1]


def summed_over_shards(loss_of, shards, distribution, trainable, non_trainable, optimizer_state, x, y, weight):
    """Each shard's gradients, loss and correct tokens (`shard_gradients`), summed over the shards as one flat
    buffer: one all-reduce. Without dropout the losses are one device's. Returns (grads, loss, correct, tokens,
    non_trainable)."""
    import jax.numpy as jnp
    tokens = jnp.sum(weight)
    grads, loss, correct, seeds = shard_gradients(loss_of, shards, distribution, trainable,
                                                  shard_seeds(non_trainable, shards, distribution), optimizer_state,
                                                  x, y, weight, tokens, 1.0 / shards)
    grads, loss, correct = summed_shards(grads, loss, correct, distribution)
    return grads, loss, correct, tokens, [state[0] for state in seeds]  # shard 0's stream is the seeds' own


def micro_batch_parts(arrays, micro_batches):
    """`arrays` (a tree of batch arrays) as `micro_batches` parts along a new leading axis. Part i is every
    `micro_batches`-th row from row i: of a batch split over devices by rows (data-parallel), each device holds its
    share of every part, so each part runs on all of them, no rows moved."""
    import jax
    import jax.numpy as jnp
    return jax.tree_util.tree_map(
        lambda array: jnp.swapaxes(
            array.reshape((array.shape[0] // micro_batches, micro_batches) + array.shape[1:]), 0, 1), arrays)


def accumulated_gradients(micro_batches, inner=None):
    """A `gradients_of` for `JitTrainStep` that sums the gradients of the batch's `micro_batches` equal parts, one
    after the other (`jax.lax.scan`: one compiled body, each part's activations freed before the next), each
    part's loss over the whole batch's tokens, so that the sum is the whole batch's token mean and its gradient:
    what one batch of all the rows would give, with a part's activations in memory at a time. `inner`, another
    `gradients_of` (fsdp's per-device gathering), differentiates each part in its own way; its part's token mean
    and gradients are then weighted by the part's share of the batch's tokens. Under a data-parallel mesh the step
    takes `accumulated_over_shards` in its place (see there)."""

    def gradients_of(loss_of, trainable, non_trainable, optimizer_state, x, y, weight):
        import jax
        import jax.numpy as jnp
        tokens = jnp.sum(weight)
        parts = micro_batch_parts((x, y, weight), micro_batches)

        def part_gradients(non_trainable, px, py, pw):
            if inner is None:
                (_, (part_loss, logits, non_trainable)), grads = jax.value_and_grad(loss_of, has_aux=True)(
                    trainable, non_trainable, optimizer_state, px, py, pw, tokens, 1.0 / micro_batches)
                return grads, part_loss, correct_tokens(py, logits, pw), non_trainable
            grads, part_loss, correct, part_tokens, non_trainable = inner(
                loss_of, trainable, non_trainable, optimizer_state, px, py, pw)
            share = part_tokens / tokens  # a part without tokens adds nothing (its own mean is 0 / 0)
            grads = jax.tree_util.tree_map(lambda g: jnp.where(part_tokens > 0, g * share.astype(g.dtype), 0), grads)
            return grads, jnp.where(part_tokens > 0, part_loss * share, 0.0), correct, non_trainable

        def add_part(carry, part):
            grads, loss, correct, non_trainable = carry
            part_grads, part_loss, part_correct, non_trainable = part_gradients(non_trainable, *part)
            grads = jax.tree_util.tree_map(jnp.add, grads, part_grads)
            return (grads, loss + part_loss, correct + part_correct, non_trainable), None

        start = (jax.tree_util.tree_map(jnp.zeros_like, list(trainable)), jnp.zeros((), jnp.float32),
                 jnp.zeros((), weight.dtype), non_trainable)
        (grads, loss, correct, non_trainable), _ = jax.lax.scan(add_part, start, parts)
        return grads, loss, correct, tokens, non_trainable

    def per_shard(shards, distribution, flat):
        """This accumulation as a data-parallel mesh's devices each do it (`accumulated_over_shards`), or None where
        `inner` differentiates each part its own way."""
        return None if inner is not None else accumulated_over_shards(micro_batches, shards, distribution, flat)

    gradients_of.micro_batches = micro_batches
    gradients_of.per_shard = per_shard
    return gradients_of


def accumulated_over_shards(micro_batches, shards, distribution, flat=True, layouts=None):
    """`accumulated_gradients` over a data-parallel mesh as DDP accumulates (`no_sync`): each shard sums its own
    micro-batches' gradients on its device (`shard_gradients`, carried with their shard axis through the loop) and
    the sums are summed over the shards once, after the last micro-batch (`summed_shards`, as one flat buffer or,
    `flat=False`, XLA's combined tuple: one all-reduce a step). Left to GSPMD, the loop's carry is replicated, and
    every micro-batch all-reduces every gradient. `layouts` (NamedShardings, one a weight): weights laid out over
    other mesh axes too (tensor-parallel's `model` axis), whose gradients are carried, and summed, in their
    weights' layouts beside the shard axis (held to the shard axis alone, each would be gathered whole)."""

    def gradients_of(loss_of, trainable, non_trainable, optimizer_state, x, y, weight):
        import jax
        import jax.numpy as jnp
        by_shard, _, constrain = _by_shard(distribution)
        carried = [by_shard] * len(trainable) if layouts is None else shard_axis_layouts(distribution, layouts)
        tokens = jnp.sum(weight)

        def add_part(carry, part):
            grads, loss, correct, seeds = carry
            part_grads, part_loss, part_correct, seeds = shard_gradients(
                loss_of, shards, distribution, trainable, seeds, optimizer_state, *part, tokens,
                1.0 / (shards * micro_batches))
            grads = [constrain(total + part, layout) for total, part, layout in zip(grads, part_grads, carried)]
            return (grads, loss + part_loss, correct + part_correct, seeds), None

        start = ([constrain(jnp.zeros((shards,) + value.shape, value.dtype), layout)
                  for value, layout in zip(trainable, carried)],
                 jnp.zeros((shards,), jnp.float32), jnp.zeros((shards,), weight.dtype),
                 shard_seeds(non_trainable, shards, distribution))
        (grads, loss, correct, seeds), _ = jax.lax.scan(add_part, start, micro_batch_parts((x, y, weight),
                                                                                         micro_batches))
        grads, loss, correct = summed_shards(grads, loss, correct, distribution, flat, layouts)
        return grads, loss, correct, tokens, [state[0] for state in seeds]

    gradients_of.micro_batches = micro_batches
    gradients_of.sums_per_shard = True
    return gradients_of


# The numbers of a Keras `CosineDecay` (mtbench's schedule, `WarmupCosineDecay`, is one), which the step takes as
# arguments instead of writing them into its program: a run of another length, learning rate or warm-up then reuses
# the program JAX's compilation cache kept for this one, whose key holds every constant.
SCHEDULE_NUMBERS = ("initial_learning_rate", "decay_steps", "alpha", "warmup_target", "warmup_steps")


def jax_step_numerics(traced_norms, model):
    """`TrainStep.numerics` of a step that traces `model`'s layer norms in one pass (`traced_norms`) and applies its
    Keras optimizer statelessly inside its compiled program, which XLA compiles as XLA_FLAGS set it."""
    optimizer = model.optimizer
    update = f"Keras's {type(inner_optimizer(optimizer)).__name__} (`stateless_apply`), compiled into the step"
    if scales_losses(optimizer):
        update += ", the loss scale updated on the device"
    return {"layer_norm": traced_norms.text(), "optimizer_update": update, "rounding_16_bit": xla_rounding_text(model)}


def schedule_numbers(optimizer):
    """{name: value} of the numbers of `optimizer`'s learning-rate schedule that the step takes as arguments; none
    for a schedule of another kind, whose numbers stay constants of the program."""
    import keras
    schedule = getattr(optimizer, "_learning_rate", None)
    if not isinstance(schedule, keras.optimizers.schedules.CosineDecay):
        return {}
    return {name: float(getattr(schedule, name)) for name in SCHEDULE_NUMBERS if getattr(schedule, name) is not None}


@contextlib.contextmanager
def schedule_reading(optimizer, values):
    """While the step is traced, `optimizer`'s schedule reads its numbers from `values` (the step's arguments)."""
    schedule = optimizer._learning_rate
    kept = {name: getattr(schedule, name) for name in values}
    try:
        for name, value in values.items():
            setattr(schedule, name, value)
        yield
    finally:
        for name, value in kept.items():
            setattr(schedule, name, value)


def laid_out_rows(distribution, arrays):
    """This process's rows of a batch array (or a tuple of them) as global arrays laid out over the
    distribution's mesh."""
    from keras.src.backend.jax.distribution_lib import distribute_data_input
    if isinstance(arrays, tuple):
        return tuple(laid_out_rows(distribution, array) for array in arrays)
    layout = distribution.get_data_layout(arrays.shape)
    return distribute_data_input(arrays, layout, distribution.batch_dim_name)


def made_whole_across_processes(variables):
    """Remakes each of `variables` whose value `jax.device_put` laid over several processes' devices from an array
    of one device: Keras places a SeedGenerator's state (made with jax.numpy) so under a distribution spanning
    processes, and jax gives such an array itself as its one shard on each process, which `addressable_shards`
    refuses (a multi-process run with dropout stopped at its first timing window). Its value is the same on every
    process (drawn from the run's seed), as `device_put` took it to be: made again from this process's copy."""
    import jax
    import numpy as np
    for variable in variables:
        value = variable.value
        if value.is_fully_addressable:
            continue
        try:
            value.addressable_shards
        except ValueError:
            host = np.asarray(value)
            variable._value = jax.make_array_from_callback(host.shape, value.sharding, lambda index: host[index])


class JitTrainStep(TrainStep):
    """Under a `keras.distribution` (data-parallel over a mesh of one process's devices or of several
    processes', the TPU strategy) the same step runs as one program over the mesh: the state is what the
    distribution laid the Keras variables out as, each batch is placed by the distribution's data layout (this
    process's rows of the global batch, `jax.make_array_from_process_local_data`), and XLA partitions the step
    (GSPMD), so the loss is the global batch's token mean, as on one device. Data-parallel on CPUs sums the
    gradients as one flat buffer (`flat_gradient_shards`)."""
    name = "jax-jit-stateless"

    def __init__(self, model, distribution=None, gradients_of=None):
        """`gradients_of`, when given, differentiates in place of the step's own way: called as
        `gradients_of(loss_of, trainable, non_trainable, optimizer_state, x, y, weight)` inside the jitted step, it
        returns (grads, loss, correct tokens, tokens, non_trainable), as `summed_over_shards` does (`fsdp`'s
        per-device gathering). `loss_of` reads only the optimizer state it is given (None: not read)."""
        import jax
        import jax.numpy as jnp
        import keras

        self.model = model
        self.distribution = distribution
        self.micro_batches = getattr(gradients_of, "micro_batches", 1)
        self.own_gradients = gradients_of is not None
        optimizer = model.optimizer
        if not optimizer.built:  # a restored checkpoint built it: building again would reset a loss scale
            optimizer.build(model.trainable_variables)
        if distribution is not None and jax.process_count() > 1:
            made_whole_across_processes([*model.variables, *optimizer.variables])
        loss_object = model.loss
        native_loss = is_token_mean_cross_entropy(loss_object)
        refuse_accumulating_other_losses(self.micro_batches, native_loss, loss_object)
        norms = layer_norms(model)
        self.traced_norms = TracedForms(norms)
        # Under a distribution each gradient is held to its weight's layout: sharded weights (fsdp) get sharded
        # gradients, never a replicated copy XLA might otherwise choose.
        layouts = None if distribution is None else [v.value.sharding for v in model.trainable_variables]
        shards = gradient_shards(model, distribution, native_loss)
        self.flat_shards = flat_gradient_shards(shards, distribution)
        # An accumulating `gradients_of` that has a per-device form takes it wherever the devices can each sum
        # their own shard's gradients (one all-reduce a step instead of one per micro-batch).
        per_shard = getattr(gradients_of, "per_shard", None)
        per_device = per_shard(shards, distribution, bool(self.flat_shards)) if per_shard and shards else None
        if per_device is not None:
            gradients_of = per_device
        self.accumulated_per_shard = getattr(gradients_of, "sums_per_shard", False)

        def loss_of(trainable, non_trainable, optimizer_state, x, y, weight, tokens, share):
            """The loss of (a shard of) the batch, its share of the model's own losses, scaled as the optimizer
            scales; `tokens` are the whole batch's, so the shards' losses add up to the batch's mean."""
            with one_pass_layer_norms(norms, self.traced_norms):
                logits, new_non_trainable, losses = model.stateless_call(
                    trainable, non_trainable, x, training=True, return_losses=True)
            loss = jnp.sum(token_cross_entropy(y, logits) * weight) / tokens if native_loss else \
                loss_object(y, logits, sample_weight=weight)
            if losses:
                loss = loss + share * sum(losses)
            mapping = [(variable, value) for variable, value in zip(optimizer.variables, optimizer_state)
                       if value is not None]
            with keras.StatelessScope(state_mapping=mapping):
                scaled = optimizer.scale_loss(loss)  # the identity unless the optimizer scales losses
            return scaled, (loss, logits, new_non_trainable)

        def step(state, x, y, weight, schedule):
            trainable, non_trainable, optimizer_state = state
            if gradients_of is not None:
                grads, loss, correct, tokens, non_trainable = gradients_of(
                    loss_of, trainable, non_trainable, optimizer_state, x, y, weight)
            elif self.flat_shards:
                grads, loss, correct, tokens, non_trainable = summed_over_shards(
                    loss_of, self.flat_shards, distribution, trainable, non_trainable, optimizer_state, x, y, weight)
            else:
                tokens = jnp.sum(weight)
                (_, (loss, logits, non_trainable)), grads = jax.value_and_grad(loss_of, has_aux=True)(
                    trainable, non_trainable, optimizer_state, x, y, weight, tokens, 1.0)
                correct = correct_tokens(y, logits, weight)
            if layouts is not None:
                grads = jax.lax.with_sharding_constraint(grads, layouts)
            with schedule_reading(inner_optimizer(optimizer), schedule):
                if scales_losses(optimizer):
                    trainable, optimizer_state = apply_if_finite(optimizer, optimizer_state, grads, trainable)
                else:
                    trainable, optimizer_state = optimizer.stateless_apply(optimizer_state, grads, trainable)
            logs = {"loss": loss, "accuracy": correct / tokens}
            return (trainable, non_trainable, optimizer_state), logs

        self._step = jax.jit(step, donate_argnums=0)
        self.state = None
        self.schedule_numbers = schedule_numbers(inner_optimizer(optimizer))
        self._schedule_arguments = None

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
        self.state, logs = self._step(self.state, x, y, sample_weight, self.schedule_arguments())
        return logs  # device scalars: the loop reads them at the edge of its timing window

    def schedule_arguments(self):
        """The schedule's numbers as the step's arguments: float32 scalars placed once, on the default device or
        replicated over the mesh of every process's devices (not copied from the host at each step)."""
        if self._schedule_arguments is None:
            import jax
            import numpy as np
            if self.distribution is None:
                place = jax.device_put
            else:
                from jax.sharding import NamedSharding, PartitionSpec
                replicated = NamedSharding(self.distribution.device_mesh.backend_mesh, PartitionSpec())
                place = lambda value: jax.make_array_from_callback((), replicated, lambda index: value)  # noqa: E731
            self._schedule_arguments = {name: place(np.float32(value)) for name, value in self.schedule_numbers.items()}
        return self._schedule_arguments

    def lowered_program(self, x, y, sample_weight, platform=None, optimised=False, compiler_options=None):
        """The step's program as StableHLO text, for the arrays it would train on (traced again, not run): for
        `platform` ('cuda', 'tpu') where given, on a machine without one too, else for the arrays' devices; with
        `optimised`, the HLO XLA compiles it to for those devices, with XLA's options `compiler_options` ({name:
        value}) over those XLA_FLAGS set where given."""
        state = self.state or tuple([v.value for v in variables] for variables in self._keras_state())
        if self.distribution is not None:
            x, y, sample_weight = self._distribute(x), self._distribute(y), self._distribute(sample_weight)
        arguments = (state, x, y, sample_weight, self.schedule_arguments())
        lowered = (self._step.trace(*arguments).lower(lowering_platforms=(platform,)) if platform
                   else self._step.lower(*arguments))
        return lowered.compile(compiler_options).as_text() if optimised else lowered.as_text()

    def _distribute(self, arrays):
        return laid_out_rows(self.distribution, arrays)

    def _accumulating(self):
        """How the step sums its micro-batches' gradients ('' for one micro-batch): in the step, or on each device
        and then over the devices (on a mesh of several axes, over the batch's)."""
        summed = f"gradients of {self.micro_batches} micro-batches summed"
        if self.micro_batches == 1:
            return ""
        if not self.accumulated_per_shard:
            return f"{summed} in the step"
        mesh = self.distribution.device_mesh
        over = "devices" if len(mesh.axis_names) == 1 else f"{self.distribution.batch_dim_name} axis"
        return f"{summed} on each device in the step, then over the {over}" + \
            (" as one flat buffer" if self.flat_shards else "")

    def description(self):
        accumulating = self._accumulating()
        if self.distribution is None:
            return accumulating
        mesh = self.distribution.device_mesh
        shape = " x ".join(f"{size} {name}" for size, name in zip(mesh.shape, mesh.axis_names))
        # A step's own `gradients_of` (accumulation, fsdp's gathering) differentiates in place of the flat buffer.
        reduction = ", gradients summed as one flat buffer" if self.flat_shards and not self.own_gradients else ""
        return ", ".join(part for part in (f"{type(self.distribution).__name__} over a mesh of {shape}{reduction}",
                                           accumulating) if part)

    def numerics(self):
        return jax_step_numerics(self.traced_norms, self.model)

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
