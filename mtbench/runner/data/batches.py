"""Token ids, length buckets and batches.

Every batch is padded to one of a few lengths (buckets) and has a fixed number of rows, so a compiling backend
sees only a few shapes. Both sides of a batch share its bucket length: one shape per bucket, not one per pair of
lengths. The batch order is drawn from numpy with the run's seed, so every backend sees the same batches.
"""

from dataclasses import dataclass

import numpy as np

from mtbench.plugins.api import SpecialTokens
from mtbench.plugins.api.steps import Batch

BUCKET_STEP = 16


def bucket_lengths(max_len):
    return list(range(BUCKET_STEP, max_len, BUCKET_STEP)) + [max_len]


def bucket_for(length, buckets):
    for bucket in buckets:
        if length <= bucket:
            return bucket
    raise ValueError(f"length {length} exceeds the largest bucket {buckets[-1]}")


@dataclass
class EncodedSplit:
    sources: list        # token ids + EOS
    targets: list        # token ids (no start/EOS: added when batching)
    pair_index: list     # index of each kept pair in the split
    dropped_too_long: int
    special: SpecialTokens  # the tokenizer's padding, EOS and start ids
    token_lengths: np.ndarray = None  # (pairs, 2): source and target tokens of every pair, dropped ones too

    def __len__(self):
        return len(self.sources)

    def head(self, count):
        """Its first `count` pairs (of those kept), as a split of their own that dropped none."""
        kept = self.pair_index[:count]
        lengths = None if self.token_lengths is None else self.token_lengths[kept]
        return EncodedSplit(sources=self.sources[:count], targets=self.targets[:count],
                            pair_index=list(range(len(kept))), dropped_too_long=0, special=self.special,
                            token_lengths=lengths)


def encode_split(pairs, tokenizer, max_len):
    """Encodes pairs; drops those whose source (+EOS) or target (+start or +EOS) exceeds max_len."""
    source_ids = tokenizer.encode_source(s for s, _ in pairs)
    target_ids = tokenizer.encode_target(t for _, t in pairs)
    kept = [i for i in range(len(pairs)) if len(source_ids[i]) + 1 <= max_len and len(target_ids[i]) + 1 <= max_len]
    lengths = np.array([[len(s), len(t)] for s, t in zip(source_ids, target_ids)], np.int64).reshape(-1, 2)
    eos = tokenizer.special.eos
    return EncodedSplit(sources=[source_ids[i] + [eos] for i in kept], targets=[target_ids[i] for i in kept],
                        pair_index=kept, dropped_too_long=len(pairs) - len(kept), special=tokenizer.special,
                        token_lengths=lengths)


def make_batch(split, indices, rows, length):
    special = split.special
    source = np.full((rows, length), special.pad, np.int32)
    target_input = np.full((rows, length), special.pad, np.int32)
    target_output = np.full((rows, length), special.pad, np.int32)
    weight = np.zeros((rows, length), np.float32)
    index = np.full((rows,), -1, np.int64)
    for row, i in enumerate(indices):
        src, tgt = split.sources[i], split.targets[i]
        source[row, :len(src)] = src
        target_input[row, :len(tgt) + 1] = [special.start] + tgt
        target_output[row, :len(tgt) + 1] = tgt + [special.eos]
        # By position, not by comparing with the padding id: a model's padding id may also be its start id.
        weight[row, :len(tgt) + 1] = 1.0
        index[row] = i
    return Batch(source, target_input, target_output, weight, index)


def _example_bucket(split, i, buckets):
    return bucket_for(max(len(split.sources[i]), len(split.targets[i]) + 1), buckets)


def _rows_of(rows):
    """`rows`: the rows of every batch, or a function of the bucket length (token batching, --max-tokens)."""
    return rows if callable(rows) else (lambda length: rows)


def bucket_members(split, rows, max_len):
    """{bucket length: the indices of the examples its batches draw from}, every bucket in order. An example goes to
    the shortest bucket that holds it; a bucket with fewer examples than a batch's rows passes them on to the next
    longer one (padded a little longer), where they train instead of never filling a batch. Only the longest
    bucket can be left short of a batch (`untrained_examples`)."""
    buckets = bucket_lengths(max_len)
    rows_of = _rows_of(rows)
    by_bucket = {b: [] for b in buckets}
    for i in range(len(split)):
        by_bucket[_example_bucket(split, i, buckets)].append(i)
    carried = []
    for bucket in buckets[:-1]:
        members = carried + by_bucket[bucket]
        carried, by_bucket[bucket] = (members, []) if len(members) < rows_of(bucket) else ([], members)
    by_bucket[buckets[-1]] = carried + by_bucket[buckets[-1]]
    return by_bucket


def untrained_examples(split, rows, max_len):
    """How many examples no training batch holds: those of a longest bucket short of a batch's rows."""
    rows_of = _rows_of(rows)
    return sum(len(members) for bucket, members in bucket_members(split, rows, max_len).items()
               if len(members) < rows_of(bucket))


def training_batches(split, rows, max_len, seed, skip=0):
    """Endless full batches, reshuffled every epoch. Each yield is (epoch, batch). Per bucket, the examples
    that do not fill a last batch wait for the next epoch's shuffle. `skip` passes over the first batches
    without building them (a resumed run): the random draws are the same, so the batches that follow are too."""
    buckets = bucket_lengths(max_len)
    rows_of = _rows_of(rows)
    by_bucket = bucket_members(split, rows, max_len)
    if all(len(members) < rows_of(bucket) for bucket, members in by_bucket.items()):
        # The facts only: which options set the rows (--batch-size, --max-tokens, --grad-accum) is the caller's to
        # say, as `rows` is a function of the length whether or not --max-tokens was given.
        sizes = [rows_of(b) for b in buckets]
        wanted = (f"{sizes[0]} rows" if len(set(sizes)) == 1 else
                  ", ".join(f"{size} rows of {b} tokens" for size, b in zip(sizes, buckets)))
        raise ValueError(f"no length bucket holds a full batch ({wanted}; {len(split)} training pairs)")
    rng = np.random.default_rng(seed)
    epoch = 0
    while True:
        plan = []
        for bucket, members in by_bucket.items():
            shuffled = rng.permutation(members)
            size = rows_of(bucket)
            for start in range(0, len(shuffled) - size + 1, size):
                plan.append((bucket, shuffled[start:start + size]))
        for k in rng.permutation(len(plan)):
            if skip:
                skip -= 1
                continue
            bucket, indices = plan[k]
            yield epoch, make_batch(split, indices, rows_of(bucket), bucket)
        epoch += 1


def batches_per_epoch(split, rows, max_len):
    rows_of = _rows_of(rows)
    return sum(len(members) // rows_of(bucket) for bucket, members in bucket_members(split, rows, max_len).items())


def evaluation_batches(split, batch_size, max_len):
    """Every example once, grouped by bucket; the last batch of a bucket is filled with empty rows (weight 0)
    so the shapes stay those of training."""
    buckets = bucket_lengths(max_len)
    for bucket in buckets:
        members = [i for i in range(len(split)) if _example_bucket(split, i, buckets) == bucket]
        for start in range(0, len(members), batch_size):
            yield make_batch(split, members[start:start + batch_size], batch_size, bucket)
