"""Memory over every process of a run: the devices', and the host's each process holds. Each process reads only the
devices it computes on (`Backend.device_memory`, `Backend.peak_device_bytes`: torch one GPU a process, JAX its local
devices), while process 0 writes the result: its figures are gathered from every process, so that "the largest
device" is the largest of the run's, the last pipeline stage's (which holds the logits) as well as the first's."""

import os

from mtbench.plugins.api import peak_host_bytes
from mtbench.runner.measurement.gathered import every_process
from mtbench.runner.measurement.load import descendant_pids


def training_memory(backend, processes, run_device=None):
    """The result's `memory.training`, read as training ends: every process's devices (each named with its process
    in a run of several); `per_device` None where a process's framework reports none, with the `reason`.
    `run_device`: the run's `Backend.device_info()`."""
    per_process = every_process(processes, backend.device_memory())
    several = processes.world_size > 1
    per_device = None if None in per_process else [
        {**device, **({"process": rank} if several else {})}
        for rank, devices in enumerate(per_process) for device in devices]
    # Peaks from the process's start on every backend: JAX's allocators keep no other.
    return {"per_device": per_device, "peak_since": "process start",
            **({} if per_device is not None else {"reason": no_device_memory_reason(backend, run_device or {})})}


def no_device_memory_reason(backend, device):
    """Why a run has no device memory figures: a CPU's memory is the host's; an accelerator's framework that reports
    none (JAX's allocator keeps no statistics under XLA_PYTHON_CLIENT_ALLOCATOR=platform) says so."""
    if device.get("kind") == "cpu":
        return "the CPU's memory is the host's: peak_host_bytes"
    return f"{backend.name} reports no memory statistics of {device.get('name') or 'its devices'}"


def largest_peak(backend, processes):
    """The largest device's peak bytes over every process (None where no framework reports one)."""
    peaks = [peak for peak in every_process(processes, backend.peak_device_bytes()) if peak is not None]
    return max(peaks) if peaks else None


def children_held_bytes(proc="/proc"):
    """{pid: proportional resident bytes (Pss)} of each process below this one that still runs: torch.compile's
    compile workers hold memory of their own (JAX compiles in the process), which getrusage counts only once they
    have ended, and then only the largest one's. Pss, not the resident size: the workers are forked from one
    server, and the pages they share with it would count once a worker; Pss counts each shared page in shares, so
    the children's sum counts it once. What they hold now (the kernel keeps no peak of it). Empty where /proc
    lists none (or has no smaps_rollup: Linux before 4.14)."""
    held = {}
    for pid in descendant_pids(os.getpid(), proc):
        try:
            with open(f"{proc}/{pid}/smaps_rollup") as f:
                held.update({pid: int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:")})
        except (OSError, ValueError, IndexError):  # ended meanwhile, or another user's process
            continue
    return held


def host_peaks(processes):
    """The result's host memory: the sum of every process's peak resident memory and what its running child
    processes hold (`children_held_bytes`; one process of several on a CPU holds a share of the run, whose whole a
    one-process run holds; a compile worker's memory is the run's as the process's own compiler's is), the
    children's part apart, and in a run of several each process's, by rank. Every process must call it at the same
    point."""
    held = every_process(processes, [peak_host_bytes(), list(children_held_bytes().values())])
    peaks = [own + sum(children) for own, children in held]
    return {"peak_host_bytes": sum(peaks), "host_child_processes": sum(len(children) for _, children in held),
            "host_bytes_children": sum(sum(children) for _, children in held),
            **({"peak_host_bytes_per_process": peaks} if len(peaks) > 1 else {})}
