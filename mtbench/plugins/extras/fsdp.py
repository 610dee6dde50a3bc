"""fsdp: parameters, gradients and optimizer state sharded over the devices, gathered layer by layer for compute,
on both backends under one name.

JAX: a `keras.distribution.ModelParallel` whose layout shards every weight over the `model` axis of a mesh of
all the run's devices, on the weight's largest axis that the axis size divides (a weight no axis of which it
divides stays replicated). The batch is split over the same axis, so each device computes on its rows with
weights XLA gathers where a layer needs them (ZeRO-3 as GSPMD does it). mtbench's jit step runs over that mesh;
its optimizer state takes the weights' layouts and its gradients are held to them, so nothing is replicated.

torch: FSDP2 (`torch.distributed.fsdp.fully_shard`) on a device mesh of the run's processes (torchrun; NCCL on
GPUs, gloo on CPUs), one unit per composite layer of the model (the Transformer's blocks) and the model itself
for the rest. FSDP gathers a unit's parameters before its forward and backward and reduce-scatters its gradients
after, but it does so for the module's registered parameters, while a Keras layer computes with its variables'
own tensors: wrapped naively, FSDP shards parameters nothing reads and the model trains the unsharded originals.
So each unit's call goes through `torch.nn.Module.__call__` (where FSDP's hooks run) and, once FSDP has gathered
the unit, points the unit's variables at the gathered parameters; between steps the variables hold the sharded
parameters (DTensors). torch's fused AdamW then updates the shards with Keras's schedule (`torch_fused_adamw`),
its state the Keras optimizer's moment variables, sharded as their parameters are.
"""

from mtbench import Extra, MtbenchError, RunFailure, WrappingStep, hookimpl, uneven_split_reason

MODEL_AXIS = "model"
SIMULATE_HINT = "on a CPU, simulate devices with XLA_FLAGS=--xla_force_host_platform_device_count=N"
LAUNCH_HINT = "start mtbench with torchrun --nproc-per-node N -m mtbench train ..."


def sharded_axis(shape, parts):
    """The axis a weight of `shape` is split on over `parts` devices: its largest one that `parts` divides (the
    first of equals); None when no axis divides."""
    divisible = [axis for axis, size in enumerate(shape) if size >= parts and size % parts == 0]
    return max(divisible, key=lambda axis: shape[axis], default=None)


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
    """A `keras.distribution.ModelParallel` over a mesh of `devices` on one `model` axis, the batch split over
    it too, laying every variable out on its `sharded_axis`."""
    import keras
    from keras.distribution import DeviceMesh, LayoutMap, ModelParallel, TensorLayout

    class ShardedWeights(ModelParallel):
        def get_variable_layout(self, variable):
            layout = super().get_variable_layout(variable)  # an explicit layout (the variable's, the map's) wins
            if any(axis is not None for axis in layout.axes):
                return layout
            axes = [None] * len(variable.shape)
            axis = sharded_axis(tuple(variable.shape), self.device_mesh.shape[0])
            if axis is not None:
                axes[axis] = MODEL_AXIS
            return TensorLayout(axes, self.device_mesh)

    mesh = DeviceMesh((len(devices),), [MODEL_AXIS], devices)
    return ShardedWeights(layout_map=LayoutMap(mesh), batch_dim_name=MODEL_AXIS)


class JaxStateProbe(WrappingStep):
    """The jit step over the sharded mesh, recording the state it holds per device as training ends."""

    def __init__(self, inner, state):
        super().__init__(inner)
        self.record = state
        self.layouts = [variable.value.sharding for variable in inner.model.trainable_variables]

    def finalize(self):
        if self.inner.state is not None:  # the arrays the step carried from step to step, before Keras holds them
            trainable, _, optimizer_state = self.inner.state
            self.record.update(jax_state_record(trainable, optimizer_state))
            # Whether the weights kept the layouts the distribution gave them through every step.
            self.record["layouts_kept"] = all(array.sharding.is_equivalent_to(layout, array.ndim)
                                              for array, layout in zip(trainable, self.layouts))
        self.inner.finalize()


# ----- torch -----

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
    moments = [slot.value for slot in [*optimizer._momentums, *optimizer._velocities]]
    unsharded = sum(parameter.numel() * parameter.element_size() for parameter in parameters)
    return state_record(torch_local_bytes(parameters), torch_local_bytes([p.grad for p in parameters]),
                        torch_local_bytes(moments), unsharded)


