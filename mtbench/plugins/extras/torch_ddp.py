"""ddp: mtbench's torch step (eager or compiled) over several processes with torch's DistributedDataParallel,
started by torchrun: `torchrun --nproc-per-node 2 -m mtbench train --backend torch --extra ddp`. Each process
trains on its shard of every global batch; DDP averages the gradients during the backward pass, and the step
weighs each process's loss by its share of the global batch's target tokens (`EagerTorchTrainStep`)."""

from mtbench import Extra, MtbenchError, hookimpl
from mtbench.plugins.extras.fsdp import processes_reason, torch_step_state


class DistributedDataParallel(Extra):
    name = "ddp"
    description = "torch DistributedDataParallel over the run's processes (torchrun; NCCL on GPUs, gloo on CPUs)"
    backends = ("torch",)
    spans_processes = True

    def unavailable_reason(self, run):
        return processes_reason(run)

    def make_train_step(self, run, model, step):
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
        if not isinstance(step, EagerTorchTrainStep):
            raise MtbenchError(f"distributes mtbench's torch step (eager or compiled), not the '{step.name}' step")
        device_ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
        # Gradients are averaged as they are produced, bucket by bucket, overlapping the backward pass.
        step.distribute(run.processes, DDP(model, device_ids=device_ids))
        run.extras_state[self.name] = {"devices": run.processes.world_size, "collectives": run.processes.collectives,
                                       "per_process_batch": run.config.batch_size // run.processes.world_size,
                                       "step": step}
        return step

    def record(self, run):
        record = dict(run.extras_state[self.name])
        # Every process holds the whole state: the parameters, their gradients, the moments (`--extra fsdp`
        # shards them). Apart from it, as the state figure leaves out what a framework adds around the state:
        # DDP's gradient buckets, a second copy of the gradients that DDP all-reduces, held for the whole run
        # (`gradient_as_bucket_view` is off, as DDP leaves it).
        record.update(torch_step_state(record.pop("step")))
        record["gradient_bucket_bytes"] = record["gradient_bytes"]
        return record


@hookimpl
def mtbench_register_extras(register):
    register(DistributedDataParallel())
