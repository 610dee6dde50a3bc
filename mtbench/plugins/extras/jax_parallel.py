"""Data parallelism on JAX, two ways: `pmap` (the classic explicit SPMD step) and `data-parallel`
(`keras.distribution.DataParallel`: one jit-compiled program over sharded arrays, pmap's successor).

Both split the global batch across the devices and must give the loss a single device gives for the same
global batch. Simulate N devices on the CPU with XLA_FLAGS=--xla_force_host_platform_device_count=N JAX_PLATFORMS=cpu.
"""

import numpy as np

from mtbench import Extra, MtbenchError, TrainStep, hookimpl
from mtbench.plugins.backends.compiled_loss import is_token_mean_cross_entropy
from mtbench.plugins.backends.jax_jit_step import SEED_STATE, correct_tokens, jax_step_numerics, token_cross_entropy
from mtbench.plugins.backends.jax_layer_norm import TracedForms, one_pass_layer_norms
from mtbench.plugins.backends.layer_norm_rows import layer_norms
from mtbench.plugins.extras.compiled_collectives import collectives_counted, hlo_collectives
from mtbench.plugins.extras.fsdp import CompiledCollectivesRecording, devices_reason, use_distribution


class PmapTrainStep(TrainStep):
    """The Keras model's forward pass (`stateless_call`) and optimizer (`stateless_apply`) inside `jax.pmap`.
    The loss is the global token mean of the single-device step's own cross-entropy (`token_cross_entropy`):
    each device divides its token-weighted loss sum by the token count of the whole batch (a psum), so the
    summed gradients are exactly those of the single-device step.

    The state is held once on each device, as the jit step holds it once: on the first call each Keras variable's
    buffer is copied to every device (a leading device axis, as pmap takes it) and then deleted, and each call
    donates the state it is given to the state it returns. `finalize` writes device 0's copy back into the Keras
    variables."""
    name = "jax-pmap"

    def __init__(self, model, devices, record=None):
        import jax
        import jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        # `record`: where the first step writes what it ran on (the devices that returned a loss, the rows each
        # was given), over what it was asked
        self.model, self.devices, self.record, self.recorded = model, devices, record, False
        optimizer = model.optimizer
        if not optimizer.built:  # a restored checkpoint built it: building again would reset a loss scale
            optimizer.build(model.trainable_variables)
        norms = layer_norms(model)
        self.traced_norms = TracedForms(norms)

        def step(trainable, non_trainable, optimizer_state, x, y, weight):
            tokens = jax.lax.psum(jnp.sum(weight), "batch")

            def loss_of(params):
                with one_pass_layer_norms(norms, self.traced_norms):
                    logits, new_non_trainable, losses = model.stateless_call(
                        params, non_trainable, x, training=True, return_losses=True)
                loss = jnp.sum(token_cross_entropy(y, logits) * weight) / tokens
                if losses:  # the model's own: each device's share, so that the psum counts them once
                    loss = loss + sum(losses) / len(devices)
                return loss, (logits, new_non_trainable)

            (loss, (logits, new_non_trainable)), grads = jax.value_and_grad(loss_of, has_aux=True)(trainable)
            grads = jax.lax.psum(grads, "batch")
            correct = correct_tokens(y, logits, weight)
            new_trainable, new_optimizer_state = optimizer.stateless_apply(optimizer_state, grads, trainable)
            logs = {"loss": jax.lax.psum(loss, "batch"), "accuracy": jax.lax.psum(correct, "batch") / tokens}
            return new_trainable, new_non_trainable, new_optimizer_state, logs

        self._step = jax.pmap(step, axis_name="batch", devices=devices, donate_argnums=(0, 1, 2))
        self.sharding = NamedSharding(Mesh(np.array(devices), ("batch",)), PartitionSpec("batch"))
        self.state = None  # (trainable, non-trainable, optimizer) replicated over the devices while training
        self.first_batch = None  # whose compiled program's collectives `finalize` counts

    def _keras_state(self):
        model = self.model
        return model.trainable_variables, model.non_trainable_variables, model.optimizer.variables

    def _replicate(self, variables):
        """Each variable's value on every device, row i on device i, in place of the Keras variable's buffer; a
        dropout seed's row i offset by i (its first word), so that each device drops its rows with masks of its
        own, as each shard of the jit step's data parallelism does (`shard_seeds`; row 0 the seed's own)."""
        import jax
        import jax.numpy as jnp
        replicated = []
        for variable in variables:
            value = variable.value
            seed = variable.name == SEED_STATE
            rows = [jax.device_put((value + jnp.asarray([index, 0], value.dtype) if seed else value)[None], device)
                    for index, device in enumerate(self.devices)]
            replicated.append(jax.make_array_from_single_device_arrays((len(self.devices), *value.shape),
                                                                       self.sharding, rows))
            value.delete()  # nothing reads the Keras variables while training: `finalize` comes first
        return replicated

    def _shard(self, array):
        return array.reshape((len(self.devices), -1) + array.shape[1:])

    def __call__(self, x, y, sample_weight):
        if self.state is None:
            self.state = tuple(self._replicate(variables) for variables in self._keras_state())
        rows = self._shard(y)
        batch = (tuple(self._shard(part) for part in x), rows, self._shard(sample_weight))
        if self.record is not None and "collectives_per_step" not in self.record and self.first_batch is None:
            self.first_batch = batch
        trainable, non_trainable, optimizer_state, logs = self._step(*self.state, *batch)
        self.state = (trainable, non_trainable, optimizer_state)
        if self.record is not None and not self.recorded:
            self.record.update(devices=len(logs["loss"].addressable_shards), per_device_batch=rows.shape[1])
            self.recorded = True
        return {name: value[0] for name, value in logs.items()}  # read by the loop at its window's edge

    def numerics(self):
        return jax_step_numerics(self.traced_norms, self.model)

    def block(self):
        import jax
        if self.state is not None:
            jax.block_until_ready(self.state)  # replicated outside the Keras variables until `finalize`

    def finalize(self):
        if self.state is None:  # nothing trained since the last finalize
            return
        if self.first_batch is not None:
            # What the step ran: the psums of the gradients, the loss and the token count, as XLA combined them.
            program = self._step.lower(*self.state, *self.first_batch).compile().as_text()
            self.record.update(collectives_counted(hlo_collectives(program)))
            self.first_batch = None
        for group, values in zip(self._keras_state(), self.state):
            for variable, value in zip(group, values):
                row = next(shard.data for shard in value.addressable_shards if shard.device == self.devices[0])
                variable.assign(row[0])  # device 0's row, on device 0 alone
        self.state = None


