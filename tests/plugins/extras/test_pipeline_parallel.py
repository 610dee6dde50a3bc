"""`--extra pipeline-parallel`: a language model's blocks in stages, one a process (two gloo processes, launched
by the coordinator flags, or four under torchrun), each batch through them in micro-batches on torch's 1F1B
schedule. It must train what one process trains, step for step, with the messages the schedule implies and each
process holding its stage's weights only.

The analysis, written down here and not read from the code under test. With S stages and M micro-batches, stage 0
sends each micro-batch's activations to stage 1 and receives their gradients back: M sends and M receives a step.
Besides: one all-gather of the batch's rows, one all-reduce of the token embedding's gradient between the first and
the last stage (the table is also the output layer), one all-reduce of the squared gradient norms (global-norm
clipping, the GPT recipe's), and one broadcast of the loss and accuracy from the last stage. The tiny GPT (d_model
64, 256 feed-forward units, bytes, block 32): a block has 4 x (64 x 64 + 64) + (64 x 256 + 256) + (256 x 64 + 64)
+ 4 x 64 = 49,984 parameters; the token embedding 256 x 64 = 16,384, the position embedding 32 x 64 = 2,048, the
final norm 128.

JAX (simulated devices in one process) runs the pipeline as one program over a `stage` mesh axis: the j-th block of
every stage stacked into one array a weight, sharded over the axis, and M + S - 1 ticks, at each of which every stage
computes and hands its activations to the next (a collective permute of one micro-batch's activations, forward and
once more in the backward pass). The blocks' weights never move; the embeddings and the final norm stay whole on
every device."""

import os
import pathlib
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import CPU_ONLY, json_answer, keras_on_jax, run_cli, simulated_devices
from tests.plugins.extras.test_fsdp import losses
from tests.plugins.extras.test_tensor_parallel import train, train_on_two_processes

FLOAT32 = 4
PROBE = pathlib.Path(__file__).parents[2] / "held_bytes_probe.py"
BLOCK, TOKEN_TABLE, POSITIONS, FINAL_NORM = 49_984, 256 * 64, 32 * 64, 2 * 64
STEPS = 6  # loss for loss, a few steps show a pipeline that trains otherwise; the one-process reference steps slowly
TINY_GPT = ["--backend", "torch", "--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "8",
            "--valid-size", "10", "--test-size", "10", "--steps", str(STEPS)]


@pytest.mark.parametrize("blocks, stages, bounds", [
    (4, 2, [(0, 2), (2, 4)]),
    (3, 2, [(0, 2), (2, 3)]),
    (5, 3, [(0, 2), (2, 4), (4, 5)]),
    (12, 4, [(0, 3), (3, 6), (6, 9), (9, 12)]),
])
def test_blocks_go_into_stages_as_evenly_as_they_can(blocks, stages, bounds):
    from mtbench.plugins.extras.pipeline_parallel import stage_bounds
    assert stage_bounds(blocks, stages) == bounds


