"""tensor-parallel: Megatron's split of every Transformer block over the devices of a `model` axis, on both backends
under one name.

The plan, the same on both (`megatron_plan`): in each attention the query, key and value projections are split by
columns (each device computes its share of the heads) and the output projection by rows (each device's product is
a part of the sum, all-reduced); in each feed-forward the first Dense by columns (its share of the hidden units)
and the second by rows. The embeddings, layer norms, the row-split layers' biases and the tied output layer are
held whole on every device. So a block's forward all-reduces the activations once after attention and once after
the feed-forward; its backward all-reduces the gradient of the column-split projections' input once for the
feed-forward and once for attention: the query, key and value (separate Dense layers in the models) take their
input as Megatron's fused projection does, in one product with their kernels side by side
(`Attention.fused_projections`), so that one partial gradient is all-reduced (torch: the product of the local
shards, its input's gradient marked partial). So 4 a block, Megatron's count.

JAX: a `keras.distribution.ModelParallel` over a mesh of every device on a `model` axis (the `data` axis of size
1), the split weights and their Adam moments laid out on it, inside mtbench's one jitted step; GSPMD inserts the
all-reduces. Over several processes (torchrun) each hands in its rows of the batch and the program all-gathers them.
On a data x model mesh with --grad-accum each data shard sums its micro-batches' gradients in the split layouts and
the data axis sums them once, after the step's loop (`accumulated_over_shards`), as torch's buckets do.

torch: DTensor over a `DeviceMesh` of the run's processes (torchrun; NCCL on GPUs, gloo on CPUs). Each split
weight is a DTensor sharded as `ColwiseParallel` and `RowwiseParallel` shard `nn.Linear`'s (Keras's kernel is
the transpose: `Shard(1)` by columns, `Shard(0)` by rows), and each split Dense computes as those plans' hooks
make `nn.Linear` compute: the input made a replicated DTensor (`from_local`, whose backward all-reduces its
gradient) or a sharded one, and a row-split product's partial sum redistributed to replicated (an all-reduce).
`parallelize_module` itself takes only `nn.Linear` and `nn.Embedding`, and a Keras layer computes with its
variables' tensors through its own `call`: so the split Dense layers take a class whose `call` does what the hooks
do, their variables hold the DTensors, and each attention computes its local heads. torch's fused AdamW updates
the local shards (`SplitAdamW`). Every process needs the whole batch, which the loop splits among the processes:
the step gathers the rows in one all-gather (Megatron broadcasts each batch over its tensor-parallel group).
With `--tensor-parallel-size` below the process count the processes make a `data` x `model` mesh, as JAX's: each
model axis gathers its share of the batch, and the gradients are averaged over the data axis in DDP's buckets, each
all-reduce started from the backward pass once its gradients are ready (`gradient_buckets`: DDP itself takes
`nn.Module` parameters, and the split weights live in Keras variables). With `torch-compile` the compiled step
takes the eager one's place inside the split (DTensor's collectives traced into its graph).
"""

import collections
import re

from mtbench import Extra, MtbenchError, RunFailure, hookimpl, uneven_split_reason
from mtbench.plugins.backends.keras_optimizer import moments_of
from mtbench.plugins.backends.torch_fused_adamw import FusedAdamW
from mtbench.plugins.extras.compiled_collectives import collectives_counted
from mtbench.plugins.extras.dispatched_collectives import dispatched_counts
from mtbench.plugins.extras.gradient_buckets import GradientBuckets
from mtbench.plugins.extras.fsdp import (
    SIMULATE_HINT,
    JaxShardedStep,
    TorchDistributedStep,
    forget_tracked_tensors,
    process_mesh,
    processes_reason,
    use_distribution,
)

MODEL_AXIS = "model"
DATA_AXIS = "data"
EMBEDDINGS = "embeddings, layer norms and the tied output layer replicated"
# How an attention's query, key and value are computed, on both backends (one all-reduce of their input's gradient).
QUERY_KEY_VALUE = "query, key and value as one product"


class SplitDense(collections.namedtuple("SplitDense", "layer by")):
    """A Dense layer of the plan, split by 'columns' (its output units) or by 'rows' (its input units)."""


