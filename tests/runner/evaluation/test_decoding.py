"""The Transformer's masks and the greedy decoder, in-process on the JAX backend."""

import numpy as np
import pytest
from keras import ops

from mtbench.keras_models.initialization import assign_weights, initial_weights
from mtbench.keras_models.presets import PRESETS
from mtbench.keras_models.transformer import build_transformer
from mtbench.plugins.backends.jax_backend import JaxBackend
from mtbench.runner.evaluation.decoding import greedy_decoder, output_length, translate
from mtbench.runner.data.tokenizer import EOS_ID, JOINT_SPECIAL

from conftest import json_answer


@pytest.fixture(scope="module")
def model():
    model = build_transformer(PRESETS["tiny"])
    assign_weights(model, initial_weights(model, seed=0))
    return model


def logits(model, source, target):
    return ops.convert_to_numpy(model((np.array(source, np.int32), np.array(target, np.int32))))


def test_decoder_is_causal(model):
    before = logits(model, [[5, 6, 7, 3]], [[2, 9, 10, 11]])
    after = logits(model, [[5, 6, 7, 3]], [[2, 9, 10, 500]])
    np.testing.assert_allclose(before[0, :3], after[0, :3], atol=1e-5)
    assert not np.allclose(before[0, 3], after[0, 3])


def test_source_padding_is_ignored(model):
    short = logits(model, [[5, 6, 7, 3]], [[2, 9, 10, 11]])
    padded = logits(model, [[5, 6, 7, 3, 0, 0]], [[2, 9, 10, 11]])
    np.testing.assert_allclose(short, padded, atol=1e-5)


def test_initial_weights_are_reproducible_and_seeded(model):
    a, b, c = initial_weights(model, 0), initial_weights(model, 0), initial_weights(model, 1)
    assert set(a) == {v.path for v in model.weights}
    assert all(np.array_equal(a[k], b[k]) for k in a)
    kernel = next(k for k in a if k.endswith("kernel"))
    assert not np.array_equal(a[kernel], c[kernel])


def test_assign_weights_refuses_a_mismatch(model):
    weights = initial_weights(model, 0)
    weights.pop(next(iter(weights)))
    with pytest.raises(ValueError, match="missing"):
        assign_weights(model, weights)


def naive_greedy(forward, source, length):
    """Reference decoder: one full forward pass (`forward(source, target) -> logits`) per token, in plain Python."""
    out = [2]
    for _ in range(length - 1):
        step = ops.convert_to_numpy(forward(np.array([source], np.int32),
                                            np.array([out + [0] * (length - len(out))], np.int32)))
        token = int(np.argmax(step[0, len(out) - 1]))
        out.append(token)
        if token == EOS_ID:
            break
    return out[1:-1] if out[-1] == EOS_ID else out[1:]


@pytest.mark.slow
def test_compiled_greedy_decoding_matches_naive_decoding(model):
    rng = np.random.default_rng(0)
    sources = [list(rng.integers(4, 1000, size=n)) + [EOS_ID] for n in (3, 9, 14, 20)]
    compiled = JaxBackend().compile_inference(greedy_decoder(model, JOINT_SPECIAL), model)
    got_compiled = translate(compiled, sources, batch_size=3, max_len=32, special=JOINT_SPECIAL)
    assert got_compiled == translate(greedy_decoder(model, JOINT_SPECIAL), sources, batch_size=3, max_len=32, special=JOINT_SPECIAL)
    assert got_compiled == translate(greedy_decoder(model, JOINT_SPECIAL, use_cache=False), sources, batch_size=3, max_len=32, special=JOINT_SPECIAL)
    # Both batches here decode into 32-token buffers (sources of up to 16 tokens get 1.5x + 2 -> bucket 32).
    assert output_length(16, 32) == output_length(32, 32) == 32
    # The reference's forward passes are jitted (one program per source length): the same full passes, without
    # eager dispatch of every operation, which took most of this test's time.
    forward = JaxBackend().compile_inference(lambda source, target: model((source, target)), model)
    assert got_compiled == [naive_greedy(forward, source, 32) for source in sources]


def test_a_sentence_decodes_alike_whatever_its_neighbours_in_the_batch(model):
    """A sentence's room to translate into follows its own source: decoded beside a long source, a short one was
    given the long one's buffer, so an output that never ends ran 63 tokens instead of 31, and BLEU changed with
    --decode-batch-size (`evaluate` decodes 64 at a time where a run decodes 128)."""
    rng = np.random.default_rng(1)
    short, long = [list(map(int, rng.integers(4, 1000, size=n))) + [EOS_ID] for n in (3, 40)]
    decoder = JaxBackend().compile_inference(greedy_decoder(model, JOINT_SPECIAL), model)
    alone = translate(decoder, [short], batch_size=2, max_len=64, special=JOINT_SPECIAL)
    beside = translate(decoder, [long, short], batch_size=2, max_len=64, special=JOINT_SPECIAL)
    assert beside[1] == alone[0]
    assert len(alone[0]) < output_length(64, 64) - 1  # less room than the long source's (it never ends here)
    done = []
    translate(decoder, [long, short, short], batch_size=2, max_len=64, special=JOINT_SPECIAL, progress=done.append)
    assert done == [2, 3]  # the two short ones, then the long one: one bucket a batch


def test_a_batch_holds_no_more_rows_than_there_are_sentences(model):
    """`translate --batch-size 100000` of one sentence decoded 100,000 rows of padding (5 GiB; more, killed by the
    kernel without a word)."""
    decoder = JaxBackend().compile_inference(greedy_decoder(model, JOINT_SPECIAL), model)
    rows = []
    counting = lambda source, buffer: rows.append(len(source)) or decoder(source, buffer)
    sentence = [5, 6, 7, EOS_ID]
    assert translate(counting, [sentence, sentence], batch_size=100_000, max_len=64, special=JOINT_SPECIAL) == \
        translate(decoder, [sentence, sentence], batch_size=2, max_len=64, special=JOINT_SPECIAL)
    assert rows == [2]


@pytest.mark.slow
def test_cached_decoding_matches_full_decoding_on_torch():
    import os
    import subprocess
    import sys
    script = """
import json, numpy as np
from mtbench.keras_models.initialization import assign_weights, initial_weights
from mtbench.keras_models.presets import PRESETS
from mtbench.keras_models.transformer import build_transformer
from mtbench.plugins.backends.torch_backend import TorchBackend
from mtbench.runner.evaluation.decoding import greedy_decoder, translate
from mtbench.runner.data.tokenizer import JOINT_SPECIAL
model = build_transformer(PRESETS["tiny"])
assign_weights(model, initial_weights(model, seed=0))
rng = np.random.default_rng(0)
sources = [list(map(int, rng.integers(4, 1000, size=n))) + [3] for n in (3, 9, 14, 20)]
run = lambda decoder: translate(TorchBackend().compile_inference(decoder, model), sources, batch_size=3, max_len=32, special=JOINT_SPECIAL)
print(json.dumps([run(greedy_decoder(model, JOINT_SPECIAL)), run(greedy_decoder(model, JOINT_SPECIAL, use_cache=False))]))
"""
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    cached, full = json_answer(proc)
    assert cached == full and all(len(tokens) > 0 for tokens in cached)
