"""Text for language models: read (a file, a folder of .txt files, or the built-in corpus), split into contiguous
ranges (enwik8's convention: the last parts are validation and test), tokenized at the byte, character or
sentencepiece level, and cut into blocks: random windows for training, consecutive ones for evaluation.

Every token carries the number of bytes of text it stands for, so that bits per byte compare models whose
tokens differ (a byte, a character of one to four bytes, a sentencepiece piece)."""

import hashlib
import io
import os
import zipfile
from dataclasses import dataclass

import numpy as np

from mtbench.errors import MtbenchError
from mtbench.plugins.api import Batch, Tokenizer, TokenStream
from mtbench.runner.data.corpus import load_dataset_pairs, registered_dataset
from mtbench.runner.files import read_json, write_bytes_atomic, write_json_atomic

# enwik8's split, 90/5/5 of its 100 M bytes: the last two twentieths are validation and test.
HELD_OUT_FRACTION = 0.05
TOKENIZERS = ("byte", "char", "sentencepiece")
# v2: a sentencepiece stream counts its <unk> pieces (v1's said none).
STREAM_CACHE_VERSION = "stream-v2"  # keys the token streams kept under --cache-dir/tokens
SAVED_NAME = "tokenizer.json"  # a byte or character tokenizer in a saved model's directory
LINE_BREAK_ID = 3              # sentencepiece's EOS id stands for a line break between encoded lines
SENTENCEPIECE_UNKNOWN_ID = 1   # tokenizer.UNK_ID: each of its pieces stands for one or more characters
BYTES_AT_ONCE = 1 << 24        # a character stream is made 16 MB of text at a time
LINES_AT_ONCE = 1 << 18        # a text's lines go to sentencepiece about 256 KB at a time: its Python lists and the
                               # tokens' int64 places of a whole text took 24 bytes a byte of it (7 MB: 168 MB)


@dataclass
class Text:
    """The raw text of a run, and where it came from: of a folder, how many files were read (`files`) and the
    entries left out (`left_out`: names, a folder's ending in '/')."""
    name: str
    origin: str
    data: bytes
    files: int = None
    left_out: tuple = ()

    def folder_line(self):
        """'2 .txt files of f2, concatenated in name order; left out: notes.md, old/ (...)', or None for a text that
        is no folder's."""
        if self.files is None:
            return None
        return self.origin + (f"; {left_out_text(self.left_out)}" if self.left_out else "")


def left_out_text(names, shown=5):
    """'left out: notes.md, old/ (...)', at most `shown` names: a folder may hold thousands of other files."""
    more = f" and {len(names) - shown:,} more" if len(names) > shown else ""
    return (f"left out: {', '.join(names[:shown])}{more} (only the folder's own files ending .txt, in any case, are "
            f"read; not its subfolders)")


def read_text(config, registry, progress):
    """--data FILE or a folder of .txt files (sorted by name and concatenated), else the source side of
    --dataset, a verse per line."""
    if config.data_file:
        return read_text_path(config.data_file)
    dataset = registered_dataset(registry, config.dataset)
    pairs = load_dataset_pairs(dataset, config.cache_dir, progress,
                               lambda: registry.plugin_code("datasets", dataset.name))
    text = "".join(source + "\n" for source, _ in pairs).encode("utf-8")
    return Text(config.dataset, f"{dataset.description}: the source side, a sentence per line", text)


def read_text_path(path):
    """The Text of a file, or of a folder's .txt files (.TXT too) sorted by name and concatenated."""
    return Text(os.path.basename(os.path.normpath(path)), *_read_files(path))


def _read_files(path):
    counted, left_out = None, ()
    if os.path.isdir(path):
        names = sorted(os.listdir(path))  # sorted by code point: the same order, and data hash, on every machine
        folders = {name for name in names if os.path.isdir(os.path.join(path, name))}
        files = [os.path.join(path, name) for name in names
                 if name not in folders and name.lower().endswith(".txt")]
        left_out = tuple(name + "/" if name in folders else name for name in names
                         if name in folders or not name.lower().endswith(".txt"))
        if not files:
            raise MtbenchError(f"{path}: the folder holds no .txt file" +
                               (f" ({left_out_text(left_out)})" if left_out else ""))
        counted = len(files)
        origin = f"{counted:,} .txt file{'s' * (counted != 1)} of {path}, concatenated in name order"
    elif os.path.isfile(path):
        files, origin = [path], path
    else:
        raise MtbenchError(f"{path}: no such file or folder")
    chunks = []
    for name in files:
        try:
            with open(name, "rb") as f:
                chunks.append(f.read())
        except OSError as error:
            raise MtbenchError(f"{name}: cannot be read: {error.strerror or error}") from None
    data = b"".join(chunks)
    if not data:
        raise MtbenchError(f"{path}: the text is empty")
    return origin, data, counted, left_out


