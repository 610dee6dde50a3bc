"""The language-model baseline a JAX user would write instead of mtbench: nanoGPT's shape in Flax (linen), trained
by benchmarks/native_flax.py's step (optax AdamW, one jitted step). Nothing from Keras.

Same architecture as `mtbench.keras_models.gpt`: pre-LayerNorm blocks (LayerNorm eps 1e-5), causal attention
through `jax.nn.dot_product_attention` (XLA's plain attention, as Keras on JAX runs it), an MLP with exact (erf)
GELU as Keras's `activation="gelu"` (Flax's `nn.gelu` defaults to the tanh approximation), learned positions, the
output layer tied to the token embedding, float32 logits. Flax modules carry the Keras layer names, so mtbench's
initial weights load by path (`native_flax.flax_path`). Mixed bfloat16 is Flax's own: modules compute in bfloat16
and keep float32 parameters.
"""

import flax.linen as nn
import jax.numpy as jnp

from benchmarks import native_flax
from benchmarks.native_flax import batch_arrays  # noqa: F401 (this module's API)

LAYER_NORM_EPSILON = 1e-5


def layer_norm(name, dtype):
    return nn.LayerNorm(epsilon=LAYER_NORM_EPSILON, dtype=dtype, name=name)


class MLP(native_flax.FeedForward):
    """The translation model's feed-forward layers, with exact GELU, and dropout on its output (as Keras's GPT)."""

    @nn.compact
    def __call__(self, x, training):
        hidden = nn.gelu(nn.Dense(self.ff_dim, dtype=self.dtype, name="hidden")(x), approximate=False)
        out = nn.Dense(self.d_model, dtype=self.dtype, name="out")(hidden)
        return nn.Dropout(self.dropout, deterministic=not training)(out)


class Block(native_flax.Block):
    @nn.compact
    def __call__(self, x, training):
        drop = nn.Dropout(self.dropout, deterministic=not training)
        h = layer_norm("attention_norm", self.dtype)(x)
        attention = native_flax.Attention(self.d_model, self.num_heads, is_causal=True, dtype=self.dtype,
                                          dropout=self.dropout, name="self_attention")
        x = x + drop(attention(h, h, training=training))
        mlp = MLP(self.d_model, self.ff_dim, self.dropout, self.dtype, name="mlp")
        return x + mlp(layer_norm("mlp_norm", self.dtype)(x), training)


class GPT(nn.Module):
    vocab_size: int
    d_model: int
    num_heads: int
    layers_count: int
    ff_dim: int
    block_size: int
    dropout: float = 0.0
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.token_embedding = nn.Embed(self.vocab_size, self.d_model, dtype=self.dtype)
        self.position_embedding = nn.Embed(self.block_size, self.d_model, dtype=self.dtype)
        self.embedding_dropout = nn.Dropout(self.dropout)
        self.blocks = [Block(self.d_model, self.num_heads, self.ff_dim, self.dropout, self.dtype, name=f"block_{i}")
                       for i in range(self.layers_count)]
        self.final_norm = layer_norm("final_norm", self.dtype)

    def __call__(self, ids, training=False):
        x = self.token_embedding(ids) + self.position_embedding(jnp.arange(ids.shape[1]))[None]
        x = self.embedding_dropout(x, deterministic=not training)
        for block in self.blocks:
            x = block(x, training)
        # Tied output layer, logits in float32 for a stable softmax.
        return self.token_embedding.attend(self.final_norm(x)).astype(jnp.float32)


def build_model(shape, dtype=jnp.float32):
    """`shape`: an mtbench `ModelPreset` (`decoder_layers` blocks, `max_len` positions)."""
    return GPT(vocab_size=shape.vocab_size, d_model=shape.d_model, num_heads=shape.num_heads,
               layers_count=shape.decoder_layers, ff_dim=shape.ff_dim, block_size=shape.max_len,
               dropout=shape.dropout, dtype=dtype)


def train_step_from_keras_weights(shape, weights, settings, **options):
    """The native step starting from mtbench's initial weights ({Keras path: numpy array}); `options` as
    `native_flax.train_step_from_keras_weights`'s (mixed_bfloat16, seed). Call it on a batch's `batch_arrays`:
    tokens, next tokens, weights."""
    return native_flax.train_step_from_keras_weights(shape, weights, settings, build=build_model, **options)
