"""What `--extra fsdp` runs, counted in the programs and collectives themselves: on JAX the compiled step's
collectives by kind (2 simulated devices, in a process of its own: XLA reads the device count at start), on torch
the collectives 2 gloo processes under torchrun ran in a step, and on both the dtype the weights travel in."""

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import CPU_ONLY, json_answer, simulated_devices

JAX_SCRIPT = r"""
import collections, dataclasses, json, re, sys
import numpy as np
import jax, keras
from mtbench.keras_models.presets import PRESETS
from mtbench.keras_models.transformer import build_transformer
from mtbench.plugins.backends.jax_jit_step import JitTrainStep
from mtbench.plugins.extras.fsdp import gathered_per_device, sharded_model_parallel
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import compile_model

# Each step's program is compiled a second time for its text: from JAX's cache, not by XLA again.
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
keras.distribution.set_distribution(sharded_model_parallel(jax.devices()))
rng = np.random.default_rng(0)
batches = []
for _ in range(4):
    source, target = rng.integers(3, 64, (8, 12)).astype("int32"), rng.integers(3, 64, (8, 13)).astype("int32")
    weight = (rng.random((8, 12)) < 0.8).astype("float32")
    batches.append(((source, target[:, :-1]), target[:, 1:], weight))

def collectives(hlo):
    found = collections.defaultdict(list)
    for shape, kind in re.findall(r"= (\(.*?\)|\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|"
                                  r"collective-permute)(?:-start)?\(", hlo):
        found[kind].append(re.sub(r"\{[0-9,]*\}|/\*index=\d+\*/", "", shape).replace(" ", ""))
    return found

def train(model, start, per_device):
    for group, values in zip((model.trainable_variables, model.non_trainable_variables, model.optimizer.variables),
                             start):
        for variable, value in zip(group, values):
            variable.assign(value)
    distribution = keras.distribution.distribution()
    step = JitTrainStep(model, distribution, gathered_per_device(model, distribution) if per_device else None)
    losses = [float(step(*batch)["loss"]) for batch in batches]
    compiled = step._step.lower(step.state, *(step._distribute(a) for a in batches[0]),
                                step.schedule_arguments()).compile()
    step.finalize()
    return {"losses": losses, "collectives": collectives(compiled.as_text()),
            "donated_bytes": compiled.memory_analysis().alias_size_in_bytes}

runs = {}
for dtype in ("float32", "mixed_bfloat16"):
    keras.config.set_dtype_policy(dtype)
    keras.utils.set_random_seed(0)
    # build_transformer creates the variables from symbolic ids. No call on the batch: JAX would compile each eager
    # operation of the forward pass, for each dtype policy (about 4 s of this process's CPU time).
    model = build_transformer(dataclasses.replace(PRESETS["tiny"], vocab_size=64, dropout=0.0))
    compile_model(keras, model, TrainConfig(learning_rate=3e-3, warmup_steps=2), 6, {})
    model.optimizer.build(model.trainable_variables)
    start = [[v.numpy() for v in group] for group in (model.trainable_variables, model.non_trainable_variables,
                                                       model.optimizer.variables)]
    runs[dtype] = {"fsdp": train(model, start, True), "gspmd": train(model, start, False),
                   "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
                   "weights": len(model.trainable_variables)}
print(json.dumps(runs))
"""


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory):
    """{dtype: the fsdp step's and GSPMD's run of the same model from the same weights} for float32 and
    mixed_bfloat16, from one process on 2 simulated devices."""
    env = {**os.environ, "KERAS_BACKEND": "jax", **simulated_devices(2)}
    proc = subprocess.run([sys.executable, "-c", JAX_SCRIPT, str(tmp_path_factory.mktemp("compile-cache"))],
                          capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    return json_answer(proc)


@pytest.mark.slow
def test_jax_fsdp_gathers_weights_and_reduce_scatters_gradients(jax_runs):
    run = jax_runs["float32"]
    fsdp, gspmd = run["fsdp"]["collectives"], run["gspmd"]["collectives"]
    half = run["parameters"] // 2
    # One all-gather and one reduce-scatter per unit (the encoder block, the decoder block, the rest), of this
    # device's halves of the unit's weights: together every weight once.
    # (The weights travel as their bits: u32 for float32.)
    assert len(fsdp["all-gather"]) == len(fsdp["reduce-scatter"]) == 3
    assert sum(int(shape.split(",")[1].rstrip("]")) for shape in fsdp["all-gather"]) == half
    assert sorted(fsdp["reduce-scatter"]) == sorted(shape.replace("u32[2,", "f32[1,") for shape in fsdp["all-gather"])
    # All-reduces of scalars only: the batch's token count, and each gradient's squared norm (Keras's clipnorm)
    # with the loss and the correct tokens, combined by XLA into one.
    assert fsdp["all-reduce"] == ["f32[]", "(" + ",".join(["f32[]"] * (run["weights"] + 2)) + ")"]
    # GSPMD, from the same layouts, partitions the step as model parallelism: no reduce-scatter, and whole
    # gradients all-reduced (the original fsdp step).
    assert "reduce-scatter" not in gspmd and any("f32[64,64]" in shape for shape in gspmd["all-reduce"])
    for mine, theirs in zip(run["fsdp"]["losses"], run["gspmd"]["losses"]):
        assert mine == pytest.approx(theirs, rel=1e-5)


@pytest.mark.slow
def test_jax_fsdp_holds_half_the_state_per_device_in_the_compiled_program(jax_runs):
    run = jax_runs["float32"]
    # What the step donates and updates in place on each device: the weights and both Adam moments, halved,
    # with the optimizer's scalars (its step counter and learning rate: a few bytes, whole on every device).
    state = run["fsdp"]["donated_bytes"]
    assert 3 * run["parameters"] * 4 // 2 <= state <= 3 * run["parameters"] * 4 // 2 + 16


@pytest.mark.slow
def test_jax_fsdp_gathers_in_the_compute_dtype_and_reduces_in_float32(jax_runs):
    run = jax_runs["mixed_bfloat16"]
    fsdp = run["fsdp"]["collectives"]
    # bfloat16's bits: 2 bytes a weight on the wire.
    assert len(fsdp["all-gather"]) == 3 and all(shape.startswith("u16[2,") for shape in fsdp["all-gather"])
    assert len(fsdp["reduce-scatter"]) == 3 and all(shape.startswith("f32[1,") for shape in fsdp["reduce-scatter"])
    for mine, theirs in zip(run["fsdp"]["losses"], run["gspmd"]["losses"]):
        assert mine == pytest.approx(theirs, rel=1e-2)  # the weights rounded to bfloat16 once, as Keras rounds them


TORCH_SCRIPT = r"""
import collections, dataclasses, json, os, sys, types
import numpy as np
import torch, torch.distributed as dist
import keras
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from mtbench.keras_models.presets import PRESETS
from mtbench.keras_models.transformer import build_transformer
from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
from mtbench.plugins.extras.fsdp import torch_sharded_step
from mtbench.runner.config import TrainConfig
from mtbench.runner.setup import compile_model

class GatheredDtypes(TorchDispatchMode):
    # The dtypes of the tensors that went through each c10d collective FSDP called.
    def __init__(self):
        super().__init__()
        self.seen = collections.defaultdict(set)
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith("c10d."):
            self.seen[str(func)].update(str(a.dtype) for a in args if isinstance(a, torch.Tensor))
        return func(*args, **(kwargs or {}))

dist.init_process_group("gloo")
keras.config.set_dtype_policy("mixed_bfloat16")
rank, rng = dist.get_rank(), np.random.default_rng(0)
batches = []
for _ in range(3):
    source, target = rng.integers(3, 64, (8, 12)).astype("int32"), rng.integers(3, 64, (8, 13)).astype("int32")
    weight = (rng.random((8, 12)) < 0.8).astype("float32")
    rows = slice(4 * rank, 4 * rank + 4)
    batches.append(((source[rows], target[rows, :-1]), target[rows, 1:], weight[rows]))
keras.utils.set_random_seed(0)
model = build_transformer(dataclasses.replace(PRESETS["tiny"], vocab_size=64, dropout=0.0))
model(batches[0][0])
compile_model(keras, model, TrainConfig(learning_rate=3e-3, warmup_steps=2), 6, {})
step = torch_sharded_step(model, EagerTorchTrainStep(model), types.SimpleNamespace(world_size=2, rank=rank,
                                                                                 collectives="gloo"))
losses = [float(step(*batches[0])["loss"])]
with profile(activities=[ProfilerActivity.CPU]) as profiled:
    losses.append(float(step(*batches[1])["loss"]))
with GatheredDtypes() as dtypes:  # a step of its own: the profiler would see each collective twice
    losses.append(float(step(*batches[2])["loss"]))
ran = collections.Counter(event.name for event in profiled.events() if event.name.startswith("c10d::"))
if rank == 0:
    print(json.dumps({"losses": losses, "ran": ran, "dtypes": {op: sorted(seen) for op, seen in dtypes.seen.items()},
                      "weights": len(model.trainable_variables), "units": step.record["units"]}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torch_fsdp_clips_with_one_all_reduce_and_gathers_in_the_compute_dtype(tmp_path):
    script = tmp_path / "fsdp_step.py"
    script.write_text(TORCH_SCRIPT)
    env = {**os.environ, "KERAS_BACKEND": "torch", "OMP_NUM_THREADS": "1", **CPU_ONLY}  # gloo, on a GPU machine too
    from mtbench.runner.orchestration.children import launcher_command
    proc = subprocess.run([*launcher_command(2, launcher_dir=str(tmp_path / "torchrun")), str(script)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    got = json_answer(proc)
    assert got["units"] == ["encoder_0", "decoder_0", "transformer"] and got["weights"] == 48
    # A step's collectives: each unit gathered once and kept from its forward to its backward, as JAX's program
    # does (FSDP2's default gathered the blocks again for the backward: 5 all-gathers), its gradients
    # reduce-scattered, and two all-reduces: the global batch's token means, and every gradient's squared norm for
    # Keras's clipnorm at once (a DTensor's norm of each gradient on its own was 48 more).
    assert got["ran"] == {"c10d::_allgather_base_": 3, "c10d::_reduce_scatter_base_": 3, "c10d::allreduce_": 2}
    # MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): what went through the collectives.
    assert got["dtypes"]["c10d._allgather_base_.default"] == ["torch.bfloat16"]
    assert got["dtypes"]["c10d._reduce_scatter_base_.default"] == ["torch.float32"]
    assert len(got["losses"]) == 3 and all(np.isfinite(got["losses"]))
