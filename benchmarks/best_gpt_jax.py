"""The GPT language model as a skilled JAX user writes it by hand: plain jax and optax, held to mtbench's arithmetic.

Where benchmarks/native_gpt_flax.py copies mtbench's model module for module, this is what JAX's best users would
benchmark against: the parameters one pytree of arrays (nested dicts) and the model a function of it, one fused
QKV projection per block (its product laid out (batch, length, 3, heads, size), as MaxText's), attention through
`jax.nn.dot_product_attention(is_causal=True)` (cuDNN's fused kernel on a GPU in bfloat16, XLA's attention
elsewhere), the loss against one-hot targets on a GPU as MaxText writes it (`token_losses`), and one `jax.jit`ted
step that donates the parameters and optimizer state so that XLA updates them in place.

The model is still mtbench's `--model gpt` (pre-LayerNorm blocks, LayerNorm eps 1e-5, exact GELU, learned
positions, the output layer tied to the token embedding, float32 logits) and the optimizer is mtbench's
(`native_flax.make_optimizer`: Keras's epsilon placement, its schedule, its clipping: by the global norm, or each
Keras variable's gradient on its own, the thirds of the fused QKV's too), so that from mtbench's initial weights
the losses are mtbench's.
Mixed bfloat16 keeps float32 parameters and casts them to bfloat16 for the matmuls; layer norms' statistics, the
softmax and the loss stay in float32. The params' keys are the Keras scopes (the model's name dropped), the fused
`qkv` aside: it loads from, and splits back into, the Keras `query`, `key` and `value` layers.
"""

import functools
import itertools
import operator

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import native_flax
from benchmarks.native_flax import batch_arrays  # noqa: F401 (this module's API)

LAYER_NORM_EPSILON = 1e-5
QKV = ("query", "key", "value")  # the Keras layers fused into one `qkv` kernel, in this order


def layer_norm(p, x):
    """As Flax's LayerNorm computes it by default (`use_fast_variance`): the variance from the mean and the mean of
    squares, both in float32 whatever the compute dtype, one pass over `x` instead of two."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    variance = jnp.maximum(jnp.square(x32).mean(-1, keepdims=True) - jnp.square(mean), 0.0)
    return ((x32 - mean) * jax.lax.rsqrt(variance + LAYER_NORM_EPSILON) * p["gamma"] + p["beta"]).astype(x.dtype)


def token_losses(logits, labels):
    """Each token's cross-entropy: on a GPU or TPU against one-hot targets, as MaxText computes it there (its
    gradient one element-wise pass over the logits, where the integer labels' gather has a scatter for its gradient
    between two); on a CPU, where the one-hot product is the slower, optax's integer labels."""
    def one_hot(logits, labels):
        return optax.softmax_cross_entropy(logits, jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype))

    return jax.lax.platform_dependent(logits, labels, cpu=optax.softmax_cross_entropy_with_integer_labels,
                                      default=one_hot)


def dense(p, x):
    return x @ p["kernel"].astype(x.dtype) + p["bias"].astype(x.dtype)


def dropout(x, rate, key):
    if not rate:
        return x
    return jnp.where(jax.random.bernoulli(key, 1 - rate, x.shape), x / (1 - rate), 0).astype(x.dtype)


def causal_attention(q, k, v, rate, key, implementation):
    """`jax.nn.dot_product_attention`, which drops no probabilities; with dropout (`rate`), nanoGPT's unfused
    attention written out: scores and softmax in float32, the probabilities dropped in the compute dtype."""
    if not rate:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
    scores = jnp.einsum("btnh,bsnh->bnts", q, k).astype(jnp.float32) * q.shape[-1] ** -0.5
    seen = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    probabilities = jax.nn.softmax(jnp.where(seen, scores, -jnp.inf), axis=-1).astype(v.dtype)
    return jnp.einsum("bnts,bsnh->btnh", dropout(probabilities, rate, key), v)