@pytest.mark.parametrize("changes, processes, reason", [
    ({}, 1, "needs at least 2 processes; this run has 1 (start mtbench with torchrun --nproc-per-node N -m mtbench "
            "train ...)"),
    ({"model_name": "transformer"}, 2, "splits the blocks of mtbench's language models (gpt and gpt2), not "
                                       "'transformer'"),
    ({"decoder_layers": 2}, 4, "the model's 2 blocks (--layers) cannot fill 4 stages, one a process"),
    ({"grad_accum": 2}, 2, "the pipeline's micro-batches are its gradient accumulation; give "
                           "--pipeline-micro-batches in place of --grad-accum 2"),
    ({"pipeline_micro_batches": 1}, 2, "--pipeline-micro-batches 1 must be at least the 2 stages (the 1F1B "
                                       "schedule keeps one in flight a stage; --pipeline-schedule gpipe takes "
                                       "fewer)"),
    ({"pipeline_micro_batches": 1, "pipeline_schedule": "gpipe"}, 2, None),
    ({"pipeline_micro_batches": 3}, 2, "the batch size 8 does not split into 3 micro-batches "
                                       "(--pipeline-micro-batches)"),
    ({}, 4, "the batch size 8 does not split into 16 micro-batches (--pipeline-micro-batches)"),
    ({"pipeline_micro_batches": 4}, 4, None),
    ({"pipeline_parallel_size": 3}, 4, "--pipeline-parallel-size 3 must be at least 2 and divide the run's 4 "
                                       "processes (the data axis takes the rest)"),
    ({"pipeline_parallel_size": 1}, 2, "--pipeline-parallel-size 1 must be at least 2 and divide the run's 2 "
                                       "processes (the data axis takes the rest)"),
    ({"pipeline_parallel_size": 2}, 4, "a data replica's 4 rows do not split into 8 micro-batches "
                                       "(--pipeline-micro-batches)"),
    ({"pipeline_parallel_size": 2, "pipeline_micro_batches": 4}, 4, None),
    ({"compile_mode": "reduce-overhead"}, 2, "--compile-mode reduce-overhead replays CUDA graphs, which reuse a "
                                             "stage's output memory for the next micro-batch while the schedule still "
                                             "holds the last one's; give --compile-mode default or "
                                             "max-autotune-no-cudagraphs"),
    ({"compile_mode": "max-autotune-no-cudagraphs"}, 2, None),
    ({}, 2, None),
])
def test_where_a_pipeline_cannot_run_it_says_why(changes, processes, reason):
    import dataclasses

    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.extras.pipeline_parallel import PipelineParallel
    from mtbench.runner.config import TrainConfig
    changes = {"model_name": "gpt", **changes}
    shape = dataclasses.replace(GPT_PRESETS["tiny"], decoder_layers=changes.pop("decoder_layers", 4))
    run = SimpleNamespace(backend=SimpleNamespace(name="torch"), processes=SimpleNamespace(world_size=processes),
                          model_shape=shape, config=TrainConfig(batch_size=8, **changes))
    assert PipelineParallel().unavailable_reason(run) == reason


