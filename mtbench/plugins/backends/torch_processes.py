"""A torch run of several processes: one `torch.distributed` process group (NCCL between GPUs, gloo between
CPUs), one GPU per process (its local rank), and a gloo group beside it for what the hosts agree on, so that
agreeing on a stop never waits for the GPU's queue."""

import datetime

from mtbench import MtbenchError, ProcessGroup


class TorchProcessGroup(ProcessGroup):
    def __init__(self, launch):
        import torch
        import torch.distributed as dist
        super().__init__(launch)
        self.collectives = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            if launch.local_rank >= torch.cuda.device_count():
                raise MtbenchError(f"process {launch.process_id} has local rank {launch.local_rank}, but this "
                                   f"machine has {torch.cuda.device_count()} GPU(s)")
            torch.cuda.set_device(launch.local_rank)
        # Under torchrun the processes meet at the store torchrun's agent already serves on MASTER_PORT.
        init_method = "env://" if launch.launcher == "torchrun" else f"tcp://{launch.coordinator}"
        timeout = datetime.timedelta(seconds=launch.timeout_s)
        try:
            dist.init_process_group(self.collectives, init_method=init_method, rank=launch.process_id,
                                    world_size=launch.num_processes, timeout=timeout)
        except (RuntimeError, ValueError) as error:
            raise MtbenchError(f"process {launch.process_id} of {launch.num_processes} could not join the others "
                               f"at {launch.coordinator}: {str(error).splitlines()[0]}") from None
        self._host_group = dist.new_group(backend="gloo", timeout=timeout) if self.collectives != "gloo" else None

    def any(self, flag):
        import torch
        import torch.distributed as dist
        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self._host_group)
        return bool(value.item())

    def sum(self, values):
        import torch
        import torch.distributed as dist
        total = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self._host_group)
        return total.tolist()

    def barrier(self):
        import torch.distributed as dist
        dist.barrier(group=self._host_group)

    def close(self):
        import torch.distributed as dist
        # Every process leaves together: one that tears its group down and exits while another still holds its
        # connections is how a gloo run can abort at exit after a completed result.
        dist.barrier(group=self._host_group)
        dist.destroy_process_group()
