"""GPT-2's byte-level BPE, read from a checkpoint directory's `vocab.json` and `merges.txt`: the tokens its
weights were trained on (what OpenAI's `encoder.py`, tiktoken's `gpt2` and transformers' `GPT2Tokenizer` make of
a text with no special tokens in it, as nanoGPT's `prepare.py` encodes one: `encode_ordinary`).

A text is cut into words by GPT-2's pattern (letters, digits, other symbols, each with the space before it; runs
of spaces), each word's bytes spelled as printable characters, and the pairs of its symbols merged in the order
of `merges.txt` until none of its pairs is listed. Each token stands for whole bytes, so bits per byte are exact."""

import array
import hashlib
import json
import re

import numpy as np

from mtbench import MtbenchError, Tokenizer, TokenStream
from mtbench.plugins.models.checkpoint_files import copy_present, require_file
from mtbench.plugins.models.gpt2_checkpoint import KIND

VOCAB, MERGES = "vocab.json", "merges.txt"
# GPT-2's pre-tokenizer (`encoder.py`): contractions, letters, digits, other symbols, each with one space before
# it, and runs of white space (the last space of a run left to the word after it).
# GPT-2's special tokens (`<|endoftext|>`, which nanoGPT's OpenWebText files put between documents): marks in the
# id stream that stand for no text, so none of their letters counts in bits per byte.
SPECIAL_TOKEN = re.compile(r"<\|[^|<>]+\|>")
WORD_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_symbols():
    """{byte: the printable character that spells it in the vocabulary}: the printable Latin-1 bytes as
    themselves, the others as the characters from U+0100 on, in order (`bytes_to_unicode` of `encoder.py`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [byte for byte in range(256) if byte not in printable]
    return {**{byte: chr(byte) for byte in printable},
            **{byte: chr(256 + number) for number, byte in enumerate(others)}}


def read_vocabulary(directory):
    """(the token -> id map, the merges' ranks {(left, right): rank}, a digest of both files) of a checkpoint
    directory."""
    why = f" (its BPE tokenizer: {VOCAB} and {MERGES})"
    paths = {name: require_file(directory, name, KIND, why) for name in (VOCAB, MERGES)}
    digest, texts = hashlib.sha256(), {}
    try:
        for name, path in paths.items():
            with open(path, "rb") as f:
                data = f.read()
            digest.update(data)
            texts[name] = data.decode("utf-8")
        vocabulary = json.loads(texts[VOCAB])
    except (OSError, ValueError) as error:
        raise MtbenchError(f"cannot read the GPT-2 tokenizer in {directory}: {error}") from None
    if not isinstance(vocabulary, dict) or not all(isinstance(i, int) for i in vocabulary.values()):
        raise MtbenchError(f"{paths[VOCAB]}: not a map of tokens to ids")
    # splitlines: the vocabulary's symbols (U+0021 to U+0143) hold no line break of its own.
    pairs = [tuple(line.split(" ")) for line in texts[MERGES].splitlines() if line and not line.startswith("#version")]
    malformed = next((pair for pair in pairs if len(pair) != 2), None)
    if malformed is not None:
        raise MtbenchError(f"{paths[MERGES]}: '{' '.join(malformed)}' is not a pair of symbols")
    return vocabulary, {pair: rank for rank, pair in enumerate(pairs)}, digest.hexdigest()


class GPT2Tokenizer(Tokenizer):
    kind = "gpt2-bpe"

    def __init__(self, directory):
        import regex
        self.directory = directory
        self.vocabulary, self.ranks, digest = read_vocabulary(directory)
        self.vocab_size = max(self.vocabulary.values()) + 1
        self.tokens = {i: token for token, i in self.vocabulary.items()}
        self.symbols = byte_symbols()
        self.bytes_of_symbol = {symbol: byte for byte, symbol in self.symbols.items()}
        self.word_pattern = regex.compile(WORD_PATTERN)
        self.word_ids = {}  # each distinct word's ids, as `encoder.py` caches them
        self.widths = None  # `bytes_per_id`, made on first use
        self.fingerprint = f"gpt2-bpe-{digest[:16]}"
        self.stream_key = self.fingerprint

    def _merge(self, word):
        """The symbols of `word` (a tuple of one-character strings) merged pair by pair, the lowest rank first."""
        while len(word) > 1:
            ranked = [(self.ranks[pair], index) for index, pair in enumerate(zip(word, word[1:])) if pair in self.ranks]
            if not ranked:
                break
            first = min(ranked)[1]
            pair = word[first], word[first + 1]
            merged, index = [], 0
            while index < len(word):
                if index < len(word) - 1 and (word[index], word[index + 1]) == pair:
                    merged.append(word[index] + word[index + 1])
                    index += 2
                else:
                    merged.append(word[index])
                    index += 1
            word = tuple(merged)
        return word

    def _ids_of_word(self, word):
        ids = self.word_ids.get(word)
        if ids is None:
            spelled = tuple(self.symbols[byte] for byte in word.encode("utf-8"))
            try:
                ids = [self.vocabulary[token] for token in self._merge(spelled)]
            except KeyError as missing:
                raise MtbenchError(f"the GPT-2 tokenizer in {self.directory} has no token {missing} that its merges "
                                   f"make") from None
            self.word_ids[word] = ids
        return ids

    def encode_text(self, text):
        return [i for word in self.word_pattern.findall(text) for i in self._ids_of_word(word)]

    def stream(self, data):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise MtbenchError(f"the text is not UTF-8 at byte {error.start} ({error.reason}): GPT-2's tokenizer "
                               f"reads UTF-8 text") from None
        ids = array.array("I")
        for word in self.word_pattern.finditer(text):
            ids.extend(self._ids_of_word(word.group()))
        ids = np.frombuffer(ids, np.uint32) if ids else np.zeros(0, np.uint32)
        widths = self.bytes_per_id()[ids]
        return TokenStream(ids.astype(np.min_scalar_type(self.vocab_size - 1)),
                           widths.astype(np.min_scalar_type(int(widths.max()) if len(widths) else 0)))

    def bytes_per_id(self):
        """The bytes of text each id stands for (a token's symbols: one a byte; none for an id with no token or a
        special token's): each token's bytes in a stream, and bits per byte on token files, which hold ids alone."""
        if self.widths is None:
            self.widths = np.zeros(self.vocab_size, np.uint16)
            for i, token in self.tokens.items():
                self.widths[i] = 0 if SPECIAL_TOKEN.fullmatch(token) else len(token)
        return self.widths

    def decode_text(self, ids):
        # An id past the tokenizer's (a row a padded embedding adds) stands for no bytes: the replacement character.
        pieces = [bytes(self.bytes_of_symbol[symbol] for symbol in self.tokens[i]) if i in self.tokens
                  else "\ufffd".encode() for i in map(int, ids)]
        return b"".join(pieces).decode("utf-8", errors="replace")

    def describe(self):
        return {"type": self.kind, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint,
                "merges": len(self.ranks)}

    def save(self, directory):
        copy_present((VOCAB, MERGES), self.directory, directory)