def forward(params, tokens, shape, dtype=jnp.float32, key=None, attention=None):
    """Float32 logits (batch, length, vocab) of `tokens` (batch, length). `shape`: the mtbench `ModelPreset`;
    `key`: dropout's random key (None: no dropout, as in evaluation); `attention`: the
    `jax.nn.dot_product_attention` implementation (None: XLA's, or "cudnn")."""
    rate = shape.dropout if key is not None else 0.0
    keys = iter(jax.random.split(key, 1 + 3 * shape.decoder_layers)) if rate else itertools.repeat(None)
    length = tokens.shape[1]
    x = params["token_embedding"]["embeddings"][tokens] + params["position_embedding"]["embeddings"][:length]
    x = dropout(x.astype(dtype), rate, next(keys))
    for i in range(shape.decoder_layers):
        p = params[f"block_{i}"]
        qkv = dense(p["self_attention"]["qkv"], layer_norm(p["attention_norm"], x))
        # Split along an axis of its own, as MaxText's fused projection: for an H100 XLA then writes the three
        # gradients together in the bias's reduction; three slices of the last axis cost two more passes (2.8 GB).
        qkv = qkv.reshape(*qkv.shape[:2], len(QKV), shape.num_heads, -1)
        q, k, v = (qkv[:, :, index] for index in range(len(QKV)))
        y = causal_attention(q, k, v, rate, next(keys), attention)
        x = x + dropout(dense(p["self_attention"]["output"], y.reshape(x.shape)), rate, next(keys))
        h = jax.nn.gelu(dense(p["mlp"]["hidden"], layer_norm(p["mlp_norm"], x)), approximate=False)
        x = x + dropout(dense(p["mlp"]["out"], h), rate, next(keys))
    # Tied output layer; float32 logits for a stable softmax, as mtbench's.
    table = params["token_embedding"]["embeddings"].astype(dtype)
    return (layer_norm(params["final_norm"], x) @ table.T).astype(jnp.float32)


def param_keys(keras_path):
    """The keys of a Keras variable's array in the params (its scopes, the model's name dropped, query, key and
    value as `qkv`) and its part of the fused array (0, 1, 2; None where not fused)."""
    *scopes, layer, leaf = keras_path.split("/")[1:]
    if layer in QKV:
        return (*scopes, "qkv", leaf), QKV.index(layer)
    return (*scopes, layer, leaf), None


def params_from_keras_weights(weights):
    """The params pytree from mtbench's {Keras variable path: array}: query, key and value kernels (in, out) and
    biases concatenated along their output axis into `qkv`."""
    arrays = {}
    for path, value in weights.items():
        keys, part = param_keys(path)
        value = np.asarray(value, np.float32)
        if part is None:
            arrays[keys] = value
        else:
            arrays.setdefault(keys, [None] * len(QKV))[part] = value
    params = {}
    for keys, value in arrays.items():
        node = functools.reduce(lambda node, key: node.setdefault(key, {}), keys[:-1], params)
        node[keys[-1]] = jnp.asarray(np.concatenate(value, axis=-1) if isinstance(value, list) else value)
    return params


def weights_by_keras_path(params, paths):
    """The params as {Keras variable path: numpy array}, `qkv` split back."""
    weights = {}
    for path in paths:
        keys, part = param_keys(path)
        value = np.asarray(functools.reduce(operator.getitem, keys, params))
        weights[path] = value if part is None else np.split(value, len(QKV), axis=-1)[part]
    return weights


def split_qkv(tree):
    """`tree` (params, or anything shaped like them) with each `qkv` entry as Keras's three: query, key, value."""
    if not isinstance(tree, dict):
        return tree
    tree = {name: split_qkv(node) for name, node in tree.items()}
    if "qkv" in tree:
        fused = tree.pop("qkv")
        parts = {leaf: jnp.split(value, len(QKV), axis=-1) for leaf, value in fused.items()}
        tree.update({layer: {leaf: parts[leaf][i] for leaf in parts} for i, layer in enumerate(QKV)})
    return tree


def fuse_qkv(tree):
    """`split_qkv`'s inverse."""
    if not isinstance(tree, dict):
        return tree
    tree = {name: fuse_qkv(node) for name, node in tree.items()}
    if QKV[0] in tree:
        parts = [tree.pop(layer) for layer in QKV]
        tree["qkv"] = {leaf: jnp.concatenate([part[leaf] for part in parts], axis=-1) for leaf in parts[0]}
    return tree


def on_keras_variables(optimizer, settings):
    """`optimizer` run on the params as mtbench's variables, each fused `qkv` as its query, key and value, where
    that changes the step: Keras's per-variable clipping clips each variable's gradient on its own, and clipping
    the fused one as one would take a different step. The split and the concatenation are traced into the jitted
    step. Clipped by the global norm (a GPT's default), or not at all, the update is element by element (the
    fused kernel decays as its three parts do, the fused bias does not, as theirs): the fused arrays are updated
    whole, as a person writing the fused projection by hand keeps them."""
    if settings.clip != "per-variable":
        return optimizer

    def update(grads, state, params=None):
        updates, state = optimizer.update(split_qkv(grads), state, split_qkv(params))
        return fuse_qkv(updates), state

    return optax.GradientTransformation(lambda params: optimizer.init(split_qkv(params)), update)


