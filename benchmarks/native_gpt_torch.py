"""mtbench's language model written in plain PyTorch, layer for layer: nanoGPT's shape as an `nn.Module`, trained by
benchmarks/native_torch.py's step (`torch.optim.AdamW` with a `LambdaLR` schedule, eager or `torch.compile`d,
optionally under `torch.autocast(bfloat16)`). Nothing from Keras: what it costs against mtbench's step is what Keras
adds. It keeps mtbench's layout (three projection Linears joined at every step); the best a PyTorch user writes is
benchmarks/best_gpt_torch.py.

Same architecture as `mtbench.keras_models.gpt`: pre-LayerNorm blocks (LayerNorm eps 1e-5), causal attention
through `F.scaled_dot_product_attention` (whose kernel mtbench's torch backend holds the process to: the math one
unless fused attention was asked for), an MLP with exact (erf) GELU as Keras's `activation="gelu"`, learned
positions, the output layer tied to the token embedding, float32 logits. Module names follow the Keras layer
names, so mtbench's initial weights load by path (`native_torch.torch_name`).
"""

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import native_torch
from benchmarks.native_torch import Attention, batch_tensors, default_device  # noqa: F401 (this module's API)

LAYER_NORM_EPSILON = 1e-5


def layer_norm(d_model):
    return nn.LayerNorm(d_model, eps=LAYER_NORM_EPSILON)


class MLP(native_torch.FeedForward):
    """The translation model's feed-forward layers, with GELU, and dropout on its output (as Keras's GPT)."""

    def forward(self, x):
        return self.dropout(self.out(F.gelu(self.hidden(x))))  # approximate="none": erf, as Keras's default


class Block(nn.Module):
    def __init__(self, d_model, num_heads, ff_dim, dropout):
        super().__init__()
        self.attention_norm = layer_norm(d_model)
        self.self_attention = Attention(d_model, num_heads, is_causal=True, dropout=dropout)
        self.mlp_norm = layer_norm(d_model)
        self.mlp = MLP(d_model, ff_dim, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        h = self.attention_norm(x)
        x = x + self.dropout(self.self_attention(h, h))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """`block`: the class of its blocks (this module's `Block` unless another model reuses the rest)."""

    def __init__(self, vocab_size, d_model, num_heads, layers_count, ff_dim, block_size, dropout=0.0, block=None):
        super().__init__()
        block = block or Block
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(block_size, d_model)
        self.embedding_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(block(d_model, num_heads, ff_dim, dropout) for _ in range(layers_count))
        self.final_norm = layer_norm(d_model)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.token_embedding(ids) + self.position_embedding(positions)[None]
        x = self.embedding_dropout(native_torch.in_compute_dtype(x))
        for block in self.blocks:
            x = block(x)
        # Tied output layer, logits in float32 for a stable softmax.
        return F.linear(self.final_norm(x), self.token_embedding.weight).float()


def build_model(shape):
    """`shape`: an mtbench `ModelPreset` (`decoder_layers` blocks, `max_len` positions)."""
    return GPT(shape.vocab_size, shape.d_model, shape.num_heads, shape.decoder_layers, shape.ff_dim, shape.max_len,
               shape.dropout)


def train_step_from_keras_weights(shape, weights, settings, **options):
    """The native step starting from mtbench's initial weights ({Keras path: numpy array}); `options` as
    `native_torch.train_step_from_keras_weights`'s (mixed_bfloat16, compile, device). Call it on a batch's
    `batch_tensors`: tokens, next tokens, weights."""
    return native_torch.train_step_from_keras_weights(shape, weights, settings, build=build_model, **options)
