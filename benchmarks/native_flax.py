"""The baseline a JAX user would write instead of mtbench: the same Transformer in Flax (linen) with optax and
one jitted train step, nothing from Keras.

Same architecture as `mtbench.keras_models.transformer` (pre-LN encoder-decoder, one embedding shared by source,
target and the output layer, learned positions, padding as a key mask, causal decoder self-attention, ReLU
feed-forward, LayerNorm eps 1e-6, float32 logits) and the same optimizer (AdamW, warm-up and cosine decay, each
gradient clipped on its own). Flax modules carry the Keras layer names, so mtbench's initial weights load by
path. Mixed bfloat16 is Flax's own: modules compute in bfloat16 and keep float32 parameters.

Parameters, optimizer state, the dropout key and batches are created with `jnp.asarray` and friends, so they live
on jax's default device, the one Keras on JAX trains on too: the GPU where jax sees one. Nothing here names a
device, so nothing pins the baseline to the CPU.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

# The same loss and accuracy formulations as mtbench's step (the label's logit read as each platform serves best).
from mtbench.plugins.backends.jax_jit_step import correct_tokens, token_cross_entropy

PAD_ID = 0
LAYER_NORM_EPSILON = 1e-6


class Projection(nn.Module):
    """A Dense layer's kernel and bias under the layer's name, for a product made with other layers' (`Attention`)."""
    features: int

    @nn.compact
    def __call__(self, in_features):
        return (self.param("kernel", nn.initializers.lecun_normal(), (in_features, self.features)),
                self.param("bias", nn.initializers.zeros, (self.features,)))


class Attention(nn.Module):
    d_model: int
    num_heads: int
    is_causal: bool = False
    dtype: jnp.dtype = jnp.float32
    dropout: float = 0.0  # of the attention probabilities, while training (mtbench's GPT's)

    @nn.compact
    def __call__(self, x, memory, key_mask=None, training=False):
        head_dim = self.d_model // self.num_heads

        def heads(projected):
            return projected.reshape(projected.shape[:2] + (self.num_heads, head_dim))

        # The projections of one input in one product, their kernels side by side, as mtbench's model computes them
        # (`Attention.fused_projections`), each kernel under its own Dense layer's name.
        names = ("query", "key", "value") if memory is x else ("key", "value")
        params = [Projection(self.d_model, name=name)(memory.shape[-1]) for name in names]
        kernels = jnp.stack([kernel for kernel, _ in params], axis=1).astype(self.dtype)
        biases = jnp.stack([bias for _, bias in params]).astype(self.dtype)
        products = jnp.einsum("btd,dnh->btnh", memory.astype(self.dtype), kernels) + biases
        query = products[:, :, 0] if memory is x else nn.Dense(self.d_model, dtype=self.dtype, name="query")(x)
        mask = None if key_mask is None else key_mask[:, None, None, :]
        q, k, v = heads(query), heads(products[:, :, -2]), heads(products[:, :, -1])
        if training and self.dropout:
            # jax.nn's attention takes no dropout: Flax's own attention does, as its users drop probabilities.
            causal = nn.make_causal_mask(jnp.ones(x.shape[:2])) if self.is_causal else None
            attended = nn.dot_product_attention(q, k, v, mask=nn.combine_masks(mask, causal),
                                                 dropout_rng=self.make_rng("dropout"), dropout_rate=self.dropout,
                                                 deterministic=False, dtype=self.dtype)
        else:
            attended = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=self.is_causal)
        return nn.Dense(self.d_model, dtype=self.dtype, name="output")(attended.reshape(x.shape[:2] + (-1,)))


class FeedForward(nn.Module):
    d_model: int
    ff_dim: int
    dropout: float
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, training):
        hidden = nn.relu(nn.Dense(self.ff_dim, dtype=self.dtype, name="hidden")(x))
        hidden = nn.Dropout(self.dropout, deterministic=not training)(hidden)
        return nn.Dense(self.d_model, dtype=self.dtype, name="out")(hidden)


def layer_norm(name, dtype):
    return nn.LayerNorm(epsilon=LAYER_NORM_EPSILON, dtype=dtype, name=name)


class Block(nn.Module):
    """What encoder and decoder blocks share: their sizes and the pre-LN feed-forward sublayer."""
    d_model: int
    num_heads: int
    ff_dim: int
    dropout: float
    dtype: jnp.dtype = jnp.float32

    def attention(self, name, is_causal=False):
        return Attention(self.d_model, self.num_heads, is_causal=is_causal, dtype=self.dtype, name=name)

    def feed_forward_residual(self, x, drop, training):
        h = layer_norm("ff_norm", self.dtype)(x)
        return x + drop(FeedForward(self.d_model, self.ff_dim, self.dropout, self.dtype, name="ff")(h, training))


