"""MarianMT (Hugging Face's `MarianMTModel`) in keras and keras.ops, so that a pretrained Marian checkpoint trains
and translates on every backend with the same mathematics as the torch original.

What sets it apart from mtbench's own Transformer: post-layer-norm blocks with no final norm, fixed sinusoidal
positions (sines in the first half of each vector, cosines in the second), embeddings optionally scaled by
sqrt(d_model), the activation the config names, a bias on the logits (`final_logits_bias`), and padding and the
decoder's start token that share one id. The model answers the same calls as the Transformer
(see `mtbench.plugins.api.models`). Not implemented: attention dropout and layer drop (Marian checkpoints set
both to 0; the marian plugin refuses one that does not).
"""

import keras
import numpy as np
from keras import layers, ops

from mtbench.keras_models.transformer import (
    Attention,
    Embedding,
    create_variables,
    decoding_state,
    dropout_layer,
    recomputed_in_backward,
)

# MarianConfig's defaults, for the keys a config.json may leave out.
MARIAN_DEFAULTS = {
    "vocab_size": 58101, "decoder_vocab_size": None, "max_position_embeddings": 1024, "d_model": 1024,
    "encoder_layers": 12, "encoder_ffn_dim": 4096, "encoder_attention_heads": 16,
    "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
    "activation_function": "gelu", "dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0,
    "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
    "scale_embedding": False, "pad_token_id": 58100, "eos_token_id": 0, "decoder_start_token_id": 58100,
    "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "bad_words_ids": None,
}

# transformers' activation names; the tanh forms are one formula written three ways.
ACTIVATIONS = {
    "relu": ops.relu,
    "swish": ops.silu,
    "silu": ops.silu,
    "gelu": lambda x: ops.gelu(x, approximate=False),
    "gelu_new": lambda x: ops.gelu(x, approximate=True),
    "gelu_fast": lambda x: ops.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: ops.gelu(x, approximate=True),
}

# torch.nn.LayerNorm's default, which Marian keeps.
LAYER_NORM_EPSILON = 1e-5
# The logit of an id decoding must never choose. Finite, so that beam search's log-softmax and sums of
# log-probabilities stay finite.
FORBIDDEN_LOGIT = -1e9


def marian_settings(config):
    """The config.json dict with MarianConfig's defaults for what it leaves out."""
    settings = {**MARIAN_DEFAULTS, **config}
    settings["decoder_vocab_size"] = settings["decoder_vocab_size"] or settings["vocab_size"]
    return settings


def sinusoidal_positions(count, dim):
    """Marian's position table: angle pos / 10000^(2*(j//2)/dim), the sines of the even columns j in the first
    half of each vector and the cosines of the odd ones in the second (not interleaved). Computed in float64 and
    rounded once to float32, as transformers does."""
    angles = np.arange(count, dtype=np.float64)[:, None] / np.power(10000.0, 2 * (np.arange(dim) // 2) / dim)
    first_half = (dim + 1) // 2
    table = np.empty((count, dim), np.float32)
    table[:, :first_half] = np.sin(angles[:, 0::2])
    table[:, first_half:] = np.cos(angles[:, 1::2])
    return table


def target_vocab_size(settings):
    """The width of the logits: the decoder's vocabulary when the two sides have their own."""
    if settings["share_encoder_decoder_embeddings"]:
        return settings["vocab_size"]
    return settings["decoder_vocab_size"]


def forbidden_ids(settings):
    """The ids greedy and beam decoding never produce, as transformers' generation does for Marian: padding (its
    checkpoints forbid it with `bad_words_ids` [[pad]]; it is also the decoder's start token, never an output)
    and every other single-token entry of `bad_words_ids`. Multi-token entries depend on what was decoded before
    and are not enforced."""
    forbidden = {settings["pad_token_id"]}
    for words in settings["bad_words_ids"] or ():
        if len(words) == 1:
            forbidden.add(words[0])
    return sorted(forbidden)


class _PostNormBlock(layers.Layer):
    """What encoder and decoder layers share: the feed-forward part and dropout. Each sublayer's output is added
    to its input and the sum normalised (post-LN)."""

    def __init__(self, d_model, ffn_dim, activation, dropout, activation_dropout, **kwargs):
        super().__init__(**kwargs)
        self.fc1 = layers.Dense(ffn_dim, name="fc1")
        self.fc2 = layers.Dense(d_model, name="fc2")
        self.final_norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="final_norm")
        self.activation = ACTIVATIONS[activation]
        self.dropout = dropout_layer(dropout)
        self.activation_dropout = dropout_layer(activation_dropout)

    def feed_forward(self, x, training):
        hidden = self.activation_dropout(self.activation(self.fc1(x)), training=training)
        return self.final_norm(x + self.dropout(self.fc2(hidden), training=training))


class MarianEncoderLayer(_PostNormBlock):
    def __init__(self, d_model, num_heads, ffn_dim, activation, dropout, activation_dropout, flash_attention=False,
                 remat=False, **kwargs):
        super().__init__(d_model, ffn_dim, activation, dropout, activation_dropout, **kwargs)
        self.remat = remat
        self.self_attention = Attention(d_model, num_heads, flash_attention=flash_attention, name="self_attention")
        self.self_attention_norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="self_attention_norm")

    def call(self, x, src_mask, training=False):
        return recomputed_in_backward(self, self.residual_branches, training, x, src_mask)

    def residual_branches(self, x, src_mask, training=False):
        attended = self.self_attention(x, x, key_mask=src_mask)
        x = self.self_attention_norm(x + self.dropout(attended, training=training))
        return self.feed_forward(x, training)


