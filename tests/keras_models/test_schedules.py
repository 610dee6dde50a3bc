"""mtbench's learning-rate schedule is Keras's CosineDecay with warm-up, number for number (to float32's last bit,
which XLA's fusion of the two differently shaped programs may round apart), without its branch."""

import numpy as np
import pytest

from conftest import keras_on_jax


@pytest.mark.parametrize("warmup_steps", [0, 1, 7])
def test_warmup_cosine_decay_is_kerass_cosine_decay_at_every_step(warmup_steps):
    import keras

    from mtbench.keras_models.schedules import WarmupCosineDecay
    settings = dict(initial_learning_rate=0.0, decay_steps=20, alpha=0.1, warmup_target=3e-3,
                    warmup_steps=warmup_steps)
    ours, keras_own = WarmupCosineDecay(**settings), keras.optimizers.schedules.CosineDecay(**settings)
    steps = range(0, warmup_steps + 25)  # past the end, where both hold the floor
    ours_values = np.array([float(ours(step)) for step in steps])
    np.testing.assert_allclose(ours_values, [float(keras_own(step)) for step in steps], rtol=2.5e-7, atol=0)
    assert ours_values[-1] == pytest.approx(3e-4) and np.isfinite(ours_values).all()


def test_the_schedule_has_no_branch_in_a_jax_program():
    import jax
    keras = keras_on_jax()
    from mtbench.keras_models.schedules import WarmupCosineDecay
    ours = WarmupCosineDecay(0.0, 20, 0.1, warmup_target=3e-3, warmup_steps=5)
    theirs = keras.optimizers.schedules.CosineDecay(0.0, 20, 0.1, warmup_target=3e-3, warmup_steps=5)
    program = lambda schedule: jax.jit(schedule).lower(jax.numpy.int32(3)).as_text()
    assert "stablehlo.case" not in program(ours) and "stablehlo.case" in program(theirs)