def megatron_plan(model):
    """(split Dense layers, attention layers) of `model`: each attention's query, key and value by columns and its
    output projection by rows; each feed-forward's first Dense by columns and its second by rows."""
    from mtbench.keras_models.gpt import MLP
    from mtbench.keras_models.transformer import Attention, FeedForward
    split, attentions = [], []
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, Attention):
            attentions.append(layer)
            split += [SplitDense(layer.query, "columns"), SplitDense(layer.key, "columns"),
                      SplitDense(layer.value, "columns"), SplitDense(layer.output_projection, "rows")]
        elif isinstance(layer, (MLP, FeedForward)):
            split += [SplitDense(layer.hidden, "columns"), SplitDense(layer.out, "rows")]
    return split, attentions


def split_variables(plan):
    """[(variable, the axis it is split on)]: a column-split layer's kernel on its output axis and its bias, a
    row-split layer's kernel on its input axis (its bias is added once, after the all-reduce: whole)."""
    variables = []
    for dense in plan:
        if dense.by == "columns":
            variables += [(dense.layer.kernel, 1)] + ([(dense.layer.bias, 0)] if dense.layer.bias is not None else [])
        else:
            variables.append((dense.layer.kernel, 0))
    return variables


def indivisible_reason(shape, parts):
    """Why a model of `shape` (a ModelPreset) cannot be split over `parts` devices, or None."""
    if shape is None:
        return None
    for name, flag in (("num_heads", "--heads"), ("ff_dim", "--ff-dim")):
        value = getattr(shape, name, None)
        if value is not None and value % parts:
            what = "attention heads" if name == "num_heads" else "feed-forward units"
            return f"the model's {value} {what} ({flag}) do not split evenly over {parts} devices"
    return None


def plan_record(plan, heads, parts):
    """What the run records of the plan: how many Dense layers it split each way, the heads each device computes."""
    split = collections.Counter(dense.by for dense in plan)
    return {"split_layers": {"columns": split["columns"], "rows": split["rows"]}, "heads_per_device": heads // parts,
            "replicated": EMBEDDINGS}


# The model families whose every block `megatron_plan` splits whole (Marian's blocks hold their feed-forward's
# Dense layers themselves: only its attention would be split).
SPLIT_FAMILIES = ("transformer", "gpt", "gpt2")


def family_reason(config):
    """Why the run's model family cannot be split, or None."""
    family = config.model_family[0]
    if family not in SPLIT_FAMILIES:
        return f"splits the blocks of mtbench's {', '.join(SPLIT_FAMILIES[:-1])} and {SPLIT_FAMILIES[-1]} models, not " \
               f"'{family}'"
    return None


def require_plan(model):
    """The plan of a model of `SPLIT_FAMILIES`, checked to split something."""
    plan, attentions = megatron_plan(model)
    if not plan:
        raise MtbenchError(f"splits the attention and feed-forward layers of mtbench's GPT and Transformer; the "
                           f"model '{model.name}' has none")
    return plan, attentions


# ----- JAX -----

def collectives_record(by_kind, activation_pattern):
    """The record of a step's collectives (`collectives_counted`) and how many were all-reduces of block
    activations (`activation_pattern` matches their shapes)."""
    return {**collectives_counted(by_kind),
            "activation_all_reduces_per_step": sum(bool(re.fullmatch(activation_pattern, shape))
                                                   for shape in by_kind.get("all-reduce", []))}


