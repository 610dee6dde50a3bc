"""Beam search on a tiny model trained briefly on the real corpus (so it emits EOS and varied tokens): the
compiled, cached loop against a plain Python beam search over full forward passes."""

import math

import keras
import numpy as np
import pytest
from rich.console import Console

from mtbench.plugins.manager import registry
from mtbench.plugins.backends.jax_backend import JaxBackend
from mtbench.runner.data.batches import bucket_for, bucket_lengths
from mtbench.runner.evaluation.decoding import beam_decoder, make_decoder, output_length, translate
from mtbench.runner.loop.timing import Stopwatch
from mtbench.runner.data.tokenizer import BOS_ID, EOS_ID, JOINT_SPECIAL, PAD_ID
from mtbench.plugins.api import RunContext
from mtbench.runner.saved_model import find_model, load_weights
from mtbench.runner.setup import build_model, choose_plugins
from mtbench.runner.training import prepare_data, read_data

STEPS = 150
MAX_LEN = 32
SOURCES = 12


@pytest.fixture(scope="module")
def trained(translation_run):
    """The model of the session's 150-step JAX run (conftest's TRANSLATION_TRAINED, which test_inference.py opens
    too), built in this process from its saved weights, and the first sources of its test set."""
    source = find_model(translation_run["path"])
    config = source.config
    assert (config.steps, config.max_len) == (STEPS, MAX_LEN)
    stopwatch = Stopwatch()
    plugins = choose_plugins(config, registry())
    data = prepare_data(config, plugins, read_data(config, plugins, Console(quiet=True), stopwatch), stopwatch)
    keras.config.set_dtype_policy("float32")  # whatever an earlier test left: both searches compare exact floats
    model, _ = build_model(RunContext(config=config, backend=plugins.backend), plugins, data.tokenizer)
    load_weights(source, keras, model, config)
    return model, data.splits['test'].sources[:SOURCES]


def compiled_translations(model, sources, beam):
    """The sources translated by the compiled decoder a run decodes with (`make_decoder`: greedy for beam 1), all
    in one batch per length bucket."""
    decode = JaxBackend().compile_inference(make_decoder(model, JOINT_SPECIAL, beam=beam), model)
    return translate(decode, sources, len(sources), MAX_LEN, JOINT_SPECIAL)


@pytest.fixture(scope="module")
def greedy(trained):
    """The compiled greedy translations, once for the tests that read them: the sanity test's, beam 1's compiled
    search, and the greedy decoding beam 3 must part from."""
    model, sources = trained
    return compiled_translations(model, sources, beam=1)


@pytest.fixture(scope="module")
def forward(trained):
    """The reference's full forward pass, jitted once for both beam widths (a program per source length)."""
    model, _ = trained
    return JaxBackend().compile_inference(lambda source, target: model((source, target)), model)


def log_softmax(logits):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def python_beam_search(forward, source, length, beam, alpha):
    """The reference: hypotheses as Python lists, one full forward pass per hypothesis and position."""
    def penalty(generated):
        return ((5 + generated) / 6) ** alpha

    alive, finished = [(0.0, [BOS_ID])], []  # (log-probability, tokens); (normalised score, tokens)
    for position in range(length - 1):
        worst_finished = min(score for score, _ in finished) if len(finished) == beam else -math.inf
        if alive[0][0] / penalty(length - 1) <= worst_finished:
            break
        proposals = []
        for score, tokens in alive:
            padded = np.array([tokens + [PAD_ID] * (length - len(tokens))], np.int32)
            logits = keras.ops.convert_to_numpy(forward(np.array([source], np.int32), padded))[0, position]
            proposals += [(score + log_prob, tokens + [token]) for token, log_prob in enumerate(log_softmax(logits))]
        proposals = sorted(proposals, key=lambda p: -p[0])[:2 * beam]
        alive = [p for p in proposals if p[1][-1] != EOS_ID][:beam]
        ended = [(score / penalty(position + 1), tokens) for score, tokens in proposals if tokens[-1] == EOS_ID]
        finished = sorted(finished + ended, key=lambda p: -p[0])[:beam]
    tokens = (finished[0] if finished else alive[0])[1][1:]
    return tokens[:tokens.index(EOS_ID)] if EOS_ID in tokens else [t for t in tokens if t != PAD_ID]


@pytest.mark.slow  # it compiles the greedy decoder for the slow tests beside it
def test_trained_model_translates_into_varied_sentences(greedy):
    assert len({tuple(t) for t in greedy}) > 1 and any(len(t) < MAX_LEN - 2 for t in greedy)


@pytest.mark.slow
@pytest.mark.parametrize("beam", [1, 3])
def test_compiled_beam_search_matches_python_beam_search(trained, forward, greedy, beam):
    model, sources = trained
    compiled = greedy if beam == 1 else compiled_translations(model, sources, beam)
    assert compiled == translate(beam_decoder(model, JOINT_SPECIAL, beam, use_cache=False), sources, SOURCES, MAX_LEN,
                                 JOINT_SPECIAL)
    # The buffer length `translate` gives the one batch these sources make.
    length = output_length(bucket_for(max(map(len, sources)), bucket_lengths(MAX_LEN)), MAX_LEN)
    assert compiled == [python_beam_search(forward, s, length, beam, 0.6) for s in sources]
    if beam > 1:
        assert compiled != greedy, "beam search should change at least one of these translations"
