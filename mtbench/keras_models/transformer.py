"""The encoder-decoder Transformer, written once with keras and keras.ops so that every backend runs the same model.

Pre-layer-norm blocks (more stable at high learning rates than the post-LN of the original paper), one embedding
shared by source, target and the output projection, learned positions. Token id 0 is padding.
"""

import keras
from keras import layers, ops

PAD_ID = 0


class Embedding(layers.Layer):
    """A table of `rows` vectors looked up by id, in its float32 variable, the result cast to the compute dtype,
    as nanoGPT's and Flax's embeddings are. Keras's `Embedding` reads its table through the layer's autocast
    scope, so under a 16-bit policy the backward pass sums each row's gradient in 16 bits (a scatter-add into a
    16-bit table): lossy where a row is looked up thousands of times a step (a byte, a common word), and on a GPU
    a 16-bit atomic loop per element. The variable is `embeddings`, as Keras's, so weights files load alike."""

    def __init__(self, rows, d_model, **kwargs):
        super().__init__(**kwargs)
        self.rows, self.d_model = rows, d_model

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(shape=(self.rows, self.d_model), initializer="uniform", autocast=False,
                                          name="embeddings")

    def call(self, ids):
        return ops.cast(ops.take(self.embeddings, ops.cast(ids, "int32"), axis=0), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.d_model)


def dropout_layer(rate):
    """Dropout at `rate`, or the identity when it is 0 (the CPU presets): on torch every Keras layer call costs
    tens of microseconds of Python bookkeeping even when the layer does nothing."""
    if rate > 0:
        return layers.Dropout(rate)
    return lambda x, training=False: x


def recomputes(layer):
    """Whether `layer` recomputes its activations in the backward pass: its `remat` is True (the family's contract:
    `keras.remat`) or the function that makes its computation recompute (the remat extra's `selective_checkpoint`)."""
    remat = getattr(layer, "remat", False)
    return remat is True or callable(remat)


def recomputed_in_backward(block, branches, training, *inputs):
    """`branches(*inputs, training)` of `block`: in training under `block.remat`, its activations are dropped after
    the forward pass and recomputed from `inputs` in the backward pass (activation checkpointing, `keras.remat`:
    `jax.checkpoint`, `torch.utils.checkpoint`; or `block.remat` itself where it is a function that makes one that
    recomputes, as a policy that keeps some outputs does). A block whose dropout layers hold seed states computes as a
    function of its variables' values: the recomputation then draws the masks the forward pass drew, and the new
    seed states leave it as outputs (on JAX, assigned inside it, they would escape the recomputed function). A block
    whose caller recomputes its whole call (`checkpointed_outside`: a wrapper that must hold the block's variables as
    they were) computes plainly."""
    if not (block.remat and training) or getattr(block, "checkpointed_outside", False):
        return branches(*inputs, training=training)
    checkpoint = block.remat if callable(block.remat) else keras.remat
    seeds = block.non_trainable_variables
    if not seeds:
        return checkpoint(lambda *values: branches(*values, training=training))(*inputs)
    weights = block.trainable_variables

    def run(weight_values, seed_values, *inputs):
        mapping = list(zip(weights + seeds, weight_values + seed_values))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            outputs = branches(*inputs, training=training)
        return outputs, [given if drawn is None else drawn
                         for given, drawn in zip(seed_values, (scope.get_current_value(seed) for seed in seeds))]

    outputs, drawn = checkpoint(run)([weight.value for weight in weights], [seed.value for seed in seeds], *inputs)
    for seed, value in zip(seeds, drawn):
        seed.assign(value)
    return outputs