def lay_out_split(model, plan, distribution):
    """Lays each split weight and its two Adam moments out over the mesh's `model` axis (the distribution laid
    every variable out whole), as Keras will lay out what is assigned to them."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec
    mesh = distribution.device_mesh.backend_mesh
    for variable, axis in split_variables(plan):
        spec = [None] * len(variable.shape)
        spec[axis] = MODEL_AXIS
        sharding = NamedSharding(mesh, PartitionSpec(*spec))
        for held in (variable, *moments_of(model.optimizer, variable)):
            held._value, held._layout = jax.device_put(held.value, sharding), sharding


def whole_batch_step(model, distribution, micro_batches=1):
    """mtbench's jit step over the mesh, the devices of each model axis computing the same rows: all of the batch,
    or with a data axis their share of it. One process places each batch over its devices by the data axis;
    several hand in their own rows of it, split over their devices, and the program all-gathers them over the
    model axis as it starts (each array once): its collectives, counted with the rest. With `micro_batches` (--grad-
    accum) each micro-batch is differentiated so in turn, in the step's loop (`accumulated_gradients`)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from mtbench.plugins.backends.jax_jit_step import (
        JitTrainStep,
        accumulated_gradients,
        accumulated_over_shards,
        correct_tokens,
    )
    mesh = distribution.device_mesh.backend_mesh
    by_data = NamedSharding(mesh, PartitionSpec(DATA_AXIS))
    rows = NamedSharding(mesh, PartitionSpec((DATA_AXIS, MODEL_AXIS)))

    def whole_batch_gradients(loss_of, trainable, non_trainable, optimizer_state, x, y, weight):
        x, y, weight = jax.lax.with_sharding_constraint((x, y, weight), by_data)
        tokens = jnp.sum(weight)
        (_, (loss, logits, non_trainable)), grads = jax.value_and_grad(loss_of, has_aux=True)(
            trainable, non_trainable, optimizer_state, x, y, weight, tokens, 1.0)
        return grads, loss, correct_tokens(y, logits, weight), tokens, non_trainable

    class WholeBatchStep(JitTrainStep):
        def _distribute(self, arrays):
            if jax.process_count() == 1:
                return super()._distribute(arrays)
            if isinstance(arrays, tuple):
                return tuple(self._distribute(array) for array in arrays)
            return jax.make_array_from_process_local_data(rows, arrays)

    data_axis = mesh.shape[DATA_AXIS]
    gradients_of = whole_batch_gradients
    if micro_batches > 1 and data_axis > 1:
        # Each data shard sums its micro-batches' gradients in the split layouts and the data axis sums them once,
        # after the loop, as torch's buckets do: left to GSPMD, the loop's carry is replicated over the data axis,
        # and every micro-batch would all-reduce every gradient.
        layouts = [variable.value.sharding for variable in model.trainable_variables]
        gradients_of = accumulated_over_shards(micro_batches, data_axis, distribution, flat=False, layouts=layouts)
    elif micro_batches > 1:
        gradients_of = accumulated_gradients(micro_batches, inner=whole_batch_gradients)
    return WholeBatchStep(model, distribution, gradients_of)


class JaxSplitStep(JaxShardedStep):
    """The jit step over the `model` mesh (`whole_batch_step`), recording the state per device and the
    collectives of its compiled program for the first batch's shapes (`CompiledCollectivesRecording`), the blocks'
    all-reduces of activations told from the rest. Over several processes the state is replicated for evaluation
    and checkpoints as fsdp's is (`JaxShardedStep`)."""

    def __init__(self, inner, record, d_model):
        super().__init__(inner, record)
        self.d_model = d_model

    def record_compiled_collectives(self, by_kind, batch):
        micro_batches = self.inner.micro_batches
        # The rows each model axis computes at once: the global batch over the data axis, a micro-batch of it.
        rows = batch[1].shape[0] * self.record["processes"] // self.record["mesh_shape"][0] // micro_batches
        # (A micro-batch summed per data shard computes its rows under a leading shard axis: [1, rows, ...].)
        self.record.update(collectives_record(by_kind, rf"[a-z0-9]+\[(?:1,)?{rows},\d+,{self.d_model}\]"),
                           # the split layers gather nothing: every all-gather is of the batch's rows
                           batch_all_gathers_per_step=len(by_kind.get("all-gather", [])))

    def description(self):
        return f"{self.inner.description()}, {EMBEDDINGS}, {QUERY_KEY_VALUE}"


def jax_split_step(run, model, step):
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    if not isinstance(step, JitTrainStep) or step.distribution is None:
        raise MtbenchError(f"splits mtbench's jit step, not the '{step.name}' step")
    plan, attentions = require_plan(model)
    step.finalize()  # the Keras variables hold the state again
    lay_out_split(model, plan, step.distribution)
    record = run.extras_state[TensorParallel.name]
    record.update(plan_record(plan, attentions[0].num_heads, record["mesh_shape"][1]))
    d_model = attentions[0].num_heads * attentions[0].head_dim
    return JaxSplitStep(whole_batch_step(model, step.distribution, step.micro_batches), record, d_model)


# ----- torch -----

