"""A failure on purpose, for the tests of how a run survives it; nothing sets it in normal use.

MTBENCH_TEST_NAN_AT_STEP=N hands step N token weights of NaN, so that the train step itself computes a NaN loss
(and NaN gradients) and the divergence check sees what a diverging run would show it. Only the batch is touched:
the train step is called exactly as in a run that diverges on its own (no `finalize` of its own for the test).

MTBENCH_TEST_KILL_AT=P:N kills process P of a run of several (SIGKILL, as the kernel's OOM killer or a lost
machine would) just before step N, so that the others meet a process that is gone.
"""

import dataclasses
import os
import signal

import numpy as np

NAN_AT_STEP_ENV = "MTBENCH_TEST_NAN_AT_STEP"
KILL_AT_ENV = "MTBENCH_TEST_KILL_AT"


def nan_step():
    value = os.environ.get(NAN_AT_STEP_ENV)
    return int(value) if value else None


def poisoned(batch):
    """`batch` with every token weight NaN."""
    return dataclasses.replace(batch, weight=np.full_like(batch.weight, np.nan))


def kill_step(rank):
    """The step before which process `rank` dies, or None."""
    process, _, step = os.environ.get(KILL_AT_ENV, "").partition(":")
    return int(step) if step and int(process) == rank else None


def die():
    os.kill(os.getpid(), signal.SIGKILL)
