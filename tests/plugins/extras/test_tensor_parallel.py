"""`--extra tensor-parallel`: Megatron's split of each block over a `model` axis (JAX: two simulated devices in one
process; torch: two gloo processes, launched by the coordinator flags). Each must train what one device trains,
step for step, with the collectives Megatron's analysis gives and each device holding its share of the split layers.

The analysis, written down here and not read from the code under test. A block splits its attention's query, key
and value projections by columns and its output projection by rows, its feed-forward's first Dense by columns and
its second by rows. Forward: one all-reduce of the activations after the attention's output projection, one after
the feed-forward. Backward: the gradient of the column-split layers' input is a partial sum, all-reduced once
for attention (the query, key and value take one input: Megatron's fused projection sums their three partial
gradients first) and once for the feed-forward. So 2 + 2 = 4 all-reduces of a (rows, length, d_model) activation
per block (a decoder block of the translation model: 3 more for its cross-attention, 1 forward and 2 backward,
one for the query's input and one for the source memory the key and value share). The weights each device holds: a block's split weights (the
query, key, value and first feed-forward kernels with their biases, the output projections' kernels) by halves;
the embeddings, layer norms and the row-split layers' biases whole."""

import json
import pathlib

import numpy as np
import pytest

from mtbench.figures import run_dtype
from mtbench.runner.results.parity import check_parity
from tests.conftest import COMPARE_STEPS, CPU_ONLY, FLOAT16_GPT, TINY_COMPARE, run_cli, simulated_devices
from tests.plugins.extras.test_fsdp import TWO_DEVICES, losses
from tests.plugins.extras.test_multi_process import launched_by_flags, torchrun

FLOAT32 = 4
# Enough steps for the losses to part if a split run trained otherwise, and a checkpoint to cross halfway: the runs'
# cost is mostly their start and compiles, and torch's one-process reference's steps.
GPT_STEPS = 10
CHECKPOINT_EVERY = str(GPT_STEPS // 2)
FOUR_DEVICES = simulated_devices(4)
# The tiny GPT preset: 2 blocks, d_model 64, 2 heads, 256 feed-forward units; byte vocabulary, block size 32.
TINY_GPT = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "8", "--valid-size", "10",
            "--test-size", "10", "--steps", str(GPT_STEPS)]
GPT_BLOCKS, D_MODEL, FF_UNITS = 2, 64, 256
# Dropout on the split runs that are held to one device's draws (`test_split_runs_drop_what_one_device_drops`).
DROPOUT = ["--dropout", "0.1"]
# The tiny translation preset (TINY_COMPARE's): one encoder and one decoder block, d_model 64, 128 feed-forward units.
TRANSLATION_FF_UNITS = 128

# Per block: 2 forward + 2 backward; per decoder block of the translation model 3 more (cross-attention).
BLOCK_ALL_REDUCES = 4
CROSS_ATTENTION_ALL_REDUCES = 3
# Split variables per block: query, key, value (kernel and bias each), the attention's output kernel, the first
# feed-forward Dense (kernel and bias), the second's kernel.
SPLIT_VARIABLES_PER_BLOCK = 10
SPLIT_VARIABLES_PER_ATTENTION = 7


def split_parameters(d_model, ff_units, attentions):
    """Parameters a block splits: per attention its 4 d x d kernels and 3 biases, and its feed-forward's two
    kernels and first bias."""
    return attentions * (4 * d_model * d_model + 3 * d_model) + 2 * d_model * ff_units + ff_units