def split_classes(mesh):
    """The classes the plan's layers take while they train: Keras's Dense computing as torch's `ColwiseParallel`
    and `RowwiseParallel` make `nn.Linear` compute, with the DTensors its variables hold ('columns', 'rows'), and
    the attention computing its query, key and value in one product of its local shards ('attention'); the
    attention and the feed-forward ('feed_forward') dropping their local heads and units by their part of the
    mask one device draws for every head and unit."""
    import keras
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    from mtbench.keras_models.transformer import Attention, FeedForward
    index, parts = mesh.get_local_rank(), mesh.size()

    def share_of_whole_mask(local, axis, rate):
        """This device's part (along `axis`) of the dropout mask of `local`'s whole (every device's parts side by
        side), drawn as one device draws it, from the stream every device of the model axis shares (their other
        dropouts drop whole activations, alike): each head and unit drops on its own, as JAX's partitioned draw
        and one device do, and the stream stays in step on every device."""
        shape = list(local.shape)
        shape[axis] *= parts
        whole = F.dropout(torch.ones(shape, dtype=local.dtype, device=local.device), rate)
        return whole.narrow(axis, index * local.shape[axis], local.shape[axis])

    def weight(variable, dtype):
        value = variable._value
        return value if value.dtype == dtype else value.to(dtype)  # the layer's compute dtype, as Keras casts

    def replicated(inputs):
        """`inputs` as a replicated DTensor, whose backward all-reduces the gradient of the input over the model
        axis (the input of a column-split layer), or `inputs` when it is one already."""
        if isinstance(inputs, DTensor):
            return inputs
        return DTensor.from_local(inputs, mesh, [Replicate()], run_check=False)

    class SplitAttention(Attention):
        def projected_together(self, inputs, projections):
            # The local heads from one product of the local column shards. A DTensor product would reshape the
            # stacked kernels with their split axis inside a merged one, which DTensor can only do by gathering
            # them. The input's gradient comes back partial, and one all-reduce makes it whole, as after
            # Megatron's fused projection.
            source = replicated(inputs).to_local(grad_placements=[Partial()])
            return self.heads_of_one_product(source, [weight(p._kernel, source.dtype).to_local() for p in projections],
                                             [weight(p.bias, source.dtype).to_local() for p in projections])

        def drop_probabilities(self, probabilities):
            return probabilities * share_of_whole_mask(probabilities, 1, self.dropout_rate)

    class SplitFeedForward(FeedForward):
        def call(self, x, training=False):
            hidden = self.hidden(x)
            if training and isinstance(self.dropout, keras.layers.Dropout):
                hidden = hidden * share_of_whole_mask(hidden, hidden.ndim - 1, self.dropout.rate)
            return self.out(hidden)

    class ColumnSplitDense(keras.layers.Dense):
        def call(self, inputs, training=None):
            x = replicated(inputs)
            y = x @ weight(self._kernel, inputs.dtype)
            if self.bias is not None:
                y = y + weight(self.bias, inputs.dtype)
            return self.activation(y.to_local())

    class RowSplitDense(keras.layers.Dense):
        def call(self, inputs, training=None):
            x = DTensor.from_local(inputs, mesh, [Shard(inputs.ndim - 1)], run_check=False)
            partial = x @ weight(self._kernel, inputs.dtype)
            y = partial.redistribute(mesh, [Replicate()]).to_local()  # the all-reduce of the partial sums
            if self.bias is not None:
                y = y + weight(self.bias, inputs.dtype)
            return self.activation(y)

    return {"columns": ColumnSplitDense, "rows": RowSplitDense, "attention": SplitAttention,
            "feed_forward": SplitFeedForward}