class Attention(layers.Layer):
    """Multi-head attention. Padding is expressed as a key mask and causality as `is_causal`, the two forms fused
    kernels accept.

    `flash_attention` (as extras set it in `run.model_options`): True asks `keras.ops.dot_product_attention`
    for the fused kernel; None calls it without Keras's fused path, so the backend picks among the kernels it
    holds the process to (torch's memory-efficient kernel for the masked attention under `--extra
    flash-attention`, FlashAttention taking no mask); False (the default) runs `plain_attention`, the same
    operations in the same dtypes on every backend. Keras's own plain attention differs by backend (JAX's keeps
    the scores in float32, torch's SDPA math kernel upcasts a 16-bit query, key and value to float32), and left to
    choose Keras on a GPU tries the fused kernel, and where it refuses the inputs logs a traceback and falls back,
    at every trace, so no run could say which one ran: Keras is always told.

    `fused_projections` (True): the projections of one input (the query, key and value of self-attention; the
    key and value of cross-attention) are one product with their kernels stacked side by side, as nanoGPT's and
    Megatron's fused projection, with the weights still in the three Dense layers (weights files, checkpoints and
    imported models load alike). One matmul of three times the width instead of three, forward and backward: the
    input's gradient is one product summed in the matmul's float32 accumulator, where three products round three
    16-bit partial gradients before adding them. XLA's GPU compiler merges the forward's three products itself
    (not the backward's); XLA's CPU compiler and torch.compile merge none. Split by columns over devices, one
    product has one partial gradient of its input to all-reduce, where three have three. False: one Dense call a
    projection (the weights are the same).

    `dropout`: the share of attention probabilities dropped while training (nanoGPT's and GPT-2's `attn_dropout`),
    in the plain attention only: the fused kernels Keras calls drop none, so asking for both is refused."""

    fused_projections = True

    def __init__(self, d_model, num_heads, is_causal=False, flash_attention=False, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        if dropout and flash_attention is not False:
            raise ValueError(f"attention dropout ({dropout:g}) needs the plain attention: the fused kernels of "
                             f"keras.ops.dot_product_attention drop no attention probabilities")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.is_causal = is_causal
        self.flash_attention = flash_attention
        self.dropout_rate = dropout
        self.probability_dropout = dropout_layer(dropout)
        self.query = layers.Dense(d_model, name="query")
        self.key = layers.Dense(d_model, name="key")
        self.value = layers.Dense(d_model, name="value")
        self.output_projection = layers.Dense(d_model, name="output")

    def _split_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, self.head_dim))

    def keys_values(self, memory):
        return self._split_heads(self.key(memory)), self._split_heads(self.value(memory))

    def projected_together(self, inputs, projections):
        """The heads of each Dense layer of `projections` applied to `inputs`, from one product with their kernels
        stacked on a new axis (each kernel, bias and product the layer's own, in its compute dtype)."""
        for projection in projections:
            if not projection.built:
                projection.build(ops.shape(inputs))
        return self.heads_of_one_product(inputs, [projection.kernel for projection in projections],
                                         [projection.bias for projection in projections])

    def heads_of_one_product(self, inputs, kernels, biases):
        """The heads of each (kernel, bias) applied to `inputs`, from one product of the kernels side by side.

        Where Keras lays weights out over devices (a `ModelParallel` distribution), the kernels are stacked on a
        new axis, (d_in, n, d_out), so that a split of their output columns stays a split of one axis: the
        partitioner keeps the heads apart (side by side, each device's columns would sit in n pieces of the
        merged axis, and it gathers them). Elsewhere one 2-D product of the rows, (b*t, d_in) by (d_in, n*d_out),
        plus the biases side by side: nanoGPT's `c_attn`, whose bias torch.compile folds into the GEMM (addmm, on
        a GPU cuBLAS's epilogue) where after a 3-D product it runs one more kernel over the product a block."""
        if isinstance(keras.distribution.distribution(), keras.distribution.ModelParallel):
            products = ops.einsum("btd,dnh->btnh", inputs, ops.stack(kernels, axis=1)) + ops.stack(biases)
            return [self._split_heads(products[:, :, index]) for index in range(len(kernels))]
        batch, length, width = ops.shape(inputs)
        rows = ops.reshape(inputs, (-1, width))
        products = ops.matmul(rows, ops.concatenate(kernels, axis=1)) + ops.concatenate(biases)
        heads = ops.shape(kernels[0])[-1] // self.head_dim  # the kernels' own: a device's share where they are split
        products = ops.reshape(products, (batch, length, len(kernels), heads, self.head_dim))
        return [products[:, :, index] for index in range(len(kernels))]

    def attend(self, x, keys, values, key_mask=None, is_causal=False, flash_attention=False, queries=None,
               training=False):
        q = self._split_heads(self.query(x)) if queries is None else queries
        if flash_attention is not False:
            fused = flash_attention is True
            mask = None if key_mask is None else attention_mask(key_mask, ops.shape(q)[1], fused)
            attended = ops.dot_product_attention(q, keys, values, mask=mask, is_causal=is_causal,
                                                 flash_attention=fused)
        else:
            dropout = self.drop_probabilities if training and self.dropout_rate else None
            attended = plain_attention(q, keys, values, key_mask, is_causal, dropout)
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return self.output_projection(ops.reshape(attended, (batch, length, self.num_heads * self.head_dim)))

    def drop_probabilities(self, probabilities):
        """`probabilities` (batch, heads, queries, keys) through the attention's dropout, while training."""
        return self.probability_dropout(probabilities, training=True)

    def call(self, x, memory=None, key_mask=None, training=False):
        """`memory`: the sequence the keys and values are made of (cross-attention); None: `x` (self-attention)."""
        queries = None
        if not self.fused_projections:
            keys, values = self.keys_values(x if memory is None else memory)
        elif memory is None:
            queries, keys, values = self.projected_together(x, (self.query, self.key, self.value))
        else:
            keys, values = self.projected_together(memory, (self.key, self.value))
        return self.attend(x, keys, values, key_mask, self.is_causal, self.flash_attention, queries, training)