class MarianDecoderLayer(_PostNormBlock):
    def __init__(self, d_model, num_heads, ffn_dim, activation, dropout, activation_dropout, flash_attention=False,
                 flash_attention_masked=False, remat=False, **kwargs):
        super().__init__(d_model, ffn_dim, activation, dropout, activation_dropout, **kwargs)
        self.remat = remat
        self.self_attention = Attention(d_model, num_heads, is_causal=True, flash_attention=flash_attention,
                                        name="self_attention")
        self.self_attention_norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="self_attention_norm")
        self.cross_attention = Attention(d_model, num_heads, flash_attention=flash_attention_masked,
                                         name="cross_attention")
        self.cross_attention_norm = layers.LayerNormalization(epsilon=LAYER_NORM_EPSILON,
                                                              name="cross_attention_norm")

    def call(self, x, memory, src_mask, training=False):
        return recomputed_in_backward(self, self.residual_branches, training, x, memory, src_mask)

    def residual_branches(self, x, memory, src_mask, training=False):
        # Causality alone, as in transformers: a padded target position is never seen by a real one before it.
        x = self.self_attention_norm(x + self.dropout(self.self_attention(x, x), training=training))
        attended = self.cross_attention(x, memory, key_mask=src_mask)
        x = self.cross_attention_norm(x + self.dropout(attended, training=training))
        return self.feed_forward(x, training)

    def step(self, x, position, cache, cross_keys_values, src_mask):
        """One decoding position: `x` (batch, 1, d_model) at `position`, `cache` this layer's self-attention keys
        and values for every position of the output (those after `position` not yet written)."""
        cache_keys, cache_values = cache
        new_keys, new_values = self.self_attention.keys_values(x)
        cache_keys = ops.slice_update(cache_keys, (0, position, 0, 0), new_keys)
        cache_values = ops.slice_update(cache_values, (0, position, 0, 0), new_values)
        written = ops.arange(ops.shape(cache_keys)[1]) <= position
        written = ops.broadcast_to(written[None, :], (ops.shape(x)[0], ops.shape(cache_keys)[1]))
        x = self.self_attention_norm(x + self.self_attention.attend(x, cache_keys, cache_values, key_mask=written))
        x = self.cross_attention_norm(x + self.cross_attention.attend(x, *cross_keys_values, key_mask=src_mask))
        return self.feed_forward(x, False), (cache_keys, cache_values)


class LogitsBias(layers.Layer):
    """Marian's `final_logits_bias`: a constant of the checkpoint (transformers keeps it as a buffer, never
    trained), saved and loaded with the other variables. Its variable is called `bias` so that mtbench's seeded
    draw, which starts every bias at zero, also fits it."""

    def build(self, logits_shape):
        # Created here rather than in __init__, so that its path lies under the model's like every other.
        self.bias = self.add_weight(shape=(logits_shape[-1],), initializer="zeros", trainable=False, name="bias")

    def call(self, logits):
        return logits + ops.cast(self.bias, logits.dtype)