class TorchSplitting:
    """The plan carried out over `mesh`: each split variable and its two moments are split once into DTensors,
    which they hold while training (`hold_distributed`), the split layers computing through `split_classes` and
    each attention over its local heads; `hold_full` gives the variables whole copies, and the layers their own
    classes, for evaluation and checkpoints."""

    def __init__(self, model, plan, attentions, mesh):
        import torch
        from torch.distributed.tensor import Shard, distribute_tensor
        self.model, self.plan, self.attentions, self.mesh = model, plan, attentions, mesh
        self.classes = split_classes(mesh)
        self.keras_classes = [type(dense.layer) for dense in plan]
        self.attention_classes = [type(attention) for attention in attentions]
        self.heads = [attention.num_heads for attention in attentions]
        from mtbench.keras_models.transformer import FeedForward
        # The translation model's (whose dropout drops its hidden units; the GPT's MLP drops its output, whole).
        self.feed_forwards = [layer for layer in model._flatten_layers(include_self=False)
                              if type(layer) is FeedForward]
        self.feed_forward_class = FeedForward
        self.shards = []  # (Keras variable, the DTensor it holds while training)
        for variable, axis in split_variables(plan):
            # Every process holds the same whole weight: each keeps its own part, nothing is sent.
            placements = [Shard(axis)]
            self.shards.append((variable, torch.nn.Parameter(
                distribute_tensor(variable.value.detach(), mesh, placements, src_data_rank=None))))
            self.shards += [(slot, distribute_tensor(slot.value.detach(), mesh, placements, src_data_rank=None))
                            for slot in moments_of(model.optimizer, variable)]
        self.distributed = False
        self.hold_distributed()  # the whole tensors the variables held are freed

    def hold_distributed(self):
        for variable, shard in self.shards:
            variable._value = shard
        forget_tracked_tensors(self.model)
        for dense in self.plan:
            dense.layer.__class__ = self.classes[dense.by]
        for attention, heads in zip(self.attentions, self.heads):
            attention.num_heads = heads // self.mesh.size()
            attention.__class__ = self.classes["attention"]
        for feed_forward in self.feed_forwards:
            feed_forward.__class__ = self.classes["feed_forward"]
        self.distributed = True

    def hold_full(self):
        import torch
        for variable, shard in self.shards:
            whole = shard.full_tensor()
            variable._value = torch.nn.Parameter(whole) if isinstance(shard, torch.nn.Parameter) else whole
        for dense, keras_class in zip(self.plan, self.keras_classes):
            dense.layer.__class__ = keras_class  # Keras names a checkpoint's objects by their class
        for attention, heads, keras_class in zip(self.attentions, self.heads, self.attention_classes):
            attention.num_heads = heads
            attention.__class__ = keras_class
        for feed_forward in self.feed_forwards:
            feed_forward.__class__ = self.feed_forward_class
        forget_tracked_tensors(self.model)
        self.distributed = False


class SplitAdamW(FusedAdamW):
    """torch's fused AdamW over the local parts of the split weights and moments (plain tensors sharing the
    DTensors' memory) and the whole replicated ones, clipped as Keras clips (`clipnorm`, `global_clipnorm`) with the
    split gradients' squared norms summed over the model axis in one all-reduce. On a data x model mesh the
    gradients are first averaged over the data axis (`data_group`, `replicas` processes: the step's own) in DDP's
    buckets, each all-reduce started from the backward pass (`GradientBuckets`)."""
    updates = "each process updating its parts of the split weights"

    def __init__(self, optimizer, variables, group, data_group=None, replicas=1, micro_batches=1):
        import torch
        super().__init__(optimizer, variables, group)
        self.values = [variable.value for variable in self.variables]
        self.split = [local is not value for local, value in zip(self.parameters, self.values)]
        self.data_axis = None if data_group is None else GradientBuckets(self.values, data_group, replicas,
                                                                         arrivals=micro_batches)
        # Made once: a tensor made from host data every step would be a host wait on a GPU.
        self.split_indices = torch.tensor([index for index, split in enumerate(self.split) if split],
                                          device=self.parameters[0].device)

    @staticmethod
    def updated_tensor(value):
        from torch.distributed.tensor import DTensor
        return value._local_tensor if isinstance(value, DTensor) else value

    def _squared_norms(self, grads):
        """Each gradient's squared norm, float32, a split one's over every process's part (one all-reduce)."""
        import torch
        import torch.distributed as dist
        squares = torch.stack(torch._foreach_norm(grads)).float().square()
        summed = squares.index_select(0, self.split_indices)
        dist.all_reduce(summed, group=self.group)
        return squares.index_copy(0, self.split_indices, summed)

    def _global_squared_norm(self, grads):
        return self._squared_norms(grads).sum()

    def _clip_each_gradient(self, grads):
        import torch
        scales = self.clipnorm / self._squared_norms(grads).sqrt().clamp_min(self.clipnorm)
        torch._foreach_mul_(grads, list(scales.to(grads[0].dtype).unbind()))

    def step(self):
        if self.data_axis is not None:
            self.data_axis.finish()
        for local, value, split in zip(self.parameters, self.values, self.split):
            if split:
                local.grad = value.grad._local_tensor
        super().step()
        for local, split in zip(self.parameters, self.split):
            if split:
                local.grad = None


