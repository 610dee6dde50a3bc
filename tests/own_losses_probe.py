"""Run by tests/plugins/backends/test_own_losses_over_replicas.py in a fresh process per backend (keras fixes its
backend at import): a model with losses of its own (an L2 penalty on a kernel, so `model.losses` is not empty)
takes one step over 8 rows on one device, the whole batch at once, and the same step split over two replicas:
torch's step in two gloo processes under DistributedDataParallel (whole batches and two micro-batches), JAX's pmap
over two simulated CPU devices. Prints one JSON line: each way's loss, the penalty, and how far each way's gradients (torch) or updated
weights (JAX) are from one device's.

    python tests/own_losses_probe.py torch|jax SCRATCH_DIR
"""

import json
import os
import sys

ROWS, LENGTH, VOCABULARY = 8, 4, 11


def build(keras):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((LENGTH,), dtype="int32")
    hidden = keras.layers.Embedding(VOCABULARY, 8)(tokens)
    logits = keras.layers.Dense(VOCABULARY, kernel_regularizer=keras.regularizers.L2(0.5))(hidden)
    model = keras.Model(tokens, logits)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="mean_with_sample_weight"))
    return model


def batch():
    import numpy as np
    generator = np.random.default_rng(1)
    x = generator.integers(0, VOCABULARY, (ROWS, LENGTH)).astype("int32")
    y = generator.integers(0, VOCABULARY, (ROWS, LENGTH)).astype("int32")
    weight = np.ones((ROWS, LENGTH), "float32")
    weight[0, 2:] = 0.0  # the first replica has fewer real tokens than the second
    return x, y, weight


def penalty(model):
    return float(sum(float(variable.regularizer(variable.value)) for variable in model.trainable_weights
                     if variable.regularizer is not None))


def torch_gradients(step, x, y, weight):
    import torch
    for variable in step.variables:
        variable._value.grad = None
    if step.micro_batches > 1:
        loss, _ = step._accumulate((torch.from_numpy(x),), torch.from_numpy(y).long(), torch.from_numpy(weight))
    else:
        loss = step((x,), y, weight)["loss"]
    return [variable._value.grad.detach().clone() for variable in step.variables], float(loss)


def torch_replica(rank, world, scratch, queue):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(scratch, 'store')}", rank=rank,
                            world_size=world)
    import keras
    from torch.nn.parallel import DistributedDataParallel
    from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
    x, y, weight = batch()
    rows = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
    figures = {}
    # The reference of both: one process's step of the whole batch (accumulating on one process would share the
    # arithmetic under test).
    expected, expected_loss = torch_gradients(EagerTorchTrainStep(build(keras)), x, y, weight)
    for micro_batches in (1, 2):
        model = build(keras)
        step = EagerTorchTrainStep(model, micro_batches=micro_batches)

        class Processes:
            pass
        processes = Processes()
        processes.rank, processes.world_size = rank, world
        step.distribute(processes, DistributedDataParallel(model))
        gradients, loss = torch_gradients(step, x[rows], y[rows], weight[rows])
        figures[f"ddp micro-batches {micro_batches}"] = {
            "loss": loss, "one device loss": expected_loss, "penalty": penalty(model),
            "largest gradient difference": max(float((a - b).abs().max()) for a, b in zip(gradients, expected)),
            "largest gradient": max(float(b.abs().max()) for b in expected)}
    if rank == 0:
        queue.put(figures)
    dist.destroy_process_group()


def on_torch(scratch):
    import torch.multiprocessing as mp
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.spawn(torch_replica, args=(2, scratch, queue), nprocs=2)
    return queue.get()


def on_jax():
    import jax
    import keras
    import numpy as np
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    from mtbench.plugins.extras.jax_parallel import PmapTrainStep
    x, y, weight = batch()
    figures = {}
    one = build(keras)
    one_penalty = penalty(one)
    one_step = JitTrainStep(one)
    one_loss = float(one_step((x,), y, weight)["loss"])
    one_step.finalize()
    pmapped = build(keras)
    pmap_step = PmapTrainStep(pmapped, jax.local_devices()[:2])
    pmap_loss = float(pmap_step((x,), y, weight)["loss"])
    pmap_step.finalize()
    difference = max(float(np.abs(np.asarray(a.value) - np.asarray(b.value)).max())
                     for a, b in zip(pmapped.trainable_weights, one.trainable_weights))
    update = max(float(np.abs(np.asarray(a.value) - np.asarray(b.value)).max())
                 for a, b in zip(one.trainable_weights, build(keras).trainable_weights))
    figures["pmap"] = {"loss": pmap_loss, "one device loss": one_loss, "penalty": one_penalty,
                       "largest weight difference": difference, "largest update": update,
                       "devices": len(jax.local_devices())}
    return figures


def main(backend, scratch):
    os.environ["KERAS_BACKEND"] = backend
    if backend == "jax":
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        figures = on_jax()
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # gloo's processes on the CPU, on a GPU machine too
        figures = on_torch(scratch)
    print(json.dumps(figures))


if __name__ == "__main__":
    main(*sys.argv[1:])
