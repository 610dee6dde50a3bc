"""Where a process stands among a run's processes: read from explicit flags, torchrun's or SLURM's environment,
before any framework is imported."""

import pytest

from mtbench.errors import MtbenchError
from mtbench import Launch
from mtbench.runner.launch import read_launch

TORCHRUN = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}


def test_a_process_started_alone_is_a_run_of_one():
    launch = read_launch(environ={})
    assert (launch.process_id, launch.num_processes, launch.launcher, launch.is_first) == (0, 1, "single", True)


def test_torchrun_environment_places_the_process():
    launch = read_launch(environ=TORCHRUN)
    assert (launch.process_id, launch.num_processes, launch.local_rank, launch.local_processes) == (3, 4, 1, 2)
    assert (launch.coordinator, launch.launcher, launch.is_first) == ("node0:29500", "torchrun", False)
    assert launch.launch_dir is None  # a torchrun a user started: no directory of mtbench's
    assert read_launch(environ={**TORCHRUN, "MTBENCH_LAUNCH_DIR": "/tmp/x"}).launch_dir == "/tmp/x"


def test_slurm_environment_places_the_process():
    launch = read_launch(environ={"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                                  "SLURM_NTASKS_PER_NODE": "1(x2)", "MASTER_ADDR": "n1", "MASTER_PORT": "1234"})
    assert (launch.process_id, launch.num_processes, launch.local_processes, launch.launcher) == (1, 2, 1, "slurm")
    assert launch.coordinator == "n1:1234"


SLURM_TASK_1 = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4",
                "MASTER_ADDR": "n1", "MASTER_PORT": "1234"}


@pytest.mark.parametrize("environ, visible, ordinal", [
    # SLURM's --gpus-per-task 1: each task sees its own GPU alone, as device 0
    ({**SLURM_TASK_1, "CUDA_VISIBLE_DEVICES": "5"}, 1, 0),
    ({**SLURM_TASK_1, "CUDA_VISIBLE_DEVICES": "5"}, None, 0),  # JAX, before it counts its devices
    ({**SLURM_TASK_1, "HIP_VISIBLE_DEVICES": "2"}, 1, 0),
    # every task sees the node's GPUs: its local rank's
    (SLURM_TASK_1, 8, 1),
    ({**SLURM_TASK_1, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4, 1),
    # torchrun's processes share one GPU named for all: NCCL would refuse it, so it is refused first
    ({**TORCHRUN, "CUDA_VISIBLE_DEVICES": "5"}, 1, None),
    (TORCHRUN, 8, 1),
    ({**TORCHRUN, "CUDA_VISIBLE_DEVICES": ""}, None, 1),  # a CPU run of several processes
])
def test_each_process_computes_on_its_own_gpu_where_the_launcher_placed_it(monkeypatch, environ, visible, ordinal):
    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert read_launch(environ=environ).device_ordinal(visible) == ordinal


def test_explicit_flags_win_over_the_environment():
    launch = read_launch("10.0.0.1:5000", 2, 1, environ=TORCHRUN)
    assert (launch.process_id, launch.num_processes, launch.coordinator, launch.launcher) == \
        (1, 2, "10.0.0.1:5000", "flags")


@pytest.mark.parametrize("flags, environ, message", [
    (("h:1", 2, None), {}, "--coordinator, --num-processes and --process-id go together"),
    (("h:1", 2, 2), {}, "process id 2 is not one of 2 processes"),
    ((None, None, None), {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "need the address of process 0"),
    ((None, None, None), {**TORCHRUN, "RANK": "x"}, "RANK='x' is not a number"),
])
def test_an_incomplete_or_inconsistent_launch_is_one_clear_error(flags, environ, message):
    with pytest.raises(MtbenchError, match=message):
        read_launch(*flags, environ=environ)


def test_local_processes_share_the_cores_instead_of_each_taking_all(monkeypatch):
    """XLA's thread pool follows the CPUs a process may run on: each of a machine's processes gets its slice, and
    torch as many threads (over torchrun's OMP_NUM_THREADS=1)."""
    import os

    from mtbench.runner.launch import share_cores
    pinned = {}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.setdefault("cpus", list(cpus)))
    environ = {"OMP_NUM_THREADS": "1"}
    record = share_cores(Launch(process_id=5, num_processes=8, local_rank=1, local_processes=4), environ)
    assert pinned["cpus"] == [2, 3] and environ["OMP_NUM_THREADS"] == "2"
    assert record == {"cpus": [2, 3], "threads": 2, "of_cpus": 8, "local_processes": 4}
    # A process alone on its machine, or more processes than CPUs: nothing is pinned.
    pinned.clear()
    assert share_cores(Launch()) is None and share_cores(Launch(0, 16, 3, 16), {}) is None and not pinned


def test_processes_started_by_the_flags_on_one_machine_count_as_one_machine():
    """Without LOCAL_RANK and LOCAL_WORLD_SIZE each process started by --coordinator learns from the others that
    they share its machine: its local rank (its GPU, its share of the cores) and their count (MFU's peak once), and
    the coordinator's port is free again for the framework's own service."""
    import socket
    from concurrent.futures import ThreadPoolExecutor
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with ThreadPoolExecutor(3) as pool:
        places = list(pool.map(lambda rank: read_launch(f"127.0.0.1:{port}", 3, rank, timeout_s=30, environ={}),
                               [2, 0, 1]))
    assert [(launch.process_id, launch.local_rank, launch.local_processes) for launch in places] == \
        [(2, 2, 3), (0, 0, 3), (1, 1, 3)]
    with socket.socket() as service:  # no SO_REUSEADDR: any socket left on the port would refuse the bind
        service.bind(("", port))
    # A launcher's own word on the machine wins, and a run of one asks nobody.
    told = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert read_launch(f"127.0.0.1:{port}", 2, 1, environ=told).local_processes == 1
    assert read_launch(f"127.0.0.1:{port}", 1, 0, environ={}).local_processes == 1
