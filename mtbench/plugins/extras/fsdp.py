"""fsdp: parameters, gradients and optimizer state sharded over the devices, gathered layer by layer for compute,
on both backends under one name.

JAX: a `keras.distribution.ModelParallel` whose layout shards every weight over the `data` axis of a mesh of
all the run's devices, on the weight's largest axis that the axis size divides (a weight no axis of which it
divides stays replicated); the batch is split over the same axis. mtbench's jit step runs over that mesh, its
optimizer state in the weights' layouts, and differentiates as FSDP does (`gathered_per_device`): each device
gathers a unit's weights (one all-gather per unit, in the compute dtype, kept for the backward), computes its rows,
and reduce-scatters the unit's gradients to their shards. Left to GSPMD, the same layouts compile to model parallelism on XLA:CPU
(activations gathered, every gradient all-reduced whole, no reduce-scatter), which is not ZeRO-3.

torch: FSDP2 (`torch.distributed.fsdp.fully_shard`) on a device mesh of the run's processes (torchrun; NCCL on
GPUs, gloo on CPUs), one unit per composite layer of the model (the Transformer's blocks) and the model itself
for the rest. FSDP gathers a unit's parameters before its forward, keeps them to its backward (as JAX's
program does: `reshard_after_forward=False`, one all-gather a unit a step on both) and reduce-scatters its
gradients after, but it does so for the module's registered parameters, while a Keras layer computes with its variables'
own tensors: wrapped naively, FSDP shards parameters nothing reads and the model trains the unsharded originals.
So each unit's call goes through `torch.nn.Module.__call__` (where FSDP's hooks run) and, once FSDP has gathered
the unit, points the unit's variables at the gathered parameters; between steps the variables hold the sharded
parameters (DTensors). torch's fused AdamW then updates the shards with Keras's schedule (`torch_fused_adamw`),
its state the Keras optimizer's moment variables, sharded as their parameters are.
"""

import contextlib
import functools
import itertools
import math
import sys
from typing import NamedTuple

from mtbench import (
    Extra,
    MtbenchError,
    RunFailure,
    WrappingStep,
    hookimpl,
    uneven_split_reason,
)
from mtbench.plugins.backends.keras_optimizer import all_moments, moments_of
from mtbench.plugins.backends.torch_fused_adamw import FusedAdamW
from mtbench.plugins.extras.compiled_collectives import collectives_counted, hlo_collectives
from mtbench.plugins.extras.dispatched_collectives import ProfiledCall, dispatched_counts

DATA_AXIS = "data"
# JAX_PLATFORMS: on a machine with one GPU, JAX would take the GPU and leave the flag unused.
SIMULATE_HINT = ("simulate N devices on the CPU with XLA_FLAGS=--xla_force_host_platform_device_count=N "
                 "JAX_PLATFORMS=cpu")
LAUNCH_HINT = "start mtbench with torchrun --nproc-per-node N -m mtbench train ..."


def sharded_axis(shape, parts):
    """The axis a weight of `shape` is split on over `parts` devices: its largest one that `parts` divides (the
    first of equals); None when no axis divides."""
    divisible = [axis for axis, size in enumerate(shape) if size >= parts and size % parts == 0]
    return max(divisible, key=lambda axis: shape[axis], default=None)


def devices_reason(run):
    """Why a JAX run cannot split its batches over its devices (fewer than 2, or a batch that does not split
    evenly), or None: `fsdp`, `pmap` and `data-parallel` alike."""
    count = run.device.get("count", 1)
    if count < 2:
        return f"needs at least 2 devices; this run has {count} ({SIMULATE_HINT})"
    return uneven_split_reason(run.config, count, "devices")


def processes_reason(run):
    """Why a torch run is not spread over processes to distribute (started without torchrun), or None: `fsdp` and
    `ddp` alike."""
    if run.processes.world_size < 2:
        return f"needs at least 2 processes; this run has 1 ({LAUNCH_HINT})"
    return None


def process_mesh(shape, axis_names=None):
    """torch's `DeviceMesh` over the run's processes, on their GPUs (NCCL) or CPUs (gloo): `shape` is their
    count, or a tuple of axis sizes whose product it is (processes next to each other share the last axis)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", shape, mesh_dim_names=axis_names)


def state_record(parameter_bytes, gradient_bytes, optimizer_state_bytes, replicated_bytes):
    """What a run records of its training state per device: the bytes of the parameters, gradients and optimizer
    state the largest device holds, beside those of the parameters unsharded."""
    return {"parameter_bytes": int(parameter_bytes), "gradient_bytes": int(gradient_bytes),
            "optimizer_state_bytes": int(optimizer_state_bytes),
            "state_bytes": int(parameter_bytes + gradient_bytes + optimizer_state_bytes),
            "unsharded_parameter_bytes": int(replicated_bytes)}


# ----- JAX -----

def jax_bytes_per_device(arrays):
    """{device: bytes of the shards of `arrays` it holds} over this process's devices."""
    held = {}
    for array in arrays:
        for shard in array.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held