def character_boundary(data, position):
    """The first position at or after `position` where a UTF-8 character starts (continuation bytes are
    10xxxxxx), so that no split cuts a character."""
    while position < len(data) and data[position] & 0xC0 == 0x80:
        position += 1
    return position


def split_ranges(data):
    """{split: (start, end)} byte ranges of `data`: training first, then validation, then test, each held-out part
    `HELD_OUT_FRACTION` of the text, cut between characters."""
    size = len(data)
    held_out = int(size * HELD_OUT_FRACTION)
    cuts = [character_boundary(data, cut) for cut in (size - 2 * held_out, size - held_out)]
    return {"train": (0, cuts[0]), "valid": (cuts[0], cuts[1]), "test": (cuts[1], size)}


class ByteTokenizer(Tokenizer):
    """Bytes as tokens, vocabulary 256: enwik8's and enwik9's setup. With `vocab_size` above 256 the model gets
    that many embedding rows, the ones past 255 never seen in the text (a padded vocabulary: the work of a larger
    one's output layer, on real bytes)."""
    kind = "byte"
    vocab_size = 256
    fingerprint = "bytes"

    def __init__(self, vocab_size=256):
        if vocab_size < 256:
            raise MtbenchError(f"a byte-level vocabulary has at least 256 entries, not {vocab_size}")
        self.vocab_size = vocab_size
        if vocab_size != 256:
            self.fingerprint = f"bytes-{vocab_size}"

    def stream(self, data):
        return TokenStream(np.frombuffer(data, np.uint8), np.broadcast_to(np.ones(1, np.uint8), (len(data),)))

    def decode_text(self, ids):
        # A padded row (no byte) decodes as the replacement character, as an invalid byte does.
        return b"".join(bytes([int(i)]) if int(i) < 256 else "\ufffd".encode() for i in ids).decode(
            "utf-8", errors="replace")

    def encode_text(self, text):
        return list(text.encode("utf-8"))

    def text_ids(self):
        """How many ids, from 0, stand for text: the padded rows past them are never drawn (`continuation`)."""
        return 256

    def describe(self):
        described = {"type": self.kind, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint}
        if self.vocab_size != 256:
            described["padded_from"] = 256
        return described

    def save(self, directory):
        write_json_atomic(os.path.join(directory, SAVED_NAME), {"type": self.kind, "vocab_size": self.vocab_size})


class CharTokenizer(ByteTokenizer):
    """The distinct characters of the training split, and id 0 for any other (<unk>), as nanoGPT's
    Shakespeare-character model."""
    kind = "char"
    unknown_id = 0

    def __init__(self, characters):
        self.characters = "".join(sorted(set(characters)))
        self.index = {c: i + 1 for i, c in enumerate(self.characters)}
        self.vocab_size = len(self.characters) + 1
        self.fingerprint = "chars-" + hashlib.sha256(self.characters.encode("utf-8")).hexdigest()[:16]

    def stream(self, data):
        # A few MB at a time: the code points and their places take 16 bytes a character.
        cuts = (character_boundary(data, cut) for cut in range(BYTES_AT_ONCE, len(data), BYTES_AT_ONCE))
        edges = [0, *cuts, len(data)]
        parts = [self._stream_part(data[start:end], start) for start, end in zip(edges, edges[1:])]
        return TokenStream(np.concatenate([part.ids for part in parts]),
                           np.concatenate([part.token_bytes for part in parts]), sum(part.unknown for part in parts))

    def _stream_part(self, data, offset):
        codes = np.frombuffer(utf8_text(data, offset).encode("utf-32-le"), np.uint32)
        known = np.frombuffer(self.characters.encode("utf-32-le"), np.uint32)  # sorted by code point
        place = np.minimum(np.searchsorted(known, codes), max(len(known) - 1, 0))
        found = known[place] == codes if len(known) else np.zeros(len(codes), bool)
        ids = np.where(found, place + 1, 0).astype(np.min_scalar_type(len(known)))
        # UTF-8 takes 1 byte below U+0080, 2 below U+0800, 3 below U+10000, else 4.
        widths = 1 + (codes >= 0x80).view(np.uint8) + (codes >= 0x800) + (codes >= 0x10000)
        return TokenStream(ids, widths, int(len(ids) - found.sum()))

    def encode_text(self, text):
        return [self.index.get(c, 0) for c in text]

    def text_ids(self):
        return self.vocab_size

    def decode_text(self, ids):
        return "".join(self.characters[i - 1] if 0 < i <= len(self.characters) else "\ufffd" for i in ids)

    def describe(self):  # the byte tokenizer's, less its padding: a vocabulary of characters pads nothing
        return {"type": self.kind, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint}

    def save(self, directory):
        write_json_atomic(os.path.join(directory, SAVED_NAME), {"type": self.kind, "characters": self.characters})