# A large negative score for hidden keys: finite, so a query that sees no key gets equal weights and no NaN.
HIDDEN_SCORE = -1e9


def plain_attention(query, keys, values, key_mask=None, is_causal=False, dropout=None):
    """Scaled dot-product attention of (batch, length, heads, head_dim) tensors, written with keras.ops so that
    every backend runs the same operations: both matmuls in the compute dtype, the scores scaled, masked and
    normalised in float32, the probabilities cast back to the compute dtype (as the fused kernels do), then
    passed through `dropout` (a function of them) where given."""
    scores = ops.cast(ops.einsum("btnh,bsnh->bnts", query, keys), "float32") * (ops.shape(query)[-1] ** -0.5)
    visible = None if key_mask is None else key_mask[:, None, None, :]
    if is_causal:
        # Comparisons of two ranges made on the device (no tensor copied from the host).
        causal = ops.arange(ops.shape(query)[1])[:, None] >= ops.arange(ops.shape(keys)[1])[None, :]
        visible = causal[None, None] if visible is None else ops.logical_and(visible, causal[None, None])
    if visible is not None:
        # Added as a bias the size of the mask, with Python numbers as kernel arguments.
        scores = scores + (1.0 - ops.cast(visible, "float32")) * HIDDEN_SCORE
    probabilities = ops.cast(ops.softmax(scores, axis=-1), values.dtype)
    if dropout is not None:
        probabilities = dropout(probabilities)
    return ops.einsum("bnts,bsnh->btnh", probabilities, values)


def attention_arithmetic(model):
    """What `model`'s attention layers (`Attention`) compute in, as they train: {'matmul_inputs': the compute
    dtype, 'accumulation': 'float32' (what the GPU libraries accumulate 16-bit matmuls in), 'scores': the dtype the
    first matmul writes (`plain_attention`: the compute dtype; the fused kernels keep them in float32), 'softmax':
    'float32', 'projections': 'fused' (one product for the query, key and value, `fused_projections`) or
    'separate', 'probability_dropout': the share of probabilities dropped while training (0: none)}; None where
    it has no such layer, or layers that compute differently."""
    found = {(layer.compute_dtype, layer.flash_attention is not False, layer.fused_projections, layer.dropout_rate)
             for layer in model._flatten_layers() if isinstance(layer, Attention)}
    if len(found) != 1:
        return None
    dtype, fused, fused_projections, dropout = found.pop()
    return {"matmul_inputs": dtype, "accumulation": "float32", "scores": "float32" if fused else dtype,
            "softmax": "float32", "projections": "fused" if fused_projections else "separate",
            "probability_dropout": dropout}