def jax_state_record(trainable, optimizer_state):
    """The state record of a jit step's arrays: the gradients take the parameters' layouts (the step holds them
    to those), so their bytes are the parameters'."""
    parameters = jax_bytes_per_device(trainable)
    optimizer = jax_bytes_per_device(optimizer_state)
    device = max(parameters, key=lambda d: parameters[d] + optimizer.get(d, 0))
    unsharded = sum(array.size * array.dtype.itemsize for array in trainable)
    return state_record(parameters[device], parameters[device], optimizer.get(device, 0), unsharded)


def sharded_model_parallel(devices):
    """A `keras.distribution.ModelParallel` over a mesh of `devices` on one `data` axis, the batch split over
    it too, laying every variable but dropout's seed states out on its `sharded_axis`."""
    from keras.distribution import DeviceMesh, LayoutMap, ModelParallel, TensorLayout

    from mtbench.plugins.backends.jax_jit_step import SEED_STATE

    class ShardedWeights(ModelParallel):
        def get_variable_layout(self, variable):
            layout = super().get_variable_layout(variable)  # an explicit layout (the variable's, the map's) wins
            if any(axis is not None for axis in layout.axes):
                return layout
            axes = [None] * len(variable.shape)
            # Dropout's seed states rest whole, as the step takes and returns them: split over 2 devices (their 2
            # words), the first step would gather them in a program of its own, and every later step compile
            # another for the whole seeds.
            if variable.name == SEED_STATE:
                return TensorLayout(axes, self.device_mesh)
            axis = sharded_axis(tuple(variable.shape), self.device_mesh.shape[0])
            if axis is not None:
                axes[axis] = DATA_AXIS
            return TensorLayout(axes, self.device_mesh)

    mesh = DeviceMesh((len(devices),), [DATA_AXIS], devices)
    return ShardedWeights(layout_map=LayoutMap(mesh), batch_dim_name=DATA_AXIS)