class Pmap(Extra):
    name = "pmap"
    description = "data-parallel train step with jax.pmap over the local devices (gradients summed with psum)"
    backends = ("jax",)
    conflicts = ("data-parallel", "tpu")
    parallelism = "data"

    def unavailable_reason(self, run):
        if run.config.dtype in ("float16", "mixed_float16"):
            return "has no loss scaling for float16; use bfloat16 or float32"
        return devices_reason(run)

    def make_train_step(self, run, model, step):
        import jax
        if not is_token_mean_cross_entropy(model.loss):
            raise MtbenchError(f"--extra pmap: the model's loss ({type(model.loss).__name__}) is not the token-mean "
                               f"cross-entropy its step computes; use --extra data-parallel")
        devices = jax.local_devices()
        # What the run asks for (the devices whose energy it counts), until its first step says what it ran on.
        run.extras_state[self.name] = {"devices": len(devices), "per_device_batch": run.config.batch_size // len(devices)}
        return PmapTrainStep(model, devices, run.extras_state[self.name])


class DataParallel(Extra):
    name = "data-parallel"
    description = ("keras.distribution.DataParallel over all devices, of every process of the run (jit with "
                   "sharded batches; several processes: torchrun, SLURM or --coordinator)")
    backends = ("jax",)
    conflicts = ("pmap", "tpu")
    parallelism = "data"
    # After jax.distributed.initialize, jax.devices() is every process's devices: the mesh spans them, and Keras
    # assembles each global batch from the processes' shards (jax.make_array_from_process_local_data).
    spans_processes = True

    def unavailable_reason(self, run):
        return devices_reason(run)

    def before_model(self, run):
        import jax
        import keras
        run.extras_state[self.name] = use_distribution(run, keras.distribution.DataParallel(devices=jax.devices()))

    def make_train_step(self, run, model, step):
        # The state each device holds whole (`--extra fsdp` shards it), recorded as training ends, and the
        # gradients' all-reduces its compiled step runs.
        return CompiledCollectivesRecording(step, run.extras_state[self.name])


@hookimpl
def mtbench_register_extras(register):
    register(Pmap())
    register(DataParallel())
