"""A model family's optimizer recipe (`ModelFamily.optimizer_recipe`) is checked as the family's: a value mtbench
refuses names the family, not the user's options."""

import math

import numpy as np
import pytest

from mtbench.errors import MtbenchError
from mtbench.plugins.api import ModelFamily
from mtbench.runner.config import TrainConfig
from mtbench.runner.loop.recipe import optimizer_recipe


def family_with(recipe):
    class Careless(ModelFamily):
        name = "careless-lm"

        def optimizer_recipe(self, config):
            return recipe
    return Careless()


@pytest.mark.parametrize("recipe, expected", [
    ({"clip": "sometimes"}, "model family 'careless-lm' sets {'clip': 'sometimes'}, which mtbench refuses: clip "
                            "'sometimes' is not one of per-variable, global, none"),
    ({"weight_decay": float("nan")}, "model family 'careless-lm' sets {'weight_decay': nan}, which mtbench refuses: "
                                     "weight_decay must be a finite number, not negative, got nan"),
    ({"min_lr_ratio": 2}, "model family 'careless-lm' sets {'min_lr_ratio': 2}, which mtbench refuses: min_lr_ratio "
                          "must be from 0 to 1 (a share of the learning rate), got 2"),
    ({"warp": 9}, "model family 'careless-lm' sets unknown optimizer settings: warp"),
    ([("clip", "global")], "model family 'careless-lm' gives an optimizer recipe of list, not a dict"),
])
def test_a_familys_refused_recipe_names_the_family(recipe, expected):
    with pytest.raises(MtbenchError) as refused:
        optimizer_recipe(TrainConfig(), 10, family_with(recipe))
    assert str(refused.value).startswith(expected)


def test_a_familys_recipe_that_raises_is_named_as_the_familys_failure():
    """Not the bare `RuntimeError: ...` a user would take for mtbench's."""
    class Broken(ModelFamily):
        name = "careless-lm"

        def optimizer_recipe(self, config):
            raise RuntimeError("no recipe today")
    with pytest.raises(MtbenchError) as failed:
        optimizer_recipe(TrainConfig(), 10, Broken())
    assert str(failed.value) == "model 'careless-lm' of plugin '?' failed: RuntimeError: no recipe today"


@pytest.mark.parametrize("option, value, expected", [
    ("weight_decay", -0.1, "--weight-decay must be a finite number, not negative, got -0.1"),
    ("weight_decay", float("nan"), "--weight-decay must be a finite number, not negative, got nan"),
    ("clip_norm", 0.0, "--clip-norm must be a positive finite number, got 0.0"),
    ("clip_norm", float("inf"), "--clip-norm must be a positive finite number, got inf"),
    ("adam_epsilon", float("nan"), "--adam-epsilon must be a positive finite number, got nan"),
    ("adam_beta1", 1.0, "--adam-beta1 must be in [0, 1), got 1.0"),
    ("adam_beta2", float("nan"), "--adam-beta2 must be in [0, 1), got nan"),
    ("weight_decay_on", "biases", "--weight-decay-on 'biases' is not one of all, matrices"),
    ("min_learning_rate", 0.01, "--min-learning-rate must lie between 0 and --learning-rate 0.001, got 0.01"),
    ("min_learning_rate", float("nan"), "--min-learning-rate must lie between 0 and --learning-rate 0.001, got nan"),
    ("lr_decay_steps", 100, "--lr-decay-steps must exceed --warmup-steps 100: the decay begins where the warm-up "
                            "ends, got 100"),
])
def test_an_optimizer_option_adamw_cannot_train_with_is_refused_by_name_when_the_run_is_configured(
        option, value, expected):
    """NaN passed the old check (which only asked `< 0`), and the rest were refused only after the data was read,
    in a message naming three options at once."""
    with pytest.raises(MtbenchError) as refused:
        TrainConfig(**{option: value})
    assert str(refused.value) == expected


def test_the_users_options_go_over_a_familys_good_recipe():
    recipe = optimizer_recipe(TrainConfig(weight_decay=0.3), 10, family_with({"weight_decay": 0.1, "clip": "global"}))
    assert (recipe["weight_decay"], recipe["clip"]) == (0.3, "global")


