"""A decoder-only (GPT-style) language model, written once with keras and keras.ops so every backend runs the same
model: pre-LayerNorm causal Transformer blocks, learned positions, the output layer tied to the token embedding, as
nanoGPT and GPT-2. Every position predicts the next token; there is no padding inside a block."""

import keras
from keras import layers, ops

from mtbench.keras_models.transformer import (
    Attention,
    Embedding,
    create_variables,
    dropout_layer,
    recomputed_in_backward,
)


def tanh_gelu(x):
    """GELU by its tanh approximation: GPT-2's own (transformers' `gelu_new`), which its trained weights expect."""
    return keras.activations.gelu(x, approximate=True)


class MLP(layers.Layer):
    def __init__(self, d_model, ff_dim, dropout, tanh_gelu_activation=False, **kwargs):
        super().__init__(**kwargs)
        # nanoGPT's exact GELU for models trained here; the approximation for GPT-2's checkpoints.
        self.hidden = layers.Dense(ff_dim, activation=tanh_gelu if tanh_gelu_activation else "gelu", name="hidden")
        self.out = layers.Dense(d_model, name="out")
        self.dropout = dropout_layer(dropout)

    def call(self, x, training=False):
        return self.dropout(self.out(self.hidden(x)), training=training)


class Block(layers.Layer):
    def __init__(self, d_model, num_heads, ff_dim, dropout, flash_attention=False, tanh_gelu_activation=False,
                 remat=False, **kwargs):
        super().__init__(**kwargs)
        self.remat = remat
        self.attention_norm = layers.LayerNormalization(epsilon=1e-5, name="attention_norm")
        # nanoGPT's and GPT-2's attention drops its probabilities at the blocks' rate.
        self.attention = Attention(d_model, num_heads, is_causal=True, flash_attention=flash_attention,
                                   dropout=dropout, name="self_attention")
        self.mlp_norm = layers.LayerNormalization(epsilon=1e-5, name="mlp_norm")
        self.mlp = MLP(d_model, ff_dim, dropout, tanh_gelu_activation, name="mlp")
        self.dropout = dropout_layer(dropout)

    def call(self, x, training=False):
        return recomputed_in_backward(self, self.residual_branches, training, x)

    def residual_branches(self, x, training=False):
        h = self.attention_norm(x)
        x = x + self.dropout(self.attention(h, training=training), training=training)
        return x + self.mlp(self.mlp_norm(x), training=training)


class GPT(keras.Model):
    """Input: token ids (batch, length) int32, or a one-element tuple of them (how mtbench's train steps pass a
    batch's inputs); output: float32 logits (batch, length, vocab) for the token after each position."""

    def __init__(self, vocab_size, d_model, num_heads, layers_count, ff_dim, block_size, dropout=0.0,
                 flash_attention=False, tanh_gelu_activation=False, remat=False, **kwargs):
        super().__init__(**kwargs)
        self.block_size = block_size
        self.token_embedding = Embedding(vocab_size, d_model, name="token_embedding")
        self.position_embedding = Embedding(block_size, d_model, name="position_embedding")
        self.embedding_dropout = dropout_layer(dropout)
        self.blocks = [Block(d_model, num_heads, ff_dim, dropout, flash_attention, tanh_gelu_activation, remat,
                             name=f"block_{i}")
                       for i in range(layers_count)]
        self.final_norm = layers.LayerNormalization(epsilon=1e-5, name="final_norm")

    def call(self, inputs, training=False):
        x = self.embed(inputs, training=training)
        for block in self.blocks:
            x = block(x, training=training)
        return self.logits(x)

    # The model's three pieces, which a pipeline runs on different devices: the embeddings, the blocks, the output.
    def embed(self, inputs, training=False):
        ids = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
        positions = ops.arange(ops.shape(ids)[1])
        x = self.token_embedding(ids) + self.position_embedding(positions)[None]
        return self.embedding_dropout(x, training=training)

    def logits(self, x):
        x = self.final_norm(x)
        # Tied output layer, as the translation model's: logits in float32 for a stable softmax.
        table = ops.cast(self.token_embedding.embeddings, x.dtype)
        return ops.cast(ops.matmul(x, ops.transpose(table)), "float32")


def build_gpt(shape, flash_attention=False, tanh_gelu_activation=False, remat=False):
    """The model of `shape` (a ModelPreset: `decoder_layers` blocks, `max_len` positions) with its variables
    created, so weights can be set before compiling. `tanh_gelu_activation`: GPT-2's approximate GELU; `remat`:
    each block's activations recomputed in the backward pass."""
    model = GPT(vocab_size=shape.vocab_size, d_model=shape.d_model, num_heads=shape.num_heads,
                layers_count=shape.decoder_layers, ff_dim=shape.ff_dim, block_size=shape.max_len,
                dropout=shape.dropout, flash_attention=flash_attention, tanh_gelu_activation=tanh_gelu_activation,
                remat=remat, name="gpt")
    return create_variables(model)


def non_embedding_parameters(shape):
    """nanoGPT's `get_num_params()`: every parameter but the position embedding (the token embedding is also the
    output layer, so it counts)."""
    d, f, layers_count = shape.d_model, shape.ff_dim, shape.decoder_layers
    block = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 4 * d
    return layers_count * block + 2 * d + shape.vocab_size * d


def training_flops(shape, rows, length):
    """nanoGPT's (and PaLM's) count for a training step: 6 x non-embedding parameters + 12 x layers x heads x head
    size x length, per token, over `rows` x `length` tokens."""
    per_token = 6 * non_embedding_parameters(shape) + 12 * shape.decoder_layers * shape.d_model * length
    return per_token * rows * length
