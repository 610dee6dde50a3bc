"""A torch run of several processes: one `torch.distributed` process group (NCCL between GPUs, gloo between
CPUs), one GPU per process (its local rank), and a gloo group beside it for what the hosts agree on, so that
agreeing on a stop never waits for the GPU's queue.

A gloo collective's worker thread lets go of the collective after the caller has moved on, taking the GIL when it
frees tensors that Python made; in a process whose interpreter has begun to shut down by then, that aborts
("terminate called without an active exception", exit -6) after a completed run. Where DDP was built on the
process group, its gloo threads outlive `destroy_process_group` and last until the process exits. So each
agreement's collective stays referenced here, to be freed by this thread, and the processes leave together
through the store, leaving no collective in a worker's hands as they exit."""

import datetime
import os
import time

from mtbench import MtbenchError, ProcessGroup


class TorchProcessGroup(ProcessGroup):
    def __init__(self, launch):
        import torch
        import torch.distributed as dist
        super().__init__(launch)
        self.collectives = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            ordinal = launch.device_ordinal(torch.cuda.device_count())
            if ordinal is None:
                raise MtbenchError(f"process {launch.process_id} has local rank {launch.local_rank}, but this "
                                   f"machine has {torch.cuda.device_count()} GPU(s)")
            torch.cuda.set_device(ordinal)
        # Under torchrun the processes meet at the store torchrun's agent already serves on MASTER_PORT; met at
        # --coordinator, process 0 serves it.
        torchrun = launch.launcher == "torchrun"
        init_method = "env://" if torchrun else f"tcp://{launch.coordinator}"
        self._serves_store = not torchrun and launch.process_id == 0
        timeout = datetime.timedelta(seconds=launch.timeout_s)
        try:
            self._store, _, _ = next(dist.rendezvous(init_method, rank=launch.process_id,
                                                     world_size=launch.num_processes, timeout=timeout))
            dist.init_process_group(self.collectives, store=self._store, rank=launch.process_id,
                                    world_size=launch.num_processes, timeout=timeout)
        except (RuntimeError, ValueError) as error:
            raise MtbenchError(f"process {launch.process_id} of {launch.num_processes} could not join the others "
                               f"at {launch.coordinator}: {str(error).splitlines()[0]}") from None
        self._host_group = dist.new_group(backend="gloo", timeout=timeout) if self.collectives != "gloo" else None
        self._last_agreement = None

    def _all_reduce(self, tensor, op):
        import torch.distributed as dist
        self._wait_keeping(dist.all_reduce(tensor, op=op, group=self._host_group, async_op=True))
        return tensor

    def _wait_keeping(self, work):
        work.wait()
        self._last_agreement = work  # freed by this thread, never by gloo's (see the module's docstring)

    def any(self, flag):
        import torch
        import torch.distributed as dist
        value = self._all_reduce(torch.tensor([1 if flag else 0], dtype=torch.int32), dist.ReduceOp.MAX)
        return bool(value.item())

    def sum(self, values):
        import torch
        import torch.distributed as dist
        return self._all_reduce(torch.tensor(values, dtype=torch.float64), dist.ReduceOp.SUM).tolist()

    def barrier(self):
        import torch.distributed as dist
        self._wait_keeping(dist.barrier(group=self._host_group, async_op=True))

    def close(self):
        import torch.distributed as dist
        # Every process leaves together: one that tears its group down and exits while another still holds its
        # connections is how a gloo run can abort at exit after a completed result.
        leave_together(self._store, self.world_size, datetime.timedelta(seconds=self.launch.timeout_s),
                       self._serves_store)
        dist.destroy_process_group()


def leave_together(store, world_size, timeout, serves_store=False):
    """Returns once every one of the `world_size` processes sharing `store` has called it (once each): under
    torchrun, once per start of the processes (its agent's store outlives a restart). The process that serves the
    store returns last, once every other one has had its answer: its exit closes the store, and a process still
    waiting on it would fail at the end of a completed run."""
    keys = f"mtbench/leaving/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if store.add(f"{keys}/arrived", 1) == world_size:
        store.set(f"{keys}/all", "1")
    store.wait([f"{keys}/all"], timeout)
    answered = store.add(f"{keys}/answered", 1)
    if not serves_store:
        return
    # Counted by the store itself, which has sent each process its answer before it counts the next request.
    deadline = time.monotonic() + timeout.total_seconds()
    while answered < world_size and time.monotonic() < deadline:
        time.sleep(0.01)
        answered = store.add(f"{keys}/answered", 0)
