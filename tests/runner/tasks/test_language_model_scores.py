"""A language model's scores over windows a stride apart, against the model's own next-token probabilities read one
token at a time: a stride of 1 predicts each token after the first block from exactly the block before it."""

import dataclasses
import math

import numpy as np
import pytest

from mtbench.keras_models.presets import GPT_PRESETS
from mtbench.runner.config import TrainConfig
from mtbench.runner.data.text import ByteTokenizer
from mtbench.runner.setup import compile_model
from mtbench.runner.tasks.language_modelling import stream_scores

BLOCK = 16
TEXT = "In the beginning God created the heaven and the earth. And the earth was without form, and void.".encode()


@pytest.fixture(scope="module")
def model():
    import keras

    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.initialization import initial_weights
    keras.config.set_dtype_policy("float32")
    built = build_gpt(dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=BLOCK))
    drawn = initial_weights(built, seed=0, scheme="torch")
    for variable in built.weights:
        variable.assign(drawn[variable.path])  # torch's draw: logits far from uniform, so that context changes every loss
    config = TrainConfig(backend="jax", model_name="gpt", preset="tiny", block_size=BLOCK, dtype="float32")
    compile_model(keras, built, config, 1, {})
    return built


def nats_of_each_token(model, ids, context_of):
    """-log p(ids[t] | ids[context_of(t):t]) for t from 1: a row a token, its context from the row's start and
    zeros after it, which a causal model's position t - 1 - context_of(t) does not read."""
    rows = np.zeros((len(ids) - 1, BLOCK), np.int32)
    read_at = []
    for row, t in enumerate(range(1, len(ids))):
        start = context_of(t)
        rows[row, :t - start] = ids[start:t]
        read_at.append(t - 1 - start)
    logits = np.asarray(model(rows), np.float64)[np.arange(len(rows)), read_at]
    shifted = logits - logits.max(-1, keepdims=True)
    return np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(len(rows)), ids[1:]]


def test_a_stride_of_one_scores_each_token_from_the_block_before_it_and_a_block_apart_from_its_blocks_start(model):
    stream = ByteTokenizer().stream(TEXT)
    sliding = nats_of_each_token(model, stream.ids, lambda t: max(0, t - BLOCK))
    blocks = nats_of_each_token(model, stream.ids, lambda t: (t - 1) // BLOCK * BLOCK)
    assert abs(sliding.mean() - blocks.mean()) > 1e-3  # the two ways differ here, so the test tells them apart
    for stride, expected in ((1, sliding), (BLOCK, blocks), (None, blocks)):
        scores = stream_scores(model, stream, 4, BLOCK, len(TEXT), stride)
        assert scores["tokens_evaluated"] == len(TEXT) - 1 and scores["bytes_evaluated"] == len(TEXT) - 1
        assert scores["loss"] == pytest.approx(expected.mean(), rel=1e-5), stride
        assert scores["bits_per_byte"] == pytest.approx(expected.sum() / math.log(2) / (len(TEXT) - 1), rel=1e-5)


def test_a_finite_loss_past_a_floats_range_scores_with_no_perplexity(model):
    """A model blown up to logits in the tens of thousands (its final norm's scale here) has a finite loss above 709
    nats, whose e overflows: the scores say so with a null perplexity (it raised OverflowError after training, and
    the run's result was lost)."""
    scale = model.final_norm.gamma
    kept = np.asarray(scale.value)
    scale.assign(kept * 1e4)
    try:
        scores = stream_scores(model, ByteTokenizer().stream(TEXT), 4, BLOCK, len(TEXT))
    finally:
        scale.assign(kept)
    assert math.isfinite(scores["loss"]) and scores["loss"] > 709.79 and scores["perplexity"] is None
    assert scores["bits_per_byte"] == pytest.approx(scores["loss"] / math.log(2), rel=1e-6)