def cudnn_attention_runs_here(head_size):
    """Whether cuDNN's fused attention runs on this process's first device for heads of `head_size`, where
    `jax.nn.dot_product_attention(implementation="cudnn")` would otherwise raise: a CUDA GPU (not ROCm) of compute
    capability 8.0 or newer, and 9.0 for heads over 128 wide."""
    device = jax.devices()[0]
    if device.platform != "gpu" or "rocm" in device.client.platform_version.lower():
        return False
    capability = tuple(int(part) for part in device.compute_capability.split(".")[:2])
    return capability >= ((9, 0) if head_size > 128 else (8, 0))


class TrainStep:
    """One jitted step: forward, token-weighted mean cross-entropy, backward, optax update. The parameters and
    optimizer state are donated, so XLA updates them in place."""

    def __init__(self, shape, params, settings, mixed_bfloat16=False, seed=0, attention="auto"):
        """`attention`: the `jax.nn.dot_product_attention` implementation; "auto": cuDNN's fused kernel, which
        takes 16-bit inputs only, in 16 bits where it runs (`cudnn_attention_runs_here`), elsewhere XLA's (None)."""
        if attention == "auto":  # unfused where dropout drops attention probabilities (`causal_attention`)
            fused = (mixed_bfloat16 and cudnn_attention_runs_here(shape.d_model // shape.num_heads)
                     and not shape.dropout)
            attention = "cudnn" if fused else None
        self.forward = functools.partial(forward, shape=shape, dtype=jnp.bfloat16 if mixed_bfloat16 else jnp.float32,
                                         attention=attention)
        self.optimizer = on_keras_variables(native_flax.make_optimizer(settings), settings)
        self.params, self.optimizer_state, self.key = params, self.optimizer.init(params), jax.random.key(seed)
        self._step = jax.jit(self.train_step, donate_argnums=(0, 1))
        self.name = "best-by-hand jax"
        attends = ("attention written out to drop its probabilities" if shape.dropout
                   else f"dot_product_attention({attention or 'xla'})")
        # What ran, recorded beside the figures as mtbench's runs record theirs (`model.attention`).
        self.attention = {"causal": "cudnn (fused)" if attention == "cudnn" and not shape.dropout else "xla (unfused)"}
        self.description = (f"plain jax + optax: fused QKV, {attends}, one donating jit"
                            + (", bf16 compute" if mixed_bfloat16 else ""))

    def loss(self, params, tokens, next_tokens, weights, key=None):
        losses = token_losses(self.forward(params, tokens, key=key), next_tokens)
        # A language model's weights are all ones; kept so that the mean is over the tokens that count.
        return jnp.sum(losses * weights) / jnp.sum(weights)

    def train_step(self, params, optimizer_state, key, tokens, next_tokens, weights):
        key, dropout_key = jax.random.split(key)
        loss, grads = jax.value_and_grad(self.loss)(params, tokens, next_tokens, weights, dropout_key)
        updates, optimizer_state = self.optimizer.update(grads, optimizer_state, params)
        return optax.apply_updates(params, updates), optimizer_state, key, loss

    def __call__(self, tokens, next_tokens, weights):
        """Device arrays (`batch_arrays(batch)`). Returns {'loss': a device array} (asynchronously)."""
        self.params, self.optimizer_state, self.key, loss = self._step(
            self.params, self.optimizer_state, self.key, tokens, next_tokens, weights)
        return {"loss": loss}

    def validation_loss(self, batches):
        """The token-weighted mean loss of `batches` (`batch_arrays` each), without dropout."""
        loss = jax.jit(self.loss)
        total = tokens = 0.0
        for tokens_in, next_tokens, weights in batches:
            total += float(loss(self.params, tokens_in, next_tokens, weights)) * float(jnp.sum(weights))
            tokens += float(jnp.sum(weights))
        return total / tokens

    def block(self):
        jax.block_until_ready(self.params)

    @property
    def devices(self):
        """The devices the parameters live on."""
        return set().union(*(leaf.devices() for leaf in jax.tree.leaves(self.params)))

    def weights_by_keras_path(self, paths):
        return weights_by_keras_path(self.params, paths)


def train_step_from_keras_weights(shape, weights, settings, mixed_bfloat16=False, seed=0, attention="auto"):
    """The step starting from mtbench's initial weights ({Keras path: numpy array}). Call it on a batch's
    `batch_arrays`: tokens, next tokens, weights."""
    return TrainStep(shape, params_from_keras_weights(weights), settings, mixed_bfloat16=mixed_bfloat16, seed=seed,
                     attention=attention)