class SentencePieceText(Tokenizer):
    """mtbench's sentencepiece model trained on the training split's lines; a line break is its EOS id. A token
    stands for the text's bytes from where it begins to where the next one begins (whitespace sentencepiece drops
    belongs to the token before it), so the first blocks of a split count the bytes they predict."""
    kind = "sentencepiece"
    # The text as it is, as the byte and character tokenizers predict it: bits per byte divides by the text's own
    # bytes, so its pieces must stand for them (sentencepiece's default NFKC folds 'ﬁ' into 'fi' and runs of
    # spaces into one, which the model then never predicts).
    TRAINING_OPTIONS = {"normalization_rule_name": "identity", "remove_extra_whitespaces": False}

    def __init__(self, joint):
        self.joint = joint
        # Tokenizing takes a few tenths of a second a MB: `token_stream` keeps streams, keyed by the model itself.
        self.stream_key = hashlib.sha256(joint.processor.serialized_model_proto()).hexdigest()
        self.vocab_size, self.fingerprint = joint.vocab_size, joint.fingerprint

    def encode_text(self, text):
        ids = []
        for encoded in self.joint.encode(text.split("\n")):
            ids += encoded + [LINE_BREAK_ID]
        return ids[:-1]

    def stream(self, data):
        """A batch of lines at a time (`line_batches`), each batch's tokens made whole, ids and bytes in their narrow
        types, before the next."""
        dtype = np.min_scalar_type(self.vocab_size - 1)
        ids_parts, bytes_parts = [], []
        pending = None  # where the bytes of the last token so far begin (the running maximum of its edges)
        for line_starts, breaks, lines in line_batches(data):
            ids, starts, counts = self.joint.encode_with_starts(lines)
            starts = starts + np.repeat(line_starts, counts)
            # A line break after every line but the text's last, beginning where its line ends.
            after_each_line = np.cumsum(counts)[:len(breaks)]
            ids = np.insert(ids, after_each_line, LINE_BREAK_ID).astype(dtype)
            starts = np.insert(starts, after_each_line, breaks)
            if not len(ids):
                continue
            # A token stands for the bytes from its start to the next token's (never back: the running maximum);
            # the first token of the text from its first byte, the last one before this batch up to its first.
            first, later = (0, starts[1:]) if pending is None else (pending, starts)
            edges = np.maximum.accumulate(np.concatenate([[first], later]))
            token_bytes = np.diff(edges)
            ids_parts.append(ids)
            bytes_parts.append(token_bytes.astype(smallest_unsigned(token_bytes)))
            pending = int(edges[-1])
        if pending is None:
            return TokenStream(np.zeros(0, dtype), np.zeros(0, np.uint8))
        last = np.array([len(data) - pending])
        ids, ids_parts = np.concatenate(ids_parts), None  # each list let go once joined: the peak is one copy
        # Each part in its own narrowest type: joined, they take the widest, the narrowest for the whole.
        return TokenStream(ids, np.concatenate([*bytes_parts, last.astype(smallest_unsigned(last))]),
                           int(np.count_nonzero(ids == SENTENCEPIECE_UNKNOWN_ID)))

    def decode_text(self, ids):
        lines, line = [], []
        for i in list(ids) + [LINE_BREAK_ID]:
            if i == LINE_BREAK_ID:
                lines.append(self.joint.decode([line])[0])
                line = []
            else:
                line.append(int(i))
        return "\n".join(lines)

    def describe(self):
        return {**self.joint.describe(), "type": "sentencepiece-unigram", "fingerprint": self.fingerprint,
                "line_break_id": LINE_BREAK_ID}

    def save(self, directory):
        self.joint.save(directory)


