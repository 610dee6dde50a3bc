"""`--extra fsdp`: parameters, gradients and optimizer state sharded over the devices (JAX: two simulated devices
in one process, or two processes; torch: two gloo processes under torchrun). Each must train what one device
trains, step for step, while every device holds half the state a replicated run holds."""

import json
import os

import numpy as np
import pytest

from tests.conftest import (COMPARE_STEPS, FLOAT16_GPT, ONE_BUCKET, TINY_COMPARE, TINY_TRAIN, run_cli,
                            simulated_devices)
from mtbench.figures import FIGURES_BY_KEY
from mtbench.plugins.extras.fsdp import sharded_axis, sharded_step_text
from tests.plugins.extras.test_multi_process import assert_same_losses, launched_by_flags, torchrun

TWO_DEVICES = simulated_devices(2)
PARALLEL = [*TINY_TRAIN, *ONE_BUCKET]  # one length bucket: one train program per run
FLOAT32 = 4
# A torch FSDP2 step of the tiny Transformer's 3 units: each gathered once and its gradients reduce-scattered, and two
# all-reduces (the batch's token count, the gradients' squared norms), as test_fsdp_collectives.py's profile counts.
TORCH_FSDP_COLLECTIVES = {"all-gather": 3, "all-reduce": 2, "reduce-scatter": 3}


