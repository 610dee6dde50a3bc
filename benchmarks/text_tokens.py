"""Tokenizing a language model's text: mtbench's character and sentencepiece streams against the per-token Python
each would be written as first (a dictionary lookup per character; sentencepiece's offsets read from its protos for
every line), and reading a stream that an earlier run kept under --cache-dir. With --gpt2 DIR, a GPT-2 checkpoint's
BPE (`--model gpt2:DIR`) against transformers' own GPT2Tokenizer of the same files (each token's bytes from its
text).

    python benchmarks/text_tokens.py [--data FILE.txt] [--copies 8 --vocab-size 2000 --repeats 3] [--gpt2 DIR]

Without --data, the source side of the built-in corpus (the English Bible, 4 MB), --copies times over. Both ways
give the same tokens and bytes per token (checked here, and in the tests); the figures are seconds per MB of text.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def per_character(tokenizer, data):
    """A character tokenizer's stream, one dictionary lookup and one encode per character."""
    from mtbench.runner.data.text import TokenStream
    text = data.decode("utf-8")
    ids = np.array([tokenizer.index.get(c, 0) for c in text], np.int32)
    return TokenStream(ids, np.array([len(c.encode("utf-8")) for c in text], np.float64), int((ids == 0).sum()))


def per_piece(tokenizer, data):
    """A sentencepiece stream from sentencepiece's offsets, read from the protos of every line."""
    from mtbench.runner.data.text import LINE_BREAK_ID, TokenStream
    ids, starts, line_start, unknown = [], [], 0, 0
    processor = tokenizer.joint.processor
    lines = data.decode("utf-8").split("\n")
    for line, proto in zip(lines, processor.encode(lines, return_type="proto")):
        line_end = line_start + len(line.encode("utf-8"))
        ids += [piece.id for piece in proto.pieces] + [LINE_BREAK_ID]
        unknown += sum(piece.id == processor.unk_id() for piece in proto.pieces)
        starts += [line_start + piece.begin for piece in proto.pieces] + [line_end]
        line_start = line_end + 1
    edges = np.maximum.accumulate(np.array([0, *starts[1:-1], len(data)], np.float64))
    return TokenStream(np.array(ids[:-1], np.int32), np.diff(edges), unknown)


def per_word_in_transformers(tokenizer, data):
    """transformers' GPT2Tokenizer (its Python BPE, a word at a time) of the checkpoint's files."""
    from transformers import GPT2Tokenizer

    from mtbench.runner.data.text import TokenStream
    theirs = GPT2Tokenizer(os.path.join(tokenizer.directory, "vocab.json"),
                           os.path.join(tokenizer.directory, "merges.txt"))
    ids = theirs(data.decode("utf-8"))["input_ids"]
    widths = [len(theirs.convert_tokens_to_string([token]).encode("utf-8"))
              for token in theirs.convert_ids_to_tokens(ids)]
    return TokenStream(np.array(ids, np.int32), np.array(widths, np.float64))


def timed(fn, repeats):
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--data", help="a UTF-8 text file (default: the built-in corpus's source side)")
    parser.add_argument("--copies", type=int, default=8, help="copies of the built-in text, one after another")
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpt2", metavar="DIR", help="a GPT-2 checkpoint directory (vocab.json, merges.txt)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.data:
        with open(args.data, "rb") as f:
            data = f.read()
    else:
        from mtbench.plugins.datasets.bible_dataset import BibleDataset
        pairs = BibleDataset("en", "fr").read_pairs(lambda *_: None)
        data = "".join(source + "\n" for source, _ in pairs).encode("utf-8") * args.copies
    from mtbench.runner.data.text import text_tokenizer, token_stream
    megabytes = len(data) / 1e6
    print(f"text: {megabytes:.1f} MB; median of {args.repeats}; seconds per MB")
    print(f"{'tokenizer':<14} {'tokens':>12} {'per token':>10} {'mtbench':>9} {'kept':>7} {'ratio':>7}  same tokens")
    summary = {"text_mb": megabytes, "repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="mtbench-text-tokens-") as cache_dir:
        kinds = [("char", per_character), ("sentencepiece", per_piece)]
        for kind, first_way in kinds + ([("gpt2-bpe", per_word_in_transformers)] if args.gpt2 else []):
            if kind == "gpt2-bpe":
                from mtbench.plugins.models.gpt2_tokenizer import GPT2Tokenizer
                tokenizer = GPT2Tokenizer(args.gpt2)
            else:
                tokenizer = text_tokenizer(kind, data, args.vocab_size, cache_dir)
            slow, expected = timed(lambda: first_way(tokenizer, data), args.repeats)
            fast, stream = timed(lambda: tokenizer.stream(data), args.repeats)
            same = (np.array_equal(stream.ids, expected.ids) and stream.unknown == expected.unknown
                    and np.array_equal(stream.token_bytes, expected.token_bytes))
            kept = None
            if token_stream(tokenizer, data, cache_dir)[1] is False and getattr(tokenizer, "stream_key", None):
                seconds, (read, was_read) = timed(lambda: token_stream(tokenizer, data, cache_dir), args.repeats)
                same = same and was_read and np.array_equal(read.ids, stream.ids) and \
                    np.array_equal(read.token_bytes, stream.token_bytes)
                kept = seconds / megabytes
            print(f"{kind:<14} {len(stream):>12,} {slow / megabytes:>10.4f} {fast / megabytes:>9.4f} "
                  f"{'n/a' if kept is None else f'{kept:.4f}':>7} {slow / fast:>6.2f}x  {same}")
            summary[kind] = {"tokens": len(stream), "per_token_s_per_mb": slow / megabytes,
                             "mtbench_s_per_mb": fast / megabytes, "kept_s_per_mb": kept, "ratio": slow / fast,
                             "same_tokens": bool(same)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