def use_distribution(run, distribution):
    """Sets `distribution`, a mesh over every process's devices (`jax.devices()`), as Keras's; returns the record
    of it (`fsdp` and `data-parallel` alike)."""
    import jax
    import keras
    keras.distribution.set_distribution(distribution)
    devices = len(jax.devices())
    return {"devices": devices, "processes": jax.process_count(), "mesh_shape": list(distribution.device_mesh.shape),
            "per_device_batch": run.config.batch_size // devices}


@functools.lru_cache(maxsize=2)
def _relayout_program(shardings):
    import jax
    return jax.jit(lambda values: values, out_shardings=list(shardings))


def jax_relaid(arrays, shardings):
    """`arrays` laid out as `shardings` say (one program: it works across processes too), compiled once per
    layout: a run lays its state out whole and sharded again around every evaluation and checkpoint."""
    return _relayout_program(tuple(shardings))(arrays)


def compile_relayout(arrays, shardings):
    """Compiles now the program `jax_relaid(arrays, shardings)` will run, which then compiles nothing."""
    _relayout_program(tuple(shardings)).lower(arrays).compile()


class StateRecording(WrappingStep):
    """Wraps a train step and records its training state per device at every `finalize`, before the step hands
    its state to Keras: `measure()` returns the record (`state_of(inner)`: `state_record`'s), or None when nothing
    trained since."""

    def __init__(self, inner, record, state_of):
        super().__init__(inner)
        self.record, self.state_of = record, state_of

    def measure(self):
        return self.state_of(self.inner)

    def finalize(self):
        measured = self.measure()
        if measured is not None:
            self.record.update(measured)
        self.inner.finalize()


class CompiledCollectivesRecording(StateRecording):
    """A JAX jit step (`JitTrainStep`) recorded as `StateRecording` records it, and the collectives of its compiled
    program counted at the first `finalize` after a step (`collectives_per_step`): what the step ran, read where it
    ran, not what its layouts asked for. The program is compiled again for the count, between timing windows."""

    def __init__(self, inner, record, state_of=None):
        super().__init__(inner, record, state_of or jax_step_state)
        self.first_batch = None  # whose compiled program's collectives the first `finalize` counts

    def __call__(self, x, y, sample_weight):
        if "collectives_per_step" not in self.record and self.first_batch is None:
            self.first_batch = (x, y, sample_weight)
        return self.inner(x, y, sample_weight)

    def finalize(self):
        if self.first_batch is not None and self.inner.state is not None:
            program = self.inner.lowered_program(*self.first_batch, optimised=True)
            self.record_compiled_collectives(hlo_collectives(program, trip_count=self.inner.micro_batches),
                                             self.first_batch)
            self.first_batch = None
        super().finalize()

    def record_compiled_collectives(self, by_kind, batch):
        """Records the collectives ({kind: arrays moved}) of the step's program compiled for `batch`."""
        self.record.update(collectives_counted(by_kind))


def jax_step_state(step):
    """The state record of a `JitTrainStep` from the arrays it carries from step to step (None before a step)."""
    if step.state is None:
        return None
    trainable, _, optimizer_state = step.state
    return jax_state_record(trainable, optimizer_state)


class Bucket(NamedTuple):
    """Weights gathered in one collective: their indices among the trainable weights, the axis each is split on
    (None: held whole), the dtype they are gathered in and the dtype they and their gradients are stored in."""
    indices: list
    dims: list
    compute_dtype: str
    stored_dtype: str


def jax_buckets(model, specs):
    """One `Bucket` per FSDP unit (`fsdp_units`) and dtype, as FSDP2 gathers a unit's parameters in one
    all-gather and reduce-scatters their gradients in one reduce-scatter; a weight no axis of which the devices
    divide is a bucket of its own (held whole, its gradient all-reduced)."""
    policy = model.dtype_policy
    unit_of = {}
    for unit, layer in enumerate(fsdp_units(model)):
        for variable in layer.trainable_variables:
            unit_of.setdefault(id(variable), unit)
    groups = {}
    for index, (variable, spec) in enumerate(zip(model.trainable_variables, specs)):
        dim = next((axis for axis, name in enumerate(spec) if name is not None), None)
        compute = policy.compute_dtype if variable.dtype == policy.variable_dtype else variable.dtype
        key = (unit_of[id(variable)], compute, variable.dtype) if dim is not None else ("whole", index)
        groups.setdefault(key, Bucket([], [], compute, variable.dtype))
        groups[key].indices.append(index)
        groups[key].dims.append(dim)
    return list(groups.values())


def bucket_gathering(axis, devices, bucket):
    """A function of a bucket's shards that returns its weights whole, in the bucket's compute dtype: one
    all-gather of the shards flattened into one buffer. Its backward sums the weights' gradients over the devices
    and keeps this device's shards of the sums, in the stored dtype: one reduce-scatter (an all-reduce for a
    weight held whole). torch's FSDP2 with MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=stored)."""
    import jax
    import jax.numpy as jnp

    def split(flat, shapes):
        ends = list(itertools.accumulate((math.prod(shape) for shape in shapes), initial=0))
        return [flat[..., start:end].reshape(flat.shape[:-1] + shape)
                for start, end, shape in zip(ends, ends[1:], shapes)]

    @jax.custom_vjp
    def gather(shards):
        shards = [shard.astype(bucket.compute_dtype) for shard in shards]
        if bucket.dims == [None]:
            return shards
        flat = jnp.concatenate([shard.reshape(-1) for shard in shards])
        # Gathered as the compute dtype's bits: XLA would move Keras's widening of the gathered weights back to
        # their variables' dtype above the all-gather, and gather float32.
        bits = jnp.dtype(f"uint{flat.dtype.itemsize * 8}")
        gathered = jax.lax.bitcast_convert_type(jax.lax.all_gather(jax.lax.bitcast_convert_type(flat, bits), axis),
                                                flat.dtype)
        pieces = split(gathered, [shard.shape for shard in shards])  # (devices, *shard)
        return [jnp.moveaxis(piece, 0, dim).reshape(shard.shape[:dim] + (-1,) + shard.shape[dim + 1:])
                for piece, shard, dim in zip(pieces, shards, bucket.dims)]

    def forward(shards):
        return gather(shards), None

    def backward(_, gradients):
        gradients = [gradient.astype(bucket.stored_dtype) for gradient in gradients]
        if bucket.dims == [None]:
            return ([jax.lax.psum(gradients[0], axis)],)
        shapes = [gradient.shape[:dim] + (gradient.shape[dim] // devices,) + gradient.shape[dim + 1:]
                  for gradient, dim in zip(gradients, bucket.dims)]
        by_device = [jnp.moveaxis(gradient.reshape(shape[:dim] + (devices,) + shape[dim:]), dim, 0)
                     .reshape(devices, -1) for gradient, shape, dim in zip(gradients, shapes, bucket.dims)]
        summed = jax.lax.psum_scatter(jnp.concatenate(by_device, axis=1), axis)
        return (split(summed, shapes),)

    gather.defvjp(forward, backward)
    return gather


def unit_gathering(model, distribution):
    """(the trainable weights' partition specs, `gathered`): `gathered(shards)`, called on one device's shards of
    the trainable weights inside a `jax.shard_map` over the distribution's mesh, returns the weights whole in the
    compute dtype, one all-gather a bucket (`bucket_gathering`), its backward one reduce-scatter."""
    mesh, axis = distribution.device_mesh.backend_mesh, distribution.batch_dim_name
    specs = [variable.value.sharding.spec for variable in model.trainable_variables]
    buckets = [(bucket, bucket_gathering(axis, mesh.shape[axis], bucket)) for bucket in jax_buckets(model, specs)]

    def gathered(shards):
        weights = [None] * len(shards)
        for bucket, gather in buckets:
            for index, weight in zip(bucket.indices, gather([shards[index] for index in bucket.indices])):
                weights[index] = weight
        return weights

    return specs, gathered


def gathered_per_device(model, distribution):
    """The fsdp step's differentiation (`JitTrainStep`'s `gradients_of`): each device, in a `jax.shard_map` over
    the mesh, gathers each unit's weights whole in the compute dtype (`bucket_gathering`: one all-gather) for the
    forward pass, computes its rows of the batch, and its backward reduce-scatters the unit's gradients to the
    weights' shards: weights, gradients and optimizer state sharded at rest, as torch's FSDP2 runs them here
    (the gathered weights kept from forward to backward on both: ZeRO-3 would gather them again for the backward). Left to GSPMD, XLA partitions the step as model
    parallelism instead (activations gathered, every gradient all-reduced whole). Each device draws its dropout
    masks from its own stream (the seeds' first word offset by its index), as `summed_over_shards` does."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    from mtbench.plugins.backends.jax_jit_step import SEED_STATE, correct_tokens
    if any(variable.name != SEED_STATE for variable in model.non_trainable_variables):
        raise MtbenchError("shards models whose only non-trainable state is dropout seeds (a batch norm's "
                           "statistics want the whole batch)")
    mesh, axis = distribution.device_mesh.backend_mesh, distribution.batch_dim_name
    devices = mesh.shape[axis]
    whole, rows = PartitionSpec(), PartitionSpec(axis)
    specs, gathered = unit_gathering(model, distribution)
    # The optimizer state the loss reads (a loss scale): the variables held whole; the moments stay outside.
    optimizer_whole = [all(name is None for name in variable.value.sharding.spec)
                       for variable in model.optimizer.variables]

    def gradients_of(loss_of, trainable, non_trainable, optimizer_state, x, y, weight):
        def per_device(trainable, seeds, optimizer_whole_state, x, y, weight):
            index = jax.lax.axis_index(axis).astype("uint32")
            offset = jnp.stack([index, jnp.zeros((), "uint32")])
            tokens = jax.lax.psum(jnp.sum(weight), axis)
            states = iter(optimizer_whole_state)
            optimizer_state = [next(states) if held else None for held in optimizer_whole]

            def loss_of_shards(shards):
                return loss_of(gathered(shards), [seed + offset for seed in seeds], optimizer_state, x, y, weight,
                               tokens, 1.0 / devices)

            (_, (loss, logits, seeds)), grads = jax.value_and_grad(loss_of_shards, has_aux=True)(trainable)
            correct = jax.lax.psum(correct_tokens(y, logits, weight), axis)
            return grads, jax.lax.psum(loss, axis), correct, tokens, [seed - offset for seed in seeds]

        held = [state for state, whole_held in zip(optimizer_state, optimizer_whole) if whole_held]
        return jax.shard_map(per_device, mesh=mesh, check_vma=False,
                             in_specs=(specs, whole, whole, rows, rows, rows),
                             out_specs=(specs, whole, whole, whole, whole))(
            trainable, non_trainable, held, x, y, weight)

    return gradients_of


def per_device_gradient(model, distribution, loss):
    """The gradient of `loss(weights, non_trainable, inputs)` with respect to the trainable weights' shards, taken
    as the fsdp step takes its own (`gathered_per_device`): each device gathers the units' weights, differentiates
    its rows' loss and reduce-scatters the gradients. A function of (shards, non-trainable values, the batch's
    inputs laid out over the mesh), for checks that must compile what the step compiles (remat's)."""
    import jax
    from jax.sharding import PartitionSpec
    specs, gathered = unit_gathering(model, distribution)

    def per_device(shards, non_trainable, inputs):
        return jax.grad(lambda own: loss(gathered(own), non_trainable, inputs))(shards)

    return jax.shard_map(per_device, mesh=distribution.device_mesh.backend_mesh, check_vma=False,
                         in_specs=(specs, PartitionSpec(), PartitionSpec(distribution.batch_dim_name)),
                         out_specs=specs)


class JaxShardedStep(CompiledCollectivesRecording):
    """The jit step over the sharded mesh: its collectives counted in its compiled program, one all-gather of each
    unit's weights and one reduce-scatter of its gradients (GSPMD's own partitioning of the same layouts
    all-reduces whole gradients instead). Across processes the whole state is replicated at `finalize` (process
    0 alone writes checkpoints and the saved model, and can read only what it holds) and laid out sharded again
    when training goes on."""

    def __init__(self, inner, record):
        super().__init__(inner, record)
        model = inner.model
        self.variables = [*model.trainable_variables, *model.non_trainable_variables, *model.optimizer.variables]
        self.layouts = [variable.value.sharding for variable in self.variables]
        self.keras_layouts = [variable._layout for variable in self.variables]  # what Keras lays assignments as
        self.replicated = self.way_back_compiled = False

    def measure(self):
        measured = super().measure()
        if measured is not None:
            # Whether the weights kept the layouts the distribution gave them through every step.
            trainable = self.inner.state[0]
            measured["layouts_kept"] = all(array.sharding.is_equivalent_to(layout, array.ndim)
                                           for array, layout in zip(trainable, self.layouts[:len(trainable)]))
        return measured

    def description(self):
        return f"{self.inner.description()}, {sharded_step_text(len(self.record['units']), self.record)}"

    def _lay_out(self, shardings, keras_layouts):
        for variable, value, layout in zip(self.variables, jax_relaid([v.value for v in self.variables], shardings),
                                           keras_layouts):
            variable._value, variable._layout = value, layout

    def __call__(self, x, y, sample_weight):
        if self.replicated:
            self._lay_out(self.layouts, self.keras_layouts)
            self.replicated = False
        return super().__call__(x, y, sample_weight)

    def finalize(self):
        import jax
        super().finalize()
        if not self.replicated and not all(variable.value.is_fully_addressable for variable in self.variables):
            whole = [jax.sharding.NamedSharding(layout.mesh, jax.sharding.PartitionSpec()) for layout in self.layouts]
            # Keras lays what is assigned to a variable out as its layout says (evaluation assigns): replicated
            # until training goes on.
            self._lay_out(whole, whole)
            self.replicated = True
            if not self.way_back_compiled:
                # Here, between timing windows: the next step would compile it inside one, unseen by compile_s.
                compile_relayout([variable.value for variable in self.variables], self.layouts)
                self.way_back_compiled = True


# ----- torch -----

def forget_tracked_tensors(model):
    """Drops the tensors Keras's torch layers keep of their variables (`_torch_params`, every layer holding its own
    and its sublayers'), which keep a tensor alive after its variable lets it go; a layer tracks its variables'
    current tensors again when torch asks for its parameters."""
    for layer in model._flatten_layers(include_self=True):
        if "_torch_params" in layer._modules:
            del layer._torch_params


def torch_local_bytes(tensors):
    """Bytes of this process's part of `tensors` (the local shard of a DTensor, a plain tensor whole)."""
    from torch.distributed.tensor import DTensor
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def torch_state_record(parameters, optimizer):
    """The state record of a torch step: its parameters and their gradients as this process holds them, and the
    moments of the Keras optimizer (torch's fused AdamW updates those very tensors)."""
    moments = [slot.value for slot in all_moments(optimizer)]
    unsharded = sum(parameter.numel() * parameter.element_size() for parameter in parameters)
    return state_record(torch_local_bytes(parameters), torch_local_bytes([p.grad for p in parameters]),
                        torch_local_bytes(moments), unsharded)


def fsdp_units(model):
    """The model's direct sublayers that hold layers of their own (its blocks): one FSDP unit each, gathered
    around its own call. The model itself is the last unit, for the weights outside them (embeddings, final
    norms), which it may read outside any sublayer's call (a tied output layer)."""
    return [layer for layer in model._flatten_layers(include_self=False, recursive=False)
            if any(True for _ in layer._flatten_layers(include_self=False))] + [model]


class ShardedUnit(NamedTuple):
    """One FSDP unit: the Keras layer, its own `call`, what it holds ((variable, where FSDP puts the gathered
    parameter, its key there, the shard FSDP keeps between gatherings)), and its class as Keras made it and as
    FSDP made it."""
    module: object
    call: object
    held: list
    keras_class: type
    fsdp_class: type


def mixed_precision_policy(model):
    """FSDP2's policy for the model's dtype policy: under a mixed one, weights gathered in the compute dtype and
    gradients reduced in the weights' own (as `bucket_gathering` does on JAX); Keras casts the layers' inputs
    itself."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy
    policy = model.dtype_policy
    if policy.compute_dtype == policy.variable_dtype:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=getattr(torch, policy.compute_dtype),
                                reduce_dtype=getattr(torch, policy.variable_dtype), cast_forward_inputs=False)


class TorchSharding:
    """FSDP2 over `mesh` around a Keras model: each unit's call runs FSDP's hooks, its variables holding the
    parameters FSDP gathered while it computes, and their shards (DTensors) before and after."""

    def __init__(self, model, mesh):
        import torch
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor

        # Keras registers each variable's tensor with its own layer and again with every layer above it; FSDP
        # wants one owner per parameter, so each layer keeps only its own variables' tensors.
        owners = {}  # id(tensor) -> (the ParameterDict holding it, its key there)
        for layer in model._flatten_layers(include_self=True):
            own = layer._trainable_variables + layer._non_trainable_variables
            layer._torch_params = torch.nn.ParameterDict({variable.path: variable.value for variable in own})
            for key, tensor in layer._torch_params._parameters.items():
                owners[id(tensor)] = (layer._torch_params, key)
        variables = {id(variable.value): variable for variable in model.variables}
        frozen = {variable.value for variable in model.variables if not variable.trainable}  # seeds stay whole
        units = fsdp_units(model)
        submodules = set(model.modules())
        for index, unit in enumerate(units[:-1]):
            if unit not in submodules:  # a layer held in a list: torch's module tree does not know it
                torch.nn.Module.add_module(model, f"fsdp_unit_{index}", unit)
        claimed, self.units = set(), []
        for unit in units:  # innermost first: the model's unit takes what the blocks left
            held = []
            for tensor in unit.parameters():
                variable = variables.get(id(tensor))
                if variable is not None and variable.trainable and id(tensor) not in claimed:
                    claimed.add(id(tensor))
                    held.append((variable, *owners[id(tensor)]))
            keras_class = type(unit)
            # Makes the unit's class FSDP's subclass of it.
            # Gathered once a step: kept from the unit's forward to its backward, as JAX's program keeps the
            # gathered weights for its backward (FSDP2's default gathers each unit a second time in the backward,
            # two all-gathers a unit against JAX's one).
            fully_shard(unit, mesh=mesh, ignored_params=frozen, mp_policy=mixed_precision_policy(model),
                        reshard_after_forward=False)
            held = [(variable, parameters, key, parameters._parameters[key]) for variable, parameters, key in held]
            for variable, _, _, shard in held:
                if not isinstance(shard, DTensor):
                    raise RunFailure(f"FSDP left the weight {variable.path} unsharded")
            self.units.append(ShardedUnit(unit, unit.call, held, keras_class, type(unit)))
        self.sharded = [(variable, shard) for unit in self.units for variable, _, _, shard in unit.held]
        self.model, self.mesh, self.moments = model, mesh, []
        self.distributed = False  # whether the variables hold their shards with FSDP's hooks on
        self.hold_distributed()  # the whole tensors the variables held are freed; `hold_full` undoes it

    def shard_moments(self, optimizer):
        """Lays the Keras optimizer's moment variables out as their parameters are (a resumed run's moments
        carried over), so that the optimizer updates shards."""
        from torch.distributed.tensor import distribute_tensor
        for variable, parameter in self.sharded:
            for slot in moments_of(optimizer, variable):
                shard = distribute_tensor(slot.value.detach(), parameter.device_mesh, parameter.placements)
                if shard.to_local().shape != parameter.to_local().shape:
                    raise RunFailure(f"the moments of {variable.path} shard unlike the weight")
                slot._value = shard
                self.moments.append((slot, shard))

    def start_gathering(self):
        """Each unit's call goes through `torch.nn.Module.__call__`, where FSDP's hooks gather the unit's
        parameters before it (and again for its backward) and reduce-scatter their gradients after."""
        import torch

        from mtbench.keras_models.transformer import recomputes
        for unit, call, held, _, fsdp_class in self.units:
            unit.__class__ = fsdp_class

            def forward(*args, _call=call, _held=held, **kwargs):
                for variable, parameters, key, _ in _held:
                    variable._value = parameters._parameters[key]  # the gathered parameter, while FSDP holds it
                try:
                    return _call(*args, **kwargs)
                finally:
                    for variable, _, _, shard in _held:
                        variable._value = shard  # the backward reads what the forward saved, not the variable

            if recomputes(unit):
                # A block that recomputes its activations (`--extra remat`) recomputes them here, pointing its
                # variables at the parameters FSDP holds gathered until its backward: its own recomputation would
                # read the shards the variables hold by then. Its own checkpoint function (a policy's) if it has one.
                unit.checkpointed_outside = True
                forward = unit.remat(forward) if callable(unit.remat) else functools.partial(
                    torch.utils.checkpoint.checkpoint, forward, use_reentrant=False)
            unit.forward = forward
            unit.call = lambda *args, _unit=unit, **kwargs: torch.nn.Module.__call__(_unit, *args, **kwargs)
        self.distributed = True

    @contextlib.contextmanager
    def micro_batch_context(self, last):
        """Under --grad-accum, each unit stays gathered from one micro-batch's backward to the next one's forward and
        is resharded after the last one's backward: one all-gather a unit a step, as JAX's program hoists its
        gathering out of the micro-batch loop (FSDP2 would gather every micro-batch). Each micro-batch's gradients
        are reduce-scattered after its backward, on both."""
        self.model.set_reshard_after_backward(last)
        yield

    def hold_distributed(self):
        """The variables at their shards, FSDP's hooks on: for the next step."""
        self.hold_shards()
        self.start_gathering()

    def hold_shards(self):
        """Points every variable at its shard and every moment variable at its own, for the next step."""
        for variable, shard in self.sharded:
            variable._value = shard
        for slot, shard in self.moments:
            slot._value = shard

    def hold_full(self):
        """Gathers every weight and moment whole into its Keras variable, for evaluation and checkpoints, and
        turns FSDP's hooks off meanwhile: evaluation computes with the variables as Keras holds them."""
        import torch
        for unit, _, _, keras_class, _ in self.units:
            del unit.call, unit.forward  # the class's own again
            unit.__dict__.pop("checkpointed_outside", None)
            # Keras names a checkpoint's objects by their class: a checkpoint must name the model's own classes.
            unit.__class__ = keras_class
        self.distributed = False
        for variable, shard in self.sharded:
            variable._value = torch.nn.Parameter(shard.full_tensor(), requires_grad=False)
        for slot, shard in self.moments:
            slot._value = shard.full_tensor()


class CombinedNormAdamW(FusedAdamW):
    """torch's fused AdamW over FSDP's shards, each gradient clipped by its own norm (Keras's `clipnorm`) as
    `FusedAdamW` clips, the squared norms of every gradient's shards summed over the processes in one all-reduce:
    a DTensor's norm is an all-reduce of its own, one per gradient (about 130 a step on the `small` preset)."""
    updates = "each process updating its FSDP shards"

    def local_parts(self, grads):
        return [grad.to_local() for grad in grads]

    def _clip_each_gradient(self, grads):
        import torch
        import torch.distributed as dist
        shards = [grad.to_local() for grad in grads]
        squares = torch.stack(torch._foreach_norm(shards)).float().square()
        dist.all_reduce(squares, group=self.group)
        scales = self.clipnorm / squares.sqrt().clamp_min(self.clipnorm)
        torch._foreach_mul_(shards, list(scales.to(shards[0].dtype).unbind()))


def torch_step_state(step):
    """The state record of mtbench's eager torch step: its variables' tensors, their gradients, the moments."""
    return torch_state_record([variable.value for variable in step.variables], step.model.optimizer)


class TorchDistributedStep(StateRecording):
    """mtbench's torch step (eager, or compiled by `torch-compile`) over weights that `layout` distributes over the
    processes: from a step after `finalize` (or the first) the variables hold their local parts
    (`layout.hold_distributed()`), from `finalize` until the next step the whole weights (`layout.hold_full()`),
    for evaluation and checkpoints. `layout.distributed` says which.

    One call is profiled for the collectives it runs (`ProfiledCall`, `record_collectives`)."""

    def __init__(self, inner, layout, record):
        super().__init__(inner, record, torch_step_state)
        self.layout = layout
        self.profiled = ProfiledCall(inner)

    def measure(self):
        return super().measure() if self.layout.distributed else None

    def hold_distributed(self):
        if not self.layout.distributed:
            self.layout.hold_distributed()

    def __call__(self, x, y, sample_weight):
        self.hold_distributed()
        logs, ran = self.profiled(lambda: self.step(x, y, sample_weight))
        if ran is not None:
            self.record_collectives(ran)
        return logs

    def step(self, x, y, sample_weight):
        return self.inner(x, y, sample_weight)

    def record_collectives(self, ran):
        """Records the collectives of one step (`profiled_collectives`'s {operation: count}) by kind:
        `collectives_per_step` (`dispatched_counts`)."""
        self.record["collectives_per_step"] = dispatched_counts(ran)

    def distributed_like_inner(self, step):
        """`step`, the compiled step `torch-compile` makes from the model when it is given after this extra,
        distributed and updating the weights as the step it replaces."""
        step.share_distribution(self.inner)
        if self.inner.fused_optimizer is not None:
            step.fused_optimizer = self.inner.fused_optimizer
        return step

    def finalize(self):
        super().finalize()
        if self.layout.distributed:
            self.layout.hold_full()


def whole_weights(model):
    """The trainable weights a sharded JAX model holds whole on every device (no axis the device count divides, as
    `sharded_axis` finds), as counts and bytes beside every trainable weight's."""
    held = [(variable, all(name is None for name in variable.value.sharding.spec))
            for variable in model.trainable_variables]
    nbytes = [math.prod(variable.shape) * variable.value.dtype.itemsize for variable, _ in held]
    return {"whole_weights": sum(whole for _, whole in held), "weights": len(held),
            "whole_weight_bytes": sum(size for size, (_, whole) in zip(nbytes, held) if whole),
            "weight_bytes": sum(nbytes)}


def whole_weights_text(record):
    """'12 of 30 weights whole (89 % of the weight bytes)'."""
    return (f"{record['whole_weights']} of {record['weights']} weights whole "
            f"({100 * record['whole_weight_bytes'] / max(record['weight_bytes'], 1):.0f} % of the weight bytes)")


def sharded_step_text(units, record):
    """What a sharded JAX step moves, as its compiled program's collectives count it once read (`finalize`, after
    the first step): '3 units gathered once a step, gradients reduce-scattered'; before that, what it asks for. The
    weights no axis of which the devices divide are held whole, their gradients all-reduced: said where any is."""
    whole = (f"; {whole_weights_text(record)} on every device, their gradients all-reduced"
             if record.get("whole_weights") else "")
    return _moved_text(units, record) + whole


def _moved_text(units, record):
    counted = record.get("collectives_per_step")
    if counted is None:
        return f"{units} units gathered once a step, gradients reduce-scattered"
    gathers, scatters = counted.get("all-gather", 0), counted.get("reduce-scatter", 0)
    gathered = (f"{units} units gathered once a step" if gathers == units else
                f"{units} units, {gathers} all-gather{'s' * (gathers != 1)} a step")
    return gathered + (", gradients reduce-scattered" if scatters else
                       f", gradients all-reduced ({counted.get('all-reduce', 0)} a step; no reduce-scatter)")


class TorchShardedStep(TorchDistributedStep):
    """mtbench's torch step over FSDP's shards. Compiled, dynamo breaks the graph at FSDP's hooks (it skips them),
    so each unit's forward is a graph of its own and the collectives run eagerly between them, as FSDP2 runs under
    torch.compile without compiled autograd."""

    def around(self, step):
        return TorchShardedStep(self.distributed_like_inner(step), self.layout, self.record)

    def description(self):
        sharded = (f"FSDP2 over {self.layout.mesh.size()} processes, {len(self.layout.units)} units gathered "
                   f"once a step")
        return ", ".join(part for part in (self.inner.description(), sharded) if part)


def torch_sharded_step(model, step, processes):
    """`step`, mtbench's eager torch step, over FSDP2's shards of `model` on `processes` (a ProcessGroup), as a
    `TorchShardedStep` whose record is the run's."""
    world = processes.world_size
    mesh = process_mesh(world)
    sharding = TorchSharding(model, mesh)
    sharding.shard_moments(model.optimizer)
    # The gradients FSDP reduce-scatters are averages over the processes, as DDP's are: the step weighs each
    # process's loss by its share of the global batch's tokens.
    step.distribute(processes, model)
    step.micro_batch_context = sharding.micro_batch_context
    if step.fused_optimizer is not None:  # else Keras's `optimizer.apply`, which takes the shards as they are
        step.fused_optimizer = CombinedNormAdamW(model.optimizer, step.variables, mesh.get_group())
    record = {"devices": world, "processes": world, "collectives": processes.collectives,
              "units": [unit.module.name for unit in sharding.units],
              "gather_dtype": model.dtype_policy.compute_dtype}
    return TorchShardedStep(step, sharding, record)


class FullySharded(Extra):
    name = "fsdp"
    description = ("parameters, gradients and optimizer state sharded over the devices, gathered per layer: JAX "
                   "per-device gathers and reduce-scatters over a data axis; torch FSDP2 under torchrun")
    backends = ("jax", "torch")
    conflicts = ("pmap", "data-parallel", "tpu", "ddp")
    spans_processes = True
    parallelism = "sharded data"

    def unavailable_reason(self, run):
        if run.backend.name == "jax":
            return devices_reason(run)
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401 (FSDP2: torch 2.6 and later)
        except ImportError:
            import torch
            return f"needs torch.distributed.fsdp.fully_shard (FSDP2), which torch {torch.__version__} lacks"
        return processes_reason(run)

    def before_model(self, run):
        if run.backend.name != "jax":
            return
        import jax
        distribution = sharded_model_parallel(jax.devices())
        run.extras_state[self.name] = {**use_distribution(run, distribution),
                                       "mesh_axes": list(distribution.device_mesh.axis_names)}

    def make_train_step(self, run, model, step):
        if run.backend.name == "jax":
            return self._jax_step(run, model, step)
        return self._torch_step(run, model, step)

    def _jax_step(self, run, model, step):
        from mtbench.plugins.backends.jax_jit_step import JitTrainStep, accumulated_gradients
        if not isinstance(step, JitTrainStep) or step.distribution is None:
            raise MtbenchError(f"shards mtbench's jit step, not the '{step.name}' step")
        gradients_of = gathered_per_device(model, step.distribution)
        if step.micro_batches > 1:  # --grad-accum: the micro-batches a loop around the per-device gathering
            gradients_of = accumulated_gradients(step.micro_batches, inner=gradients_of)
        sharded = JitTrainStep(model, step.distribution, gradients_of)
        run.extras_state[self.name].update(units=[unit.name for unit in fsdp_units(model)],
                                           gather_dtype=model.dtype_policy.compute_dtype, **whole_weights(model))
        record = run.extras_state[self.name]
        if record["whole_weight_bytes"] * 2 > record["weight_bytes"]:
            # torch's FSDP2 pads such a weight and shards it: the two backends would hold different shares unsaid,
            # so the result's warnings say it (and every table and verdict beside the run's figures).
            record["warning"] = (f"holds {whole_weights_text(record)} on every device: most of the weights are not "
                                 f"sharded, their gradients all-reduced as in data parallelism (give sizes that "
                                 f"{step.distribution.device_mesh.shape[0]} divides)")
            if run.processes.rank == 0:
                print(f"warning: fsdp {record['warning']}", file=sys.stderr)
        return JaxShardedStep(sharded, record)

    def _torch_step(self, run, model, step):
        from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
        if not isinstance(step, EagerTorchTrainStep):
            raise MtbenchError(f"shards mtbench's torch step (eager or compiled), not the '{step.name}' step")
        sharded = torch_sharded_step(model, step, run.processes)
        sharded.record["per_process_batch"] = run.config.batch_size // run.processes.world_size
        run.extras_state[self.name] = sharded.record
        return sharded


@hookimpl
def mtbench_register_extras(register):
    register(FullySharded())
