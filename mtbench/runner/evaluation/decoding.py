"""Decoding as one loop under keras.ops, so a compiling backend compiles it once per buffer shape and stops as
soon as every row has produced EOS: greedy, or beam search over `beam` hypotheses per sentence. The decoder keeps
a key/value cache, so each new token costs one position of work, not a pass over everything decoded so far."""

import itertools
import math

import keras
import numpy as np
from keras import ops

from mtbench.runner.data.batches import bucket_for, bucket_lengths

# A log-probability no real hypothesis reaches; finite, so sums of them stay comparable (no inf - inf).
IMPOSSIBLE = -1e9


def _next_logits_fn(model, memory, src_mask, use_cache):
    """`next_logits(t, buffer, state) -> (logits (rows, vocab) of position t + 1, state)` and the initial state.

    With `use_cache`, each position runs the decoder on one token against cached keys and values (linear in
    the output length); without, it reruns the decoder over the whole buffer (quadratic), which is the
    reference the cached decoder must agree with."""

    def next_logits(t, buffer, state):
        if not use_cache:
            return ops.take(model.decode(buffer, memory, src_mask), t, axis=1), ()
        cross, caches = state
        rows = ops.shape(buffer)[0]
        logits, caches = model.decode_step(ops.slice(buffer, (0, t), (rows, 1)), t, caches, cross, src_mask)
        return logits, (cross, caches)

    return next_logits


def _start(model, memory, length, use_cache):
    # An empty tuple, not None, when there is no cache: loop variables must be (nested) tensors.
    return model.start_decoding(memory, length) if use_cache else ()


def greedy_decoder(model, special, use_cache=True):
    """Returns decode(source_ids (rows, S), buffer (rows, T)) -> token ids (rows, T) beginning with the start id;
    `special` (SpecialTokens) says which ids pad and end a sentence."""

    def decode(source, buffer):
        memory, src_mask = model.encode(source)
        length = ops.shape(buffer)[1]
        next_logits = _next_logits_fn(model, memory, src_mask, use_cache)
        # Filler rows (no source token) count as finished from the start.
        finished = ops.logical_not(ops.any(src_mask, axis=1))

        def keep_going(t, buffer, finished, state):
            return ops.logical_and(t < length - 1, ops.logical_not(ops.all(finished)))

        def next_token(t, buffer, finished, state):
            logits, state = next_logits(t, buffer, state)
            ids = ops.where(finished, special.pad, ops.cast(ops.argmax(logits, axis=-1), "int32"))
            buffer = ops.slice_update(buffer, (0, t + 1), ids[:, None])
            return t + 1, buffer, ops.logical_or(finished, ops.equal(ids, special.eos)), state

        start = (ops.convert_to_tensor(0), ops.convert_to_tensor(buffer), finished,
                 _start(model, memory, length, use_cache))
        _, buffer, _, _ = ops.while_loop(keep_going, next_token, start)
        return buffer

    return decode


def length_penalty(lengths, alpha):
    """GNMT's length normalisation ((5 + length) / 6) ** alpha: without it beam search favours short outputs."""
    return ops.power((5.0 + ops.cast(lengths, "float32")) / 6.0, alpha)


