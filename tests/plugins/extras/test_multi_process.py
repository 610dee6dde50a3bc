"""Several processes train one model (`ddp` on torch, `data-parallel` over jax.distributed on JAX), launched by
torchrun as users launch them: 2 CPU processes, joined through gloo, must train what one process trains on the
same global batches, stop together, and resume together."""

import json
import math
import os
import re
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import (CPU_ONLY, MACHINE_CPUS, TINY_COMPARE, cli_environment, free_coordinator,
                            install_plugin_distribution, json_answer, on_every_core, python_path, run_cli)

RELATIVE_TOLERANCE = 1e-5  # float32 gradients summed in another order by the collectives


def torchrun(*args, env=None, timeout=600, processes=2):
    """Runs `torchrun --nproc-per-node PROCESSES -m mtbench ARGS` on the machine's cores; returns the
    CompletedProcess."""
    from mtbench.runner.launch import LAUNCH_DIR_VARIABLE
    from mtbench.runner.orchestration.children import launcher_command
    # torchrun as compare starts it: this interpreter's module, its agent's folder removed afterwards.
    with tempfile.TemporaryDirectory(prefix="mtbench-torchrun-") as launcher_dir:
        # Its directory named to the processes as compare names it (JAX's leave their coordinator's port there).
        command, env = on_every_core([*launcher_command(processes, launcher_dir=launcher_dir), "-m", "mtbench", *args],
                                     {**CPU_ONLY, LAUNCH_DIR_VARIABLE: launcher_dir, **(env or {})})
        return subprocess.run(command, capture_output=True, text=True, env=cli_environment(env), timeout=timeout)


def launched_by_flags(*args, env=None, timeout=300):
    """Runs `python -m mtbench ARGS` as 2 processes on the machine's cores, launched by --coordinator (a free port),
    --num-processes and --process-id alone, without torchrun (nor its agent, a third process importing torch),
    `env` over their environment; asserts that both exit with 0 and returns process 0's output (process 1 prints
    nothing)."""
    coordinator = free_coordinator()
    started = []
    for rank in (1, 0):
        command, full_env = on_every_core([sys.executable, "-m", "mtbench", *args, "--coordinator", coordinator,
                                           "--num-processes", "2", "--process-id", str(rank)],
                                          {**CPU_ONLY, "LOCAL_RANK": None, "LOCAL_WORLD_SIZE": None, **(env or {})})
        started.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=cli_environment(full_env)))
    outputs = [process.communicate(timeout=timeout) for process in started]
    assert [process.returncode for process in started] == [0, 0], "".join(err[-2000:] for _, err in outputs)
    return outputs[1][0]


