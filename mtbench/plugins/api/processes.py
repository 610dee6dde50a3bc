"""The processes of one run. A run may be started once per GPU or per machine by a launcher (torchrun, SLURM, or
explicit flags); each process then trains on its shard of every global batch and the backend's collectives
keep the processes in step. `Launch` is where this process stands among them, read before any framework is
imported; `ProcessGroup` is what the backend makes of it (`Backend.start_processes`) and what mtbench asks
of it: agreeing on a stop, and waiting for each other.
"""

import contextlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Launch:
    """How this process was started. `coordinator` is host:port of the service process 0 runs for the others
    (torch.distributed's store, JAX's coordination service)."""
    process_id: int = 0
    num_processes: int = 1
    local_rank: int = 0        # this process's place among the processes of its machine: its GPU
    local_processes: int = 1
    coordinator: str = None
    launcher: str = "single"   # single | torchrun | slurm | flags
    timeout_s: int = 300       # how long a process waits for the others before it stops with an error
    # A directory made for this launch alone that every process reads, all of them on one machine (mtbench's own
    # torchrun, for a compare's run, names one): where they can leave each other what no launcher variable says.
    launch_dir: str = None

    @property
    def is_first(self):
        """Process 0 writes the result, checkpoints and the model, and prints; the others only train."""
        return self.process_id == 0

    def device_ordinal(self, visible_devices=None):
        """The device this process computes on when it has one of its own, as it numbers the devices it sees
        (`visible_devices` of them, where the framework has counted them): its local rank among its machine's, or,
        where SLURM bound each task to a GPU of its own (`--gpus-per-task 1`: one in its CUDA_VISIBLE_DEVICES), that
        one, its local rank notwithstanding. None: it sees too few for its local rank. (torchrun's processes share
        their variables: one GPU named there is one for all of them, which NCCL refuses to share.)"""
        if self.launcher == "slurm" and self.local_rank and visible_devices in (1, None) and _one_gpu_bound():
            return 0
        if visible_devices is not None and self.local_rank >= visible_devices:
            return None
        return self.local_rank


def _one_gpu_bound():
    """Whether the process is held to one GPU by the variables CUDA, HIP and ROCr read (one entry in any)."""
    values = [os.environ.get(name, "").strip()
              for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")]
    return any(value and "," not in value for value in values)


class ProcessGroup:
    """The run's processes as one backend joined them. One process alone is a group of one, whose agreements
    are its own answers; a backend that joins several overrides `any`, `sum` and `barrier` with its collectives
    (`gather_bytes` is built on `sum`)."""
    collectives = None  # the library the processes talk through: 'gloo', 'nccl', ...

    def __init__(self, launch):
        self.launch = launch

    @property
    def rank(self):
        return self.launch.process_id

    @property
    def world_size(self):
        return self.launch.num_processes

    def any(self, flag):
        """True on every process when `flag` is true on any one (a signal one process received, a target one
        process's validation reached): every process must stop after the same step."""
        return bool(flag)

    def sum(self, values):
        """The element-wise sum over every process of `values` (a list of floats, as long on each), on every
        process: figures each process measures of its own devices (the joules of its GPU). Every process must
        call it at the same point."""
        return [float(value) for value in values]

    def gather_bytes(self, data):
        """Every process's `data` (a 1-D numpy uint8 array, as long on each), in process order, on every process:
        what each process alone holds that process 0 writes for all (a checkpoint's random generator states).
        Every process must call it at the same point. Built on `sum`: each process adds its bytes in its own slot
        of zeros, which any float sum keeps exact (whole numbers below 256)."""
        import numpy as np
        data = np.asarray(data, dtype=np.uint8).ravel()
        if self.world_size == 1:
            return [data]
        slots = np.zeros((self.world_size, data.size))
        slots[self.rank] = data
        summed = np.asarray(self.sum(slots.ravel().tolist())).reshape(self.world_size, data.size)
        return [row.astype(np.uint8) for row in summed]

    def barrier(self):
        """Returns once every process has called it."""

    @contextlib.contextmanager
    def alone(self):
        """A context in which this process works on the model by itself while the others go on: process 0
        writes checkpoints and the saved model in it (after `TrainStep.finalize`, which every process calls, has
        made each variable's whole value readable here). Whatever runs inside must start no collective the other
        processes would have to join; a backend whose framework would start one (JAX places each new variable
        over every process's devices, and checks that they agree on its value) turns that off here. The default
        does nothing."""
        yield

    def close(self):
        """Leaves the group at the end of the run."""

    def record(self, devices_per_process):
        """The result's `processes` entry."""
        return {"world_size": self.world_size, "processes": self.world_size,
                "devices_per_process": devices_per_process, "launcher": self.launch.launcher,
                "collectives": self.collectives, "coordinator": self.launch.coordinator}