def gathered_rows(arrays, group, world):
    """The whole batch on every process, as tensors on the processes' device, from each process's rows of `arrays`
    (numpy arrays of the same rows): one all-gather of their bytes side by side. The arrays are copied to the device
    as the step copies its batch (`to_device`); the rest happens there."""
    import torch
    import torch.distributed as dist
    from keras.src.backend.torch.core import get_device

    from mtbench.plugins.backends.torch_eager_step import to_device
    parts = [to_device(array, get_device()) for array in arrays]
    rows = parts[0].shape[0]
    columns = [part.reshape(rows, -1).contiguous().view(torch.uint8) for part in parts]
    local = torch.cat(columns, dim=1)
    gathered = local.new_empty((world * rows, local.shape[1]))
    # torch 2.13 names it all_gather_single and warns of the old name in every run; earlier torch has the old alone.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    all_gather(gathered, local, group=group)
    whole, start = [], 0
    for part, column in zip(parts, columns):
        width = column.shape[1]
        whole.append(gathered[:, start:start + width].contiguous().view(part.dtype)
                     .reshape((world * rows,) + part.shape[1:]))
        start += width
    return whole


def torch_collectives_record(ran, replayed=False):
    """What a split step records of the collectives one step ran (`profiled_collectives`'s counts). `replayed`: the
    step replayed CUDA graphs, whose captured collectives the host dispatches no more: a count without the blocks'
    all-reduces is then not the step's, and the record says so rather than write it."""
    kinds = collections.Counter(dispatched_counts(ran))
    # DTensor's all-reduces (functional collectives) are the blocks' activations and their gradients
    # (`all_reduce_` in place in a compiled graph).
    activations = sum(count for op, count in ran.items() if op.startswith("_c10d_functional::all_reduce"))
    if replayed and not activations:
        return {"collectives_per_step": None, "activation_all_reduces_per_step": None,
                "batch_all_gathers_per_step": kinds["all-gather"],
                "collectives_why_not": "the counted step replayed CUDA graphs, whose collectives the host does not "
                                       "dispatch"}
    return {"collectives_per_step": dict(sorted(kinds.items())), "activation_all_reduces_per_step": activations,
            "batch_all_gathers_per_step": kinds["all-gather"]}


class TorchSplitStep(TorchDistributedStep):
    """mtbench's torch step over the split weights, each process given the whole batch: its collectives recorded
    as `torch_collectives_record` tells the blocks' all-reduces from the rest."""

    def __init__(self, inner, splitting, record, group):
        super().__init__(inner, splitting, record)
        self.group = group

    def around(self, step):
        return TorchSplitStep(self.distributed_like_inner(step), self.layout, self.record, self.group)

    def step(self, x, y, sample_weight):
        arrays = gathered_rows([*x, y, sample_weight], self.group, self.layout.mesh.size())
        return self.inner(tuple(arrays[:-2]), *arrays[-2:])

    def record_collectives(self, ran):
        self.record.update(torch_collectives_record(ran, replayed=self.inner.warmup_calls > 1))
        data_axis = self.inner.fused_optimizer.data_axis
        if data_axis is not None:
            self.record["data_axis_gradients"] = data_axis.record()

    def description(self):
        model_axis, replicas = self.layout.mesh.size(), self.inner.replicas
        data_axis = self.inner.fused_optimizer.data_axis
        buckets = 0 if data_axis is None else len(data_axis.buckets)
        over = (f"a mesh of {replicas} data x {model_axis} model processes (the gradients averaged over the data "
                f"axis in DDP's buckets: {buckets} all-reduce{'s' * (buckets != 1)}, each started in the backward "
                f"pass when its gradients are ready)" if data_axis is not None else f"{model_axis} processes")
        own = f"tensor-parallel over {over}, {EMBEDDINGS}, {QUERY_KEY_VALUE}"
        return ", ".join(part for part in (self.inner.description(), own) if part)


def require_fused_eager_step(step, weights):
    """Refuses a step other than mtbench's eager torch step on one process with torch's fused AdamW, which updates
    `weights` (what the extra lays out: 'the split weights')."""
    from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
    if not isinstance(step, EagerTorchTrainStep) or step.processes is not None:
        raise MtbenchError(f"splits mtbench's eager torch step, not the '{step.name}' step")
    if step.fused_optimizer is None:
        raise MtbenchError(f"updates {weights} with torch's fused AdamW, which cannot carry out this optimizer "
                           f"({step.fused_optimizer_refused})")