CPUS = MACHINE_CPUS
# Process 0's half of the machine's cores, by hand: the first half of them, one thread each.
FIRST_HALF = {"cpus": CPUS[:len(CPUS) // 2], "threads": len(CPUS) // 2, "of_cpus": len(CPUS),
              "local_processes": 2} if CPUS and len(CPUS) >= 2 else None


def assert_same_losses(history, reference):
    assert [h["step"] for h in history] == [h["step"] for h in reference]
    assert [h["tokens"] for h in history] == [h["tokens"] for h in reference]  # the global batches
    for got, want in zip(history, reference):
        assert got["loss"] == pytest.approx(want["loss"], rel=RELATIVE_TOLERANCE), got["step"]


@pytest.mark.slow
@pytest.mark.parametrize("backend, extra, kept, train_step", [
    ("torch", "ddp", {"per_process_batch": 16}, "torch-eager"),
    # Process 0 writes the checkpoint of step 30 alone, under a distribution over both processes' devices (Keras's
    # save_weights creates variables, which JAX would place with a collective the other process never joins).
    ("jax", "data-parallel", {"processes": 2, "mesh_shape": [2]}, "jax-jit-stateless"),
], ids=["torch-ddp", "jax-data-parallel"])
def test_a_killed_process_stops_the_run_which_resumes_to_the_losses_of_one_process(backend, extra, kept, train_step,
                                                                                   cpu_compared_runs, cache_dir, tmp_path):
    out = tmp_path / f"{backend}-2.json"
    proc = torchrun("train", "--backend", backend, "--extra", extra, *TINY_COMPARE, "--checkpoint-every", "15",
                    "--process-timeout", "60", "--cache-dir", cache_dir, "--out", str(out),
                    env={"MTBENCH_TEST_KILL_AT": "1:22"}, timeout=300)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    # The survivor says why it stopped; torchrun names the process that died first.
    assert "process 0 of 2: stopped, as the run's other processes cannot be reached" in output \
        or "rank      : 0" in output, output[-3000:]
    # torchrun's report lists each failed process; which one it calls the root cause is a race between the
    # killed process and the survivor, which now exits as soon as its collective fails.
    report = output[output.index("mtbench FAILED"):]
    assert re.search(r"rank +: 1 \(local_rank: 1\)\n +exitcode +: -9 .*\(SIGKILL\)", report), output[-3000:]
    assert sorted(os.listdir(tmp_path / f"{backend}-2.run")) == ["checkpoint-000015", "run.json", "tokenizer"]
    assert not out.exists()  # torchrun ended the survivor (SIGTERM, then SIGKILL) before a partial result

    # Resumed under a torchrun a user starts (no directory of mtbench's): JAX's processes meet through its store.
    proc = torchrun("train", "--resume", str(tmp_path / f"{backend}-2.run"), timeout=300,
                    env={"MTBENCH_LAUNCH_DIR": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["status"] == "completed" and result["timing"]["resumed_at_steps"] == [16]
    # Every step, the killed run's and the resumed one's, across the checkpoint at step 15 that process 0 wrote alone
    # while the other went on: the losses of one process on the same global batches.
    assert_same_losses(result["history"], cpu_compared_runs[backend]["result"]["history"])
    assert result["processes"] == {"world_size": 2, "processes": 2, "devices_per_process": 1,
                                   "launcher": "torchrun", "collectives": "gloo",
                                   "coordinator": result["processes"]["coordinator"], "spanned_by": [extra],
                                   **({"coordinator_port_from": "torchrun's store (torch imported)"}
                                      if backend == "jax" else {}),
                                   # Process 0's half of the cores: its framework's thread pool follows it.
                                   "cpu_share": FIRST_HALF, "machines": 1}
    assert kept.items() <= result["extras_record"][extra].items()
    # What a run of the other backend must share to be held against this one (`report.same_way_of_training`).
    assert result["way_of_training"] == {"parallelism": ["data"], "extras": []}
    # On JAX mtbench's jit step over the two processes' mesh, as one process trains with (not train_on_batch).
    assert result["train_step"] == train_step
    # The batch's arrays (on JAX named by the guard under jax.distributed by their global shape) are no host wait.
    assert result["host_syncs_per_step"] == 0, result["host_syncs"]
    # Process 0 alone prints the table and writes: one result, one run directory.
    assert proc.stdout.count("result: ") == 1 and proc.stdout.count("tokens/s") == 1
    assert "(2 devices over 2 processes)" in proc.stdout  # each process sees its own share of the machine
    assert sorted(os.listdir(tmp_path)) == [f"{backend}-2.{end}" for end in ("hyp.txt", "json", "ref.txt", "run")]
    # Every process evaluates the same weights; process 0's figures are those of one process's weights.
    one = cpu_compared_runs[backend]["result"]["metrics"]
    assert result["metrics"]["test_loss"] == pytest.approx(one["test_loss"], rel=1e-4)
    assert result["metrics"]["bleu"] is not None
    cache = result["timing"]["compile_cache"]
    if backend == "jax":
        # Process 0 loads every program the killed run kept: each of its misses is a program that run never
        # reached (the evaluation after training; in a whole suite, another test's run may have cached it), which
        # it writes anew; the cache, which the suite's other runs share, grows by at least as many. JAX kept none
        # of process 1's (it writes from process 0 alone, keyed by the compiling process's devices), so process 1
        # compiled them all again: the run's programs are partly warm.
        assert cache["hits"] > 0 and cache["misses"] <= cache["entries_after"] - cache["entries_before"], cache
        assert cache["every_process"]["processes"] == 2 and cache["every_process"]["misses"] > 0, cache
        assert cache["programs"] == "partly warm"
    else:  # torch's eager step compiles nothing
        assert cache["state"] == "off" and cache["every_process"] is None and cache["programs"] is None, cache
    if extra == "ddp":  # each process holds the whole state, and DDP's buckets hold the gradients a second time
        record, parameters = result["extras_record"]["ddp"], result["model"]["parameters"]
        assert record["parameter_bytes"] == record["gradient_bytes"] == record["gradient_bucket_bytes"] == \
            parameters * 4
        # The tiny model's 0.6 MB of gradients fit DDP's first bucket (1 MB): one all-reduced bucket a step.
        assert record["gradient_buckets"] == 1
        # What a step dispatched, as torch's profiler saw it: each bucket's all-reduce, and one of the global batch's
        # token count; not the bucket order DDP broadcasts once, as it lays them out again in the second step.
        assert record["collectives_per_step"] == {"all-reduce": record["gradient_buckets"] + 1}
        assert record["state_bytes"] == sum(record[key] for key in ("parameter_bytes", "gradient_bytes",
                                                                     "optimizer_state_bytes"))
    assert sorted(os.listdir(tmp_path / f"{backend}-2.run")) == ["checkpoint-000015", "checkpoint-000030", "model",
                                                                 "run.json", "tokenizer"]


SECOND_OF_TWO = """
import json, os
from mtbench.plugins.api import Launch
from mtbench.runner.launch import share_cores
record = share_cores(Launch(local_rank=1, local_processes=2))
import torch
print(json.dumps({"record": record, "cpus": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}))
"""


@pytest.mark.skipif(not CPUS or len(CPUS) < 2, reason="needs at least 2 CPUs to share")
def test_the_second_of_two_local_processes_runs_on_the_second_half_of_the_cores_with_as_many_threads():
    command, env = on_every_core([sys.executable, "-c", SECOND_OF_TWO])
    proc = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120, env=cli_environment(env))
    got = json_answer(proc)
    half = len(CPUS) // 2
    assert got["cpus"] == CPUS[half:2 * half] and got["threads"] == half  # what torch's intra-op pool got
    assert got["record"] == {"cpus": got["cpus"], "threads": half, "of_cpus": len(CPUS), "local_processes": 2}


@pytest.mark.parametrize("args, message", [
    (["--backend", "torch"], "2 processes were launched, but no extra of this run trains one model over them "
                             "(--extra ddp or --extra fsdp or --extra tensor-parallel or --extra pipeline-parallel); "
                             "without one each process would train its own"),
    (["--backend", "jax", "--extra", "data-parallel", "--batch-size", "33"],
     "the batch size 33 does not split evenly over 2 processes"),
])
def test_a_launch_without_one_model_over_its_processes_is_refused(cache_dir, tmp_path, args, message):
    proc = torchrun("train", *args, "--preset", "tiny", "--steps", "2", "--cache-dir", cache_dir,
                    "--out", str(tmp_path / "r.json"), timeout=120)
    assert proc.returncode != 0
    # Every process refuses; torchrun ends the others as soon as one has exited, so whichever refused first says so.
    assert re.search(rf"^Error: process [01] of 2: {re.escape(message)}$", proc.stderr, re.MULTILINE), proc.stderr
    assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_ddp_in_one_process_says_how_to_launch_several(cache_dir, tmp_path):
    proc = run_cli("train", "--backend", "torch", "--extra", "ddp", "--preset", "tiny", "--steps", "2",
                   "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "Error: extra 'ddp' cannot run here: needs at least 2 processes; this run has 1 (start mtbench with "
        "torchrun --nproc-per-node N -m mtbench train ...)")


# 2 processes profiling their steps, with dropout (`profiled_run`).
PROFILED = ["--model", "gpt", "--preset", "tiny", "--block-size", "16", "--batch-size", "8", "--steps", "8",
            "--dropout", "0.1", "--profile", "2", "--measure-only"]


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory, cache_dir):
    """(result, process 0's output) of PROFILED's run of a backend and its extra over 2 processes, made when a test
    first asks for that backend's. torch's is launched by the coordinator flags alone (no torchrun agent): the
    test of that launch reads the same run, whose profile is no matter to it; JAX's by torchrun."""
    made = {}

    def run(backend, extra):
        if backend not in made:
            out = tmp_path_factory.mktemp(f"{backend}-profiled") / "profiled.json"
            arguments = ["train", "--backend", backend, "--extra", extra, *PROFILED, "--cache-dir", cache_dir,
                         "--out", str(out)]
            if backend == "torch":
                stdout = launched_by_flags(*arguments)
            else:
                proc = torchrun(*arguments, timeout=300)
                assert proc.returncode == 0, proc.stderr[-3000:]
                stdout = proc.stdout
            made[backend] = (json.loads(out.read_text()), stdout)
        return made[backend]
    return run


@pytest.mark.slow
@pytest.mark.parametrize("backend, extra", [("torch", "ddp"), ("jax", "data-parallel")])
def test_every_process_reads_its_own_trace_and_process_0s_result_holds_each_ones_busy_time(backend, extra,
                                                                                           profiled_run):
    """Each process profiles its own steps, with dropout: Keras lays each dropout seed over every process's devices
    from an array of one device, which JAX gave each process as its one shard and then refused to list at the first
    timing window (every multi-process JAX run with dropout stopped there until the step made such values whole)."""
    from mtbench.plugins.backends.jax_profiler import JaxStepProfiler
    from mtbench.plugins.backends.torch_profiler import TorchStepProfiler
    result, stdout = profiled_run(backend, extra)
    assert result["model"]["attention"]["arithmetic"]["probability_dropout"] == 0.1
    assert len(result["history"]) == 8 and all(math.isfinite(h["loss"]) for h in result["history"])
    # The machine's load tells the run's two processes' CPU time from other processes' (machine_load_probe.py).
    load = result["machine_load"]
    assert load["run_processes_cpu_s"] > 0 and 0 <= load["other_processes_percent"] <= 100, load
    profile = result["profile"]
    operations = profile["operations"]
    assert profile["directory"].endswith("process-0")
    busy = operations["processes_busy_s"]
    assert len(busy) == 2 and busy[0] == pytest.approx(operations["busy_s"], rel=1e-6)
    # Process 1's figure is its own trace's, read here from its folder beside process 0's.
    second = os.path.join(os.path.dirname(profile["directory"]), "process-1")
    reader = TorchStepProfiler(second) if backend == "torch" else JaxStepProfiler(second)
    reader.files = [os.path.join(root, name) for root, _, names in os.walk(second) for name in names]
    assert busy[1] == pytest.approx(reader.operations()["busy_s"], rel=1e-6) and busy[1] != busy[0]
    per_step = [seconds / len(profile["steps"]) * 1e3 for seconds in busy]
    assert f"the 2 processes' {min(per_step):.1f} (process {per_step.index(min(per_step))}) to {max(per_step):.1f} ms" \
        in stdout


DROPOUT_PROBE = '''
import json, os
from mtbench import Extra, hookimpl


class DropoutStreams(Extra):
    name = "dropout-streams"
    description = ("writes the mask a dropout layer draws next in each process, once the step is made; process 1 "
                   "also touches 512 MiB of host memory (a probe)")
    backends = ("torch",)

    def verify(self, run, model, batch):
        import keras
        import numpy as np
        if run.processes.rank == 1:
            np.ones(512 << 20, np.uint8)  # freed at once, but in the process's peak resident memory
        kept = keras.layers.Dropout(0.5)(np.ones(512, "float32"), training=True)
        with open(os.path.join(os.environ["DROPOUT_STREAMS"], f"{run.processes.rank}.json"), "w") as f:
            json.dump((keras.ops.convert_to_numpy(kept) > 0).tolist(), f)


@hookimpl
def mtbench_register_extras(register):
    register(DropoutStreams())
'''


def dropout_streams_probe(directory):
    """The environment of a run that loads DROPOUT_PROBE (installed under `directory`), and the folder it writes
    each process's mask to."""
    site, streams = directory / "site", directory / "streams"
    install_plugin_distribution(site, "mtbench_dropout_streams", "dropout_streams", "mtbench_dropout_streams")
    streams.mkdir()
    (site / "mtbench_dropout_streams.py").write_text(DROPOUT_PROBE)
    return {"PYTHONPATH": python_path(site), "MTBENCH_LOAD_PLUGINS": "mtbench_dropout_streams",
            "DROPOUT_STREAMS": str(streams)}, streams


# The tiny GPT with dropout, for the dropout probe's runs.
DROPPING_GPT = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "8", "--valid-size", "10",
                "--test-size", "10", "--dtype", "float32", "--dropout", "0.1", "--measure-only"]


@pytest.fixture(scope="module")
def resumed_ddp_dropout_run(tmp_path_factory, cache_dir):
    """DDP over 2 processes (torchrun) with dropout and the dropout probe, stopped by a NaN at step 6 with steps 1
    to 5 trained and a checkpoint after step 3, then resumed: the stopped run (its process, result and masks, and
    the generator states of its checkpoint, read before the resumed run writes) and the resumed one (its process
    and result). --measure-only (which the resumed run keeps): the checks read the losses, checkpoints, masks and
    host memory, not the evaluation."""
    import numpy as np
    directory = tmp_path_factory.mktemp("ddp-dropout")
    env, streams = dropout_streams_probe(directory)
    out = directory / "r.json"
    stopping = torchrun("train", "--backend", "torch", "--extra", "ddp", "--extra", "dropout-streams", *DROPPING_GPT,
                        "--steps", "8", "--checkpoint-every", "3", "--cache-dir", cache_dir, "--out", str(out),
                        env={**env, "MTBENCH_TEST_NAN_AT_STEP": "6"})
    assert stopping.returncode != 0 and "the loss is nan at step 6" in stopping.stderr, stopping.stderr[-3000:]
    masks = [json.loads((streams / f"{rank}.json").read_text()) for rank in (0, 1)]
    with np.load(directory / "r.run" / "checkpoint-000003" / "generator_state.npz") as saved:
        generators = {name: saved[name] for name in saved.files}
    stopped = json.loads(out.read_text())
    resuming = torchrun("train", "--resume", str(directory / "r.run"), env=env)
    assert resuming.returncode == 0, resuming.stderr[-3000:]
    return {"stopped": stopped, "masks": masks, "generators": generators, "resuming": resuming,
            "resumed": json.loads(out.read_text())}


def assert_process_1_held_512_mib_more(memory):
    """The run's host memory is both processes': process 1's peak holds the 512 MiB the dropout probe touched."""
    process_0, process_1 = memory["peak_host_bytes_per_process"]
    # (process 1 touched them early, at about 400 MB; process 0 may grow later, as it trains and writes)
    assert process_1 > (512 + 200) << 20 and process_1 - process_0 > 200 << 20 and process_0 > 100 << 20
    assert memory["peak_host_bytes"] == process_0 + process_1


@pytest.mark.slow
@pytest.mark.parametrize("extra, alike", [("ddp", False), ("tensor-parallel", True)])
def test_torch_replicas_drop_their_rows_with_masks_of_their_own_and_a_model_axis_alike(tmp_path, cache_dir, extra,
                                                                                       alike, request):
    """Keras's dropout on torch draws from torch's generator, which every process seeds alike. Each data replica
    (ddp's processes) moves it on by its index, as each shard of JAX's data-parallel step draws its own masks;
    the processes of a model axis (tensor-parallel's) keep one stream, as they must drop the activations each holds
    whole alike. What a dropout layer draws next in each process, once the step is made: two masks of 512. The
    result's host memory is each process's, process 1's 512 MiB larger. ddp's are the first run of
    `resumed_ddp_dropout_run` (the probe draws before the resumed run puts the checkpoint's generators back);
    tensor-parallel's is a run of its own, launched by the coordinator flags (no torchrun agent)."""
    if extra == "ddp":
        run = request.getfixturevalue("resumed_ddp_dropout_run")
        (first, second), memory = run["masks"], run["stopped"]["memory"]
    else:
        env, streams = dropout_streams_probe(tmp_path)
        launched_by_flags("train", "--backend", "torch", "--extra", extra, "--extra", "dropout-streams",
                          *DROPPING_GPT, "--steps", "2", "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"),
                          env=env)
        first, second = (json.loads((streams / f"{rank}.json").read_text()) for rank in (0, 1))
        memory = json.loads((tmp_path / "r.json").read_text())["memory"]
    assert 150 < sum(first) < 350 and 150 < sum(second) < 350  # a mask at 0.5 each
    assert (first == second) is alike
    assert_process_1_held_512_mib_more(memory)