def train(tmp_path, name, cache_dir, *args, env=None, flags=PARALLEL):
    out = tmp_path / f"{name}.json"
    proc = run_cli("train", *flags, "--cache-dir", cache_dir, "--out", str(out), *args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def losses(result):
    return np.array([h["loss"] for h in result["history"]])


def assert_half_of_the_state(record, parameters):
    """Each of 2 devices holds half of every weight, of its gradient and of its two Adam moments."""
    whole = parameters * FLOAT32
    assert record["unsharded_parameter_bytes"] == whole
    assert record["parameter_bytes"] == whole // 2
    assert record["gradient_bytes"] == whole // 2
    # The two moments, and the optimizer's step counter and learning rate (a few bytes, on every device).
    assert whole <= record["optimizer_state_bytes"] <= whole + 16
    assert record["state_bytes"] == sum(record[key] for key in ("parameter_bytes", "gradient_bytes",
                                                                "optimizer_state_bytes"))


def test_each_weight_is_split_on_its_largest_axis_that_the_devices_divide():
    assert sharded_axis((1000, 64), 2) == 0
    assert sharded_axis((64, 128), 2) == 1
    assert sharded_axis((64, 64), 2) == 0  # the first of equals
    assert sharded_axis((63, 8), 2) == 1
    assert sharded_axis((7,), 2) is None  # stays whole on every device
    assert sharded_axis((), 2) is None
    assert sharded_axis((1, 3), 4) is None


def test_the_sharded_jax_steps_description_says_what_its_compiled_program_moves():
    """Read from the counted collectives once the program is read (the runs below count 3 and 3): a program that
    all-reduced whole gradients, as GSPMD partitions the same layouts without fsdp's gradient, says so."""
    assert sharded_step_text(3, {}) == "3 units gathered once a step, gradients reduce-scattered"  # not yet read
    assert sharded_step_text(3, {"collectives_per_step": {"all-gather": 3, "reduce-scatter": 6}}) == \
        "3 units gathered once a step, gradients reduce-scattered"  # each of 2 micro-batches' gradients
    assert sharded_step_text(3, {"collectives_per_step": {"all-gather": 7, "all-reduce": 12}}) == \
        "3 units, 7 all-gathers a step, gradients all-reduced (12 a step; no reduce-scatter)"


def test_the_sharded_jax_steps_description_names_the_weights_it_holds_whole():
    record = {"whole_weights": 3, "weights": 10, "whole_weight_bytes": 300, "weight_bytes": 1000}
    assert sharded_step_text(2, record) == ("2 units gathered once a step, gradients reduce-scattered; 3 of 10 weights "
                                            "whole (30 % of the weight bytes) on every device, their gradients "
                                            "all-reduced")
    assert sharded_step_text(2, {**record, "whole_weights": 0}).endswith("gradients reduce-scattered")


@pytest.mark.slow
def test_jax_fsdp_says_it_holds_whole_the_weights_the_devices_divide_no_axis_of(tmp_path, cache_dir):
    """--d-model 63: most weights have no even axis, and stay whole on each of 2 devices (torch's FSDP2 pads and
    shards them): the step's description and the record say how many and how many bytes, and a warning, printed and
    among the result's, says that most are not sharded."""
    out = tmp_path / "odd.json"
    proc = run_cli("train", "--backend", "jax", "--extra", "fsdp", "--model", "gpt", "--preset", "tiny",
                   "--block-size", "32", "--batch-size", "16", "--steps", "3", "--measure-only", "--d-model", "63",
                   "--heads", "3", "--ff-dim", "127", "--cache-dir", cache_dir, "--out", str(out), env=TWO_DEVICES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    record = result["extras_record"]["fsdp"]
    assert record["weight_bytes"] == result["model"]["parameters"] * FLOAT32
    # What each device was measured to hold: the whole weights, and half of the others.
    assert record["parameter_bytes"] == record["whole_weight_bytes"] + \
        (record["weight_bytes"] - record["whole_weight_bytes"]) // 2
    assert record["whole_weight_bytes"] * 2 > record["weight_bytes"]
    share = round(100 * record["whole_weight_bytes"] / record["weight_bytes"])
    assert result["train_step_detail"].endswith(
        f"; {record['whole_weights']} of {record['weights']} weights whole ({share} % of the weight bytes) on every "
        f"device, their gradients all-reduced")
    assert "warning: fsdp holds" in proc.stderr and "most of the weights are not sharded" in proc.stderr
    # In the result too, so that a comparison's tables and verdicts beside torch's FSDP2 carry it.
    from mtbench.figures import run_warnings
    assert [text for text in run_warnings(result) if text.startswith("extra 'fsdp': ")] == [
        f"extra 'fsdp': holds {record['whole_weights']} of {record['weights']} weights whole ({share} % of the weight "
        f"bytes) on every device: most of the weights are not sharded, their gradients all-reduced as in data "
        f"parallelism (give sizes that 2 divides)"]


def test_the_state_per_device_figure_reads_the_extras_record():
    figure = FIGURES_BY_KEY["state_bytes_per_device"]
    result = {"extras_record": {"flash-attention": {"kernels": []}, "fsdp": {"state_bytes": 3 * 2 ** 20}}}
    assert figure.value(result) == 3 * 2 ** 20 and figure.text(figure.value(result)) == "3.0"
    assert figure.title == "training state, largest device (MiB)"
    assert figure.value({"extras_record": {}}) is None and figure.text(None) == "n/a"


@pytest.mark.parametrize("args, env, message", [
    (["--backend", "jax", "--extra", "fsdp"], None,
     "extra 'fsdp' cannot run here: needs at least 2 devices; this run has 1 (simulate N devices on the CPU with "
     "XLA_FLAGS=--xla_force_host_platform_device_count=N JAX_PLATFORMS=cpu)"),
    (["--backend", "jax", "--extra", "fsdp", "--batch-size", "33"], TWO_DEVICES,
     "extra 'fsdp' cannot run here: the batch size 33 does not split evenly over 2 devices"),
    (["--backend", "jax", "--extra", "fsdp", "--extra", "data-parallel"], TWO_DEVICES,
     "extra 'fsdp' cannot run together with 'data-parallel'"),
    (["--backend", "torch", "--extra", "fsdp"], None,
     "extra 'fsdp' cannot run here: needs at least 2 processes; this run has 1 (start mtbench with torchrun "
     "--nproc-per-node N -m mtbench train ...)"),
])
def test_fsdp_where_it_cannot_run_says_why(tmp_path, cache_dir, args, env, message):
    proc = run_cli("train", "--preset", "tiny", "--steps", "2", "--cache-dir", cache_dir,
                   "--out", str(tmp_path / "r.json"), *args, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"Error: {message}"
    assert not (tmp_path / "r.json").exists()


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory, cache_dir, cpu_compared_runs, jax_data_parallel_run):
    """One JAX device and two devices replicating the state (data-parallel), the session's, and two sharding it
    (fsdp)."""
    tmp_path = tmp_path_factory.mktemp("jax-fsdp")
    return {None: cpu_compared_runs["jax"]["result"], "data-parallel": jax_data_parallel_run["result"],
            "fsdp": train(tmp_path, "fsdp", cache_dir, "--backend", "jax", "--extra", "fsdp", env=TWO_DEVICES,
                          flags=TINY_COMPARE)}


@pytest.mark.slow
def test_jax_fsdp_trains_like_one_device_with_half_the_state_on_each(jax_runs):
    one, replicated, sharded = jax_runs[None], jax_runs["data-parallel"], jax_runs["fsdp"]
    assert len(losses(sharded)) == COMPARE_STEPS
    np.testing.assert_allclose(losses(sharded), losses(one), rtol=1e-5)
    assert sharded["metrics"]["val_loss"] == pytest.approx(one["metrics"]["val_loss"], rel=1e-5)
    record = sharded["extras_record"]["fsdp"]
    assert record["mesh_axes"] == ["data"] and record["mesh_shape"] == [2] and record["per_device_batch"] == 16
    assert record["units"] == ["encoder_0", "decoder_0", "transformer"] and record["gather_dtype"] == "float32"
    # mtbench's jit step ran over the sharded mesh, and its state kept the layouts through every step.
    assert sharded["train_step"] == "jax-jit-stateless"
    assert sharded["train_step_detail"] == ("ShardedWeights over a mesh of 2 data, 3 units gathered once a step, "
                                            "gradients reduce-scattered")
    assert record["layouts_kept"] is True
    # The compiled step gathered each unit's weights and reduce-scattered its gradients once: GSPMD's own
    # partitioning of the same layouts (the step without fsdp's gradient) trains the same losses with none.
    assert (record["collectives_per_step"]["all-gather"], record["collectives_per_step"]["reduce-scatter"]) == (3, 3)
    parameters = sharded["model"]["parameters"]
    assert_half_of_the_state(record, parameters)
    # data-parallel holds every weight, gradient and moment whole on each device.
    whole = replicated["extras_record"]["data-parallel"]
    assert whole["parameter_bytes"] == whole["gradient_bytes"] == parameters * FLOAT32
    assert record["state_bytes"] * 2 == pytest.approx(whole["state_bytes"], abs=32)
    state = FIGURES_BY_KEY["state_bytes_per_device"]
    assert state.value(sharded) == record["state_bytes"] and state.value(one) is None


@pytest.mark.slow
@pytest.mark.parametrize("backend, kept, train_step", [
    ("jax", {"processes": 2, "mesh_shape": [2], "layouts_kept": True},
     ("jax-jit-stateless", "ShardedWeights over a mesh of 2 data, 3 units gathered once a step, gradients reduce-scattered")),
    # Had the Keras variables kept their own whole tensors, torch's step would train those and FSDP's shards would
    # stay as they started: the losses would part from one process's at the second step.
    ("torch", {"collectives": "gloo", "units": ["encoder_0", "decoder_0", "transformer"]},
     ("torch-eager", "FSDP2 over 2 processes, 3 units gathered once a step")),
], ids=["jax", "torch"])
def test_a_killed_fsdp_run_resumes_to_the_losses_of_one_process(backend, kept, train_step, cpu_compared_runs,
                                                                cache_dir, tmp_path):
    out = tmp_path / f"{backend}-fsdp.json"
    proc = torchrun("train", "--backend", backend, "--extra", "fsdp", *TINY_COMPARE, "--checkpoint-every", "15",
                    "--process-timeout", "60", "--cache-dir", cache_dir, "--out", str(out),
                    env={"MTBENCH_TEST_KILL_AT": "1:22"}, timeout=300)
    assert proc.returncode != 0 and not out.exists()
    assert sorted(p.name for p in (tmp_path / f"{backend}-fsdp.run").iterdir()) == ["checkpoint-000015", "run.json",
                                                                                     "tokenizer"]
    proc = torchrun("train", "--resume", str(tmp_path / f"{backend}-fsdp.run"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "completed" and result["timing"]["resumed_at_steps"] == [16]
    # Every process loaded the checkpoint's whole weights into the sharded layouts, which the steps kept (on
    # torch the resumed steps update the shards with Keras's own optimizer: the fused one counts steps from 0).
    # Every step, the killed run's and the resumed one's, across the checkpoints (the weights gathered whole for
    # them, then sharded again) that process 0 writes alone while the other goes on.
    assert_same_losses(result["history"], cpu_compared_runs[backend]["result"]["history"])
    assert len(result["history"]) == COMPARE_STEPS
    assert (result["train_step"], result["train_step_detail"]) == train_step
    record = result["extras_record"]["fsdp"]
    assert kept.items() <= record.items()
    if backend == "jax":  # over processes too, the compiled step gathers and reduce-scatters each unit once
        assert [record["collectives_per_step"][kind] for kind in ("all-gather", "reduce-scatter")] == [3, 3]
    else:  # as test_fsdp_collectives.py's own profile of the sharded step counts them
        assert record["collectives_per_step"] == TORCH_FSDP_COLLECTIVES
    assert_half_of_the_state(record, result["model"]["parameters"])
    # Process 0 evaluated and saved the weights the two processes held in halves; the checkpoints hold the whole
    # weights under the model's own layer names.
    one = cpu_compared_runs[backend]["result"]["metrics"]
    assert result["metrics"]["test_loss"] == pytest.approx(one["test_loss"], rel=1e-4)
    assert sorted(p.name for p in (tmp_path / f"{backend}-fsdp.run").iterdir()) == [
        "checkpoint-000015", "checkpoint-000030", "model", "run.json", "tokenizer"]


@pytest.mark.slow
def test_torch_fsdp_runs_the_compiled_step_given_either_side_of_torch_compile(cache_dir, tmp_path):
    """torch-compile given first makes the compiled step that fsdp shards; given after, it compiles the step
    inside fsdp's wrapper (`TorchShardedStep.around`). Either way FSDP's collectives run between compiled graphs.
    (Launched by the coordinator flags, without torchrun's agent: how the processes started is not checked here.)"""
    results = []
    for extras in (["fsdp", "torch-compile"], ["torch-compile", "fsdp"]):
        out = tmp_path / f"{'-'.join(extras)}.json"
        launched_by_flags("train", "--backend", "torch", *(arg for extra in extras for arg in ("--extra", extra)),
                          *PARALLEL, "--steps", "8", "--measure-only", "--cache-dir", cache_dir, "--out", str(out),
                          timeout=600)
        results.append(json.loads(out.read_text()))
    for result in results:
        assert result["train_step"] == "torch-compiled"
        assert result["train_step_detail"].endswith(", FSDP2 over 2 processes, 3 units gathered once a step")
        assert result["train_step_numerics"]["optimizer_update"].endswith(", each process updating its FSDP shards")
        compiled = result["extras_record"]["torch-compile"]
        assert compiled["graphs_compiled"] >= 3 and compiled["shapes_run_eagerly"] == 0
        assert_half_of_the_state(result["extras_record"]["fsdp"], result["model"]["parameters"])
        # Counted in a steady compiled step: the collectives between the graphs, as the eager step runs them.
        assert result["extras_record"]["fsdp"]["collectives_per_step"] == TORCH_FSDP_COLLECTIVES
    np.testing.assert_allclose(losses(results[0]), losses(results[1]), rtol=1e-5)


@pytest.mark.slow  # 2 processes in float16 on the CPU, beside the session's one-process run (`torch_float16_gpt_run`)
def test_torch_fsdp_scales_float16_losses_as_one_process(tmp_path, cache_dir, torch_float16_gpt_run):
    """Each process unscales and checks its own shards and the processes agree on the verdict (one all-reduce):
    the same scale and losses as one process. No step of this run overflows; an overflow on one process is
    tests/plugins/backends/test_overflow_agreement.py's. (Launched by the coordinator flags, without torchrun's
    agent: how the processes started is not checked here.)"""
    out = tmp_path / "sharded.json"
    launched_by_flags("train", "--backend", "torch", "--extra", "fsdp", *FLOAT16_GPT, "--cache-dir", cache_dir,
                      "--out", str(out), timeout=600)
    sharded, one = json.loads(out.read_text()), torch_float16_gpt_run
    np.testing.assert_allclose(losses(sharded), losses(one), rtol=1e-4)
    assert sharded["loss_scaling"] == one["loss_scaling"] and sharded["loss_scaling"]["initial_scale"] == 32768.0
    assert sharded["host_syncs_per_step"] == 0


DTENSOR_OVERFLOW_PROBE = """
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29533"))
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard
mesh = init_device_mesh("cpu", (1,))
weight = torch.nn.Parameter(distribute_tensor(torch.ones(4, 3), mesh, [Shard(0)]))
weight.grad = distribute_tensor(torch.full((4, 3), 0.5), mesh, [Shard(0)])
optimizer = torch.optim.AdamW([weight], lr=torch.tensor(0.1), fused=True)
for found_inf in (1.0, 0.0):
    optimizer.found_inf = torch.tensor(found_inf)
    optimizer.step()
    print(float(weight.to_local().sum()), float(optimizer.state[weight]["step"]))
dist.destroy_process_group()
"""


def test_the_fused_kernel_skips_fsdps_shards_on_an_overflow():
    """What torch's fsdp step relies on in float16: the fused AdamW over DTensor shards takes a plain verdict tensor
    (`found_inf`), leaves the shards and the step count as they were where it is 1, and updates where it is 0."""
    import socket
    import subprocess
    import sys
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    proc = subprocess.run([sys.executable, "-c", DTENSOR_OVERFLOW_PROBE], capture_output=True, text=True,
                          env={**os.environ, "PORT": port, "CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (skipped, skipped_steps), (updated, updated_steps) = [map(float, line.split()) for line in
                                                          proc.stdout.split("\n")[:2]]
    assert (skipped, skipped_steps) == (12.0, 0.0)
    assert updated < 12.0 and updated_steps == 1.0