def fsdp_units(model):
    """The model's direct sublayers that hold layers of their own (its blocks): one FSDP unit each, gathered
    around its own call. The model itself is the last unit, for the weights outside them (embeddings, final
    norms), which it may read outside any sublayer's call (a tied output layer)."""
    return [layer for layer in model._flatten_layers(include_self=False, recursive=False)
            if any(True for _ in layer._flatten_layers(include_self=False))] + [model]


class TorchSharding:
    """FSDP2 over `mesh` around a Keras model: the units' calls run FSDP's hooks, and the Keras variables hold
    the sharded parameters between steps and the gathered ones inside a unit's call."""

    def __init__(self, model, mesh):
        import torch
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor, distribute_tensor

        # Keras registers each variable's tensor with its own layer and again with every layer above it; FSDP
        # wants one owner per parameter, so each layer keeps only its own variables' tensors.
        for layer in model._flatten_layers(include_self=True):
            own = layer._trainable_variables + layer._non_trainable_variables
            layer._torch_params = torch.nn.ParameterDict({variable.path: variable.value for variable in own})
        owners = {}  # id(tensor) -> (the ParameterDict holding it, its key there)
        for layer in model._flatten_layers(include_self=True):
            for key, tensor in layer._torch_params._parameters.items():
                owners[id(tensor)] = (layer._torch_params, key)
        variables = {id(variable.value): variable for variable in model.variables}
        frozen = {variable.value for variable in model.variables if not variable.trainable}
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
                if variable is None or not variable.trainable or id(tensor) in claimed:
                    continue
                claimed.add(id(tensor))
                held.append((variable, *owners[id(tensor)]))
            fully_shard(unit, mesh=mesh, ignored_params=frozen)
            self.units.append((unit, unit.call, held))
        self.held = [entry for _, _, entries in self.units for entry in entries]
        self.hold_shards()
        self.sharded = [(variable, variable.value) for variable, _, _ in self.held]  # each with its shard
        for variable, parameter in self.sharded:
            if not isinstance(parameter, DTensor):
                raise RunFailure(f"FSDP left the weight {variable.path} unsharded")
        self.model, self.mesh, self.distribute_tensor = model, mesh, distribute_tensor
        self.full_moments = None
        self.gathering = False

    def shard_moments(self, optimizer):
        """Lays the Keras optimizer's moment variables out as their parameters are (a resumed run's moments
        carried over), so that torch's AdamW updates shards."""
        self.moments = []
        for variable, parameter in self.sharded:
            index = optimizer._get_variable_index(variable)
            for slot in (optimizer._momentums[index], optimizer._velocities[index]):
                shard = self.distribute_tensor(slot.value.detach(), parameter.device_mesh, parameter.placements)
                if shard.to_local().shape != parameter.to_local().shape:
                    raise RunFailure(f"the moments of {variable.path} shard unlike the weight")
                slot._value = shard
                self.moments.append((slot, shard))

    def start_gathering(self):
        """Each unit's call runs FSDP's hooks around it, its variables pointed at the parameters FSDP gathered."""
        import torch
        if self.gathering:
            return
        for unit, call, held in self.units:
            def forward(*args, _call=call, _held=held, **kwargs):
                for variable, parameters, key in _held:
                    variable._value = parameters._parameters[key]  # the gathered parameter, now the module's
                return _call(*args, **kwargs)

            unit.forward = forward
            unit.call = lambda *args, _unit=unit, **kwargs: torch.nn.Module.__call__(_unit, *args, **kwargs)
        self.gathering = True

    def stop_gathering(self):
        for unit, _, _ in self.units:
            del unit.call, unit.forward  # the class's own again
        self.gathering = False

    def hold_shards(self):
        """Points every variable at its sharded parameter (and each moment at its shard) for the optimizer's
        update and the next step."""
        for variable, parameters, key in self.held:
            variable._value = parameters._parameters[key]
        for slot, shard in getattr(self, "moments", ()):
            slot._value = shard

    def hold_full(self):
        """Gathers every weight and moment whole into its Keras variable, for evaluation and checkpoints (FSDP's
        hooks off meanwhile: evaluation computes with the variables as Keras holds them)."""
        import torch
        self.stop_gathering()
        for variable, parameter in self.sharded:
            variable._value = torch.nn.Parameter(parameter.full_tensor(), requires_grad=False)
        for slot, shard in self.moments:
            slot._value = shard.full_tensor()