def torch_split_step(run, model, step):
    require_fused_eager_step(step, "the split weights")
    plan, attentions = require_plan(model)
    world = run.processes.world_size
    model_axis = run.config.tensor_parallel_size or world
    data_axis = world // model_axis
    if data_axis == 1:
        mesh = process_mesh(world, axis_names=(MODEL_AXIS,))
    else:
        # Processes next to each other (on a GPU machine the GPUs joined by the fastest links) share a model axis.
        grid = process_mesh((data_axis, model_axis), axis_names=(DATA_AXIS, MODEL_AXIS))
        mesh = grid[MODEL_AXIS]
        step.distribute(run.processes, model, data_group=grid.get_group(DATA_AXIS))
    splitting = TorchSplitting(model, plan, attentions, mesh)
    step.fused_optimizer = SplitAdamW(model.optimizer, step.variables, mesh.get_group(), step.data_group,
                                      step.replicas, step.micro_batches)
    record = {"devices": world, "processes": world, "collectives": run.processes.collectives,
              "per_device_batch": run.config.batch_size // data_axis,
              **({"mesh_axes": [MODEL_AXIS], "mesh_shape": [world]} if data_axis == 1 else
                 {"mesh_axes": [DATA_AXIS, MODEL_AXIS], "mesh_shape": [data_axis, model_axis]}),
              **plan_record(plan, splitting.heads[0], model_axis)}
    for dense in plan:
        if dense.layer._kernel._value.to_local().numel() * model_axis != dense.layer._kernel._value.numel():
            raise RunFailure(f"the kernel of {dense.layer.path} did not split over {model_axis} processes")
    return TorchSplitStep(step, splitting, record, mesh.get_group())


class TensorParallel(Extra):
    name = "tensor-parallel"
    description = ("Megatron's split of each Transformer block over a model axis (attention heads and feed-forward "
                   "units; one all-reduce after each): JAX a ModelParallel mesh inside the jit step, torch DTensor "
                   "under torchrun")
    backends = ("jax", "torch")
    conflicts = ("fsdp", "ddp", "data-parallel", "pmap", "tpu")
    spans_processes = True
    parallelism = "tensor"
    # Each device drops its part of the masks one device draws for the whole layer, and what it holds whole as the
    # others do (tested on both backends), so the run draws one device's masks; a data axis (a
    # --tensor-parallel-size below the devices) draws its rows' own, and compare keeps such runs apart by that size.
    keeps_random_draws = True

    def unavailable_reason(self, run):
        shape, processes, size = run.model_shape, run.processes.world_size, run.config.tensor_parallel_size
        if run.backend.name == "jax":
            count = run.device.get("count", 1)
            if count < 2:
                return f"needs at least 2 devices; this run has {count} ({SIMULATE_HINT})"
            model_axis = size or count
            if count % model_axis or model_axis < 2:
                return (f"--tensor-parallel-size {model_axis} must be at least 2 and divide the run's {count} "
                        f"devices (the data axis takes the rest)")
            return (family_reason(run.config) or uneven_split_reason(run.config, processes, "processes")
                    or uneven_split_reason(run.config, count // model_axis, "devices of the data axis")
                    or indivisible_reason(shape, model_axis))
        reason = processes_reason(run)
        if reason:
            return reason
        if size is not None and (size < 2 or processes % size):
            return (f"--tensor-parallel-size {size} must be at least 2 and divide the run's {processes} processes "
                    f"(the data axis takes the rest)")
        return (family_reason(run.config) or uneven_split_reason(run.config, processes, "processes")
                or indivisible_reason(shape, size or processes))

    def before_model(self, run):
        if run.backend.name != "jax":
            return
        import jax
        from keras.distribution import DeviceMesh, LayoutMap, ModelParallel
        devices = jax.devices()
        model_axis = run.config.tensor_parallel_size or len(devices)
        data_axis = len(devices) // model_axis
        # Devices next to each other share a model axis: on a GPU machine the ones joined by the fastest links.
        mesh = DeviceMesh((data_axis, model_axis), [DATA_AXIS, MODEL_AXIS], devices)
        distribution = ModelParallel(layout_map=LayoutMap(mesh), batch_dim_name=DATA_AXIS)
        run.extras_state[self.name] = {**use_distribution(run, distribution), "mesh_axes": [DATA_AXIS, MODEL_AXIS],
                                       "per_device_batch": run.config.batch_size // data_axis}

    def make_train_step(self, run, model, step):
        if run.backend.name == "jax":
            return jax_split_step(run, model, step)
        split = torch_split_step(run, model, step)
        run.extras_state[self.name] = split.record
        return split


@hookimpl
def mtbench_register_extras(register):
    register(TensorParallel())
