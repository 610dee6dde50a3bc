"""The data-parallel JAX step on CPUs sums its gradients as one flat buffer: the compiled step holds one
all-reduce for the gradients (and one for the batch's token count), and it trains what XLA's own reduction
trains. On 2 simulated devices, in a process of its own (XLA reads the device count at start)."""

import json
import os
import subprocess
import sys

SCRIPT = r"""
import dataclasses, json, re, sys
import numpy as np
import jax, keras
from mtbench.keras_models.presets import PRESETS
from mtbench.keras_models.transformer import build_transformer
from mtbench.plugins.backends import jax_jit_step
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import compile_model

dropout = float(sys.argv[1])
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
keras.utils.set_random_seed(0)
model = build_transformer(dataclasses.replace(PRESETS["tiny"], vocab_size=64, dropout=dropout))
rng = np.random.default_rng(0)
batches = []
for _ in range(6):
    source, target = rng.integers(3, 64, (8, 12)).astype("int32"), rng.integers(3, 64, (8, 13)).astype("int32")
    weight = (rng.random((8, 12)) < 0.8).astype("float32")
    batches.append(((source, target[:, :-1]), target[:, 1:], weight))
model(batches[0][0])
compile_model(keras, model, TrainConfig(learning_rate=3e-3, warmup_steps=2), 6, {})
model.optimizer.build(model.trainable_variables)
start = [[v.numpy() for v in group] for group in (model.trainable_variables, model.non_trainable_variables,
                                                   model.optimizer.variables)]

def train(flat):
    for group, values in zip((model.trainable_variables, model.non_trainable_variables, model.optimizer.variables),
                             start):
        for variable, value in zip(group, values):
            variable.assign(value)
    shards = jax_jit_step.flat_gradient_shards
    if not flat:
        jax_jit_step.flat_gradient_shards = lambda *args: 0
    try:
        step = jax_jit_step.JitTrainStep(model, keras.distribution.distribution())
    finally:
        jax_jit_step.flat_gradient_shards = shards
    losses = [float(step(*batch)["loss"]) for batch in batches]
    hlo = step._step.lower(step.state, *(step._distribute(a) for a in batches[0])).compile().as_text()
    step.finalize()
    reductions = [re.sub(r"\{[0-9,]*\}", "", shape) for shape in re.findall(r"= (\(.*?\)|\S+) all-reduce\(", hlo)]
    return {"losses": losses, "detail": step.description(), "all_reduces": reductions,
            "seeds": [v.numpy().tolist() for v in model.non_trainable_variables],
            "weights": [float(np.abs(v.numpy()).sum()) for v in model.trainable_variables], "names": [v.path for v in model.trainable_variables]}

print(json.dumps({"flat": train(True), "xla": train(False),
                  "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables))}))
"""


def run(dropout):
    env = {**os.environ, "KERAS_BACKEND": "jax", "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(dropout)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_one_all_reduce_sums_every_gradient_and_trains_what_xlas_reduction_trains():
    got = run(0.0)
    flat, xla = got["flat"], got["xla"]
    assert flat["detail"] == "DataParallel over a mesh of 2 batch, gradients summed as one flat buffer"
    assert xla["detail"] == "DataParallel over a mesh of 2 batch"
    # The token count, then every gradient with the loss and the correct tokens in one buffer; XLA's own
    # reduction combines the gradients too, but as a tuple of one buffer per gradient, which XLA:CPU sums one by one.
    assert flat["all_reduces"] == ["f32[]", f"f32[{got['parameters'] + 2}]"]
    assert len(xla["all_reduces"]) == 2 and xla["all_reduces"][1].startswith("(") and \
        xla["all_reduces"][1].count("f32[") > 30
    assert len(flat["losses"]) == 6 and flat["losses"][-1] < flat["losses"][0]
    for mine, theirs in zip(flat["losses"], xla["losses"]):
        assert abs(mine - theirs) <= 1e-5 * abs(theirs)
    # Every weight but the attention keys' biases, whose gradient is zero but for rounding (softmax ignores a shift
    # of all its scores), which Adam divides by its own square root: those move by noise under any reduction.
    weights = [(name, mine, theirs) for name, mine, theirs in zip(flat["names"], flat["weights"], xla["weights"])
               if not name.endswith("/key/bias")]
    assert len(weights) == len(flat["names"]) - 3
    for name, mine, theirs in weights:
        assert abs(mine - theirs) <= 1e-5 * abs(theirs), name


def test_with_dropout_each_shard_draws_its_own_masks_and_the_seeds_advance_as_one_devices():
    got = run(0.1)
    flat, xla = got["flat"], got["xla"]
    # The seeds end where one device's end (shard 0's stream is theirs); the other shard drew other masks, so the
    # losses differ from XLA's reduction (which draws one mask for the whole batch), though not by much.
    assert flat["seeds"] == xla["seeds"] and flat["seeds"] and flat["seeds"][0] != [0, 0]
    assert flat["losses"][0] != xla["losses"][0]
    for mine, theirs in zip(flat["losses"], xla["losses"]):
        assert abs(mine - theirs) <= 0.05 * abs(theirs)