def line_batches(data):
    """`data`'s lines about LINES_AT_ONCE bytes at a time (a longer line alone), as (where each line begins, where
    the line break after each is, their text): the text is decoded a batch at a time, never whole."""
    breaks = np.flatnonzero(np.frombuffer(data, np.uint8) == ord("\n"))  # no other UTF-8 byte is 10
    starts = np.concatenate([[0], breaks + 1])
    cuts = np.unique(np.searchsorted(starts, np.arange(LINES_AT_ONCE, len(data), LINES_AT_ONCE)))
    for first, last in zip([0, *cuts], [*cuts, len(starts)]):
        if first == last:
            continue
        begin, end = int(starts[first]), int(breaks[last - 1]) if last <= len(breaks) else len(data)
        yield starts[first:last], breaks[first:last], utf8_text(data[begin:end], begin).split("\n")


def token_stream(tokenizer, data, cache_dir, digest=None):
    """`tokenizer.stream(data)`, kept under `cache_dir` for a tokenizer that takes a while (one with a
    `stream_key`), as nanoGPT's prepare step keeps its train.bin: the next run of the same text and tokenizer reads
    it. `digest`: `sha256_hex(data)`, where the caller has it. Returns the stream and whether it was read."""
    stream_key = getattr(tokenizer, "stream_key", None)
    if not stream_key or not cache_dir:
        return tokenizer.stream(data), False
    key = sha256_hex(f"{STREAM_CACHE_VERSION}:{stream_key}:{digest or sha256_hex(data)}".encode())[:32]
    path = os.path.join(cache_dir, "tokens", f"{key}.npz")
    try:
        with np.load(path) as kept:
            return TokenStream(kept["ids"], kept["token_bytes"], int(kept["unknown"])), True
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):  # none yet, or cut short: again
        pass
    stream = tokenizer.stream(data)
    kept = io.BytesIO()
    np.savez(kept, ids=stream.ids, token_bytes=stream.token_bytes, unknown=stream.unknown)
    write_bytes_atomic(path, kept.getvalue())
    return stream, False


def sha256_hex(data):
    """The hex sha256 of `data`: a split is hashed once (a corpus may be gigabytes), and its digest keys the
    tokenizer, the streams and the run's data fingerprint."""
    return hashlib.sha256(data).hexdigest()


def smallest_unsigned(values):
    return np.min_scalar_type(int(values.max()) if len(values) else 0)


class NotUtf8(MtbenchError):
    """Text that is not UTF-8, from `position` (a byte offset in the data given) on."""

    def __init__(self, position, reason):
        super().__init__(f"the text is not UTF-8 at byte {position} ({reason}); train it at the byte level: "
                         f"--tokenizer byte")
        self.position, self.reason = position, reason