def beam_decoder(model, special, beam, alpha=0.6, use_cache=True):
    """Returns decode(source_ids (rows, S), buffer (rows, T)) -> token ids (rows, T) beginning with the start id: the best
    hypothesis of a beam search over `beam` hypotheses per sentence, scored by its log-probability over the
    length penalty (`alpha`).

    Each sentence keeps two sets of `beam`: alive hypotheses (adjacent rows of one buffer, with their key/value
    caches) and finished ones (ended by EOS). At each position every alive hypothesis proposes every token and
    the sentence's 2 x `beam` best sums of log-probabilities are taken: enough that `beam` of them do not end
    (each parent ends in one way only). Those that end join the finished set, scored with the length penalty;
    the best `beam` that do not end stay alive, their buffers and caches gathered from their parents. A sentence
    is done when no alive hypothesis could still beat its worst finished one, even stretched to the buffer's
    end (a log-probability only falls as tokens are added). The answer is the best finished hypothesis, or the
    best alive one where none finished within the buffer."""
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")

    def decode(source, buffer):
        memory, src_mask = model.encode(source)
        rows, length = ops.shape(buffer)[0], ops.shape(buffer)[1]
        filler = ops.logical_not(ops.any(src_mask, axis=1))  # rows with no source: nothing to wait for
        memory, src_mask = ops.repeat(memory, beam, axis=0), ops.repeat(src_mask, beam, axis=0)
        next_logits = _next_logits_fn(model, memory, src_mask, use_cache)
        # Every hypothesis starts as the same BOS: only the first may propose, or the beam fills with copies.
        first = ops.convert_to_tensor([[0.0] + [IMPOSSIBLE] * (beam - 1)], dtype="float32")
        alive_scores = ops.tile(first, (rows, 1))
        finished_scores = ops.full((rows, beam), IMPOSSIBLE, dtype="float32")
        alive = ops.repeat(ops.convert_to_tensor(buffer), beam, axis=0)
        sentence = ops.arange(rows)[:, None]
        longest = length_penalty(length - 1, alpha)

        def keep_going(t, alive, alive_scores, finished, finished_scores, state):
            could_improve = alive_scores[:, 0] / longest > ops.min(finished_scores, axis=1)
            undecided = ops.logical_and(could_improve, ops.logical_not(filler))
            return ops.logical_and(t < length - 1, ops.any(undecided))

        def extend(t, alive, alive_scores, finished, finished_scores, state):
            logits, state = next_logits(t, alive, state)
            vocab = ops.shape(logits)[-1]
            log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
            proposals = ops.reshape(ops.reshape(alive_scores, (-1,))[:, None] + log_probs, (rows, beam * vocab))
            scores, choice = ops.top_k(proposals, 2 * beam)
            parents = ops.reshape(sentence * beam + ops.floor_divide(choice, vocab), (-1,))
            tokens = ops.cast(ops.mod(choice, vocab), "int32")
            extended = ops.slice_update(ops.take(alive, parents, axis=0), (0, t + 1), ops.reshape(tokens, (-1, 1)))
            ended = ops.equal(tokens, special.eos)

            alive_scores, kept = ops.top_k(ops.where(ended, IMPOSSIBLE, scores), beam)
            kept = ops.reshape(sentence * 2 * beam + kept, (-1,))
            alive = ops.take(extended, kept, axis=0)
            if use_cache:
                # The cross-attention keys and values are the same for every hypothesis of a sentence.
                cross, caches = state
                survivors = ops.take(parents, kept, axis=0)
                state = (cross, keras.tree.map_structure(lambda c: ops.take(c, survivors, axis=0), caches))

            candidates = ops.where(ended, scores / length_penalty(t + 1, alpha), IMPOSSIBLE)
            pooled = ops.concatenate([ops.reshape(finished, (rows, beam, length)),
                                      ops.reshape(extended, (rows, 2 * beam, length))], axis=1)
            finished_scores, best = ops.top_k(ops.concatenate([finished_scores, candidates], axis=1), beam)
            finished = ops.take(ops.reshape(pooled, (-1, length)), ops.reshape(sentence * 3 * beam + best, (-1,)),
                                axis=0)
            return t + 1, alive, alive_scores, finished, finished_scores, state

        start = (ops.convert_to_tensor(0), alive, alive_scores, alive, finished_scores,
                 _start(model, memory, length, use_cache))
        _, alive, _, finished, finished_scores, _ = ops.while_loop(keep_going, extend, start)
        first_of_each = ops.arange(rows) * beam  # both sets are sorted best first
        any_finished = finished_scores[:, 0] > IMPOSSIBLE / 2
        return ops.where(any_finished[:, None], ops.take(finished, first_of_each, axis=0),
                         ops.take(alive, first_of_each, axis=0))

    return decode


def make_decoder(model, special, beam=1, alpha=0.6, use_cache=True):
    """The decoder a run translates with: greedy for `beam` 1 (no log-softmax or top-k), else beam search."""
    if beam == 1:
        return greedy_decoder(model, special, use_cache)
    return beam_decoder(model, special, beam, alpha, use_cache)


def output_length(source_length, max_len):
    """Room for the translation: targets run up to ~1.5x their source in these languages."""
    buckets = bucket_lengths(max_len)
    return bucket_for(min(max_len, math.ceil(1.5 * source_length) + 2), buckets)


def translate(decode, sources, batch_size, max_len, special, progress=None):
    """Translations (token ids without start/EOS) of `sources` (lists of ids ending in EOS), in order.
    Each batch holds sources of one length bucket alone, so each sentence decodes into the buffer its own length
    gives it, whatever its neighbours (a short source beside a long one was let run twice as long: the scores
    changed with the batch size). `progress(done)` is called with the sentences translated so far."""
    batch_size = max(1, min(batch_size, len(sources)))  # no rows of padding beyond the sentences there are
    buckets = bucket_lengths(max_len)
    bucket_of = {i: bucket_for(len(source), buckets) for i, source in enumerate(sources)}
    order = sorted(range(len(sources)), key=lambda i: (bucket_of[i], len(sources[i])))
    results = [None] * len(sources)
    batches = [group[start:start + batch_size]
               for _, members in itertools.groupby(order, key=bucket_of.get) for group in [list(members)]
               for start in range(0, len(group), batch_size)]
    done = 0
    for members in batches:
        source_length = bucket_of[members[0]]
        source = np.full((batch_size, source_length), special.pad, np.int32)
        for row, i in enumerate(members):
            source[row, :len(sources[i])] = sources[i]
        buffer = np.full((batch_size, output_length(source_length, max_len)), special.pad, np.int32)
        buffer[:, 0] = special.start
        tokens = ops.convert_to_numpy(decode(source, buffer))
        for row, i in enumerate(members):
            ids = [int(t) for t in tokens[row, 1:]]
            results[i] = ids[:ids.index(special.eos)] if special.eos in ids else [t for t in ids if t != special.pad]
        done += len(members)
        if progress:
            progress(done)
    return results
