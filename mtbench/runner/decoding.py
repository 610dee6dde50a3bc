"""Greedy decoding as one loop under keras.ops, so a compiling backend compiles it once per buffer shape and
stops as soon as every row has produced EOS. The decoder keeps a key/value cache, so each new token costs one
position of work, not a pass over everything decoded so far."""

import math

import numpy as np
from keras import ops

from mtbench.runner.batches import bucket_for, bucket_lengths
from mtbench.runner.tokenizer import BOS_ID, EOS_ID, PAD_ID


def greedy_decoder(model, use_cache=True):
    """Returns decode(source_ids (rows, S), buffer (rows, T)) -> token ids (rows, T) beginning with BOS.

    With `use_cache`, each position runs the decoder on one token against cached keys and values (linear in
    the output length); without, it reruns the decoder over the whole buffer (quadratic), which is the
    reference the cached decoder must agree with."""

    def decode(source, buffer):
        memory, src_mask = model.encode(source)
        rows, length = ops.shape(buffer)[0], ops.shape(buffer)[1]
        # Filler rows (no source token) count as finished from the start.
        finished = ops.logical_not(ops.any(src_mask, axis=1))
        # An empty tuple, not None, when there is no cache: loop variables must be (nested) tensors.
        state = model.start_decoding(memory, length) if use_cache else ()

        def next_logits(t, buffer, state):
            if not use_cache:
                return ops.take(model.decode(buffer, memory, src_mask), t, axis=1), ()
            cross, caches = state
            logits, caches = model.decode_step(ops.slice(buffer, (0, t), (rows, 1)), t, caches, cross, src_mask)
            return logits, (cross, caches)

        def keep_going(t, buffer, finished, state):
            return ops.logical_and(t < length - 1, ops.logical_not(ops.all(finished)))

        def next_token(t, buffer, finished, state):
            logits, state = next_logits(t, buffer, state)
            ids = ops.where(finished, PAD_ID, ops.cast(ops.argmax(logits, axis=-1), "int32"))
            buffer = ops.slice_update(buffer, (0, t + 1), ids[:, None])
            return t + 1, buffer, ops.logical_or(finished, ops.equal(ids, EOS_ID)), state

        start = (ops.convert_to_tensor(0), ops.convert_to_tensor(buffer), finished, state)
        _, buffer, _, _ = ops.while_loop(keep_going, next_token, start)
        return buffer

    return decode


def output_length(source_length, max_len):
    """Room for the translation: targets run up to ~1.5x their source in these languages."""
    buckets = bucket_lengths(max_len)
    return bucket_for(min(max_len, math.ceil(1.5 * source_length) + 2), buckets)


def translate(decode, sources, batch_size, max_len):
    """Greedy translations (token ids without BOS/EOS) of `sources` (lists of ids ending in EOS), in order.
    Sources are sorted by length so each batch decodes into a buffer that fits it."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    results = [None] * len(sources)
    buckets = bucket_lengths(max_len)
    for start in range(0, len(order), batch_size):
        members = order[start:start + batch_size]
        source_length = bucket_for(max(len(sources[i]) for i in members), buckets)
        source = np.full((batch_size, source_length), PAD_ID, np.int32)
        for row, i in enumerate(members):
            source[row, :len(sources[i])] = sources[i]
        buffer = np.full((batch_size, output_length(source_length, max_len)), PAD_ID, np.int32)
        buffer[:, 0] = BOS_ID
        tokens = ops.convert_to_numpy(decode(source, buffer))
        for row, i in enumerate(members):
            ids = [int(t) for t in tokens[row, 1:]]
            results[i] = ids[:ids.index(EOS_ID)] if EOS_ID in ids else [t for t in ids if t != PAD_ID]
    return results