def fused_attention_layers(model):
    """How many of `model`'s attention layers (`Attention`) of each kind were asked for a fused kernel: the
    causal 'decoder self-attention', the padded 'encoder self-attention' and 'cross-attention'."""
    counts = {"decoder self-attention": 0, "encoder self-attention": 0, "cross-attention": 0}
    for layer in model._flatten_layers():
        if isinstance(layer, Attention) and layer.flash_attention is not False:
            kind = ("decoder self-attention" if layer.is_causal else
                    "cross-attention" if layer.name == "cross_attention" else "encoder self-attention")
            counts[kind] += 1
    return counts


def attention_mask(key_mask, query_length, fused):
    """The attention mask of `key_mask` (batch, keys; True where a key is real). Plain attention broadcasts a
    (batch, 1, 1, keys) mask itself; cuDNN's fused kernel takes the mask as a bias that must already span every
    query, (batch, 1, queries, keys), and refuses the broadcastable form (jax-ml/jax#28974). Both masks hide the
    same keys from every query, so the numbers are the same."""
    mask = key_mask[:, None, None, :]
    if not fused:
        return mask
    return ops.broadcast_to(mask, (ops.shape(key_mask)[0], 1, query_length, ops.shape(key_mask)[1]))


class FeedForward(layers.Layer):
    def __init__(self, d_model, ff_dim, dropout, **kwargs):
        super().__init__(**kwargs)
        self.hidden = layers.Dense(ff_dim, activation="relu", name="hidden")
        self.out = layers.Dense(d_model, name="out")
        self.dropout = dropout_layer(dropout)

    def call(self, x, training=False):
        return self.out(self.dropout(self.hidden(x), training=training))


class EncoderBlock(layers.Layer):
    def __init__(self, d_model, num_heads, ff_dim, dropout, flash_attention=False, remat=False, **kwargs):
        super().__init__(**kwargs)
        self.remat = remat
        self.attention_norm = layers.LayerNormalization(epsilon=1e-6, name="attention_norm")
        self.attention = Attention(d_model, num_heads, flash_attention=flash_attention, name="self_attention")
        self.ff_norm = layers.LayerNormalization(epsilon=1e-6, name="ff_norm")
        self.ff = FeedForward(d_model, ff_dim, dropout, name="ff")
        self.dropout = dropout_layer(dropout)

    def call(self, x, src_mask, training=False):
        return recomputed_in_backward(self, self.residual_branches, training, x, src_mask)

    def residual_branches(self, x, src_mask, training=False):
        h = self.attention_norm(x)
        x = x + self.dropout(self.attention(h, key_mask=src_mask), training=training)
        return x + self.dropout(self.ff(self.ff_norm(x), training=training), training=training)


