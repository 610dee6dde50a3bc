"""Processes that hold different gradients of one model (fsdp's shards, tensor-parallel's parts, pipeline stages)
agree on a float16 overflow: where one process's gradients overflowed, every process skips the update and halves
the loss scale, as one process holding them all would (tests/overflow_agreement_probe.py, two gloo processes).
The runs of those extras in float16 overflow in no step, so this is where the agreement is seen to act."""

import pytest

from conftest import run_joined_probes


@pytest.mark.slow  # two torch processes: 6 s alone, 14 s beside the other worker, which took the quick tier to 5 min
def test_one_processs_overflow_skips_every_processs_update():
    first, second = run_joined_probes("overflow_agreement_probe.py", timeout=300)
    skipped = {"moved": False, "iterations": 0}
    for process in (first, second):
        grouped = process["grouped"]
        assert {key: grouped[key] for key in skipped} == skipped
        assert grouped["scale"] == grouped["scale_before"] / 2
    # Without the group each process judged alone: process 0, whose gradients were finite, updated.
    assert (first["alone"]["moved"], first["alone"]["iterations"]) == (True, 1)
    assert first["alone"]["scale"] == first["alone"]["scale_before"]
    assert (second["alone"]["moved"], second["alone"]["iterations"]) == (False, 0)
    # What the update's record says of the step count the host corrects epsilon by, which a skipped step parts.
    assert first["grouped"]["description"].endswith(
        "the loss scale updated on the device; epsilon's bias correction counts the steps attempted (Keras's the "
        "steps applied: they part after a skipped step)")
