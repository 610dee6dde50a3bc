"""--init's schemes, each drawn as its users' framework would start the layer, checked against the formulas written
out here: GPT-2's paper and nanoGPT (normal 0.02, residual projections 0.02 / sqrt(branches)), torch.nn.Linear's
`reset_parameters` (kaiming_uniform with a = sqrt(5): bound 1 / sqrt(fan_in), the bias alike), torch.nn.Embedding
(normal 0, 1), Flax's `lecun_normal` (variance 1 / fan_in, truncated at 2 sigma) and `nn.Embed` (variance 1 /
features), and Glorot's uniform bound sqrt(6 / (fan_in + fan_out))."""

import math

import numpy as np
import pytest

from mtbench.keras_models.initialization import INIT_SCHEMES, initial_value, initial_weights
from mtbench.keras_models.presets import GPT_PRESETS, PRESETS

# Large draws keep a sample's spread within 4 % of the population's.
SPREAD = 0.04


@pytest.fixture(scope="module")
def models():
    import dataclasses

    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.transformer import build_transformer
    # tiny GPT: 2 blocks of an attention and an MLP (4 residual branches); tiny Transformer: 1 encoder layer (2
    # branches) and 1 decoder layer (self-attention, cross-attention, feed-forward: 3).
    return {"gpt": (build_gpt(dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256)), 4),
            "transformer": (build_transformer(PRESETS["tiny"]), 5)}


def by_kind(model):
    """{path: (kind, fan_in)} where kind is residual (an attention's output, a feed-forward's last layer), kernel,
    bias, embeddings, gamma or beta."""
    kinds = {}
    for variable in model.weights:
        path, name = variable.path, variable.path.rsplit("/", 1)[-1]
        residual = name == "kernel" and (path.endswith("/output/kernel") or path.endswith("/out/kernel"))
        kinds[path] = ("residual" if residual else name, variable.shape[0])
    return kinds


def close(value, expected):
    return abs(value - expected) <= SPREAD * expected


def drawn_variables(model, scheme, zero_biases=True):
    """(path, kind, fan_in, value) of each variable `scheme` draws at random, once the norms are checked to start at
    scale 1 and offset 0 (and the biases at 0, where `zero_biases`)."""
    constants = {"gamma": 1.0, "beta": 0.0, **({"bias": 0.0} if zero_biases else {})}
    weights = initial_weights(model, 0, scheme)
    for path, (kind, fan_in) in by_kind(model).items():
        if kind in constants:
            assert np.all(weights[path] == constants[kind]), path
        else:
            yield path, kind, fan_in, weights[path]


@pytest.mark.parametrize("family", ["gpt", "transformer"])
def test_gpt2_draws_normal_002_and_scales_the_residual_projections_by_their_count(models, family):
    model, branches = models[family]
    for path, kind, _, value in drawn_variables(model, "gpt2"):
        expected = 0.02 / math.sqrt(branches) if kind == "residual" else 0.02
        assert close(value.std(), expected) and abs(value.mean()) < 0.1 * expected, (path, value.std())


@pytest.mark.parametrize("family", ["gpt", "transformer"])
def test_torch_draws_what_torch_nn_gives_a_new_layer(models, family):
    model, _ = models[family]
    fan_ins = {path.rsplit("/", 1)[0]: fan_in for path, (kind, fan_in) in by_kind(model).items()
               if kind in ("kernel", "residual")}
    for path, kind, _, value in drawn_variables(model, "torch", zero_biases=False):
        if kind == "embeddings":
            assert close(value.std(), 1.0), path
            continue
        bound = 1.0 / math.sqrt(fan_ins[path.rsplit("/", 1)[0]])  # the layer's inputs, for its bias too
        assert bound >= np.abs(value).max() > 0.9 * bound, path
        if value.size >= 1000:
            assert close(value.std(), bound / math.sqrt(3.0)), path


@pytest.mark.parametrize("family", ["gpt", "transformer"])
def test_flax_draws_lecun_normal_kernels_truncated_at_two_sigma_and_embed_by_features(models, family):
    model, _ = models[family]
    for path, kind, fan_in, value in drawn_variables(model, "flax"):
        if kind == "embeddings":
            assert close(value.std(), 1.0 / math.sqrt(value.shape[1])), path
            continue
        # The truncated draw is rescaled to keep the variance 1 / fan_in; nothing beyond 2 / 0.8796 of it.
        assert close(value.std(), 1.0 / math.sqrt(fan_in)), path
        assert np.abs(value).max() <= 2.0 / 0.8796256610342398 / math.sqrt(fan_in), path


def test_glorot_keeps_mtbenchs_first_draw():
    """The draw results were made from before --init: Glorot-uniform kernels, token embeddings normal(0, d^-0.5),
    positions normal(0, 0.02), from one generator per (seed, path)."""
    import zlib
    rng = np.random.default_rng([7, zlib.crc32(b"m/dense/kernel")])
    expected = rng.uniform(-math.sqrt(6.0 / 96), math.sqrt(6.0 / 96), size=(32, 64)).astype(np.float32)
    np.testing.assert_array_equal(initial_value("m/dense/kernel", (32, 64), 7), expected)
    np.testing.assert_array_equal(initial_value("m/dense/kernel", (32, 64), 7, "glorot"), expected)
    token = initial_value("m/token_embedding/embeddings", (4000, 64), 0)
    position = initial_value("m/position_embedding/embeddings", (4000, 64), 0)
    assert close(token.std(), 64 ** -0.5) and close(position.std(), 0.02)


def test_every_scheme_draws_the_same_numbers_for_a_seed_and_others_for_another_scheme(models):
    model, _ = models["gpt"]
    draws = {scheme: initial_weights(model, 3, scheme) for scheme in INIT_SCHEMES}
    again = initial_weights(model, 3, "gpt2")
    assert all(np.array_equal(again[path], draws["gpt2"][path]) for path in again)
    path = "gpt/block_0/self_attention/query/kernel"
    assert len({draws[scheme][path].std().round(4) for scheme in INIT_SCHEMES}) == len(INIT_SCHEMES)
    with pytest.raises(ValueError, match="no initialisation scheme 'xavier'"):
        initial_value(path, (64, 64), 0, "xavier")