@pytest.mark.slow
def test_a_resumed_ddp_run_with_dropout_draws_each_replicas_masks_on_from_the_checkpoint(resumed_ddp_dropout_run):
    """Each replica's generator differs, so the checkpoint keeps both, and each process of the resumed run draws
    on from its own. A NaN at step 6 stops the run with steps 1 to 5 trained and a checkpoint after step 3: the
    resumed run trains steps 4 and 5 again with the masks they had (a fresh generator's would differ)."""
    import numpy as np
    generators = resumed_ddp_dropout_run["generators"]
    assert sorted(generators) == ["process_0", "process_1"]
    assert not np.array_equal(generators["process_0"], generators["process_1"])
    proc = resumed_ddp_dropout_run["resuming"]
    assert "the random generators start afresh" not in proc.stdout + proc.stderr
    result, stopped = resumed_ddp_dropout_run["resumed"], resumed_ddp_dropout_run["stopped"]
    assert result["timing"]["resumed_at_steps"] == [4]
    for got, want in zip(result["history"][3:5], stopped["history"][3:5]):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), got["step"]


@pytest.mark.parametrize("as_view", [False, True])
def test_ddps_gradient_buckets_are_counted_as_its_reducer_allocated_them(tmp_path, as_view):
    """A second copy of the gradients, over several buckets (`bucket_cap_mb`), unless the gradients are views into
    them; the buckets counted are those the reducer rebuilt after the first backward pass, each all-reduced once in
    the third (torch's profiler), not the one bucket it first put every gradient in."""
    import collections

    import torch
    import torch.distributed as dist
    from torch.profiler import profile

    from mtbench.plugins.extras.torch_ddp import gradient_bucket_bytes, gradient_buckets
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(300, 500), torch.nn.Linear(500, 300))
        distributed = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.5,
                                                                gradient_as_bucket_view=as_view)
        for _ in range(2):  # the reducer rebuilds its buckets in the second step and logs them in the third
            distributed(torch.randn(4, 300)).sum().backward()
        with profile() as trace:
            distributed(torch.randn(4, 300)).sum().backward()
        counted, buckets = gradient_bucket_bytes(distributed), gradient_buckets(distributed)
    finally:
        dist.destroy_process_group()
    assert counted == (0 if as_view else (300 * 500 + 500 + 500 * 300 + 300) * 4)
    all_reduces = collections.Counter(event.name for event in trace.events())["c10d::allreduce_"]
    assert len(buckets) == all_reduces == 2 and sum(buckets) == (300 * 500 + 500 + 500 * 300 + 300) * 4


@pytest.mark.slow
@pytest.mark.skipif(not FIRST_HALF, reason="needs at least 2 CPUs to share")
def test_processes_started_by_the_coordinator_flags_on_one_machine_share_it_and_ddp_says_how_it_reduced(profiled_run):
    """Two processes given --coordinator, --num-processes and --process-id alone (no LOCAL_RANK): one machine, its
    cores shared out, MFU over one machine's peak; and DDP's step says what it all-reduced, as fsdp's does. (The
    profiled torch run, launched so: its dropout and profile change none of this.)"""
    result, _ = profiled_run("torch", "ddp")
    assert result["processes"]["launcher"] == "flags"
    assert result["processes"]["machines"] == 1 and result["processes"]["cpu_share"] == FIRST_HALF
    assert result["utilization"]["peak_devices"] == 1
    # The tiny GPT's 459 KiB of float32 gradients (a block of 16) fit DDP's first bucket (1 MiB).
    assert result["train_step"] == "torch-eager"
    assert result["train_step_detail"].startswith("DDP over 2 processes, float32 gradients all-reduced in 1 bucket "
                                                  f"({result['model']['parameters'] * 4 / 1024:.3g} KiB")