def test_micro_batches_without_the_extra_are_refused(tmp_path, cache_dir):
    proc = run_cli("train", *TINY_GPT, "--pipeline-micro-batches", "4", "--cache-dir", cache_dir, "--out",
                   str(tmp_path / "r.json"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == (
        "Error: --pipeline-micro-batches is an option of --extra pipeline-parallel; give the extra too")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_a_stage_frees_the_weights_and_moments_of_the_others():
    """Stage 0 of 2 over 4 blocks lets go of blocks 2 and 3 and the final norm (the last stage's), each weight
    with its two Adam moments: Keras's layers keep their variables' tensors too, which must go as well. It keeps
    the shared token table and computes its own part."""
    env = {key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"}
    proc = subprocess.run([sys.executable, str(PROBE), "pipeline"], capture_output=True, text=True, env=env,
                          timeout=600)
    figures = json_answer(proc)
    assert figures["freed"] == 3 * (2 * BLOCK + FINAL_NORM) * FLOAT32
    assert figures["stage_output"] == [2, 32, 64]


def train_pipelined(tmp_path, name, cache_dir, *args, processes=2):
    return train_on_two_processes(tmp_path, name, cache_dir, *args, processes=processes, extra="pipeline-parallel")


def assert_trains_like_one_process(pipelined, one, steps=STEPS):
    assert len(losses(pipelined)) == steps
    np.testing.assert_allclose(losses(pipelined), losses(one), rtol=1e-5)
    assert pipelined["metrics"]["test_loss"] == pytest.approx(one["metrics"]["test_loss"], rel=1e-5)


def assert_stages_compiled(pipelined):
    """Each stage's forward ran as one graph dynamo compiled, for the one batch shape trained, without a break."""
    assert pipelined["train_step"] == "torch-compiled"
    record = pipelined["extras_record"]["torch-compile"]
    assert record["compiled"].startswith("each pipeline stage's forward")
    assert record["frames_compiled"] == record["graphs_compiled"] == 1 and record["graph_breaks"] == 0
    assert record["shapes_trained"] == 1 and record["recompilations"] == record["shapes_run_eagerly"] == 0


FOUR_BLOCKS = [*TINY_GPT, "--layers", "4"]


@pytest.fixture(scope="module")
def one_process_of_four_blocks(tmp_path_factory, cache_dir):
    """The tiny GPT of 4 blocks in one process: the reference of both compiled pipelines of it, which train over
    gloo, on the CPU."""
    return train(tmp_path_factory.mktemp("one-process"), "one", cache_dir, *FOUR_BLOCKS, env=CPU_ONLY)


@pytest.mark.slow
def test_two_compiled_stages_train_what_one_process_trains_sending_each_micro_batch_once(tmp_path, cache_dir,
                                                                                        one_process_of_four_blocks):
    """torch-compile given after the pipeline, where `--step auto` puts it on a GPU: it compiles each stage."""
    one = one_process_of_four_blocks
    pipelined = train_pipelined(tmp_path, "pipelined", cache_dir, *FOUR_BLOCKS, "--extra", "torch-compile")
    assert_trains_like_one_process(pipelined, one)
    assert_stages_compiled(pipelined)
    record = pipelined["extras_record"]["pipeline-parallel"]
    assert record["stage_blocks"] == [[0, 2], [2, 4]]
    assert record["micro_batches"] == 8 and record["micro_batch_rows"] == 1  # 4 a stage by default
    assert record["bubble_fraction"] == pytest.approx(1 / 9, abs=1e-4)
    assert record["messages_per_step"] == {"send": 8, "receive": 8, "all-gather": 1, "all-reduce": 2,
                                           "broadcast": 1}
    # Stage 0: two blocks and both embeddings; stage 1: two blocks, the final norm and the shared table.
    assert record["parameter_bytes_by_stage"] == [(2 * BLOCK + TOKEN_TABLE + POSITIONS) * FLOAT32,
                                                  (2 * BLOCK + FINAL_NORM + TOKEN_TABLE) * FLOAT32]
    whole = 4 * BLOCK + TOKEN_TABLE + POSITIONS + FINAL_NORM
    assert record["unsharded_parameter_bytes"] == whole * FLOAT32
    assert record["parameter_bytes"] == record["gradient_bytes"] == (2 * BLOCK + TOKEN_TABLE + POSITIONS) * FLOAT32
    # Measured over every moment the optimizer holds: AdamW's two of each of this stage's weights, the other
    # stage's freed (held too, they would be the whole model's).
    assert record["optimizer_state_bytes"] == 2 * record["parameter_bytes"]
    assert pipelined["host_syncs_per_step"] == 0
    assert pipelined["train_step_detail"] == ("mode default, CUDA graphs: not used (mode default), pipeline-parallel "
                                              "over 2 processes (blocks 0-1 | blocks 2-3), 8 micro-batches, 1F1B")
    assert pipelined["train_step_numerics"]["optimizer_update"].endswith(", each process updating its stage's weights")


@pytest.mark.slow
def test_uneven_stages_on_gpipe_in_float16_with_remat_train_what_one_process_trains(tmp_path, cache_dir):
    """3 blocks over 2 stages, 2 micro-batches on GPipe's schedule, float16's loss scaling agreed by both stages,
    each block recomputed in the backward pass."""
    # 6 steps: float16 matmuls are slow on a CPU.
    args = [*TINY_GPT, "--steps", "6", "--layers", "3", "--dtype", "mixed_float16", "--extra", "remat"]
    one = train(tmp_path, "one", cache_dir, *args, env=CPU_ONLY)  # the pipelines train over gloo, on the CPU
    pipelined = train_pipelined(tmp_path, "pipelined", cache_dir, *args, "--pipeline-micro-batches", "2",
                                "--pipeline-schedule", "gpipe")
    assert_trains_like_one_process(pipelined, one, steps=6)
    assert pipelined["loss_scaling"] == one["loss_scaling"]
    record = pipelined["extras_record"]["pipeline-parallel"]
    assert record["stage_blocks"] == [[0, 2], [2, 3]] and record["schedule"] == "GPipe"
    assert record["messages_per_step"]["send"] == record["messages_per_step"]["receive"] == 2
    # The overflow verdict is agreed as well: one all-reduce more than in float32.
    assert record["messages_per_step"]["all-reduce"] == 3
    assert pipelined["extras_record"]["remat"]["blocks"] == 3


@pytest.mark.slow
def test_two_compiled_pipelines_on_a_data_axis_train_what_one_process_trains(tmp_path, cache_dir,
                                                                            one_process_of_four_blocks):
    """4 processes as 2 data x 2 stages: each pipeline trains its half of the batch's rows, the stages' gradients
    averaged over the data axis (one bucket of this small model, from the backward pass, of compiled stages here:
    torch-compile given before the pipeline), the losses one process's."""
    one = one_process_of_four_blocks
    # The compiled step first: the pipeline then compiles its stages with it.
    pipelined = train_on_two_processes(tmp_path, "pipelined", cache_dir, *FOUR_BLOCKS, "--extra", "pipeline-parallel",
                                       "--pipeline-parallel-size", "2", "--pipeline-micro-batches", "4", processes=4,
                                       extra="torch-compile")
    assert_trains_like_one_process(pipelined, one)
    assert_stages_compiled(pipelined)
    record = pipelined["extras_record"]["pipeline-parallel"]
    assert (record["mesh_axes"], record["mesh_shape"]) == (["data", "stage"], [2, 2])
    assert record["micro_batch_rows"] == 1  # 8 rows, 4 a pipeline, 4 micro-batches
    # Beside the float32 run of one pipeline: the data axis's all-reduce of stage 0's gradients.
    assert record["messages_per_step"] == {"send": 4, "receive": 4, "all-gather": 1, "all-reduce": 3,
                                           "broadcast": 1}
    assert record["data_axis_gradients"]["buckets"] == 1
    assert record["parameter_bytes_by_stage"] == [(2 * BLOCK + TOKEN_TABLE + POSITIONS) * FLOAT32,
                                                  (2 * BLOCK + FINAL_NORM + TOKEN_TABLE) * FLOAT32]


# ----- JAX -----

JAX_GPT = ["--backend", "jax", *TINY_GPT[2:], "--steps", "20"]


@pytest.mark.parametrize("changes, devices, reason", [
    ({}, 1, "needs at least 2 devices; this run has 1 (simulate N devices on the CPU with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N JAX_PLATFORMS=cpu)"),
    ({"decoder_layers": 1}, 2, "the model's 1 block (--layers) cannot fill 2 stages, one a device"),
    ({"decoder_layers": 3}, 2, "JAX stacks the stages' blocks into one array a weight, sharded over the stage "
                               "axis: the model's 3 blocks (--layers) must divide evenly into its 2 stages"),
    ({"pipeline_schedule": "1f1b"}, 2, "JAX differentiates its pipeline as one program, every forward then every "
                                       "backward: GPipe's schedule; give --pipeline-schedule gpipe"),
    ({"pipeline_micro_batches": 1}, 2, None),  # GPipe's schedule, JAX's own, takes fewer micro-batches than stages
    ({"pipeline_parallel_size": 3}, 4, "--pipeline-parallel-size 3 must be at least 2 and divide the run's 4 "
                                       "devices (the data axis takes the rest)"),
    ({"pipeline_parallel_size": 2, "batch_size": 6, "pipeline_micro_batches": 3}, 4, None),
    ({"pipeline_parallel_size": 2, "batch_size": 5, "pipeline_micro_batches": 1}, 4,
     "the batch size 5 does not split evenly over 2 devices of the data axis"),
    ({}, 2, None),
])
def test_where_a_jax_pipeline_cannot_run_it_says_why(changes, devices, reason):
    import dataclasses

    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.extras.pipeline_parallel import PipelineParallel
    from mtbench.runner.config import TrainConfig
    changes = {"model_name": "gpt", "batch_size": 8, **changes}
    shape = dataclasses.replace(GPT_PRESETS["tiny"], decoder_layers=changes.pop("decoder_layers", 4))
    run = SimpleNamespace(backend=SimpleNamespace(name="jax"), processes=SimpleNamespace(world_size=1),
                          device={"count": devices}, model_shape=shape, config=TrainConfig(**changes))
    assert PipelineParallel().unavailable_reason(run) == reason


def activation_shape(rows):
    """The shape XLA gives a stage's part of the stages' activations: (data replica, stage, rows, positions, width)."""
    return f"f32[1,1,{rows},32,64]"


@pytest.mark.slow
def test_jax_stages_train_what_one_device_trains_moving_only_activations(tmp_path, cache_dir):
    """Two stages of two blocks each on two simulated devices, 8 micro-batches of one row, across a checkpoint at
    step 10 (the stages made whole for it, then stacked again)."""
    args = [*JAX_GPT, "--layers", "4"]
    one = train(tmp_path, "one", cache_dir, *args, env=CPU_ONLY)
    pipelined = train(tmp_path, "pipelined", cache_dir, *args, "--extra", "pipeline-parallel", "--checkpoint-every",
                      "10", env=simulated_devices(2))
    assert_trains_like_one_process(pipelined, one, steps=20)
    record = pipelined["extras_record"]["pipeline-parallel"]
    assert (record["mesh_axes"], record["mesh_shape"]) == (["data", "stage"], [1, 2])
    assert record["stage_blocks"] == [[0, 2], [2, 4]] and record["schedule"] == "GPipe"
    assert record["micro_batches"] == 8 and record["micro_batch_rows"] == 1
    # Each device: its stage's two blocks, and the embeddings and the final norm whole.
    held = (2 * BLOCK + TOKEN_TABLE + POSITIONS + FINAL_NORM) * FLOAT32
    assert record["parameter_bytes"] == record["gradient_bytes"] == held
    assert record["unsharded_parameter_bytes"] == (4 * BLOCK + TOKEN_TABLE + POSITIONS + FINAL_NORM) * FLOAT32
    assert 2 * held <= record["optimizer_state_bytes"] <= 2 * held + 16  # the two moments and the step counter
    moved = record["collectives_moved"]
    ticks = 8 + 2 - 1
    # A micro-batch's activations move to the next stage at every tick, and their gradients back: one permute each
    # way, nothing else of a tick's, as torch's stages send and receive each micro-batch once each way. The last
    # stage's output was gathered to every device at every tick, its gradient all-reduced, the entering
    # micro-batch's gradient all-reduced over the stages, and the move's gradient took two permutes: 5 permutes, 1
    # all-gather and 2 all-reduces a tick.
    assert moved["collective-permute"][activation_shape(1)] == 2 * ticks
    assert activation_shape(1) not in moved["all-reduce"]
    # What is gathered is activations (the micro-batches on their way in and out), never a weight, and not a tick's.
    assert moved["all-gather"] and all(shape.endswith(",32,64]") for shape in moved["all-gather"])
    assert sum(moved["all-gather"].values()) < ticks
    # Nor does any collective move a block's kernel or its gradient: a stage's stacked 64 x 192 (query, key and
    # value), 64 x 64, 64 x 256 and 256 x 64, behind their stage and block axes (as the 2 x 2 run's data axis
    # all-reduces them: f32[1,64,256]). The token table, [256,64], is every stage's and all-reduced.
    kernels = re.compile(r"[a-z0-9]+\[(\d+,)+(64,(64|192|256)|256,64)\]")
    assert not [shape for shapes in moved.values() for shape in shapes if kernels.fullmatch(shape)], moved
    assert pipelined["host_syncs_per_step"] == 0
    assert "pipeline-parallel (blocks 0-1 | blocks 2-3), 8 micro-batches, GPipe" in pipelined["train_step_detail"]
    # The second stage's blocks are computed by the first stage's layers, stacked: their norms in the same one pass.
    assert pipelined["train_step_numerics"] == one["train_step_numerics"]
    assert one["train_step_numerics"]["layer_norm"].endswith(f"({2 * 4 + 1} of {2 * 4 + 1} layer norms)")


@pytest.mark.slow
def test_jax_stages_on_a_data_axis_in_bfloat16_with_remat_train_what_one_device_trains(tmp_path, cache_dir):
    """2 data x 2 stages on four simulated devices, 4 micro-batches of one row (8 rows, 4 a data replica), bfloat16
    matmuls, each block recomputed in the backward pass: one device's losses, to bfloat16's rounding of micro-batches
    summed in another order."""
    # --measure-only: no test loss is compared here, the training losses and the compiled programs are.
    common = [*JAX_GPT, "--layers", "4", "--dtype", "mixed_bfloat16", "--measure-only"]
    args = [*common, "--extra", "remat"]
    one = train(tmp_path, "one", cache_dir, *args, env=CPU_ONLY)
    pipelined = train(tmp_path, "pipelined", cache_dir, *args, "--extra", "pipeline-parallel",
                      "--pipeline-parallel-size", "2", "--pipeline-micro-batches", "4", env=simulated_devices(4))
    assert len(losses(pipelined)) == 20
    np.testing.assert_allclose(losses(pipelined), losses(one), rtol=2e-4)
    record = pipelined["extras_record"]["pipeline-parallel"]
    assert (record["mesh_axes"], record["mesh_shape"]) == (["data", "stage"], [2, 2])
    assert record["micro_batches"] == 4 and record["micro_batch_rows"] == 1 and record["per_device_batch"] == 4
    # The residual stream between blocks stays float32 under mixed_bfloat16 (the sum of float32 embeddings and
    # bfloat16 branches): so are the activations the stages hand on.
    assert record["collectives_moved"]["collective-permute"][activation_shape(1)] >= 2 * (4 + 2 - 1)
    # Each stage's feed-forward kernels (its part of a stacked 64 x 256 and 256 x 64, for each of its 2 blocks): their
    # gradients cross the data axis once a step, not once a tick.
    reduced = record["collectives_moved"]["all-reduce"]
    assert reduced["f32[1,64,256]"] == reduced["f32[1,256,64]"] == 2
    assert pipelined["extras_record"]["remat"]["blocks"] == 4
    # The stages recompute: their compiled program has products beyond the same pipeline's without remat.
    keeping = train(tmp_path, "keeping", cache_dir, *common, "--extra", "pipeline-parallel",
                    "--pipeline-parallel-size", "2", "--pipeline-micro-batches", "4",
                    "--steps", "2", env=simulated_devices(4))
    assert (record["matrix_products_compiled"]
            > keeping["extras_record"]["pipeline-parallel"]["matrix_products_compiled"] > 0)


def test_the_stacked_weights_optimizer_is_made_as_the_models_with_its_loss_scaling():
    """JAX trains float16 only on a GPU: what can be checked here is that the stacked variables' optimizer takes the
    model's recipe, loss scaling and weight-decay exclusions (a stacked bias: none), and keeps the same counters.
    In this process, keras on JAX (a process of its own would start JAX and keras again for a few optimizers)."""
    from mtbench import MtbenchError
    from mtbench.plugins.extras.pipeline_parallel import mirrored_optimizer
    keras = keras_on_jax()
    weights = [keras.Variable(keras.ops.zeros((3, 3)), name="kernel"),
               keras.Variable(keras.ops.zeros((3,)), name="bias")]
    optimizer = keras.optimizers.AdamW(learning_rate=keras.optimizers.schedules.CosineDecay(1e-3, 100),
                                       weight_decay=0.1, beta_2=0.95, global_clipnorm=1.0)
    optimizer.exclude_from_weight_decay(var_list=[weights[1]])
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=1024.0)
    optimizer.build(weights)
    stacked = [keras.Variable(keras.ops.zeros((2, 3, 3)), name="stacked_kernel"),
               keras.Variable(keras.ops.zeros((2, 3)), name="stacked_bias")]
    mirrored = mirrored_optimizer(optimizer, stacked, weights)
    mirrored.build(stacked)
    inner = mirrored.inner_optimizer
    assert (type(mirrored).__name__, mirrored.initial_scale, inner.beta_2, inner.global_clipnorm,
            inner.weight_decay) == ("LossScaleOptimizer", 1024.0, 0.95, 1.0, 0.1)
    assert inner._learning_rate is optimizer.inner_optimizer._learning_rate
    assert [inner._use_weight_decay(v) for v in stacked] == [True, False]
    assert [v.name for v in mirrored.variables if v.shape == ()] == [v.name for v in optimizer.variables
                                                                      if v.shape == ()]
    # Each weight clipped on its own: a stacked weight's norm would be every stage's copy's together.
    with pytest.raises(MtbenchError) as refused:
        mirrored_optimizer(keras.optimizers.AdamW(clipnorm=1.0), stacked, weights)
    assert type(refused.value) is MtbenchError
    assert str(refused.value) == ("cannot clip each weight on its own on JAX (Keras's clipnorm would take every "
                                  "stage's copy of a weight as one); give --clip global or --clip none")


@pytest.mark.slow
def test_a_pipeline_of_one_micro_batch_says_so_in_the_singular(tmp_path, cache_dir):
    pipelined = train(tmp_path, "pipelined", cache_dir, *JAX_GPT, "--steps", "2", "--measure-only", "--extra",
                      "pipeline-parallel", "--pipeline-micro-batches", "1", env=simulated_devices(2))
    assert "pipeline-parallel (block 0 | block 1), 1 micro-batch, GPipe" in pipelined["train_step_detail"]


@pytest.mark.parametrize("devices", [1, 2])
def test_a_jax_pipeline_over_several_processes_is_refused_for_its_processes_whatever_each_sees(devices):
    """`compare --matrix 'jax+pipeline-parallel@2'` said `needs at least 2 devices ... (simulate N devices with
    XLA_FLAGS=...)` to a run of 2 processes of one device each; simulating devices led only to `start one
    process`, which torchrun's processes were told at once."""
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.extras.pipeline_parallel import PipelineParallel
    from mtbench.runner.config import TrainConfig
    run = SimpleNamespace(backend=SimpleNamespace(name="jax"), processes=SimpleNamespace(world_size=2),
                          device={"count": devices}, model_shape=GPT_PRESETS["tiny"],
                          config=TrainConfig(model_name="gpt", batch_size=8))
    assert PipelineParallel().unavailable_reason(run) == "JAX's pipeline runs over one process's devices; start one " \
                                                        "process"
