"""The collectives of torch's data-parallel extras under --grad-accum, counted where they ran (torch's profiler over
gloo, one steady step of two processes): the micro-batches' gradients are averaged over the processes once a step
by ddp, and fsdp gathers each unit once a step and reduce-scatters each micro-batch's gradients, as JAX's fsdp
program does (tests/plugins/extras/test_fsdp_collectives.py); the losses are those of one micro-batch a step."""

import numpy as np
import pytest

from conftest import run_joined_probes

pytestmark = pytest.mark.slow  # two processes that each train the tiny GPT under ddp and fsdp: about 17 s


@pytest.fixture(scope="module")
def reports():
    """Each process's report of the accumulation probe."""
    return run_joined_probes("accumulation_probe.py", timeout=300)


def test_ddp_all_reduces_each_bucket_once_a_step_whatever_the_micro_batches(reports):
    for report in reports:
        ddp = report["ddp"]
        buckets = ddp["1"]["buckets"]
        assert buckets > 1 and ddp["2"]["buckets"] == buckets
        # One micro-batch: each bucket, and the step's token count and figures in one.
        assert ddp["1"]["collectives"] == {"c10d::allreduce_": buckets + 1}
        # Two: each bucket still once (the first micro-batch's backward under `no_sync`), the batch's token count
        # before the micro-batches and the figures after.
        assert ddp["2"]["collectives"] == {"c10d::allreduce_": buckets + 2}
        np.testing.assert_allclose(ddp["2"]["losses"], ddp["1"]["losses"], rtol=1e-5)


def test_fsdp_gathers_each_unit_once_a_step_and_reduce_scatters_each_micro_batch(reports):
    for report in reports:
        fsdp = report["fsdp"]
        units = fsdp["1"]["units"]
        assert units == 3  # the two blocks, and the model for the rest
        one, two = fsdp["1"]["collectives"], fsdp["2"]["collectives"]
        assert one["c10d::_allgather_base_"] == units and one["c10d::_reduce_scatter_base_"] == units
        # Kept gathered from the first micro-batch's backward to the second's forward (FSDP2 alone gathers again).
        assert two["c10d::_allgather_base_"] == units and two["c10d::_reduce_scatter_base_"] == 2 * units
        # The gradients' norm for clipping and the figures: one; with micro-batches the token count before.
        assert two["c10d::allreduce_"] == one["c10d::allreduce_"] + 1
        np.testing.assert_allclose(fsdp["2"]["losses"], fsdp["1"]["losses"], rtol=1e-5)
