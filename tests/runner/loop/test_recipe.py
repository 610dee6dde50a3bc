"""A model family's optimizer recipe (`ModelFamily.optimizer_recipe`) is checked as the family's: a value mtbench
refuses names the family, not the user's options."""

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
