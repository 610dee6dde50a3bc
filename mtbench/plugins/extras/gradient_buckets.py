"""DDP's gradient buckets for weights that are not a module's registered parameters: each bucket's gradients are
averaged over a process group by one all-reduce, started from the backward pass as soon as the bucket's last
gradient is accumulated, so that it runs while the backward computes the gradients of the layers below.

`DistributedDataParallel` does this for `nn.Module` parameters; a Keras layer computes with its variables' own
tensors (DTensors, when `tensor-parallel` splits them), which DDP does not see. The buckets follow DDP's defaults:
the weights in reverse order (the order the backward pass reaches them), a first bucket of 1 MiB so that the first
all-reduce starts early, then 25 MiB buckets (`bucket_cap_mb`), one dtype a bucket. Each bucket is a flat buffer
kept from step to step: the gradients are copied into it, summed over the group, divided by the number of
replicas and copied back, as DDP does with `gradient_as_bucket_view=False` (its default).
"""

FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
BUCKET_BYTES = 25 << 20       # DistributedDataParallel's bucket_cap_mb default


def local_part(tensor):
    """This process's part of `tensor`: a DTensor's local tensor, a plain tensor itself."""
    return getattr(tensor, "_local_tensor", tensor)


def as_weight(weight, local):
    """`local` (this process's part) as a tensor laid out as `weight`: a DTensor's local part as such a DTensor."""
    if weight is local_part(weight):
        return local
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(local, weight.device_mesh, weight.placements)


class Bucket:
    """Weights whose gradients are summed in one all-reduce: their flat buffer and their views in it."""

    def __init__(self, weights):
        import torch
        self.weights = weights
        locals_ = [local_part(weight) for weight in weights]
        self.flat = torch.empty(sum(local.numel() for local in locals_), dtype=locals_[0].dtype,
                                device=locals_[0].device)
        self.views, start = [], 0
        for local in locals_:
            self.views.append(self.flat[start:start + local.numel()].view(local.shape))
            start += local.numel()
        self.arrived, self.work = 0, None


def bucketed(weights, first_bucket_bytes, bucket_bytes):
    """`weights` in reverse order, grouped into buckets of one dtype each up to `first_bucket_bytes` for the
    first bucket of a dtype and `bucket_bytes` for the others (a weight larger than the cap is a bucket alone)."""
    buckets, filling = [], {}  # dtype -> (weights, their bytes, the cap)
    for weight in reversed(weights):
        local = local_part(weight)
        size = local.numel() * local.element_size()
        group, held, cap = filling.get(local.dtype, ([], 0, first_bucket_bytes))
        if group and held + size > cap:
            buckets.append(group)
            group, held, cap = [], 0, bucket_bytes
        filling[local.dtype] = (group + [weight], held + size, cap)
    buckets += [group for group, _, _ in filling.values() if group]
    return [Bucket(group) for group in buckets]


class GradientBuckets:
    """Averages the gradients of `weights` (leaf tensors, DTensors among them) over `group`, `replicas` processes:
    each bucket's all-reduce is started by a hook when its last gradient has been accumulated (`arrivals` times a
    step: once, or once per micro-batch), and `finish()`, before the update, waits for them. `last_started` says, for
    the last step, how many gradients were still to come when each all-reduce started from the backward pass (0: at
    its end)."""

    def __init__(self, weights, group, replicas, arrivals=1, first_bucket_bytes=FIRST_BUCKET_BYTES,
                 bucket_bytes=BUCKET_BYTES):
        self.group, self.replicas, self.arrivals = group, replicas, arrivals
        self.buckets = bucketed(list(weights), first_bucket_bytes, bucket_bytes)
        bucket_of = {id(weight): bucket for bucket in self.buckets for weight in bucket.weights}
        self.expected = arrivals * len(bucket_of)
        self.pending, self.started, self.last_started = self.expected, [], []
        for weight in weights:
            weight.register_post_accumulate_grad_hook(
                lambda weight, bucket=bucket_of[id(weight)]: self._arrived(bucket))

    def _arrived(self, bucket):
        self.pending -= 1
        bucket.arrived += 1
        if bucket.arrived == self.arrivals * len(bucket.weights):
            self._start(bucket)

    def _start(self, bucket):
        import torch
        import torch.distributed as dist
        with torch.no_grad():
            for view, weight in zip(bucket.views, bucket.weights):
                if weight.grad is None:  # a weight the loss does not reach: nothing from this process
                    view.zero_()
                else:
                    view.copy_(local_part(weight.grad))
        bucket.work = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        self.started.append(self.pending)

    def finish(self):
        """Waits for every bucket's all-reduce (starting those the backward did not complete) and leaves each
        weight's gradient the mean over the replicas."""
        import torch
        never = self.pending  # gradients of weights the loss did not reach
        # Gradients still to come when each all-reduce started from the backward pass (0: at its end).
        self.last_started = [pending - never for pending in self.started]
        for bucket in self.buckets:
            if bucket.work is None:
                self._start(bucket)
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.flat.div_(self.replicas)
            with torch.no_grad():
                for view, weight in zip(bucket.views, bucket.weights):
                    if weight.grad is None:
                        weight.grad = as_weight(weight, view.clone())
                    else:
                        local_part(weight.grad).copy_(view)
            bucket.arrived, bucket.work = 0, None
        self.started, self.pending = [], self.expected

    def record(self):
        """What the run records: the buckets, the bytes their buffers hold beside the gradients (as DDP's), and how
        many of their all-reduces started before the backward pass had computed every gradient (in the last step)."""
        return {"buckets": len(self.buckets),
                "bucket_bytes": sum(bucket.flat.numel() * bucket.flat.element_size() for bucket in self.buckets),
                "started_before_the_backward_ended": sum(1 for pending in self.last_started if pending > 0)}
