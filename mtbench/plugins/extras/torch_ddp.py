"""ddp: mtbench's torch step (eager or compiled) over several processes with torch's DistributedDataParallel,
started by torchrun: `torchrun --nproc-per-node 2 -m mtbench train --backend torch --extra ddp`. Each process
trains on its shard of every global batch; DDP averages the gradients during the backward pass, and the step
weighs each process's loss by its share of the global batch's target tokens (`EagerTorchTrainStep`)."""

from mtbench import Extra, MtbenchError, WrappingStep, hookimpl
from mtbench.plugins.extras.dispatched_collectives import ProfiledCall, dispatched_counts
from mtbench.plugins.extras.fsdp import processes_reason, torch_step_state


class DistributedDataParallel(Extra):
    name = "ddp"
    description = "torch DistributedDataParallel over the run's processes (torchrun; NCCL on GPUs, gloo on CPUs)"
    backends = ("torch",)
    spans_processes = True
    parallelism = "data"

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
        distributed = DDP(model, device_ids=device_ids)
        step.distribute(run.processes, distributed)
        run.extras_state[self.name] = {"devices": run.processes.world_size, "collectives": run.processes.collectives,
                                       "per_process_batch": run.config.batch_size // run.processes.world_size,
                                       "step": step, "ddp": distributed}
        return DistributedStep(step, distributed, run.processes.world_size, run.extras_state[self.name])

    def record(self, run):
        record = dict(run.extras_state[self.name])
        # Every process holds the whole state: the parameters, their gradients, the moments (`--extra fsdp`
        # shards them). Apart from it, as the state figure leaves out what a framework adds around the state:
        # DDP's gradient buckets, which it all-reduces, held for the whole run.
        distributed = record.pop("ddp")
        record["gradient_bucket_bytes"] = gradient_bucket_bytes(distributed)
        record["gradient_buckets"] = len(gradient_buckets(distributed) or ()) or None
        record.update(torch_step_state(record.pop("step")))
        return record


class DistributedStep(WrappingStep):
    """mtbench's torch step under DDP, which says so in the step's description, as fsdp's and JAX's data-parallel
    steps do, and records the collectives one step dispatched (`collectives_per_step`: DDP's bucket all-reduces and
    the step's own, the global batch's token count) in `record`; everything else is the wrapped step's."""

    def __init__(self, inner, distributed, processes, record):
        super().__init__(inner)
        self.distributed, self.processes_count, self.record = distributed, processes, record
        # At least the second call: DDP lays its buckets out again in the second step's forward, and all-reduces
        # them so from then on. The bucket order it broadcasts there is no step's.
        self.profiled = ProfiledCall(inner, at_least=2, once=("_rebuild_buckets",))

    def __call__(self, x, y, sample_weight):
        logs, ran = self.profiled(lambda: self.inner(x, y, sample_weight))
        if ran is not None:
            self.record["collectives_per_step"] = dispatched_counts(ran)
        return logs

    def __getattr__(self, name):  # what a later extra reads of mtbench's torch step (its processes, optimizer)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def around(self, step):
        """`step`, the compiled step `torch-compile` makes when given after this extra, over the same DDP wrapper
        (a second would reduce every gradient twice)."""
        step.share_distribution(self.inner)
        return DistributedStep(step, self.distributed, self.processes_count, self.record)

    def description(self):
        return ", ".join(part for part in (self.inner.description(),
                                           ddp_text(self.distributed, self.processes_count)) if part)


def ddp_text(distributed, processes):
    """'DDP over 2 processes, float32 gradients all-reduced in 1 bucket (463 KiB; at most 25 MiB each)': the buckets
    as the reducer last made them (rebuilt in the second step)."""
    dtypes = sorted({str(parameter.dtype).replace("torch.", "") for parameter in distributed.module.parameters()
                     if parameter.requires_grad})
    text = f"DDP over {processes} process{'es' * (processes != 1)}, {'/'.join(dtypes)} gradients all-reduced"
    sizes = gradient_buckets(distributed)
    if sizes is None:
        return text
    cap = getattr(distributed, "bucket_bytes_cap", None)
    limit = f"; at most {_bytes_text(cap)} each" if cap else ""
    return (f"{text} in {len(sizes)} bucket{'s' * (len(sizes) != 1)} "
            f"({', '.join(_bytes_text(size) for size in sizes)}{limit})")


def _bytes_text(count):
    return f"{count / 2 ** 20:.3g} MiB" if count >= 2 ** 20 else f"{count / 2 ** 10:.3g} KiB"


def gradient_buckets(distributed):
    """The byte sizes of DDP's gradient buckets, which it all-reduces one by one, from its reducer's own logging data
    (a prototype interface): as the reducer rebuilt them in the second step (in the order the gradients became
    ready, at most `bucket_cap_mb` each) and logged them from the third; before that, as it first assigned them (one
    bucket where it looks for no unused parameters). None where this torch does not say."""
    try:
        logged = distributed._get_ddp_logging_data()
        listed = logged.get("rebuilt_bucket_sizes") or logged["bucket_sizes"]
        return [int(size) for size in str(listed).split(",") if size.strip()]
    except (AttributeError, KeyError, ValueError):
        return None


def gradient_bucket_bytes(distributed):
    """The bytes of DDP's gradient buckets as its reducer allocated them: a second copy of the gradients, unless
    `gradient_as_bucket_view` makes the gradients views into them (0 bytes more). None where this torch does not
    say."""
    sizes = gradient_buckets(distributed)
    if sizes is None:
        return None
    return 0 if distributed._get_ddp_logging_data().get("gradient_as_bucket_view") else sum(sizes)


@hookimpl
def mtbench_register_extras(register):
    register(DistributedDataParallel())
