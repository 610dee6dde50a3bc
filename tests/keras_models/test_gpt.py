"""The decoder-only model's dropouts, counted in the program JAX traces for its forward pass."""

import dataclasses
from collections import Counter

import numpy as np
import pytest

from mtbench.keras_models.gpt import build_gpt
from mtbench.keras_models.presets import GPT_PRESETS


def masks_drawn(model, ids, training):
    """{shape: count} of the random bits the forward pass of `ids` draws (one draw a dropout mask)."""
    import jax

    def walk(jaxpr, found):
        for equation in jaxpr.eqns:
            if equation.primitive.name == "random_bits":
                found[tuple(equation.outvars[0].aval.shape)] += 1
            for value in equation.params.values():
                for inner in value if isinstance(value, (list, tuple)) else [value]:
                    inner = getattr(inner, "jaxpr", inner)
                    if hasattr(inner, "eqns"):
                        walk(inner, found)
        return found

    trainable = [variable.value for variable in model.trainable_variables]
    fixed = [variable.value for variable in model.non_trainable_variables]
    traced = jax.make_jaxpr(lambda t, n: model.stateless_call(t, n, ids, training=training)[0])(trainable, fixed)
    return dict(walk(traced.jaxpr, Counter()))


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_it_draws_nanogpts_dropout_masks_attention_probabilities_among_them(dropout):
    """nanoGPT's dropouts while training: the embeddings' and, in each block, the attention probabilities'
    (batch, heads, queries, keys), the attention output's and the MLP output's; none at rate 0 or outside
    training."""
    shape = dataclasses.replace(GPT_PRESETS["tiny"], dropout=dropout)  # 2 blocks, 2 heads, 64 wide
    model = build_gpt(shape)
    ids = np.zeros((3, 16), "int32")
    expected = {(3, 16, 64): 1 + 2 * 2, (3, 2, 16, 16): 2} if dropout else {}
    assert masks_drawn(model, ids, training=True) == expected
    assert masks_drawn(model, ids, training=False) == {}


def test_mfus_flop_count_takes_the_parameters_the_model_holds_and_nanogpts_figures():
    """The FLOPs behind every GPT run's MFU: nanoGPT's 6N + 12·L·d·T a token, N its `get_num_params()` (every
    weight but the position embedding). N is read off the built model here, and GPT-2 small's is the 123.69M
    nanoGPT prints for its 50,304-row vocabulary."""
    from mtbench.keras_models.gpt import non_embedding_parameters, training_flops
    shape = dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32)
    model = build_gpt(shape)
    positions = sum(int(np.prod(w.shape)) for w in model.weights if "position_embedding" in w.path)
    assert positions == 32 * shape.d_model
    assert non_embedding_parameters(shape) == model.count_params() - positions
    small = GPT_PRESETS["gpt2-small"]
    assert non_embedding_parameters(small) == 123_689_472
    # 6 x 123,689,472 + 12 x 12 layers x 768 x 1024 tokens of context, a token; 16 rows of 1024.
    assert training_flops(small, 16, 1024) == 855_383_040 * 16 * 1024