def assert_split_state(record, parameters, split):
    """Each of 2 devices holds half of the split parameters and the rest whole, the same for their gradients and
    each of the two Adam moments."""
    per_device = (parameters - split // 2) * FLOAT32
    assert record["unsharded_parameter_bytes"] == parameters * FLOAT32
    assert record["parameter_bytes"] == record["gradient_bytes"] == per_device
    # The two moments, and the optimizer's step counter and learning rate (a few bytes, on every device).
    assert 2 * per_device <= record["optimizer_state_bytes"] <= 2 * per_device + 16


def train(tmp_path, name, cache_dir, *args, env=None):
    out = tmp_path / f"{name}.json"
    proc = run_cli("train", *args, "--cache-dir", cache_dir, "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def train_on_two_processes(tmp_path, name, cache_dir, *args, processes=2, extra="tensor-parallel"):
    """The result of a run of `processes` processes. Two of torch's are launched by the coordinator flags (how they
    started is not checked here; torchrun's agent, one more process importing torch, cost 3 to 4 CPU s a launch).
    torchrun launches the rest: JAX's took no less CPU by the flags, and more processes than cores need torchrun's
    one thread each (by the flags they spun threads on every core: 2.4 times the CPU)."""
    out = tmp_path / f"{name}.json"
    arguments = ["train", "--extra", extra, *args, "--cache-dir", cache_dir, "--out", str(out)]
    if args[args.index("--backend") + 1] == "torch" and processes == 2:
        launched_by_flags(*arguments, timeout=600)
    else:
        proc = torchrun(*arguments, processes=processes)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def assert_trains_like_one_device(split, one, steps):
    assert len(losses(split)) == steps
    np.testing.assert_allclose(losses(split), losses(one), rtol=1e-5)
    assert split["metrics"]["test_loss"] == pytest.approx(one["metrics"]["test_loss"], rel=1e-5)


def test_the_plan_splits_attention_and_feed_forward_by_columns_then_rows():
    import keras

    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.extras.tensor_parallel import megatron_plan, split_variables
    keras.config.set_dtype_policy("float32")
    model = build_gpt(GPT_PRESETS["tiny"])
    plan, attentions = megatron_plan(model)
    assert len(attentions) == GPT_BLOCKS
    by_path = {dense.layer.path: dense.by for dense in plan}
    assert by_path == {f"gpt/block_{i}/{path}": by for i in range(GPT_BLOCKS) for path, by in [
        ("self_attention/query", "columns"), ("self_attention/key", "columns"), ("self_attention/value", "columns"),
        ("self_attention/output", "rows"), ("mlp/hidden", "columns"), ("mlp/out", "rows")]}
    axes = {variable.path: axis for variable, axis in split_variables(plan)}
    assert len(axes) == GPT_BLOCKS * SPLIT_VARIABLES_PER_BLOCK
    assert axes["gpt/block_0/self_attention/query/kernel"] == 1 and axes["gpt/block_0/self_attention/query/bias"] == 0
    assert axes["gpt/block_0/self_attention/output/kernel"] == 0
    assert "gpt/block_0/self_attention/output/bias" not in axes and "gpt/block_0/mlp/out/bias" not in axes
    assert axes["gpt/block_1/mlp/hidden/kernel"] == 1 and axes["gpt/block_1/mlp/out/kernel"] == 0


# A compiled program's text as XLA prints it: a loop whose body all-reduces an activation, after it a scalar.
LOOPED_PROGRAM = """HloModule jit_step, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%body.7 (carry: (s32[], f32[4])) -> (s32[], f32[4]) {
  %carry = (s32[], f32[4]{0}) parameter(0)
  %g = f32[4]{0} get-tuple-element(%carry), index=1
  %all-reduce.1 = f32[4]{0} all-reduce(f32[4]{0} %g), replica_groups={{0,1}}, to_apply=%add
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %all-reduce.1)
}

%cond.8 (carry: (s32[], f32[4])) -> pred[] {
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

ENTRY %main.9 (p: f32[4]) -> f32[4] {
  %w = (s32[], f32[4]{0}) while(%t0), condition=%cond.8, body=%body.7, backend_config={TRIPS}
  %all-reduce.2 = f32[] all-reduce(f32[] %s), replica_groups={{0,1}}, to_apply=%add
  ROOT %r = f32[4]{0} get-tuple-element(%w), index=1
}
"""


@pytest.mark.parametrize("trips, trip_count, runs", [('{"known_trip_count":{"n":"3"}}', 2, 3), ("{}", 2, 2)])
def test_a_collective_in_a_loops_body_counts_as_often_as_the_loop_runs(trips, trip_count, runs):
    from mtbench.plugins.extras.compiled_collectives import hlo_collectives
    found = hlo_collectives(LOOPED_PROGRAM.replace("{TRIPS}", trips), trip_count=trip_count)
    assert sorted(found["all-reduce"]) == ["f32[4]"] * runs + ["f32[]"]


def test_a_combined_collective_is_one_instruction_moving_each_of_its_arrays():
    """XLA combines independent all-reduces (a step's gradients, its loss and token count) into one of a tuple: the
    arrays it moves each count, and so does the one instruction, as torch's profiler counts a dispatched call."""
    from mtbench.plugins.extras.compiled_collectives import collectives_counted, hlo_collectives
    program = LOOPED_PROGRAM.replace("{TRIPS}", '{"known_trip_count":{"n":"3"}}').replace(
        "%all-reduce.2 = f32[] all-reduce(f32[] %s)",
        "%all-reduce.2 = (f32[], f32[8]{0}, f32[2,4]{1,0}) all-reduce(f32[] %s, f32[8]{0} %u, f32[2,4]{1,0} %v)")
    assert collectives_counted(hlo_collectives(program)) == {
        "collectives_per_step": {"all-reduce": 3 + 3}, "collective_instructions_per_step": {"all-reduce": 3 + 1}}


def test_an_asynchronous_collective_counts_once_with_what_it_moved():
    """XLA:GPU runs collectives asynchronously, as a `-start` whose tuple holds the operands beside the result (a
    permute's two context scalars too) and a `-done` whose result is what moved: each counts once, as XLA:CPU's
    synchronous form of it does (lines as XLA prints them)."""
    from mtbench.plugins.extras.compiled_collectives import hlo_collectives
    gpu = """ENTRY %main.3 (p: u16[1024]) -> f32[8] {
  %all-gather-start = (u16[1024]{0}, u16[2048]{0}) all-gather-start(u16[1024]{0} %p), dimensions={0}
  %all-gather-done = u16[2048]{0} all-gather-done((u16[1024]{0}, u16[2048]{0}) %all-gather-start)
  %all-reduce-start = f32[512]{0} all-reduce-start(f32[512]{0} %g), to_apply=%add
  %all-reduce-done = f32[512]{0} all-reduce-done(f32[512]{0} %all-reduce-start)
  %collective-permute-start = (f32[8]{0}, f32[8]{0}, u32[], u32[]) collective-permute-start(f32[8]{0} %x)
  ROOT %collective-permute-done = f32[8]{0} collective-permute-done((f32[8]{0}, f32[8]{0}, u32[], u32[]) %c)
}
"""
    cpu = """ENTRY %main.3 (p: u16[1024]) -> f32[8] {
  %all-gather = u16[2048]{0} all-gather(u16[1024]{0} %p), dimensions={0}
  %all-reduce = f32[512]{0} all-reduce(f32[512]{0} %g), to_apply=%add
  ROOT %collective-permute = f32[8]{0} collective-permute(f32[8]{0} %x), source_target_pairs={{0,1},{1,0}}
}
"""
    expected = {"all-gather": ["u16[2048]"], "all-reduce": ["f32[512]"], "collective-permute": ["f32[8]"]}
    assert hlo_collectives(gpu) == hlo_collectives(cpu) == expected


def test_only_the_families_whose_blocks_it_splits_whole_are_taken():
    from mtbench.plugins.extras.tensor_parallel import family_reason
    from mtbench.runner.config import TrainConfig
    assert family_reason(TrainConfig(model_name="gpt")) is None
    assert family_reason(TrainConfig(model_name="transformer")) is None
    # gpt's model, GPT-2's weights (a block given: the default is read from the checkpoint, which is not there)
    assert family_reason(TrainConfig(model_name="gpt2:/some/checkpoint", block_size=64)) is None
    # Marian's blocks hold their feed-forward's Dense layers themselves: only its attention would be split.
    assert family_reason(TrainConfig(model_name="marian:/some/checkpoint")) == (
        "splits the blocks of mtbench's transformer, gpt and gpt2 models, not 'marian'")


@pytest.mark.parametrize("args, env, message", [
    (["--backend", "jax"], None,
     "extra 'tensor-parallel' cannot run here: needs at least 2 devices; this run has 1 (simulate N devices on the "
     "CPU with XLA_FLAGS=--xla_force_host_platform_device_count=N JAX_PLATFORMS=cpu)"),
    (["--backend", "jax", "--ff-dim", "129"], TWO_DEVICES,
     "extra 'tensor-parallel' cannot run here: the model's 129 feed-forward units (--ff-dim) do not split evenly "
     "over 2 devices"),
    (["--backend", "jax", "--extra", "data-parallel"], TWO_DEVICES,
     "extra 'tensor-parallel' cannot run together with 'data-parallel'"),
    (["--backend", "torch", "--extra", "fsdp"], None, "extra 'tensor-parallel' cannot run together with 'fsdp'"),
    (["--backend", "torch"], None,
     "extra 'tensor-parallel' cannot run here: needs at least 2 processes; this run has 1 (start mtbench with "
     "torchrun --nproc-per-node N -m mtbench train ...)"),
])
def test_tensor_parallel_where_it_cannot_run_says_why(tmp_path, cache_dir, args, env, message):
    proc = run_cli("train", "--extra", "tensor-parallel", "--preset", "tiny", "--steps", "2", "--cache-dir",
                   cache_dir, "--out", str(tmp_path / "r.json"), *args, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"Error: {message}"
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("processes, size, reason", [
    (1, None, "needs at least 2 processes; this run has 1 (start mtbench with torchrun --nproc-per-node N -m mtbench "
              "train ...)"),
    (4, 3, "--tensor-parallel-size 3 must be at least 2 and divide the run's 4 processes (the data axis takes the "
           "rest)"),
    (4, 1, "--tensor-parallel-size 1 must be at least 2 and divide the run's 4 processes (the data axis takes the "
           "rest)"),
    (8, 4, "the model's 2 attention heads (--heads) do not split evenly over 4 devices"),
    (6, 2, "the batch size 8 does not split evenly over 6 processes"),
    (4, 2, None),
    (4, None, "the model's 2 attention heads (--heads) do not split evenly over 4 devices"),
])
def test_torch_meshes_it_refuses_and_takes(processes, size, reason):
    """On torch the model axis is --tensor-parallel-size processes (default: all of them), the data axis the rest."""
    assert mesh_refusal("torch", processes, size) == reason


@pytest.mark.parametrize("devices, size, reason", [
    (4, 3, "--tensor-parallel-size 3 must be at least 2 and divide the run's 4 devices (the data axis takes the "
           "rest)"),
    (4, None, "the model's 2 attention heads (--heads) do not split evenly over 4 devices"),
    (4, 2, None),
    (8, 2, None),
])
def test_jax_meshes_it_refuses_and_takes(devices, size, reason):
    """On JAX the model axis is --tensor-parallel-size devices (default: all of them), the data axis the rest."""
    assert mesh_refusal("jax", 1, size, devices) == reason


def mesh_refusal(backend, processes, size, devices=1):
    """The extra's refusal of the tiny GPT, batch 8, on `backend` with `processes` processes and `devices`
    devices, the model axis --tensor-parallel-size `size`."""
    from types import SimpleNamespace

    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.extras.tensor_parallel import TensorParallel
    from mtbench.runner.config import TrainConfig
    run = SimpleNamespace(backend=SimpleNamespace(name=backend), processes=SimpleNamespace(world_size=processes),
                          device={"count": devices}, model_shape=GPT_PRESETS["tiny"],
                          config=TrainConfig(model_name="gpt", batch_size=8, tensor_parallel_size=size))
    return TensorParallel().unavailable_reason(run)


def test_a_model_axis_size_without_the_extra_is_refused(tmp_path, cache_dir):
    proc = run_cli("train", "--backend", "jax", "--tensor-parallel-size", "2", "--preset", "tiny", "--steps", "2",
                   "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "Error: --tensor-parallel-size is an option of --extra tensor-parallel; give the extra too")


@pytest.fixture(scope="module")
def gpt_runs(tmp_path_factory, cache_dir):
    """The tiny GPT on one JAX device and split over two devices of one process and over two processes, and on one
    torch process and split over two; the 1 x 2 split runs across a checkpoint at step 5 (the weights made whole for
    it, then split again). The runs over two processes drop with DROPOUT, held to one-device runs that drop alike:
    one run of each backend checks both the split over processes and its masks, which
    `test_split_runs_drop_what_one_device_drops` reads. The 2 data x 2 model runs drop nothing: their data replicas
    draw masks of their own."""
    tmp_path = tmp_path_factory.mktemp("tensor-parallel")
    return {
        # The references on the CPU, as the split runs (simulated devices, gloo processes).
        "jax": train(tmp_path, "jax", cache_dir, "--backend", "jax", *TINY_GPT, env=CPU_ONLY),
        "jax-dropout": train(tmp_path, "jax-dropout", cache_dir, "--backend", "jax", *TINY_GPT, *DROPOUT,
                             env=CPU_ONLY),
        "jax-split": train(tmp_path, "jax-split", cache_dir, "--backend", "jax", "--extra", "tensor-parallel",
                           *TINY_GPT, "--checkpoint-every", CHECKPOINT_EVERY, env=TWO_DEVICES),
        "jax-over-2-processes": train_on_two_processes(tmp_path, "jax-over-2-processes", cache_dir, "--backend",
                                                       "jax", *TINY_GPT, *DROPOUT, "--checkpoint-every",
                                                       CHECKPOINT_EVERY),
        "torch": train(tmp_path, "torch", cache_dir, "--backend", "torch", *TINY_GPT, env=CPU_ONLY),
        "torch-dropout": train(tmp_path, "torch-dropout", cache_dir, "--backend", "torch", *TINY_GPT, *DROPOUT,
                               env=CPU_ONLY),
        "torch-split": train_on_two_processes(tmp_path, "torch-split", cache_dir, "--backend", "torch", *TINY_GPT,
                                              *DROPOUT, "--checkpoint-every", CHECKPOINT_EVERY),
        # 2 data x 2 model: four simulated devices, four gloo processes.
        "jax-2d": train(tmp_path, "jax-2d", cache_dir, "--backend", "jax", "--extra", "tensor-parallel",
                        "--tensor-parallel-size", "2", *TINY_GPT, env=FOUR_DEVICES),
        "torch-2d": train_on_two_processes(tmp_path, "torch-2d", cache_dir, "--backend", "torch",
                                           "--tensor-parallel-size", "2", *TINY_GPT, processes=4),
    }


def split_gpt_record(split, one, train_step, detail):
    """The record of a split run of the tiny GPT, checked for what both backends share: one device's losses, each
    device's half of the split weights, one head each, 4 all-reduces of activations per block."""
    assert_trains_like_one_device(split, one, GPT_STEPS)
    assert split["train_step"] == train_step and split["train_step_detail"] == detail
    # The replicated norms compute their statistics as one device's do.
    assert split["train_step_numerics"]["layer_norm"] == one["train_step_numerics"]["layer_norm"]
    assert split["host_syncs_per_step"] == 0  # the batch's rows gathered on the devices, the norms' indices kept
    record = split["extras_record"]["tensor-parallel"]
    assert record["split_layers"] == {"columns": 4 * GPT_BLOCKS, "rows": 2 * GPT_BLOCKS}
    assert record["heads_per_device"] == 1
    assert record["activation_all_reduces_per_step"] == GPT_BLOCKS * BLOCK_ALL_REDUCES
    assert_split_state(record, split["model"]["parameters"],
                       GPT_BLOCKS * split_parameters(D_MODEL, FF_UNITS, attentions=1))
    return record


@pytest.mark.slow
def test_jax_tensor_parallel_gpt_trains_like_one_device_with_megatrons_all_reduces(gpt_runs):
    record = split_gpt_record(gpt_runs["jax-split"], gpt_runs["jax"], "jax-jit-stateless",
                              "ModelParallel over a mesh of 1 data x 2 model, embeddings, layer norms and the tied "
                              "output layer replicated, query, key and value as one product")
    assert record["mesh_axes"] == ["data", "model"] and record["mesh_shape"] == [1, 2]
    # Counted in the compiled program: the blocks' all-reduces of activations, and one scalar per split gradient
    # (its squared norm, for Keras's global_clipnorm; XLA combines them into one collective), and nothing else.
    assert record["collectives_per_step"] == {
        "all-reduce": GPT_BLOCKS * BLOCK_ALL_REDUCES + GPT_BLOCKS * SPLIT_VARIABLES_PER_BLOCK}
    assert record["batch_all_gathers_per_step"] == 0  # one process: every device is given the whole batch


@pytest.mark.slow
def test_torch_tensor_parallel_gpt_trains_like_one_process_with_megatrons_all_reduces(gpt_runs):
    record = split_gpt_record(gpt_runs["torch-split"], gpt_runs["torch-dropout"], "torch-eager",
                              "tensor-parallel over 2 processes, embeddings, layer norms and the tied output layer "
                              "replicated, query, key and value as one product")
    assert record["collectives"] == "gloo" and record["mesh_axes"] == ["model"] and record["mesh_shape"] == [2]
    assert gpt_runs["torch-split"]["train_step_numerics"]["optimizer_update"].endswith(
        ", each process updating its parts of the split weights")
    # Counted over gloo in a step: DTensor's all-reduces of activations and one all-reduce of the split gradients'
    # squared norms (global_clipnorm); before them, one all-gather of the batch's rows (the loop hands each process
    # its share of the batch; every process needs all of it).
    assert record["collectives_per_step"] == {"all-reduce": GPT_BLOCKS * BLOCK_ALL_REDUCES + 1, "all-gather": 1}
    assert record["batch_all_gathers_per_step"] == 1


@pytest.mark.slow  # 2 processes in float16 on the CPU, beside the session's one-process run (`torch_float16_gpt_run`)
def test_torch_tensor_parallel_scales_float16_losses_as_one_process(tmp_path, cache_dir, torch_float16_gpt_run):
    """Each process checks its own parts of the split gradients for an overflow and the model axis agrees on the
    verdict (one all-reduce), so the split run scales, skips and updates as one process does. No step of this run
    overflows; an overflow on one process is tests/plugins/backends/test_overflow_agreement.py's."""
    split = train_on_two_processes(tmp_path, "split", cache_dir, "--backend", "torch", *FLOAT16_GPT)
    one = torch_float16_gpt_run
    np.testing.assert_allclose(losses(split), losses(one), rtol=1e-4)
    assert split["loss_scaling"] == one["loss_scaling"] and split["loss_scaling"]["initial_scale"] == 32768.0
    assert split["host_syncs_per_step"] == 0


@pytest.mark.slow
def test_torch_tensor_parallel_compiles_and_runs_the_eager_steps_collectives(gpt_runs, tmp_path, cache_dir):
    """With torch-compile given after it (the split wraps the compiled step): the forward and loss one graph, no
    break, no shape run eagerly; the losses of one process; the collectives the eager split step runs, counted in
    a compiled step."""
    out = tmp_path / "compiled.json"
    proc = torchrun("train", "--backend", "torch", "--extra", "tensor-parallel", "--extra", "torch-compile",
                    *TINY_GPT, "--cache-dir", cache_dir, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The batch's rows gathered by torch's current all-gather: the deprecated name warned in every process.
    assert "is deprecated" not in proc.stderr, proc.stderr[-3000:]
    split = json.loads(out.read_text())
    assert_trains_like_one_device(split, gpt_runs["torch"], GPT_STEPS)
    assert split["train_step"] == "torch-compiled"
    compiled = split["extras_record"]["torch-compile"]
    assert compiled["graphs_compiled"] >= 1 and compiled["graph_breaks"] == 0
    assert compiled["shapes_run_eagerly"] == 0
    record, eager = (run["extras_record"]["tensor-parallel"] for run in (split, gpt_runs["torch-split"]))
    for key in ("collectives_per_step", "activation_all_reduces_per_step", "batch_all_gathers_per_step"):
        assert record[key] == eager[key], key


@pytest.mark.slow
def test_jax_tensor_parallel_over_two_processes_gathers_the_batch_and_trains_like_one_device(gpt_runs):
    # Across a checkpoint at step 5 (the state replicated for process 0 to write, then split again, the dropout
    # seeds' too): one device's losses, its dropout masks drawn alike.
    split = gpt_runs["jax-over-2-processes"]
    assert_trains_like_one_device(split, gpt_runs["jax-dropout"], GPT_STEPS)
    # The program that splits the state again was compiled at the checkpoint, not in the timing window after it.
    assert {h["step"]: h["compilations"] for h in split["history"] if h["compilations"]} == {1: 1}
    record = split["extras_record"]["tensor-parallel"]
    assert record["processes"] == 2 and record["mesh_shape"] == [1, 2] and record["layouts_kept"] is True
    assert record["activation_all_reduces_per_step"] == GPT_BLOCKS * BLOCK_ALL_REDUCES
    # In the compiled program: the batch's three arrays (input ids, targets, weights) gathered from the processes,
    # then what one process runs.
    assert record["collectives_per_step"] == {
        "all-gather": 3, "all-reduce": GPT_BLOCKS * BLOCK_ALL_REDUCES + GPT_BLOCKS * SPLIT_VARIABLES_PER_BLOCK}
    assert record["batch_all_gathers_per_step"] == 3
    assert sorted(p.name for p in pathlib.Path(split["run_dir"]).iterdir()) == [
        "checkpoint-000005", "checkpoint-000010", "model", "run.json", "tokenizer"]


def assert_data_by_model_mesh(split, one):
    """Four devices as 2 data x 2 model, the form people train with: each model axis computes half of the batch's
    rows, holds the split weights by halves as on 1 x 2, and every gradient is averaged over the data axis
    besides, so that it trains what one device trains."""
    assert_trains_like_one_device(split, one, GPT_STEPS)
    record = split["extras_record"]["tensor-parallel"]
    assert record["mesh_axes"] == ["data", "model"] and record["mesh_shape"] == [2, 2]
    assert record["per_device_batch"] == 4 and record["heads_per_device"] == 1
    assert record["activation_all_reduces_per_step"] == GPT_BLOCKS * BLOCK_ALL_REDUCES
    assert_split_state(record, split["model"]["parameters"],
                       GPT_BLOCKS * split_parameters(D_MODEL, FF_UNITS, attentions=1))
    return record


@pytest.mark.slow
def test_jax_on_a_data_by_model_mesh_trains_like_one_device(gpt_runs):
    split = gpt_runs["jax-2d"]
    record = assert_data_by_model_mesh(split, gpt_runs["jax"])
    assert "mesh of 2 data x 2 model" in split["train_step_detail"]
    # Beyond the 1 x 2 mesh's: each gradient summed over the data axis (the two embeddings; per block 2 norms
    # of 2, the query, key and value kernels side by side and their biases side by side (one product: one
    # gradient of each), the output and two feed-forward Dense layers of 2; the final norm's 2), and the step's
    # figures (loss, tokens) summed over it too.
    one_axis = gpt_runs["jax-split"]["extras_record"]["tensor-parallel"]["collectives_per_step"]["all-reduce"]
    trainable = 2 + GPT_BLOCKS * (4 + 2 + 6) + 2
    assert one_axis + trainable <= record["collectives_per_step"]["all-reduce"] <= one_axis + trainable + 4


@pytest.mark.slow
def test_jax_on_a_data_by_model_mesh_sums_each_shards_micro_batches_and_all_reduces_the_gradients_once(
        gpt_runs, tmp_path, cache_dir):
    """--grad-accum 2 on 2 data x 2 model: each data shard sums its micro-batches' gradients, the split ones in
    their halves, and the data axis sums them after the step's loop, as torch's buckets do: the losses of one device
    trained on the same rows in one batch, each block's all-reduces once a micro-batch, and the gradients
    all-reduced once a step. Left to GSPMD, the loop's sum was replicated over the data axis: every gradient
    all-reduced at each micro-batch (28 arrays more), or, summed per shard in the data axis's layout alone, the split
    weights gathered whole."""
    # Two micro-batches of 4 rows a step: the rows of the module's batches of 8, so that the module's one-device run
    # is the reference (micro-batches train as one batch: test_gradient_accumulation.py). --measure-only: the
    # training losses and the compiled step are compared here, no test loss.
    split = train(tmp_path, "split", cache_dir, "--backend", "jax", "--extra", "tensor-parallel",
                  "--tensor-parallel-size", "2", *TINY_GPT, "--batch-size", "4", "--grad-accum", "2",
                  "--measure-only", env=FOUR_DEVICES)
    np.testing.assert_allclose(losses(split), losses(gpt_runs["jax"]), rtol=1e-5)
    assert "gradients of 2 micro-batches summed on each device in the step, then over the data axis" in \
        split["train_step_detail"]
    record = split["extras_record"]["tensor-parallel"]
    without = gpt_runs["jax-2d"]["extras_record"]["tensor-parallel"]
    assert record["activation_all_reduces_per_step"] == 2 * without["activation_all_reduces_per_step"] == \
        2 * GPT_BLOCKS * BLOCK_ALL_REDUCES
    assert set(record["collectives_per_step"]) == {"all-reduce"} and record["batch_all_gathers_per_step"] == 0
    # Beyond the second micro-batch's block all-reduces: each block's query, key and value kernels and biases summed
    # one by one (2 arrays more each a block; without accumulation XLA sums them stacked); 28 would be every
    # gradient again.
    more = record["collectives_per_step"]["all-reduce"] - without["collectives_per_step"]["all-reduce"]
    assert GPT_BLOCKS * BLOCK_ALL_REDUCES <= more <= GPT_BLOCKS * BLOCK_ALL_REDUCES + GPT_BLOCKS * 4


@pytest.mark.slow
def test_torch_on_a_data_by_model_mesh_trains_like_one_process(gpt_runs):
    split = gpt_runs["torch-2d"]
    record = assert_data_by_model_mesh(split, gpt_runs["torch"])
    assert split["train_step_detail"] == (
        "tensor-parallel over a mesh of 2 data x 2 model processes (the gradients averaged over the data axis in "
        "DDP's buckets: 1 all-reduce, each started in the backward pass when its gradients are ready), embeddings, "
        "layer norms and the tied output layer replicated, "
        "query, key and value as one product")
    assert split["host_syncs_per_step"] == 0
    # Beyond the 1 x 2 mesh's: the step's figures (loss, accuracy, tokens) summed over the data axis in one
    # all-reduce, and every gradient in another: the tiny GPT's 270 kB of gradients a process fit DDP's first
    # bucket (1 MiB), whose all-reduce starts when the last gradient arrives (test_gradient_buckets.py: several).
    one_axis = gpt_runs["torch-split"]["extras_record"]["tensor-parallel"]["collectives_per_step"]
    assert record["collectives_per_step"] == {"all-gather": 1, "all-reduce": one_axis["all-reduce"] + 2}
    # The bucket holds a copy of every gradient this process holds, as DDP's buckets do.
    assert record["data_axis_gradients"] == {"buckets": 1, "bucket_bytes": record["gradient_bytes"],
                                             "started_before_the_backward_ended": 0}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["split", "2d"])
def test_both_backends_split_the_same_weights_and_run_the_same_block_all_reduces(gpt_runs, mesh):
    jax_record = gpt_runs[f"jax-{mesh}"]["extras_record"]["tensor-parallel"]
    torch_record = gpt_runs[f"torch-{mesh}"]["extras_record"]["tensor-parallel"]
    for key in ("parameter_bytes", "unsharded_parameter_bytes", "split_layers", "activation_all_reduces_per_step",
                "per_device_batch"):
        assert jax_record[key] == torch_record[key], key


def assert_translation_split(split):
    """The translation model's blocks split as the GPT's: one encoder block, one decoder block (three attentions in
    all)."""
    record = split["extras_record"]["tensor-parallel"]
    assert record["activation_all_reduces_per_step"] == 2 * BLOCK_ALL_REDUCES + CROSS_ATTENTION_ALL_REDUCES
    assert_split_state(record, split["model"]["parameters"],
                       split_parameters(64, TRANSLATION_FF_UNITS, attentions=1)
                       + split_parameters(64, TRANSLATION_FF_UNITS, attentions=2))


@pytest.mark.slow
def test_tensor_parallel_translation_trains_like_one_device(tmp_path, cache_dir, cpu_compared_runs):
    """On two devices of one JAX process. Torch's two processes split the translation model in
    `test_split_runs_drop_what_one_device_drops[torch-translation]`, held there to one process's losses with
    dropout, which drops the split feed-forward units besides."""
    one = cpu_compared_runs["jax"]["result"]  # the session's run of TINY_COMPARE in one process on the CPU
    split = train(tmp_path, "split", cache_dir, "--backend", "jax", "--extra", "tensor-parallel", *TINY_COMPARE,
                  env=TWO_DEVICES)
    assert_trains_like_one_device(split, one, COMPARE_STEPS)
    assert_translation_split(split)


@pytest.mark.slow
@pytest.mark.parametrize("backend, model", [("jax", "gpt"), ("torch", "gpt"), ("torch", "translation")])
def test_split_runs_drop_what_one_device_drops(request, tmp_path, cache_dir, backend, model):
    """With dropout, a split run trains one device's losses: each device drops its heads' attention probabilities
    (the GPT's) and its feed-forward units (the translation model's) by its part of the mask one device draws for
    them all, and every device drops the activations it holds whole alike. JAX's partitioned draw gives each
    device its part; on torch, where each device drew a mask of its own part's shape, the losses parted by up to
    0.09 % in 10 steps (the GPT). Split over two processes on both: JAX's seeds laid over the processes' devices
    from one device's array were refused at the first timing window (`made_whole_across_processes`)."""
    if model == "gpt":  # the module's runs over two processes drop, across their checkpoint (`gpt_runs`)
        runs = request.getfixturevalue("gpt_runs")
        steps, one = GPT_STEPS, runs[f"{backend}-dropout"]
        split = runs["jax-over-2-processes" if backend == "jax" else "torch-split"]
    else:
        # The translation model 5 steps (its one-process step is slow here, 32 rows): a step's masks of its
        # feed-forward already move its loss by 0.2 % or more from the step's without dropout.
        steps = 5
        args = [*TINY_COMPARE, "--steps", str(steps), "--backend", backend, *DROPOUT]
        one = train(tmp_path, "one", cache_dir, *args, env=CPU_ONLY)
        split = train_on_two_processes(tmp_path, "split", cache_dir, *args)
    arithmetic = split["model"]["attention"]["arithmetic"]
    assert arithmetic["probability_dropout"] == (0.1 if model == "gpt" else 0.0)
    assert_trains_like_one_device(split, one, steps)
    # compare holds the split run to the one-device run's curve, as it holds remat's: they draw the same masks.
    report = check_parity([("one", one), ("split", split)], run_dtype, steps=steps, tolerance=1e-4)
    assert [(pair.reference, pair.run, pair.within_tolerance) for pair in report.pairs] == [("one", "split", True)]
    assert report.unchecked == []
    if model == "translation":  # its attention drops nothing: its feed-forward's masks were drawn, or this shows
        kept = train(tmp_path, "kept", cache_dir, *args, "--dropout", "0", "--measure-only", env=CPU_ONLY)
        assert max(abs(np.array(losses(kept)) / np.array(losses(one)) - 1)) > 1e-3
        assert_translation_split(split)


@pytest.mark.slow
def test_torch_split_lets_the_whole_weights_and_moments_go(tmp_path):
    """Each of 2 processes keeps its half of every split weight and of its two Adam moments, and frees the rest:
    Keras's layers keep their variables' tensors too (`_torch_params`), which must go with them. The tiny GPT of 4
    blocks; a few bytes of the mesh's own are allowed for."""
    import os
    import subprocess

    from mtbench.runner.orchestration.children import launcher_command
    probe = pathlib.Path(__file__).parents[2] / "held_bytes_probe.py"
    env = {**{key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"}, **CPU_ONLY}
    proc = subprocess.run([*launcher_command(2, launcher_dir=str(tmp_path)), str(probe), "tensor-parallel"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    freed = [json.loads(line)["freed"] for line in proc.stdout.splitlines() if line.startswith("{")]
    expected = 3 * 4 * split_parameters(D_MODEL, FF_UNITS, 1) // 2 * FLOAT32
    assert len(freed) == 2 and all(abs(bytes_freed - expected) <= 64 for bytes_freed in freed), (freed, expected)


def test_a_step_replayed_from_cuda_graphs_records_no_count_of_collectives_it_could_not_see():
    """Under CUDA graphs (torch-compile's reduce-overhead on a GPU) the counted step replays the graphs: the host
    dispatches only the batch's all-gather, outside them, and none of the blocks' all-reduces captured inside. That
    count is not the step's: the record says why instead of writing 0 all-reduces. (No CUDA graphs here: the
    counts are the profiler's names, as a replay and a counted step have them.)"""
    from collections import Counter

    from mtbench.plugins.extras.tensor_parallel import torch_collectives_record
    replay = Counter({"c10d::allgather_into_tensor_coalesced_": 1})
    counted = Counter({"c10d::allgather_into_tensor_coalesced_": 1, "c10d::allreduce_": 8,
                       "_c10d_functional::all_reduce_": 8})
    assert torch_collectives_record(replay, replayed=True) == {
        "collectives_per_step": None, "activation_all_reduces_per_step": None, "batch_all_gathers_per_step": 1,
        "collectives_why_not": "the counted step replayed CUDA graphs, whose collectives the host does not dispatch"}
    for replayed in (False, True):  # a graph whose collectives were not captured dispatches them on every call
        assert torch_collectives_record(counted, replayed) == {
            "collectives_per_step": {"all-gather": 1, "all-reduce": 8}, "activation_all_reduces_per_step": 8,
            "batch_all_gathers_per_step": 1}
    assert torch_collectives_record(replay) == {"collectives_per_step": {"all-gather": 1},
                                                "activation_all_reduces_per_step": 0, "batch_all_gathers_per_step": 1}
