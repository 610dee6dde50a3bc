"""The data-parallel JAX step on CPUs sums its gradients as one flat buffer: the compiled step holds one
all-reduce for the gradients (and one for the batch's token count), and it trains what XLA's own reduction
trains. On 2 simulated devices, in a process of its own (XLA reads the device count at start)."""

import math
import os
import re
import subprocess
import sys

import pytest

from conftest import json_answer, simulated_devices

pytestmark = pytest.mark.slow  # one process compiling five data-parallel steps: about a minute

SCRIPT = r"""
import dataclasses, json, re, sys
import numpy as np
import jax, keras
from mtbench.keras_models.presets import PRESETS
from mtbench.keras_models.transformer import build_transformer
from mtbench.plugins.backends import jax_jit_step
from mtbench.plugins.extras.compiled_collectives import hlo_collectives
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import compile_model

# Each step's program is compiled a second time for its text: from JAX's cache, not by XLA again.
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
rng = np.random.default_rng(0)
batches = []
for _ in range(6):
    source, target = rng.integers(3, 64, (8, 12)).astype("int32"), rng.integers(3, 64, (8, 13)).astype("int32")
    weight = (rng.random((8, 12)) < 0.8).astype("float32")
    batches.append(((source, target[:, :-1]), target[:, 1:], weight))

def train(model, start, flat, micro_batches=1, per_device=None):
    # flat: the gradients summed as one flat buffer (else XLA's reduction); per_device (accumulating): each device
    # sums its own micro-batches' first (default: as flat).
    for group, values in zip((model.trainable_variables, model.non_trainable_variables, model.optimizer.variables),
                             start):
        for variable, value in zip(group, values):
            variable.assign(value)
    shards = jax_jit_step.flat_gradient_shards, jax_jit_step.gradient_shards
    if not flat:
        jax_jit_step.flat_gradient_shards = lambda *args: 0
    if not (flat if per_device is None else per_device):
        jax_jit_step.gradient_shards = lambda *args: 0
    accumulating = jax_jit_step.accumulated_gradients(micro_batches) if micro_batches > 1 else None
    try:
        step = jax_jit_step.JitTrainStep(model, keras.distribution.distribution(), gradients_of=accumulating)
    finally:
        jax_jit_step.flat_gradient_shards, jax_jit_step.gradient_shards = shards
    losses = [float(step(*batch)["loss"]) for batch in batches]
    reductions = None
    if not model.non_trainable_variables:  # the compiled step's all-reduces (its program again, from the cache)
        hlo = step.lowered_program(*batches[0], optimised=True)
        if micro_batches == 1:
            reductions = [re.sub(r"\{[0-9,]*\}", "", shape)
                          for shape in re.findall(r"= (\(.*?\)|\S+) all-reduce\(", hlo)]
        else:  # each array an all-reduce moves, as often as the step runs it (its loop's body: per micro-batch)
            reductions = hlo_collectives(hlo, trip_count=micro_batches)["all-reduce"]
    step.finalize()
    return {"losses": losses, "detail": step.description(), "all_reduces": reductions,
            "seeds": [v.numpy().tolist() for v in model.non_trainable_variables],
            "weights": [float(np.abs(v.numpy()).sum()) for v in model.trainable_variables],
            "names": [v.path for v in model.trainable_variables]}

runs = {}
for dropout in (0.0, 0.1):
    keras.utils.set_random_seed(0)
    model = build_transformer(dataclasses.replace(PRESETS["tiny"], vocab_size=64, dropout=dropout))
    model(batches[0][0])
    compile_model(keras, model, TrainConfig(learning_rate=3e-3, warmup_steps=2), 6, {})
    model.optimizer.build(model.trainable_variables)
    start = [[v.numpy() for v in group] for group in (model.trainable_variables, model.non_trainable_variables,
                                                       model.optimizer.variables)]
    runs[dropout] = {"flat": train(model, start, True), "start_seeds": [seed.tolist() for seed in start[1]],
                     "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables))}
    if not dropout:
        runs[dropout]["xla"] = train(model, start, False)
        runs[dropout]["accumulated"] = train(model, start, True, micro_batches=2)
        runs[dropout]["accumulated_tuple"] = train(model, start, False, micro_batches=2, per_device=True)
        runs[dropout]["accumulated_xla"] = train(model, start, False, micro_batches=2)
print(json.dumps(runs))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{dropout: the flat and XLA reductions' runs} for dropout 0 and 0.1, from one process."""
    env = {**os.environ, "KERAS_BACKEND": "jax", **simulated_devices(2)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path_factory.mktemp("compile-cache"))],
                          capture_output=True, text=True, env=env, timeout=300)
    return json_answer(proc)


def test_one_all_reduce_sums_every_gradient_and_trains_what_xlas_reduction_trains(runs):
    got = runs["0.0"]
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


def test_with_dropout_the_seeds_advance_as_one_devices(runs):
    got = runs["0.1"]
    flat = got["flat"]
    # Shard 0 draws from the seeds' own stream and every other shard from its own (its index in the seed's first
    # word): the seeds keep their first word and are as many draws on as one device's after 6 steps, by the
    # calls of each dropout layer a step (a feed-forward's 1, an encoder block's and the embeddings' 2, a decoder
    # block's 3).
    assert flat["detail"].endswith(", gradients summed as one flat buffer") and got["start_seeds"]
    assert [first for first, _ in flat["seeds"]] == [first for first, _ in got["start_seeds"]]
    draws = [end - start for (_, end), (_, start) in zip(flat["seeds"], got["start_seeds"])]
    assert sorted(set(draws)) == [6, 12, 18]
    assert len(flat["losses"]) == 6 and all(loss == loss for loss in flat["losses"])  # no NaN from the masks


def elements_all_reduced(all_reduces):
    """The elements the all-reduces of a compiled step carry, from their types ('f32[64,3,64]', tuples of them)."""
    return sum(math.prod(int(size) for size in shape.split(",") if size)
               for reduced in all_reduces for shape in re.findall(r"f32\[([\d,]*)\]", reduced))


def test_micro_batches_sum_on_each_device_then_once_over_the_devices(runs):
    """--grad-accum 2 over the data-parallel mesh, as DDP's `no_sync`: each device sums its rows' gradients over
    the two micro-batches and the step all-reduces them once, the same two all-reduces as without accumulation
    (counted in the compiled step, its loop's body once per micro-batch); left to GSPMD the loop's sum is
    replicated, and every micro-batch all-reduces every gradient. Both train what one batch of 8 trains."""
    got = runs["0.0"]
    accumulated, tuple_, xla = got["accumulated"], got["accumulated_tuple"], got["accumulated_xla"]
    assert accumulated["detail"] == ("DataParallel over a mesh of 2 batch, gradients of 2 micro-batches summed on "
                                     "each device in the step, then over the devices as one flat buffer")
    assert accumulated["all_reduces"] == ["f32[]", f"f32[{got['parameters'] + 2}]"]
    # As on a GPU (no flat buffer): each gradient once a step, with the token count, the loss and the correct tokens.
    assert tuple_["detail"].endswith("summed on each device in the step, then over the devices")
    gradients = len(got["flat"]["names"])
    assert len(tuple_["all_reduces"]) == gradients + 3
    # Left to GSPMD, each micro-batch all-reduces every gradient's elements (the query, key and value's in one array).
    assert elements_all_reduced(xla["all_reduces"]) >= 2 * got["parameters"]
    for run in (accumulated, tuple_, xla):
        for mine, whole in zip(run["losses"], got["flat"]["losses"]):
            assert abs(mine - whole) <= 1e-5 * abs(whole)