class TorchShardedStep(WrappingStep):
    """mtbench's eager torch step over FSDP's shards: the variables hold the shards between steps, the whole
    weights from `finalize` until the next step."""

    def __init__(self, inner, sharding, record):
        super().__init__(inner)
        self.sharding, self.record = sharding, record

    def __call__(self, x, y, sample_weight):
        if not self.sharding.gathering:
            self.sharding.hold_shards()
            self.sharding.start_gathering()
        logs = self.inner(x, y, sample_weight)
        self.sharding.hold_shards()  # before the next step clears the gradients of the variables' tensors
        return logs

    def description(self):
        units = len(self.sharding.units)
        return f"FSDP2 over {self.sharding.mesh.size()} processes, {units} units"

    def finalize(self):
        if self.sharding.gathering:
            self.record.update(torch_state_record([parameter for _, parameter in self.sharding.sharded],
                                                  self.inner.model.optimizer))
            self.sharding.hold_full()
        self.inner.finalize()


class FullySharded(Extra):
    name = "fsdp"
    description = ("parameters, gradients and optimizer state sharded over the devices, gathered per layer: JAX "
                   "keras.distribution.ModelParallel over a model axis; torch FSDP2 under torchrun")
    backends = ("jax", "torch")
    conflicts = ("pmap", "data-parallel", "tpu", "ddp", "torch-compile")
    spans_processes = True

    def unavailable_reason(self, run):
        if run.backend.name == "jax":
            count = run.device.get("count", 1)
            if count < 2:
                return f"needs at least 2 devices; this run has {count} ({SIMULATE_HINT})"
            return uneven_split_reason(run.config, count, "devices")
        try:
            from torch.distributed.fsdp import fully_shard  # noqa: F401 (FSDP2: torch 2.6 and later)
        except ImportError:
            import torch
            return f"needs torch.distributed.fsdp.fully_shard (FSDP2), which torch {torch.__version__} lacks"
        if run.processes.world_size < 2:
            return f"needs at least 2 processes; this run has 1 ({LAUNCH_HINT})"
        return None

    def before_model(self, run):
        if run.backend.name != "jax":
            return
        import jax
        import keras
        distribution = sharded_model_parallel(jax.devices())
        keras.distribution.set_distribution(distribution)
        run.extras_state[self.name] = {"devices": len(jax.devices()), "processes": jax.process_count(),
                                       "mesh_shape": list(distribution.device_mesh.shape),
                                       "mesh_axes": list(distribution.device_mesh.axis_names),
                                       "per_device_batch": run.config.batch_size // len(jax.devices())}

    def make_train_step(self, run, model, step):
        if run.backend.name == "jax":
            return self._jax_step(run, model, step)
        return self._torch_step(run, model, step)

    def _jax_step(self, run, model, step):
        from mtbench.plugins.backends.jax_jit_step import JitTrainStep
        if not isinstance(step, JitTrainStep) or step.distribution is None:
            raise MtbenchError(f"shards mtbench's jit step, not the '{step.name}' step")
        return JaxStateProbe(step, run.extras_state[self.name])

    def _torch_step(self, run, model, step):
        import torch
        from torch.distributed.device_mesh import init_device_mesh

        from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
        from mtbench.plugins.backends.torch_fused_adamw import FusedAdamW
        if type(step) is not EagerTorchTrainStep:
            raise MtbenchError(f"shards mtbench's eager torch step, not the '{step.name}' step")
        if step.fused_optimizer is None:
            # Keras's own `optimizer.apply` updates the variables with operations DTensor shards do not take.
            from mtbench.plugins.backends.torch_fused_adamw import fused_adamw_unsupported
            raise MtbenchError(f"updates the shards with torch's fused AdamW, which cannot carry out this run's "
                               f"optimizer: {fused_adamw_unsupported(model.optimizer)}")
        world = run.processes.world_size
        mesh = init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", (world,))
        sharding = TorchSharding(model, mesh)
        sharding.shard_moments(model.optimizer)
        # The gradients FSDP reduce-scatters are averages over the processes, as DDP's are: the step weighs each
        # process's loss by its share of the global batch's tokens.
        step.distribute(run.processes, model)
        step.fused_optimizer = FusedAdamW(model.optimizer, step.variables)  # over the shards now
        run.extras_state[self.name] = {"devices": world, "processes": world, "collectives": run.processes.collectives,
                                       "units": [unit.name for unit, _, _ in sharding.units],
                                       "per_process_batch": run.config.batch_size // world}
        return TorchShardedStep(step, sharding, run.extras_state[self.name])


@hookimpl
def mtbench_register_extras(register):
    register(FullySharded())