def utf8_text(data, offset=0):
    """`data` (which begins at byte `offset` of its split) as text, or the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotUtf8(offset + error.start, error.reason) from None


def text_tokenizer(kind, train_data, vocab_size, cache_dir, byte_vocab_size=256, train_digest=None):
    """`vocab_size`: what a sentencepiece model is trained to; `byte_vocab_size`: a byte tokenizer's embedding
    rows (the preset's, 256 unless padded); `train_digest`: `sha256_hex(train_data)`, where the caller has it."""
    if kind == "byte":
        return ByteTokenizer(byte_vocab_size)
    if kind == "char":
        return CharTokenizer(utf8_text(train_data))
    from mtbench.runner.data.tokenizer import TOKENIZER_VERSION, load_or_train_sentencepiece
    digest = sha256_hex(f"text-{TOKENIZER_VERSION}:{vocab_size}:{train_digest or sha256_hex(train_data)}".encode())
    lines = lambda: (line for *_, batch in line_batches(train_data) for line in batch if line.strip())
    return SentencePieceText(load_or_train_sentencepiece(lines, digest, vocab_size, cache_dir,
                                                         **SentencePieceText.TRAINING_OPTIONS))


def load_text_tokenizer(directory, description):
    """The tokenizer `save` wrote into a saved model's directory."""
    from mtbench.runner.data.tokenizer import SAVED_NAME as SENTENCEPIECE_NAME, JointTokenizer
    from mtbench.runner.data.token_files import TokenIds
    if description.get("type") == "sentencepiece-unigram":
        return SentencePieceText(JointTokenizer.from_file(os.path.join(directory, SENTENCEPIECE_NAME)))
    saved = read_json(os.path.join(directory, SAVED_NAME), "a saved model's tokenizer")
    if saved["type"] == "char":
        return CharTokenizer(saved["characters"])
    if saved["type"] == TokenIds.kind:
        return TokenIds(saved["vocab_size"], saved.get("characters"))
    return ByteTokenizer(saved.get("vocab_size", 256))


def window_batch(ids, starts, block, rows=None, scored_from=None):
    """Rows of `block` tokens from each start, and the next token of each as its label; filler rows (up to `rows`)
    and positions past the stream's end weigh nothing, nor do each row's positions before its `scored_from`."""
    rows = rows or len(starts)
    inputs = np.zeros((rows, block), np.int32)
    labels = np.zeros((rows, block), np.int32)
    weight = np.zeros((rows, block), np.float32)
    index = np.full((rows,), -1, np.int64)
    for row, start in enumerate(starts):
        taken = min(block, len(ids) - 1 - start)
        inputs[row, :taken] = ids[start:start + taken]
        labels[row, :taken] = ids[start + 1:start + 1 + taken]
        weight[row, 0 if scored_from is None else scored_from[row]:taken] = 1.0
        index[row] = start
    return Batch(None, inputs, labels, weight, index)


def training_batches(stream, rows, block, seed, skip=0):
    """Endless batches of `rows` windows of `block` tokens at starts drawn uniformly from the seed (nanoGPT's
    `get_batch`), the same on every backend; an epoch is as many batches as hold the split's tokens once. `skip`
    draws and passes over the first batches (a resumed run)."""
    rng = np.random.default_rng(seed)
    per_epoch = batches_per_epoch(stream, rows, block)
    drawn = 0
    while True:
        starts = rng.integers(0, len(stream) - block, size=rows)
        if drawn >= skip:
            yield drawn // per_epoch, window_batch(stream.ids, starts, block)
        drawn += 1


def batches_per_epoch(stream, rows, block):
    return max(1, (len(stream) - 1) // (rows * block))


def evaluated_tokens(stream, text_bytes):
    """How many tokens evaluation predicts (tokens 1 to N: token 0 is only read): as many as stand for at most
    `text_bytes` bytes of text, at least one. A byte budget, not a count of tokens, so that models whose tokens
    differ are scored on the same text. A stream that does not know its bytes (token files) counts the budget in
    tokens."""
    if stream.token_bytes is None:
        return max(1, min(int(text_bytes), len(stream) - 1))
    return reached_tokens(stream, predicted_bytes(stream, text_bytes), text_bytes)


def reached_tokens(stream, predicted, text_bytes):
    """`evaluated_tokens` from the stream's `predicted_bytes`."""
    return max(1, min(int(np.searchsorted(predicted, text_bytes, side="right")), len(stream) - 1))


def predicted_bytes(stream, text_bytes):
    """The bytes tokens 1 to n stand for, for each n up to the first past `text_bytes` (or the split's end): a
    prefix about the budget's size, not a sum over the whole split (8 bytes a token) at every validation."""
    count = int(text_bytes) + 2  # tokens of a byte or more each: the budget's bytes and one more are enough
    while True:
        summed = np.cumsum(stream.token_bytes[1:count], dtype=np.int64)
        if count >= len(stream) or (len(summed) and summed[-1] > text_bytes):
            return summed
        count *= 2


def evaluation_batches(stream, rows, block, text_bytes, stride=None):
    """Windows of `block` tokens from the split's start predicting its first `text_bytes` bytes
    (`evaluated_tokens`), every token once, `rows` to a batch; the last window may be partial (its missing positions
    weigh nothing). Consecutive blocks by default; with a `stride` below the block, each window starts `stride`
    tokens after the one before and scores only its last `stride` positions, so that every token after the first
    block is predicted from at least `block - stride + 1` tokens of context, a whole block at stride 1 (the first
    window scores all of its positions)."""
    end = evaluated_tokens(stream, text_bytes)
    stride = min(stride or block, block)
    # Window j > 0 scores tokens up to j * stride + block: the last one is the first to reach `end`.
    starts = [0, *range(stride, end - block + stride, stride)]
    scored_from = [0] + [block - stride] * (len(starts) - 1)
    for first in range(0, len(starts), rows):
        yield window_batch(stream.ids[:end + 1], starts[first:first + rows], block, rows,
                           scored_from[first:first + rows])


def evaluated_bytes(stream, text_bytes):
    """The bytes of text that `evaluation_batches` predicts: those of tokens 1 to `evaluated_tokens` (None for a
    stream that does not know them)."""
    if stream.token_bytes is None:
        return None
    predicted = predicted_bytes(stream, text_bytes)
    return float(predicted[reached_tokens(stream, predicted, text_bytes) - 1])