class DecoderBlock(layers.Layer):
    def __init__(self, d_model, num_heads, ff_dim, dropout, flash_attention=False, flash_attention_masked=False,
                 remat=False, **kwargs):
        super().__init__(**kwargs)
        self.remat = remat
        self.self_attention_norm = layers.LayerNormalization(epsilon=1e-6, name="self_attention_norm")
        self.self_attention = Attention(d_model, num_heads, is_causal=True, flash_attention=flash_attention,
                                        name="self_attention")
        self.cross_attention_norm = layers.LayerNormalization(epsilon=1e-6, name="cross_attention_norm")
        self.cross_attention = Attention(d_model, num_heads, flash_attention=flash_attention_masked,
                                         name="cross_attention")
        self.ff_norm = layers.LayerNormalization(epsilon=1e-6, name="ff_norm")
        self.ff = FeedForward(d_model, ff_dim, dropout, name="ff")
        self.dropout = dropout_layer(dropout)

    def call(self, x, memory, src_mask, training=False):
        return recomputed_in_backward(self, self.residual_branches, training, x, memory, src_mask)

    def residual_branches(self, x, memory, src_mask, training=False):
        # Target padding needs no mask: causality keeps real positions from seeing the padding after them,
        # and the loss ignores the padded positions themselves.
        h = self.self_attention_norm(x)
        x = x + self.dropout(self.self_attention(h), training=training)
        h = self.cross_attention_norm(x)
        x = x + self.dropout(self.cross_attention(h, memory, key_mask=src_mask), training=training)
        return x + self.dropout(self.ff(self.ff_norm(x), training=training), training=training)


    def step(self, x, position, cache, cross_keys_values, src_mask):
        """One decoding position with a key/value cache: `x` (batch, 1, d_model) is the input at `position`;
        `cache` holds this block's self-attention keys and values for every position so far."""
        cache_keys, cache_values = cache
        h = self.self_attention_norm(x)
        new_keys, new_values = self.self_attention.keys_values(h)
        cache_keys = ops.slice_update(cache_keys, (0, position, 0, 0), new_keys)
        cache_values = ops.slice_update(cache_values, (0, position, 0, 0), new_values)
        # The cache has room for the whole output; attend only to the positions written so far.
        written = ops.arange(ops.shape(cache_keys)[1]) <= position
        written = ops.broadcast_to(written[None, :], (ops.shape(x)[0], ops.shape(cache_keys)[1]))
        x = x + self.self_attention.attend(h, cache_keys, cache_values, key_mask=written)
        h = self.cross_attention_norm(x)
        x = x + self.cross_attention.attend(h, *cross_keys_values, key_mask=src_mask)
        return x + self.ff(self.ff_norm(x)), (cache_keys, cache_values)


def decoding_state(decoder_blocks, memory, length):
    """The state incremental decoding carries: the cross-attention keys and values of the source (computed once)
    and an empty self-attention cache of `length` positions per decoder block (blocks with `self_attention`
    and `cross_attention` Attention layers)."""
    rows = ops.shape(memory)[0]
    cross = [block.cross_attention.keys_values(memory) for block in decoder_blocks]
    caches = []
    for block in decoder_blocks:
        attention = block.self_attention
        empty = ops.zeros((rows, length, attention.num_heads, attention.head_dim), dtype=memory.dtype)
        caches.append((empty, empty))
    return cross, caches


