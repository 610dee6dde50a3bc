"""Run by tests/plugins/backends/test_host_syncs.py in a fresh process for torch (keras fixes its backend at
import; its JAX runs are `reports` called in the test's own process, keras on JAX): for each dtype named, builds the
tiny Transformer as mtbench compiles it, runs the backend's train step (or torch's compiled step) until its shape is
steady, then counts the host waits of a few steady steps with the backend's counter. On torch with CUDA the counted
steps run under `torch.cuda.set_sync_debug_mode('error')`. Prints one JSON line, {dtype: {'syncs_per_step',
'events', 'cuda_sync_debug', 'counted_steps', 'variables', 'losses', 'description', 'optimizer_update'}} (the last two
the step's own words: its `description()` and the update row of its `numerics()`).

    python tests/host_syncs_probe.py BACKEND DTYPE[:keras-schedule|:compiled][,DTYPE...]
        (DTYPE: a Keras policy, each a new model and step in this one process, which spares each the seconds of
        importing the framework, Keras and mtbench; keras-schedule: Keras's own CosineDecay, which branches, in
        place of mtbench's, for that dtype; compiled: torch's compiled step in place of the backend's default one;
        each report is keyed by its DTYPE as given)
"""

import contextlib
import json
import os
import sys

WARM_STEPS, COUNTED_STEPS = 2, 3


def batch(seed, rows=4, length=16):
    import numpy as np
    rng = np.random.default_rng(seed)
    source, target = (rng.integers(4, 1000, size=(rows, length)).astype(np.int32) for _ in range(2))
    source[:, -3:] = 0  # padding, so the encoder's key mask hides something
    target[1:, -2:] = 0
    weight = (target != 0).astype(np.float32)
    return (source, target), target, weight


def main(backend, dtypes):
    os.environ["KERAS_BACKEND"] = backend
    print(json.dumps(reports(backend, dtypes)))


# A dtype's option: (the step, the schedule) it runs with.
OPTIONS = {"": ("default", "mtbench"), "keras-schedule": ("default", "keras-schedule"),
           "compiled": ("compiled", "mtbench")}


def reports(backend, dtypes):
    """{DTYPE as given: its report} of the comma-separated `dtypes`, in this process, whose keras is on `backend`
    (or is imported here, on the backend KERAS_BACKEND names)."""
    runs = {given: given.partition(":") for given in dtypes.split(",")}
    return {given: count(backend, OPTIONS[option][0], dtype, OPTIONS[option][1])
            for given, (dtype, _, option) in runs.items()}


def count(backend, step_kind, dtype, schedule):
    import keras

    from mtbench.keras_models.initialization import assign_weights, initial_weights
    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model
    keras.config.set_dtype_policy(dtype)
    model = build_transformer(PRESETS["tiny"])
    assign_weights(model, initial_weights(model, 0))
    compile_model(keras, model, TrainConfig(preset="tiny", dtype=dtype, warmup_steps=2), 20, {})
    if schedule == "keras-schedule":
        ours = model.optimizer._learning_rate
        model.optimizer._learning_rate = keras.optimizers.schedules.CosineDecay(
            0.0, ours.decay_steps, ours.alpha, warmup_target=ours.warmup_target, warmup_steps=ours.warmup_steps)
    if backend == "torch":
        from mtbench.plugins.backends.torch_host_syncs import TorchHostSyncCounter as Counter
        if step_kind == "compiled":
            from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep as Step
        else:
            from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep as Step
    else:
        from mtbench.plugins.backends.jax_host_syncs import JaxHostSyncCounter as Counter
        from mtbench.plugins.backends.jax_jit_step import JitTrainStep as Step
    step = Step(model)
    logs = [step(*batch(i)) for i in range(WARM_STEPS)]
    counter = Counter()
    with cuda_sync_debug(backend) as sync_debug:
        logs += [counter.count_step(step, *batch(WARM_STEPS + i)) for i in range(COUNTED_STEPS)]
    return {"syncs_per_step": counter.per_step(), "events": dict(counter.events), "cuda_sync_debug": sync_debug,
            "counted_steps": COUNTED_STEPS, "variables": len(model.trainable_variables),
            "losses": [float(entry["loss"]) for entry in logs], "description": step.description(),
            "optimizer_update": step.numerics()["optimizer_update"]}


@contextlib.contextmanager
def cuda_sync_debug(backend):
    """On torch with CUDA, every synchronising call is an error while inside; yields the mode, or why none."""
    if backend != "torch":
        yield "not torch"
        return
    import torch
    if not torch.cuda.is_available():
        yield "no CUDA device"
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield "error"
    finally:
        torch.cuda.set_sync_debug_mode("default")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(*sys.argv[1:])
