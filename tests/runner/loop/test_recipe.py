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
    ({"clip": "sometimes"}, "model family 'careless-lm' sets {'clip': 'sometimes'}, which mtbench refuses: weight "
                            "decay on 'all', clipping 'sometimes': choose among "),
    ({"warp": 9}, "model family 'careless-lm' sets unknown optimizer settings: warp"),
    ([("clip", "global")], "model family 'careless-lm' gives an optimizer recipe of list, not a dict"),
])
def test_a_familys_refused_recipe_names_the_family(recipe, expected):
    with pytest.raises(MtbenchError) as refused:
        optimizer_recipe(TrainConfig(), 10, family_with(recipe))
    assert str(refused.value).startswith(expected)


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
