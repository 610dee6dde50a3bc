"""Run by tests/plugins/extras/test_extras.py with two simulated CPU devices (keras fixes its backend at import,
XLA its devices): builds the tiny Transformer as mtbench compiles it, and prints as one JSON line the bytes held on
device 0 by the model and optimizer state alone ('state'), once the pmap step is made ('made'), after two steps
('trained') and after `finalize` ('finalized'), with the losses of those steps.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python tests/pmap_memory_probe.py
"""

import json
import os
import sys


def device_bytes(device):
    """Bytes of every live array's shards on `device`."""
    import jax
    return sum(shard.data.nbytes for array in jax.live_arrays() for shard in array.addressable_shards
               if shard.device == device)


def main():
    os.environ["KERAS_BACKEND"] = "jax"
    import gc

    import jax
    import keras

    from mtbench.keras_models.initialization import assign_weights, initial_weights
    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.plugins.extras.jax_parallel import PmapTrainStep
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model
    from tests.host_syncs_probe import batch
    model = build_transformer(PRESETS["tiny"])
    assign_weights(model, initial_weights(model, 0))
    compile_model(keras, model, TrainConfig(preset="tiny", warmup_steps=2), 20, {})
    model.optimizer.build(model.trainable_variables)
    device = jax.local_devices()[0]
    gc.collect()
    state = sum(v.value.nbytes for v in model.variables + model.optimizer.variables)
    held = {"state": state, "before": device_bytes(device)}
    step = PmapTrainStep(model, jax.local_devices())
    gc.collect()
    held["made"] = device_bytes(device)
    losses = [float(step(*batch(seed))["loss"]) for seed in range(2)]
    step.block()
    gc.collect()
    held["trained"] = device_bytes(device)
    step.finalize()
    gc.collect()
    held["finalized"] = device_bytes(device)
    print(json.dumps({**held, "losses": losses}))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
