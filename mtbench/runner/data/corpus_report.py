"""The corpus report, printed before training and stored under `data` in the result: pairs read, kept and
dropped (and why), sentence lengths in tokens, and how many test sources also occur in the training data."""

import numpy as np

SPLITS = ("train", "valid", "test")


def _length_statistics(lengths):
    if len(lengths) == 0:
        return None
    return {"mean": float(np.mean(lengths)), "median": float(np.median(lengths)),
            "p95": float(np.percentile(lengths, 95)), "max": int(np.max(lengths))}


def corpus_report(corpus, encoded, max_len, untrained=0):
    """`encoded`: {split: EncodedSplit}; `untrained`: how many kept training pairs no batch holds
    (`batches.untrained_examples`). Lengths are sentencepiece tokens of the training pairs before the --max-len
    filter (special tokens not counted: the filter counts a side's end token, so a length of --max-len is over it),
    so they show what that filter cuts."""
    train_sources = {source for source, _ in corpus.train}
    dropped = {reason: {split: counts.get(split, 0) for split in SPLITS} for reason, counts in corpus.dropped.items()}
    dropped["too_long"] = {split: encoded[split].dropped_too_long for split in SPLITS}
    lengths = encoded["train"].token_lengths
    return {
        "sources": dict(corpus.sources),
        "read": {split: corpus.read.get(split) for split in SPLITS},
        "kept": {split: len(encoded[split]) for split in SPLITS},
        "untrained": untrained,
        "dropped": dropped,
        "max_len": max_len,
        "token_lengths": {"source": _length_statistics(lengths[:, 0]), "target": _length_statistics(lengths[:, 1])},
        "test_sources_in_train": sum(1 for source, _ in corpus.test if source in train_sources),
        "test_sources_checked": len(corpus.test),
    }


def report_lines(name, report):
    """The report in a few lines for the terminal."""
    kept, dropped, lengths = report["kept"], report["dropped"], report["token_lengths"]
    read = ", ".join(f"{split} {count}" for split, count in report["read"].items() if count is not None)
    lines = [f"corpus {name}: read {read}; kept train {kept['train']}, valid {kept['valid']}, test {kept['test']}"]
    # --max-len counts a side's end token too (`batches.encode_split`): a sentence of 48 tokens is over --max-len 48.
    for reason, label in (("empty_side", "with an empty side"), ("duplicate", "duplicate{s}"),
                          ("too_long", f"longer than --max-len {report['max_len']} tokens with their end token")):
        counts = dropped[reason]
        total = sum(counts.values())
        if total:
            lines.append(f"  dropped {total} {label.format(s='s' * (total != 1))} "
                         f"({', '.join(f'{split} {n}' for split, n in counts.items() if n)})")
    untrained = report.get("untrained")
    if untrained:
        lines.append(f"  {untrained} training pair{'s' * (untrained != 1)} in no batch: the longest length bucket "
                     f"holds fewer than a batch's rows")
    for side in ("source", "target"):
        if lengths[side]:
            s = lengths[side]
            lines.append(f"  {side} tokens (train): mean {s['mean']:.1f}, median {s['median']:.0f}, "
                         f"p95 {s['p95']:.0f}, max {s['max']}")
    lines.append(f"  test sources also in the training data: {report['test_sources_in_train']} of "
                 f"{report['test_sources_checked']}")
    return lines
