"""DDP's buckets for the data axis of torch's tensor-parallel mesh: which weights share an all-reduce, and that each
all-reduce starts from the backward pass as soon as its gradients are accumulated (while earlier layers' gradients
are still to come), on a one-process gloo group in this process; the four-process 2 x 2 run in
test_tensor_parallel.py checks the averages against one process's training."""

import pytest

import torch
import torch.distributed as dist

from mtbench.plugins.extras.gradient_buckets import GradientBuckets, bucketed  # noqa: E402

KIB = 1024


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def weights_of(*shapes, dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator, dtype=dtype).requires_grad_() for shape in shapes]


def test_buckets_take_the_weights_backwards_a_small_first_bucket_then_larger_ones_one_dtype_each():
    # float32 16 x 16 = 1 KiB; 16 x 64 = 4 KiB.
    first, second, third, fourth, large = weights_of((16, 16), (16, 16), (16, 16), (16, 16), (16, 64))
    half = weights_of((16, 16), dtype=torch.bfloat16)[0]  # 512 bytes
    buckets = bucketed([first, second, half, third, large, fourth], first_bucket_bytes=2 * KIB,
                       bucket_bytes=2 * KIB)
    assert [[id(w) for w in bucket.weights] for bucket in buckets] == [
        [id(fourth)], [id(large)], [id(third), id(second)], [id(first)], [id(half)]]
    assert [bucket.flat.numel() for bucket in buckets] == [256, 1024, 512, 256, 256]
    assert buckets[-1].flat.dtype == torch.bfloat16


def chain_loss(weights, x, whole=lambda weight: weight):
    for weight in weights:
        x = torch.tanh(x @ whole(weight))
    return x.square().sum()


def test_each_all_reduce_starts_in_the_backward_pass_when_its_bucket_is_ready(group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))
    weights = weights_of((16, 16), (16, 16), (16, 16), (16, 16), (16, 16))
    # The third a DTensor split by columns, as tensor-parallel holds a column-split kernel.
    weights[2] = torch.nn.Parameter(distribute_tensor(weights[2].detach(), mesh, [Shard(1)]))
    unused = weights_of((4,))[0]
    x = weights_of((8, 16))[0].detach()

    def loss():
        return chain_loss(weights, x, lambda w: w.redistribute(mesh, [Replicate()]).to_local() if w is weights[2]
                          else w)

    loss().backward()
    expected = [w.grad.full_tensor() if w is weights[2] else w.grad.clone() for w in weights]
    for w in weights:
        w.grad = None

    reducer = GradientBuckets([unused, *weights], group, replicas=1, first_bucket_bytes=KIB,
                              bucket_bytes=2 * KIB)
    # [5th], [4th, 3rd], [2nd, 1st], [unused]
    assert [len(bucket.weights) for bucket in reducer.buckets] == [1, 2, 2, 1]
    loss().backward()
    reducer.finish()
    # The weights' gradients arrive last layer first: the 5th's bucket starts with 4 of the 5 still to come, the
    # 4th and 3rd's with 2, the 2nd and 1st's at the end; the unused weight's when the update waits.
    assert reducer.last_started == [4, 2, 0]
    assert reducer.record() == {"buckets": 4, "bucket_bytes": (5 * 16 * 16 + 4) * 4,
                                "started_before_the_backward_ended": 2}
    for weight, grad in zip(weights, expected):
        got = weight.grad.full_tensor() if weight is weights[2] else weight.grad
        torch.testing.assert_close(got, grad, rtol=0, atol=0)
    torch.testing.assert_close(unused.grad, torch.zeros(4))  # started by finish, nothing from this process

    # The next step counts afresh.
    for w in [*weights, unused]:
        w.grad = None
    loss().backward()
    reducer.finish()
    assert reducer.last_started == [4, 2, 0]


def test_with_micro_batches_the_buckets_wait_for_the_last_ones_gradients(group):
    weights = weights_of((16, 16), (16, 16))
    x = weights_of((8, 16))[0].detach()
    reducer = GradientBuckets(weights, group, replicas=1, arrivals=2, first_bucket_bytes=KIB, bucket_bytes=KIB)
    chain_loss(weights, x[:4]).backward()
    assert reducer.started == []  # the first micro-batch's gradients are only half of the sum
    chain_loss(weights, x[4:]).backward()
    reducer.finish()
    assert reducer.last_started == [1, 0]


def average_on_two_processes(rank, store, out):
    """One of two gloo processes: its own batch's gradients of a 5-layer chain averaged in 3 buckets."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    weights = weights_of((16, 16), (16, 16), (16, 16), (16, 16), (16, 16))
    x = torch.randn((8, 16), generator=torch.Generator().manual_seed(1 + rank))  # each process its own rows
    chain_loss(weights, x).backward()
    own = [weight.grad.clone() for weight in weights]
    for weight in weights:
        weight.grad = None
    reducer = GradientBuckets(weights, dist.group.WORLD, replicas=2, first_bucket_bytes=KIB, bucket_bytes=2 * KIB)
    chain_loss(weights, x).backward()
    reducer.finish()
    torch.save({"own": own, "averaged": [weight.grad for weight in weights], "record": reducer.record()},
               f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


def test_two_processes_end_with_the_mean_of_their_gradients_bucket_by_bucket(tmp_path):
    import torch.multiprocessing as mp
    mp.spawn(average_on_two_processes, args=(tmp_path / "store", tmp_path / "grads"), nprocs=2)
    ranks = [torch.load(tmp_path / f"grads.{rank}") for rank in range(2)]
    assert ranks[0]["record"] == {"buckets": 3, "bucket_bytes": 5 * 16 * 16 * 4, "started_before_the_backward_ended": 2}
    assert not torch.equal(ranks[0]["own"][0], ranks[1]["own"][0])
    for index in range(5):
        mean = (ranks[0]["own"][index] + ranks[1]["own"][index]) / 2
        for rank in ranks:
            torch.testing.assert_close(rank["averaged"][index], mean)