class EncoderBlock(Block):
    @nn.compact
    def __call__(self, x, src_mask, training):
        drop = nn.Dropout(self.dropout, deterministic=not training)
        h = layer_norm("attention_norm", self.dtype)(x)
        x = x + drop(self.attention("self_attention")(h, h, key_mask=src_mask))
        return self.feed_forward_residual(x, drop, training)


class DecoderBlock(Block):
    @nn.compact
    def __call__(self, x, memory, src_mask, training):
        drop = nn.Dropout(self.dropout, deterministic=not training)
        h = layer_norm("self_attention_norm", self.dtype)(x)
        x = x + drop(self.attention("self_attention", is_causal=True)(h, h))
        h = layer_norm("cross_attention_norm", self.dtype)(x)
        x = x + drop(self.attention("cross_attention")(h, memory, key_mask=src_mask))
        return self.feed_forward_residual(x, drop, training)


class Transformer(nn.Module):
    vocab_size: int
    d_model: int
    num_heads: int
    encoder_layers: int
    decoder_layers: int
    ff_dim: int
    max_len: int
    dropout: float = 0.0
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.token_embedding = nn.Embed(self.vocab_size, self.d_model, dtype=self.dtype)
        self.position_embedding = nn.Embed(self.max_len, self.d_model, dtype=self.dtype)
        self.embedding_dropout = nn.Dropout(self.dropout)
        self.encoder_blocks = [EncoderBlock(self.d_model, self.num_heads, self.ff_dim, self.dropout, self.dtype,
                                            name=f"encoder_{i}") for i in range(self.encoder_layers)]
        self.decoder_blocks = [DecoderBlock(self.d_model, self.num_heads, self.ff_dim, self.dropout, self.dtype,
                                            name=f"decoder_{i}") for i in range(self.decoder_layers)]
        self.encoder_norm = layer_norm("encoder_norm", self.dtype)
        self.decoder_norm = layer_norm("decoder_norm", self.dtype)

    def embed(self, ids, training):
        x = self.token_embedding(ids) * jnp.asarray(math.sqrt(self.d_model), self.dtype)
        x = x + self.position_embedding(jnp.arange(ids.shape[1]))[None]
        return self.embedding_dropout(x, deterministic=not training)

    def __call__(self, source_ids, target_input_ids, training=False):
        src_mask = source_ids != PAD_ID
        memory = self.embed(source_ids, training)
        for block in self.encoder_blocks:
            memory = block(memory, src_mask, training)
        memory = self.encoder_norm(memory)
        x = self.embed(target_input_ids, training)
        for block in self.decoder_blocks:
            x = block(x, memory, src_mask, training)
        # Tied output layer, logits in float32 for a stable softmax.
        return self.token_embedding.attend(self.decoder_norm(x)).astype(jnp.float32)


def build_model(shape, dtype=jnp.float32):
    """`shape`: an mtbench `ModelPreset` (any object with its fields)."""
    return Transformer(vocab_size=shape.vocab_size, d_model=shape.d_model, num_heads=shape.num_heads,
                       encoder_layers=shape.encoder_layers, decoder_layers=shape.decoder_layers,
                       ff_dim=shape.ff_dim, max_len=shape.max_len, dropout=shape.dropout, dtype=dtype)


KERAS_TO_FLAX_LEAF = {"kernel": "kernel", "bias": "bias", "gamma": "scale", "beta": "bias",
                      "embeddings": "embedding"}


def flax_path(keras_path):
    """The key path in Flax's params of a Keras variable path (e.g. `transformer/encoder_0/ff/hidden/kernel`):
    Flax's module names are Keras's layer names, and Dense kernels share Keras's (in, out) layout."""
    *scopes, leaf = keras_path.split("/")[1:]  # drop the model's own name
    return ("params", *scopes, KERAS_TO_FLAX_LEAF[leaf])


def params_from_keras_paths(weights):
    """Flax params from {Keras variable path: array}."""
    params = {}
    for path, value in weights.items():
        *scopes, leaf = flax_path(path)
        node = params
        for scope in scopes:
            node = node.setdefault(scope, {})
        node[leaf] = jnp.asarray(value, jnp.float32)
    return params


def weights_by_keras_path(params, paths):
    """The params as {Keras variable path: numpy array}."""
    weights = {}
    for path in paths:
        node = params
        for key in flax_path(path):
            node = node[key]
        weights[path] = np.asarray(node)
    return weights


