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