class Transformer(keras.Model):
    """Inputs: `(source_ids, target_input_ids)`, both (batch, length) int32; output: logits (batch, length, vocab)."""
    pad_id = PAD_ID

    def __init__(self, vocab_size, d_model, num_heads, encoder_layers, decoder_layers, ff_dim, max_len,
                 dropout=0.0, flash_attention=False, flash_attention_masked=False, remat=False, **kwargs):
        """`flash_attention` applies to the decoder's causal self-attention; `flash_attention_masked` to the
        attentions that take a padding mask (encoder self-attention, cross-attention), since some fused
        kernels (torch's flash) accept no mask. `remat`: each block's activations recomputed in the backward
        pass."""
        super().__init__(**kwargs)
        self.d_model = d_model
        self.max_len = max_len
        # sqrt(d_model) in the compute dtype, as a Python number: multiplied in, it is an argument of the
        # multiplication's kernel, where a constant made in each call would be a tensor built from host data (on
        # torch with a GPU, a copy the host waits for, twice a step).
        self.embedding_scale = float(ops.convert_to_numpy(ops.cast(d_model ** 0.5, self.compute_dtype)))
        self.token_embedding = Embedding(vocab_size, d_model, name="token_embedding")
        self.position_embedding = Embedding(max_len, d_model, name="position_embedding")
        self.embedding_dropout = dropout_layer(dropout)
        self.encoder_blocks = [EncoderBlock(d_model, num_heads, ff_dim, dropout, flash_attention_masked, remat,
                                            name=f"encoder_{i}") for i in range(encoder_layers)]
        self.decoder_blocks = [DecoderBlock(d_model, num_heads, ff_dim, dropout, flash_attention,
                                            flash_attention_masked, remat, name=f"decoder_{i}")
                               for i in range(decoder_layers)]
        self.encoder_norm = layers.LayerNormalization(epsilon=1e-6, name="encoder_norm")
        self.decoder_norm = layers.LayerNormalization(epsilon=1e-6, name="decoder_norm")

    def _embed(self, ids, training):
        positions = ops.arange(ops.shape(ids)[1])
        x = self.token_embedding(ids) * self.embedding_scale
        return self.embedding_dropout(x + self.position_embedding(positions)[None], training=training)

    def encode(self, source_ids, training=False):
        """Returns the encoder output and the source padding mask that decoding attends with."""
        # `!=` with a Python number, not `ops.not_equal`, which would make a tensor of PAD_ID from host data.
        src_mask = source_ids != PAD_ID
        x = self._embed(source_ids, training)
        for block in self.encoder_blocks:
            x = block(x, src_mask, training=training)
        return self.encoder_norm(x), src_mask

    def decode(self, target_input_ids, memory, src_mask, training=False):
        x = self._embed(target_input_ids, training)
        for block in self.decoder_blocks:
            x = block(x, memory, src_mask, training=training)
        return self._logits(self.decoder_norm(x))

    def _logits(self, x):
        # Tied output layer: logits against the shared embedding table, computed in float32 for a stable softmax.
        table = ops.cast(self.token_embedding.embeddings, x.dtype)
        return ops.cast(ops.matmul(x, ops.transpose(table)), "float32")

    def start_decoding(self, memory, length):
        return decoding_state(self.decoder_blocks, memory, length)

    def decode_step(self, token_ids, position, caches, cross, src_mask):
        """Logits (batch, vocab) for the token after `token_ids` (batch, 1) at `position`, and the new caches."""
        x = self.token_embedding(token_ids) * self.embedding_scale
        x = x + self.position_embedding(ops.reshape(position, (1,)))[None]
        new_caches = []
        for block, cache, cross_keys_values in zip(self.decoder_blocks, caches, cross):
            x, cache = block.step(x, position, cache, cross_keys_values, src_mask)
            new_caches.append(cache)
        return self._logits(self.decoder_norm(x))[:, 0], new_caches

    def call(self, inputs, training=False):
        source_ids, target_input_ids = inputs
        memory, src_mask = self.encode(source_ids, training=training)
        return self.decode(target_input_ids, memory, src_mask, training=training)


def create_variables(model, inputs=1):
    """`model` with its variables created, by a call on symbolic ids (batch 1, length 8; a tuple of `inputs` of
    them): the call's shapes are traced and no operation runs. Called on real ids, JAX would compile each eager
    operation of the forward pass, on a GPU a program each: about 60 for GPT-2 small, 11 s of a process's start on
    an H100. The initializers draw the same numbers either way.

    Traced with the plain attention, which holds no weights of its own: a fused kernel's checks refuse symbolic
    tensors (torch's flash check wants them on a GPU, with a warning for each), and Keras would then run the whole
    call again on the device."""
    ids = keras.KerasTensor((1, 8), dtype="int32")
    attentions = [layer for layer in model._flatten_layers() if isinstance(layer, Attention)]
    asked = [layer.flash_attention for layer in attentions]
    for layer in attentions:
        layer.flash_attention = False
    try:
        model(ids if inputs == 1 else (ids,) * inputs)
    finally:
        for layer, flash_attention in zip(attentions, asked):
            layer.flash_attention = flash_attention
    return model


def build_transformer(preset, flash_attention=False, flash_attention_masked=False, remat=False):
    """Builds the model with its variables created, so weights can be set before compiling."""
    model = Transformer(vocab_size=preset.vocab_size, d_model=preset.d_model, num_heads=preset.num_heads,
                        encoder_layers=preset.encoder_layers, decoder_layers=preset.decoder_layers,
                        ff_dim=preset.ff_dim, max_len=preset.max_len, dropout=preset.dropout,
                        flash_attention=flash_attention, flash_attention_masked=flash_attention_masked,
                        remat=remat, name="transformer")
    return create_variables(model, inputs=2)
