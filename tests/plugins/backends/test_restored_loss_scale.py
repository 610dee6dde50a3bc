"""A resumed float16 run keeps the loss scale its checkpoint restored. Restoring builds the optimizer (its variables
must exist to be loaded), and Keras's `LossScaleOptimizer.build` makes its scale and counter anew each time it is
called: a step that built the optimizer again trained on from 2^15 beside the restored variables left behind, and
its next checkpoint held two more variables than the model's optimizer, which a second resume refused. Each
backend's step is made here from an optimizer built and set as a checkpoint leaves it."""

import os
import subprocess
import sys

import pytest

from conftest import json_answer


STEP_OF_RESTORED_OPTIMIZER = """
import dataclasses, json, sys
import keras
from mtbench.keras_models.gpt import build_gpt
from mtbench.keras_models.presets import GPT_PRESETS
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import compile_model
if sys.argv[1] == "jax":
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep as Step
else:
    from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep as Step
keras.config.set_dtype_policy("mixed_float16")
model = build_gpt(dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32))
compile_model(keras, model, TrainConfig(model_name="gpt", preset="tiny", dtype="mixed_float16"), 20, {})
optimizer = model.optimizer
optimizer.build(model.trainable_variables)
optimizer.dynamic_scale.assign(4.0)
optimizer.step_counter.assign(7)
count = len(optimizer.variables)
step = Step(model)
if sys.argv[1] == "torch":  # one finite step (XLA has no float16 matmul on the CPU): the counter goes on from 7
    import numpy as np
    ids = np.ones((2, 32), np.int32)
    step((ids,), ids, np.ones((2, 32), np.float32))
    step.finalize()
print(json.dumps({"scale": float(optimizer.dynamic_scale), "counter": int(optimizer.step_counter),
                  "variables": len(optimizer.variables), "restored_variables": count}))
"""


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_step_trains_on_from_the_restored_loss_scale(backend):
    """Each backend's keras in a process of its own (about 10 s), on the CPU."""
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")}
    env.update(KERAS_BACKEND=backend, MTBENCH_LOAD_PLUGINS="", CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", STEP_OF_RESTORED_OPTIMIZER, backend], capture_output=True,
                          text=True, env=env, timeout=300)
    got = json_answer(proc)
    # torch trained a step from the restored scale: one more finite step, the scale kept (growth waits for 2,000)
    assert (got["scale"], got["counter"]) == ((4.0, 8) if backend == "torch" else (4.0, 7))
    assert got["variables"] == got["restored_variables"]
