"""A failure on purpose, for the tests of how a run survives it; nothing sets it in normal use.

MTBENCH_TEST_NAN_AT_STEP=N fills the first trainable variable with NaN just before step N, so that step's loss is
a real NaN computed by the model and the divergence check sees what a diverging run would show it.
"""

import os

import numpy as np

NAN_AT_STEP_ENV = "MTBENCH_TEST_NAN_AT_STEP"


def nan_step():
    value = os.environ.get(NAN_AT_STEP_ENV)
    return int(value) if value else None


def poison_weights(model):
    variable = model.trainable_variables[0]
    variable.assign(np.full(tuple(variable.shape), np.nan, np.float32))