def test_betas_that_are_one_in_the_weights_16_bit_dtype_are_refused():
    """Keras's AdamW computes in 16-bit weights' dtype on both backends: bfloat16 holds 0.999 as 1.0 (its largest
    value below 1 is 0.99609375), so 1 - beta2^t would be 0 and no weight would move."""
    with pytest.raises(MtbenchError) as refused:
        optimizer_recipe(TrainConfig(dtype="bfloat16", adam_beta2=0.999), 10)
    assert str(refused.value) == (
        "Adam's beta2 0.999 is 1.0 in bfloat16, the dtype of the weights and of Keras's AdamW over them: no weight "
        "would move (give --dtype mixed_bfloat16, or --adam-beta2 of at most 0.996094)")
    assert optimizer_recipe(TrainConfig(dtype="bfloat16", adam_beta2=0.996), 10)["beta_2"] == 0.996
    assert optimizer_recipe(TrainConfig(dtype="float16", adam_beta2=0.999), 10)["beta_2"] == 0.999  # 0.99902 there
    assert optimizer_recipe(TrainConfig(dtype="mixed_bfloat16", adam_beta2=0.999), 10)["beta_2"] == 0.999
    with pytest.raises(MtbenchError, match="^Adam's beta2 0.9999 is 1.0 in float16"):
        optimizer_recipe(TrainConfig(dtype="float16", adam_beta2=0.9999), 10)


@pytest.mark.parametrize("family", [None, "gpt"])  # mtbench's recipe clips each gradient, GPT's all together
def test_clip_none_records_no_clip_norm_and_builds_an_optimizer_that_clips_nothing(family):
    """A run of --clip none recorded the base's or the family's clip_norm 1.0 in `compile_options.optimizer_recipe`,
    as if its gradients had been clipped to it."""
    from conftest import keras_on_jax
    from mtbench.runner.setup import compile_model
    keras = keras_on_jax()
    config = TrainConfig(clip="none", **({"model_name": family} if family else {}))
    recipe = optimizer_recipe(config, 10)
    assert (recipe["clip"], recipe["clip_norm"]) == ("none", None)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    recorded = compile_model(keras, model, config, 10, {})["optimizer_recipe"]
    assert (recorded["clip"], recorded["clip_norm"]) == ("none", None)
    assert model.optimizer.clipnorm is None and model.optimizer.global_clipnorm is None
    clipped = optimizer_recipe(TrainConfig(clip="global"), 10)  # a clipping run still records its norm
    assert (clipped["clip"], clipped["clip_norm"]) == ("global", 1.0)


def nanogpt_learning_rate(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """nanoGPT's `get_lr` (train.py), restated."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


@pytest.mark.parametrize("lr_decay_steps", [None, 30, 59])
def test_the_decay_reaches_the_floor_at_lr_decay_steps_as_nanogpts_lr_decay_iters_and_stays_there(lr_decay_steps):
    """The rate Keras's AdamW reads at each update (its schedule run by keras.ops, here on JAX) is nanoGPT's from
    the end of the warm-up on (the warm-up itself is Keras's, one step later: docs/commands.md), whether the
    decay ends at the last step (the default) or before it, where the floor holds."""
    import keras

    from mtbench.keras_models.schedules import schedule_of_recipe
    steps, warmup = 60, 10
    config = TrainConfig(steps=steps, warmup_steps=warmup, learning_rate=6e-4, min_learning_rate=6e-5,
                         lr_decay_steps=lr_decay_steps)
    schedule = schedule_of_recipe(optimizer_recipe(config, steps))
    applied = [float(keras.ops.convert_to_numpy(schedule(it))) for it in range(steps)]
    decay_iters = steps if lr_decay_steps is None else lr_decay_steps
    expected = [nanogpt_learning_rate(it, 6e-4, 6e-5, warmup, decay_iters) for it in range(steps)]
    np.testing.assert_allclose(applied[warmup:], expected[warmup:], rtol=2e-6)
    at_floor = [it for it in range(warmup, steps) if applied[it] == pytest.approx(6e-5, rel=1e-6)]
    assert at_floor == list(range(decay_iters, steps))
