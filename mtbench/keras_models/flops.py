"""Analytic training FLOPs of mtbench's Transformer (and of MarianMT, the same stacks of matmuls): what the built-in
model families give as `ModelFamily.training_flops`, the numerator of MFU (`runner/measurement/peaks.py` gives the
denominator).

Counted on the padded batch (the work the device really does): every matmul of the forward pass at 2 FLOPs per
multiply-add, attention's two batched matmuls over the full (not causally halved) score matrix, the tied output
projection; training = 3x forward (the backward pass costs two matmuls per forward matmul). Element-wise work
(softmax, layer norm, the optimizer) is left out, as MFU conventionally does.
"""

def forward_flops(model, batch, source_length, target_length):
    """FLOPs of one forward pass of `model` (a ModelPreset) over a padded batch."""
    d, f, vocab = model.d_model, model.ff_dim, model.vocab_size
    source_tokens, target_tokens = batch * source_length, batch * target_length

    def attention(query_tokens, query_length, key_tokens, key_length):
        projections = 2 * query_tokens * d * d * 2 + 2 * key_tokens * d * d * 2  # Q and output; K and V
        scores_and_mix = 2 * (2 * batch * query_length * key_length * d)
        return projections + scores_and_mix

    feed_forward = lambda tokens, width: 2 * 2 * tokens * d * width
    # A shape may give its decoder a feed-forward width of its own (a MarianMT checkpoint's decoder_ffn_dim).
    decoder_f = getattr(model, "decoder_ff_dim", None) or f
    encoder = model.encoder_layers * (attention(source_tokens, source_length, source_tokens, source_length)
                                      + feed_forward(source_tokens, f))
    decoder = model.decoder_layers * (attention(target_tokens, target_length, target_tokens, target_length)
                                      + attention(target_tokens, target_length, source_tokens, source_length)
                                      + feed_forward(target_tokens, decoder_f))
    output_layer = 2 * target_tokens * d * vocab
    return encoder + decoder + output_layer


def training_flops(model, batch, source_length, target_length):
    return 3 * forward_flops(model, batch, source_length, target_length)
