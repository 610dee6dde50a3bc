"""The attention layer's choice of implementation: Keras is never left to pick one (on a GPU it then tries the
fused kernel and logs a traceback wherever that refuses the padding mask), plain attention is the model's own and
computes what Keras's does, and the mask's form for the fused kernel changes no number."""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import CPU_ONLY, TESTS_DIR, cli_environment, first_position_kept_or_dropped, json_answer
from keras import ops

from mtbench.keras_models import transformer
from mtbench.keras_models.presets import PRESETS
from mtbench.keras_models.transformer import Attention, attention_mask, build_transformer


def padded_ids(rows, length, vocab, seed):
    """Random token ids with a random amount of padding (id 0) at the end of each row, one token at least."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, size=(rows, length)).astype("int32")
    for row, real in enumerate(rng.integers(1, length + 1, size=rows)):
        ids[row, real:] = 0
    return ids


def attend_through_keras(self, x, keys, values, key_mask=None, is_causal=False, flash_attention=False,
                         queries=None, training=False):
    """`Attention.attend` as it was: Keras's plain attention (XLA's on JAX) with the broadcastable mask."""
    q = self._split_heads(self.query(x)) if queries is None else queries
    mask = None if key_mask is None else key_mask[:, None, None, :]
    attended = ops.dot_product_attention(q, keys, values, mask=mask, is_causal=is_causal, flash_attention=False)
    batch, length = ops.shape(x)[0], ops.shape(x)[1]
    return self.output_projection(ops.reshape(attended, (batch, length, self.num_heads * self.head_dim)))


def test_plain_attention_computes_what_keras_computes_in_float32(monkeypatch):
    import jax

    model = build_transformer(PRESETS["tiny"])
    source = padded_ids(4, 16, PRESETS["tiny"].vocab_size, seed=1)
    target = padded_ids(4, 12, PRESETS["tiny"].vocab_size, seed=2)
    # Compiled (a new function each time, traced with `attend` as it is then): op by op, JAX dispatches hundreds.
    logits = np.asarray(jax.jit(lambda s, t: model((s, t)))(source, target))
    monkeypatch.setattr(Attention, "attend", attend_through_keras)
    before = np.asarray(jax.jit(lambda s, t: model((s, t)))(source, target))
    np.testing.assert_allclose(logits, before, rtol=0, atol=1e-5)


def test_mask_spelled_out_for_the_fused_kernel_gives_the_same_attention():
    rng = np.random.default_rng(0)
    query, key, value = (rng.standard_normal((3, length, 2, 8)).astype("float32") for length in (5, 7, 7))
    key_mask = padded_ids(3, 7, 10, seed=3) != 0
    broadcastable = attention_mask(key_mask, 5, fused=False)
    spelled_out = attention_mask(key_mask, 5, fused=True)
    assert tuple(broadcastable.shape) == (3, 1, 1, 7) and tuple(spelled_out.shape) == (3, 1, 5, 7)
    plain = ops.dot_product_attention(query, key, value, mask=broadcastable, flash_attention=False)
    full = ops.dot_product_attention(query, key, value, mask=spelled_out, flash_attention=False)
    np.testing.assert_allclose(ops.convert_to_numpy(plain), ops.convert_to_numpy(full), rtol=0, atol=1e-6)


@pytest.fixture
def attention_calls(monkeypatch):
    """What every `keras.ops.dot_product_attention` call was told (the call still computes, plainly)."""
    calls = []
    real = ops.dot_product_attention

    def spy(query, key, value, **kwargs):
        mask = kwargs.get("mask")
        calls.append({"flash_attention": kwargs.get("flash_attention"), "is_causal": kwargs.get("is_causal"),
                      "mask_shape": None if mask is None else tuple(mask.shape)})
        # Computed plainly: this CPU has no fused kernel, and Keras refuses flash_attention=True here.
        return real(query, key, value, **{**kwargs, "flash_attention": False})

    monkeypatch.setattr(transformer.ops, "dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("asked, passed, mask_shape", [(None, False, (2, 1, 1, 6)), (True, True, (2, 1, 5, 6))])
def test_masked_attention_tells_keras_its_choice(attention_calls, asked, passed, mask_shape):
    layer = Attention(16, 2, flash_attention=asked)
    x, memory = np.ones((2, 5, 16), "float32"), np.ones((2, 6, 16), "float32")
    layer(x, memory, key_mask=padded_ids(2, 6, 10, seed=4) != 0)
    # Keras may call the layer once more while building it: every call must tell the same.
    assert attention_calls
    assert all(call == {"flash_attention": passed, "is_causal": False, "mask_shape": mask_shape}
               for call in attention_calls)


def test_plain_attention_and_decoding_never_call_keras(attention_calls):
    model = build_transformer(PRESETS["tiny"])
    source, target = padded_ids(2, 8, 50, seed=5), padded_ids(2, 8, 50, seed=6)
    model((source, target))
    memory, src_mask = model.encode(source)
    cross, caches = model.start_decoding(memory, 8)
    model.decode_step(ops.ones((2, 1), "int32"), ops.convert_to_tensor(0), caches, cross, src_mask)
    assert attention_calls == []


def test_a_fused_models_decoding_attends_unfused(attention_calls):
    """A model that trains with the fused kernels (the flash-attention extra's options) still decodes with its cache
    through its own unfused attention, on both backends: what `model.attention.decoding` records."""
    model = build_transformer(PRESETS["tiny"], flash_attention=True, flash_attention_masked=True)
    source = padded_ids(2, 8, 50, seed=5)
    memory, src_mask = model.encode(source)
    encoded = len(attention_calls)
    assert encoded == PRESETS["tiny"].encoder_layers and all(call["flash_attention"] for call in attention_calls)
    cross, caches = model.start_decoding(memory, 8)
    model.decode_step(ops.ones((2, 1), "int32"), ops.convert_to_tensor(0), caches, cross, src_mask)
    assert len(attention_calls) == encoded



def test_attention_dropout_drops_whole_probabilities_while_training_only():
    """nanoGPT's `attn_dropout`: a query's probability of each key is kept, scaled by 1 / (1 - rate), or dropped,
    every dimension of that head's value with it. The first position of a causal attention sees one key with
    probability 1, so through identity value and output projections it gives its head's part of the input, doubled
    (rate 0.5) or zero, about half of each; outside training, the input itself."""
    rows, length, width, heads = 200, 3, 8, 2
    layer = Attention(width, heads, is_causal=True, dropout=0.5)
    x = np.random.default_rng(7).uniform(1, 2, size=(rows, length, width)).astype("float32")
    layer(x)
    for projection in (layer.value, layer.output_projection):
        projection.kernel.assign(np.eye(width, dtype="float32"))
        projection.bias.assign(np.zeros(width, "float32"))
    first = x[:, 0].reshape(rows, heads, width // heads)
    np.testing.assert_allclose(ops.convert_to_numpy(layer(x))[:, 0], x[:, 0], rtol=1e-6)
    trained = ops.convert_to_numpy(layer(x, training=True))[:, 0].reshape(rows, heads, width // heads)
    first_position_kept_or_dropped(trained, first)
    with pytest.raises(ValueError, match="attention dropout"):
        Attention(width, heads, is_causal=True, dropout=0.5, flash_attention=True)


@pytest.mark.slow  # two compilations of the model's gradient, 11 s beside the other worker
def test_fused_projections_compute_what_three_products_compute():
    """Self-attention's query, key and value, and cross-attention's key and value, from one product with the
    kernels side by side (the model's default): the translation model's output and every gradient as with one
    product a projection, in 5 fewer products a forward pass (2 in each self-attention, 1 in the cross-attention)."""
    import jax

    model = build_transformer(PRESETS["tiny"])  # one encoder block, one decoder block
    source = padded_ids(4, 16, PRESETS["tiny"].vocab_size, seed=1)
    target = padded_ids(4, 12, PRESETS["tiny"].vocab_size, seed=2)
    attentions = [layer for layer in model._flatten_layers() if isinstance(layer, Attention)]
    assert len(attentions) == 3
    fixed = [variable.value for variable in model.non_trainable_variables]

    def logits(trainable):
        return model.stateless_call(trainable, fixed, (source, target))[0]

    def loss(trainable):
        return ops.mean(ops.square(logits(trainable)))

    def products(trainable):
        def count(jaxpr):
            found = 0
            for equation in jaxpr.eqns:
                found += equation.primitive.name == "dot_general"
                for value in equation.params.values():  # the jitted functions' own programs (jnp.einsum's)
                    inner = getattr(value, "jaxpr", value)
                    if hasattr(inner, "eqns"):
                        found += count(inner)
            return found
        # A new function each time: JAX keeps the program it traced for a function it saw before.
        return count(jax.make_jaxpr(lambda values: logits(values))(trainable).jaxpr)

    def loss_and_gradients(trainable):
        # Compiled (a new function each time, traced with the attentions as they are now): op by op, the backward
        # pass of a whole model dispatches thousands of small operations.
        return jax.jit(jax.value_and_grad(lambda values: loss(values)))(trainable)

    trainable = [variable.value for variable in model.trainable_variables]
    assert all(attention.fused_projections for attention in attentions)  # the model's way
    together, together_products = loss_and_gradients(trainable), products(trainable)
    for attention in attentions:
        attention.fused_projections = False
    separate, separate_products = loss_and_gradients(trainable), products(trainable)
    np.testing.assert_allclose(together[0], separate[0], rtol=1e-6)
    for fused, alone in zip(together[1], separate[1]):
        np.testing.assert_allclose(fused, alone, rtol=1e-5, atol=1e-7)
    assert separate_products - together_products == 5


# The eager runs first (tests/matmul_count_probe.py says why).
PRODUCT_RUNS = ("eager-float32", "eager-mixed_bfloat16", "compiled-float32")


@pytest.fixture(scope="module")
def products_counted():
    """tests/matmul_count_probe.py's counts for each of PRODUCT_RUNS ("kind-dtype"), all in one process."""
    proc = subprocess.run([sys.executable, os.path.join(TESTS_DIR, "matmul_count_probe.py"), *PRODUCT_RUNS],
                          capture_output=True, text=True, timeout=600,
                          env=cli_environment({"TORCHINDUCTOR_COMPILE_THREADS": "1", **CPU_ONLY}))
    return json_answer(proc)


@pytest.mark.slow
@pytest.mark.parametrize("kind, dtype", [("eager", "float32"), ("compiled", "float32"), ("eager", "mixed_bfloat16")])
def test_a_torch_step_multiplies_by_one_query_key_value_matrix_a_block(products_counted, kind, dtype):
    """What mtbench's torch steps ran in one step of the tiny GPT, counted from torch's profiler: each weight matrix
    three products (forward, the input's gradient, the weight's gradient), one of them the query, key and value
    side by side in each block (inductor does not merge three products itself), and
    attention's two batched products three times a block; in mixed bfloat16, every one of them on bfloat16
    inputs (the JAX step's: tests/plugins/backends/test_jax_step_program.py)."""
    counted = products_counted[f"{kind}-{dtype}"]
    blocks = counted["blocks"]
    # A block's query-key-value, output and two feed-forward matrices; the tied output layer's table.
    assert counted["weights"] == 3 * (4 * blocks + 1)
    assert counted["batched"] == 3 * 2 * blocks
    assert list(counted["input_dtypes"]) == [{"float32": "float", "mixed_bfloat16": "c10::BFloat16"}[dtype]]