class MarianMT(keras.Model):
    """Inputs: `(source_ids, target_input_ids)`, both (batch, length) int32, targets starting with the decoder's
    start id (Marian's padding id); output: float32 logits (batch, length, target vocabulary)."""

    def __init__(self, config, flash_attention=False, flash_attention_masked=False, remat=False, **kwargs):
        """`config`: the parsed config.json of a transformers MarianMT checkpoint. `flash_attention` applies to
        the decoder's causal self-attention, `flash_attention_masked` to the attentions with a padding mask;
        `remat`: each layer's activations recomputed in the backward pass."""
        super().__init__(**kwargs)
        settings = marian_settings(config)
        activation = settings["activation_function"]
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation_function '{activation}' is not one of {', '.join(ACTIVATIONS)}")
        d_model = settings["d_model"]
        self.pad_id = settings["pad_token_id"]
        self.d_model = d_model
        self.max_len = settings["max_position_embeddings"]
        self.embed_scale = float(np.sqrt(d_model)) if settings["scale_embedding"] else 1.0
        if settings["share_encoder_decoder_embeddings"]:
            self.encoder_embedding = self.decoder_embedding = Embedding(
                settings["vocab_size"], d_model, name="shared_embedding")
        else:
            self.encoder_embedding = Embedding(settings["vocab_size"], d_model, name="encoder_embedding")
            self.decoder_embedding = Embedding(settings["decoder_vocab_size"], d_model, name="decoder_embedding")
        vocab = target_vocab_size(settings)
        # Tied: the logits are scores against the decoder's input embeddings.
        self.lm_head = (None if settings["tie_word_embeddings"]
                        else layers.Dense(vocab, use_bias=False, name="lm_head"))
        self.final_logits_bias = LogitsBias(name="final_logits_bias")
        self.positions = ops.convert_to_tensor(sinusoidal_positions(self.max_len, d_model))
        forbidden = np.zeros(vocab, bool)
        forbidden[forbidden_ids(settings)] = True
        self.forbidden = ops.convert_to_tensor(forbidden)
        self.embedding_dropout = dropout_layer(settings["dropout"])
        block = dict(activation=activation, dropout=settings["dropout"],
                     activation_dropout=settings["activation_dropout"], remat=remat)
        self.encoder_layers = [
            MarianEncoderLayer(d_model, settings["encoder_attention_heads"], settings["encoder_ffn_dim"],
                               flash_attention=flash_attention_masked, name=f"encoder_layer_{i}", **block)
            for i in range(settings["encoder_layers"])]
        self.decoder_layers = [
            MarianDecoderLayer(d_model, settings["decoder_attention_heads"], settings["decoder_ffn_dim"],
                               flash_attention=flash_attention, flash_attention_masked=flash_attention_masked,
                               name=f"decoder_layer_{i}", **block)
            for i in range(settings["decoder_layers"])]

    def _embed(self, embedding, ids, positions, training):
        x = embedding(ids)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        return self.embedding_dropout(x + ops.cast(positions, x.dtype), training=training)

    def _leading_positions(self, length):
        return ops.slice(self.positions, (0, 0), (length, self.d_model))[None]

    def encode(self, source_ids, training=False):
        """The encoder output and the source padding mask that decoding attends with."""
        # `!=` with a Python number, not `ops.not_equal`, which would make a tensor of the pad id from host data.
        src_mask = source_ids != self.pad_id
        x = self._embed(self.encoder_embedding, source_ids, self._leading_positions(ops.shape(source_ids)[1]),
                        training)
        for layer in self.encoder_layers:
            x = layer(x, src_mask, training=training)
        return x, src_mask

    def decode(self, target_input_ids, memory, src_mask, training=False):
        positions = self._leading_positions(ops.shape(target_input_ids)[1])
        x = self._embed(self.decoder_embedding, target_input_ids, positions, training)
        for layer in self.decoder_layers:
            x = layer(x, memory, src_mask, training=training)
        return self._logits(x)

    def _logits(self, x):
        if self.lm_head is None:
            table = ops.cast(self.decoder_embedding.embeddings, x.dtype)
            logits = ops.matmul(x, ops.transpose(table))
        else:
            logits = self.lm_head(x)
        # In float32 for a stable softmax, whatever the compute dtype.
        return self.final_logits_bias(ops.cast(logits, "float32"))

    def start_decoding(self, memory, length):
        return decoding_state(self.decoder_layers, memory, length)

    def decode_step(self, token_ids, position, caches, cross, src_mask):
        """Logits (batch, vocab) for the token after `token_ids` (batch, 1) at `position`, and the new caches.
        The ids Marian never generates (`forbidden_ids`) get FORBIDDEN_LOGIT: this is the call decoding makes,
        while training's logits (`decode`) stay those of the model."""
        position_row = ops.take(self.positions, ops.reshape(position, (1,)), axis=0)[None]
        x = self._embed(self.decoder_embedding, token_ids, position_row, training=False)
        new_caches = []
        for layer, cache, cross_keys_values in zip(self.decoder_layers, caches, cross):
            x, cache = layer.step(x, position, cache, cross_keys_values, src_mask)
            new_caches.append(cache)
        logits = self._logits(x)[:, 0]
        return ops.where(self.forbidden[None, :], FORBIDDEN_LOGIT, logits), new_caches

    def call(self, inputs, training=False):
        source_ids, target_input_ids = inputs
        memory, src_mask = self.encode(source_ids, training=training)
        return self.decode(target_input_ids, memory, src_mask, training=training)


def build_marian(config, flash_attention=False, flash_attention_masked=False, remat=False):
    """The MarianMT of a parsed config.json, with its variables created so weights can be set before compiling."""
    model = MarianMT(config, flash_attention=flash_attention, flash_attention_masked=flash_attention_masked,
                     remat=remat, name="marian")
    return create_variables(model, inputs=2)
