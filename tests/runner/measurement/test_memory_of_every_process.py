"""A run of several processes writes the device memory of every process's devices: each process reads only its
own (torch one GPU a process), and process 0 writes the result."""

import json
import subprocess
import sys

from conftest import run_joined_probes
from mtbench.plugins.api import Launch, ProcessGroup
from mtbench.runner.measurement.device_memory import largest_peak, training_memory

MIB = 2 ** 20


def test_the_largest_device_of_two_processes_is_the_second_ones_and_every_device_is_listed():
    first, second = run_joined_probes("device_memory_probe.py")
    assert first == second  # every process gathers the same figures; process 0 writes them
    assert first["peak"] == 900 * MIB  # process 1's, not process 0's 400 MiB
    assert first["training"] == {"peak_since": "process start", "per_device": [
        {"device": "NVIDIA H100 80GB HBM3", "index": 0, "peak_bytes": 300 * MIB, "in_use_bytes": 100 * MIB,
         "process": 0},
        {"device": "NVIDIA H100 80GB HBM3", "index": 1, "peak_bytes": 800 * MIB, "in_use_bytes": 100 * MIB,
         "process": 1}]}


class Reported:
    """A backend's report of its devices: two GPUs of one process (JAX), or none (a CPU)."""
    name = "jax"

    def __init__(self, devices):
        self.devices = devices

    def device_memory(self):
        return self.devices

    def peak_device_bytes(self):
        return max(device["peak_bytes"] for device in self.devices) if self.devices else None


def test_one_process_writes_its_devices_as_the_backend_reports_them():
    alone = ProcessGroup(Launch())
    two_gpus = [{"device": "NVIDIA A100-SXM4-80GB", "index": index, "peak_bytes": (index + 1) * MIB,
                 "in_use_bytes": MIB} for index in (0, 1)]
    assert training_memory(Reported(two_gpus), alone) == {"per_device": two_gpus, "peak_since": "process start"}
    assert largest_peak(Reported(two_gpus), alone) == 2 * MIB
    cpu, gpu = {"kind": "cpu", "name": "AMD EPYC 7B13", "count": 1}, {"kind": "gpu", "name": "NVIDIA H100", "count": 1}
    assert training_memory(Reported(None), alone, cpu) == {"per_device": None, "peak_since": "process start",
                                                           "reason": "the CPU's memory is the host's: peak_host_bytes"}
    # An accelerator whose framework keeps no statistics (JAX under XLA_PYTHON_CLIENT_ALLOCATOR=platform).
    assert training_memory(Reported(None), alone, gpu)["reason"] == "jax reports no memory statistics of NVIDIA H100"
    assert largest_peak(Reported(None), alone) is None


def test_the_host_peak_counts_the_memory_of_the_child_processes_still_running():
    """A compile worker holds memory of its own (inductor's warm pool, about 300 MiB): a child that holds 200 MiB
    is in the run's host peak, apart, and out of it once it has ended."""

    from mtbench.plugins.api import peak_host_bytes
    from mtbench.runner.measurement.device_memory import children_held_bytes, host_peaks
    alone = ProcessGroup(Launch())
    earlier = children_held_bytes()  # a test worker's own children (an inductor pool that an earlier test warmed)
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; held = bytearray(200 * 2 ** 20); "
                              "print('held', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        children = children_held_bytes()
        assert children.keys() - earlier.keys() == {child.pid} and children[child.pid] >= 200 * MIB
        own_before = peak_host_bytes()
        memory = host_peaks(alone)
        # (A shared page's share moves as other processes map it: the children's sum is read again, not equal.)
        assert memory["host_child_processes"] == len(children) and memory["host_bytes_children"] >= 200 * MIB
        children_bytes = memory["host_bytes_children"]
        assert own_before + 200 * MIB <= memory["peak_host_bytes"] <= peak_host_bytes() + children_bytes
    finally:
        child.kill()
        child.wait()
    assert child.pid not in children_held_bytes()


def test_a_process_started_by_a_large_one_reports_its_own_peak_not_its_parents():
    """Linux keeps, across the exec of a process's program, the peak resident memory of the process that started
    it: getrusage's ru_maxrss of a small program started here reads at least what this process holds. A run's host
    peak must be its own (mtbench started from a notebook or a test worker holding a GB)."""
    parent_holds = bytearray(400 * MIB)
    parent_holds[::4096] = b"\1" * len(parent_holds[::4096])  # resident, not only reserved
    child = ("import json, resource; from mtbench.plugins.api import peak_host_bytes; "
             "print(json.dumps([peak_host_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]))")
    own, ru_maxrss = json.loads(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                                               check=True).stdout)
    assert ru_maxrss >= 400 * MIB  # the parent's, on the kernels this runs on
    assert own < 200 * MIB  # the child's Python, numpy and mtbench's API: about 60 MiB
    del parent_holds