def clip_each_by_norm(max_norm):
    """Scales every gradient whose own L2 norm exceeds `max_norm` down to it (Keras's `clipnorm`; optax's
    `clip_by_global_norm` would clip all of them together)."""

    def clip(update):
        norm = jnp.sqrt(jnp.sum(jnp.square(update)))
        return update * max_norm / jnp.maximum(norm, max_norm)

    return optax.stateless(lambda updates, params=None: jax.tree.map(clip, updates))


def make_optimizer(settings):
    """`settings`: `benchmarks.workload.OptimizerSettings`. Epsilon is placed where Keras places it: Keras adds
    it to sqrt(v) before v's bias correction, optax after, so at update t optax gets Keras's epsilon divided by
    sqrt(1 - beta_2**t). Without that, the rows of tokens a batch hardly touches (sqrt(v) of epsilon's order)
    would move differently."""
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=settings.learning_rate, warmup_steps=settings.warmup_steps,
        decay_steps=settings.warmup_steps + settings.decay_steps, end_value=settings.alpha * settings.learning_rate)

    def keras_epsilon(count):  # `count` updates done before this one
        return settings.epsilon / jnp.sqrt(1 - settings.beta_2 ** (count + 1))

    # `mask` is static: inject_hyperparams would call any other callable as a schedule of the step count.
    adamw = optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
        learning_rate=schedule, b1=settings.beta_1, b2=settings.beta_2, eps=keras_epsilon,
        weight_decay=settings.weight_decay, mask=lambda params: jax.tree.map(lambda p: settings.decays(p.shape), params))
    clipping = {"per-variable": lambda: clip_each_by_norm(settings.clipnorm),
                "global": lambda: clip_by_global_norm_as_keras(settings.clipnorm),
                "none": optax.identity}[settings.clip]
    return optax.chain(clipping(), adamw)


def clip_by_global_norm_as_keras(max_norm):
    """Keras's `clip_by_global_norm`: every gradient times max_norm x min(1 / norm, 1 / max_norm), the norm of
    them all."""

    def clip(updates, params=None):
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(update)) for update in jax.tree.leaves(updates)))
        scale = max_norm * jnp.minimum(1.0 / norm, 1.0 / max_norm)
        return jax.tree.map(lambda update: update * scale, updates)

    return optax.stateless(clip)


class FlaxTrainStep:
    """One jitted step: forward, token-weighted mean cross-entropy, backward, optax update. Parameters and
    optimizer state are donated, so XLA updates them in place."""

    def __init__(self, model, params, optimizer, seed=0):
        self.model, self.optimizer = model, optimizer
        self.state = (params, optimizer.init(params), jax.random.key(seed))
        self._step = jax.jit(self._train_step, donate_argnums=0)

    def _train_step(self, state, *arrays):
        *inputs, target_output, weight = arrays
        params, optimizer_state, key = state
        key, dropout_key = jax.random.split(key)
        tokens = jnp.sum(weight)

        def loss_of(params):
            logits = self.model.apply(params, *inputs, training=True, rngs={"dropout": dropout_key})
            token_loss = token_cross_entropy(target_output, logits)
            return jnp.sum(token_loss * weight) / tokens, logits

        (loss, logits), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, optimizer_state = self.optimizer.update(grads, optimizer_state, params)
        params = optax.apply_updates(params, updates)
        accuracy = correct_tokens(target_output, logits, weight) / tokens
        return (params, optimizer_state, key), {"loss": loss, "accuracy": accuracy}

    def __call__(self, *arrays):
        """`arrays`: the model's inputs (the translation model's source and target input, a language model's
        tokens), the labels, the weights. Returns the batch's {'loss', 'accuracy'} as device arrays
        (asynchronously); `block()` waits."""
        self.state, logs = self._step(self.state, *arrays)
        return logs

    def block(self):
        jax.block_until_ready(self.state)

    @property
    def devices(self):
        """The devices the parameters live on."""
        return set().union(*(leaf.devices() for leaf in jax.tree.leaves(self.state[0])))

    def weights_by_keras_path(self, paths):
        return weights_by_keras_path(self.state[0], paths)


def train_step_from_keras_weights(shape, weights, settings, mixed_bfloat16=False, seed=0, build=build_model):
    """The native step of the model `build(shape, dtype)` makes (default: the translation Transformer), starting
    from mtbench's initial weights ({Keras path: numpy array})."""
    model = build(shape, jnp.bfloat16 if mixed_bfloat16 else jnp.float32)
    return FlaxTrainStep(model, params_from_keras_paths(weights), make_optimizer(settings), seed)


def batch_arrays(batch):
    """An mtbench `Batch` as the step's arrays, on jax's default device: the model's inputs (`batch.inputs`), the
    labels, the weights."""
    return tuple(jnp.asarray(np.asarray(a)) for a in (*batch.inputs, batch.target_output, batch.weight))
