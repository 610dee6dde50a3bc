"""A resumed float16 run keeps the loss scale its checkpoint restored. Restoring builds the optimizer (its variables
must exist to be loaded), and Keras's `LossScaleOptimizer.build` makes its scale and counter anew each time it is
called: a step that built the optimizer again trained on from 2^15 beside the restored variables left behind, and
its next checkpoint held two more variables than the model's optimizer, which a second resume refused. Each
backend's step is made here from an optimizer built and set as a checkpoint leaves it."""

import os
import subprocess
import sys

import pytest

from conftest import tiny_jax_gpt

TORCH_STEP = """
import dataclasses, json
import keras
from mtbench.keras_models.gpt import build_gpt
from mtbench.keras_models.presets import GPT_PRESETS
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import compile_model
from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
keras.config.set_dtype_policy("mixed_float16")
model = build_gpt(dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32))
compile_model(keras, model, TrainConfig(model_name="gpt", preset="tiny", dtype="mixed_float16"), 20, {})
optimizer = model.optimizer
optimizer.build(model.trainable_variables)
optimizer.dynamic_scale.assign(4.0)
optimizer.step_counter.assign(7)
count = len(optimizer.variables)
EagerTorchTrainStep(model)
print(json.dumps({"scale": float(optimizer.dynamic_scale), "counter": int(optimizer.step_counter),
                  "variables": len(optimizer.variables), "restored_variables": count}))
"""


def test_the_jax_step_trains_on_from_the_restored_loss_scale():
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    model = tiny_jax_gpt("mixed_float16")
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    optimizer.dynamic_scale.assign(4.0)
    optimizer.step_counter.assign(7)
    count = len(optimizer.variables)
    JitTrainStep(model)
    assert (float(optimizer.dynamic_scale), int(optimizer.step_counter)) == (4.0, 7)
    assert len(optimizer.variables) == count


@pytest.mark.slow  # torch's keras in a process of its own: 10 s
def test_the_torch_step_trains_on_from_the_restored_loss_scale():
    import json
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(KERAS_BACKEND="torch", MTBENCH_LOAD_PLUGINS="", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", TORCH_STEP], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["scale"], got["counter"]) == (4.0, 7)
    assert got["variables"] == got["restored_variables"]
