"""Text tokenized already, as nanoGPT's `prepare.py` leaves it: a folder holding `train.bin` and `val.bin`, each
the ids of a token stream as uint16 (GPT-2's BPE for OpenWebText and Shakespeare, characters for
shakespeare_char). mtbench trains on these ids as they are, read from disk as batches need them (OpenWebText's
train.bin is 17 GB), so that a model is scored on the very tokens nanoGPT trains and validates on.

The files carry ids alone: no tokenizer to turn text into them or back, and not the bytes each token stands for.
Such a run reports loss and perplexity per token (nanoGPT's own figures), no bits per byte, and takes no
--sample-prompt. A character-level folder's `meta.pkl` (shakespeare_char's) gives each id its character: text then
goes both ways, and each token's bytes are known. A `meta.pkl` of `vocab_size` alone (the token files of a
tokenizer of one's own) sizes the vocabulary, as nanoGPT's train.py takes it, and decodes nothing. It is read as
numbers, strings, lists and dicts alone, so that unpickling it runs no code."""

import hashlib
import json
import math
import os
import pickle
from dataclasses import dataclass

import numpy as np

from mtbench.errors import MtbenchError
from mtbench.plugins.api import Tokenizer, TokenStream
from mtbench.runner.files import write_json_atomic

TOKEN_FILES = {"train": "train.bin", "val": "val.bin"}
META_FILE = "meta.pkl"  # {'vocab_size'}, and a character-level folder's 'itos': {id: character} and 'stoi'
TOKEN_DTYPE = np.dtype(np.uint16)  # what nanoGPT's prepare.py writes
VOCABULARY_MULTIPLE = 64          # nanoGPT pads GPT-2's 50,257 ids to 50,304 rows, a multiple of 64
SAVED_NAME = "tokenizer.json"     # as the other text tokenizers name theirs
FINGERPRINT_SAMPLES = 64          # places of a token file read for its fingerprint, not all of its GBs
FINGERPRINT_SAMPLE_BYTES = 1 << 16
KEPT_FOLDER = "token-files"       # under --cache-dir: what a pass over a token file found


class TokenFile:
    """The ids of a token file from `start` to `end`, read from disk when a batch takes them: slicing gives another
    range, unread; numpy reads it (`__array__`). Not a memory map, whose pages stay in the process's resident
    memory once touched: a run's peak host memory would grow towards the file's size (17 GB for OpenWebText)."""

    def __init__(self, path, start=0, end=None, descriptor=None):
        self.path = path
        self.descriptor = os.open(path, os.O_RDONLY) if descriptor is None else descriptor
        self.start = start
        self.end = os.path.getsize(path) // TOKEN_DTYPE.itemsize if end is None else end
        self.dtype = TOKEN_DTYPE

    def __len__(self):
        return self.end - self.start

    def __getitem__(self, index):
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("a token file is read by contiguous ranges")
        first, last, _ = index.indices(len(self))
        return TokenFile(self.path, self.start + first, self.start + max(first, last), self.descriptor)

    def __array__(self, dtype=None, copy=None):
        parts, offset, left = [], self.start * TOKEN_DTYPE.itemsize, len(self) * TOKEN_DTYPE.itemsize
        while left:  # a read returns at most about 2 GB on Linux
            part = os.pread(self.descriptor, left, offset)
            if not part:
                raise MtbenchError(f"{self.path}: ended at byte {offset:,}, before the ids it held as the run started")
            parts.append(part)
            offset, left = offset + len(part), left - len(part)
        ids = np.frombuffer(b"".join(parts), TOKEN_DTYPE)
        return ids if dtype is None else ids.astype(dtype)


@dataclass
class TokenFiles:
    """A folder of token files, read as batches need them."""
    name: str
    origin: str
    folder: str
    train: TokenFile
    val: TokenFile
    characters: list = None  # meta.pkl's character of each id, where the folder has one with 'itos'
    vocab_size: int = None   # meta.pkl's vocabulary: its vocab_size, or its characters' count


class TokenWidths:
    """The bytes of text each token of a token file stands for, by the UTF-8 width of its character, found for the
    ranges evaluation takes (never for a whole file at once)."""

    def __init__(self, ids, widths):
        self.ids, self.widths = ids, widths

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return self.widths[np.asarray(self.ids[index])]


class BuiltinsOnly(pickle.Unpickler):
    """Unpickles numbers, strings, lists and dicts alone: any other object of a pickle runs code as it loads."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names {module}.{name}")


@dataclass
class Meta:
    """What a folder's meta.pkl says of its ids: how many there are, and where it has `itos`, each one's character."""
    vocab_size: int
    characters: list = None


def read_meta(folder):
    """The folder's `Meta`, or None where it has no meta.pkl."""
    path = os.path.join(folder, META_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            meta = BuiltinsOnly(f).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, OSError) as error:
        raise MtbenchError(f"{path}: not read, as it is not a pickle of numbers, strings, lists and dicts alone "
                           f"({error})") from None
    if isinstance(meta, dict) and "itos" in meta:
        itos = meta["itos"]
        if not isinstance(itos, dict) or sorted(itos) != list(range(len(itos))) or not itos or \
                not all(isinstance(text, str) for text in itos.values()):
            raise MtbenchError(f"{path}: not nanoGPT's meta.pkl, whose 'itos' gives every id from 0 its character")
        return Meta(len(itos), [itos[i] for i in range(len(itos))])
    # Without 'itos', as nanoGPT's train.py reads it: a vocabulary size alone, of ids no character stands for.
    size = meta.get("vocab_size") if isinstance(meta, dict) else None
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise MtbenchError(f"{path}: not nanoGPT's meta.pkl, whose 'vocab_size' gives the number of ids (and 'itos' "
                           f"each one's character)")
    return Meta(size)


def read_characters(folder):
    """meta.pkl's character of each id (its `itos`), or None where the folder has no meta.pkl or one without them."""
    meta = read_meta(folder)
    return None if meta is None else meta.characters


def is_token_folder(path):
    """Whether `path` is a folder of nanoGPT's token files, or of one of them (then they are read, whatever else
    it holds, and one alone is refused)."""
    return bool(path) and os.path.isdir(path) and any(os.path.isfile(os.path.join(path, name))
                                                        for name in TOKEN_FILES.values())


def named_token_file(path):
    """Whether `path` is a file named as nanoGPT's token files are (`*.bin`): mtbench reads them from their folder,
    so one named alone is refused, never read as text."""
    return bool(path) and os.path.isfile(path) and path.endswith(".bin")


def read_token_files(path):
    """The folder's train.bin and val.bin (nothing is read until a batch needs it)."""
    ids = {}
    for split, name in TOKEN_FILES.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise MtbenchError(f"{file}: no such file; nanoGPT's token files are {' and '.join(TOKEN_FILES.values())} "
                               f"together")
        size = os.path.getsize(file)
        if size % TOKEN_DTYPE.itemsize:
            raise MtbenchError(f"{file}: {size:,} bytes, not a whole number of {TOKEN_DTYPE.name} token ids (nanoGPT's "
                               f"prepare.py writes {TOKEN_DTYPE.name})")
        if size == 0:
            raise MtbenchError(f"{file}: the file holds no token")
        ids[split] = TokenFile(file)
    meta = read_meta(path)
    read = [*TOKEN_FILES.values(), *([META_FILE] if meta is not None else [])]
    others = sorted(name for name in os.listdir(path) if name not in read)
    origin = f"token ids ({TOKEN_DTYPE.name}) of {', '.join(read)} in {path}, as nanoGPT's prepare.py writes them" + \
             (f" ({', '.join(others)} not read)" if others else "")
    meta = meta or Meta(None)
    return TokenFiles(os.path.basename(os.path.normpath(path)), origin, path, ids["train"], ids["val"], meta.characters,
                      meta.vocab_size)


def largest_id(ids, chunk=1 << 24):
    """The largest id of a token file, read a chunk at a time (so the whole file is never in memory at once): a
    pass over OpenWebText's 8.5 G ids that counting them (`id_counts`) would make ten times longer."""
    return max(int(np.asarray(ids[start:start + chunk]).max()) for start in range(0, len(ids), chunk))


def kept_largest_id(ids, cache_dir):
    """`largest_id` of a whole token file and whether it was read back: kept under `cache_dir` by the file's path,
    size, modification time and fingerprint, so that the next run of the file reads one number instead of every
    id (OpenWebText's train.bin: a pass of about 17 s in each process of each run)."""
    if not cache_dir:
        return largest_id(ids), False
    stat = os.stat(ids.path)
    identity = f"{os.path.realpath(ids.path)}:{stat.st_size}:{stat.st_mtime_ns}:{file_fingerprint(ids)}"
    kept = os.path.join(cache_dir, KEPT_FOLDER, hashlib.sha256(identity.encode()).hexdigest()[:32] + ".json")
    try:
        with open(kept, encoding="utf-8") as f:
            return int(json.load(f)["largest_id"]), True
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: the pass again
        pass
    largest = largest_id(ids)
    write_json_atomic(kept, {"file": os.path.realpath(ids.path), "bytes": stat.st_size, "largest_id": largest})
    return largest, False


def kept_largest_of_folder(files, cache_dir):
    """The largest id of a folder's train.bin and val.bin (`kept_largest_id`), and the names of the files whose
    largest id was read back."""
    found = {name: kept_largest_id(getattr(files, split), cache_dir) for split, name in TOKEN_FILES.items()}
    return max(largest for largest, _ in found.values()), [name for name, (_, read) in found.items() if read]


def id_counts(ids, chunk=1 << 24):
    """How often each id occurs in a token file (up to its largest), read a chunk at a time."""
    counts = np.zeros(0, np.int64)
    for start in range(0, len(ids), chunk):
        found = np.bincount(np.asarray(ids[start:start + chunk]))
        counts = np.pad(counts, (0, max(len(found) - len(counts), 0)))
        counts[:len(found)] += found
    return counts


def utf8_widths(characters):
    return np.array([len(text.encode("utf-8")) for text in characters], np.uint8)


def bytes_per_id(tokenizer):
    """The bytes of text each id of `tokenizer` stands for (its optional `bytes_per_id()`), or None where it does
    not know them."""
    if not callable(getattr(tokenizer, "bytes_per_id", None)):
        return None
    widths = tokenizer.bytes_per_id()
    if widths is None:
        return None
    widths = np.asarray(widths)
    if widths.ndim != 1 or len(widths) < tokenizer.vocab_size or not np.issubdtype(widths.dtype, np.integer):
        raise MtbenchError(f"the model's {tokenizer.describe()['type']} tokenizer gives bytes_per_id() of shape "
                           f"{widths.shape} and dtype {widths.dtype}: not whole bytes for each of its "
                           f"{tokenizer.vocab_size:,} ids")
    return widths


def held_out_ids(folder, tokenizer, label):
    """The `TokenStream` of a token folder's val.bin (each token's bytes where `tokenizer` knows them), for a model
    whose `tokenizer` reads token files (`label` names the model in refusals): what `mtbench evaluate` scores."""
    path = os.path.join(folder, TOKEN_FILES["val"])
    if not os.path.isfile(path):
        raise MtbenchError(f"{path}: no such file; a model is scored on the val.bin of nanoGPT's token files")
    if os.path.getsize(path) % TOKEN_DTYPE.itemsize or os.path.getsize(path) < 2 * TOKEN_DTYPE.itemsize:
        raise MtbenchError(f"{path}: {os.path.getsize(path):,} bytes, not two or more {TOKEN_DTYPE.name} token ids")
    characters = read_characters(folder)
    if characters is not None and characters != getattr(tokenizer, "characters", None):
        raise MtbenchError(f"{folder}: its {META_FILE} gives each id a character, which the model ({label}) reads "
                           f"otherwise")
    ids, widths = TokenFile(path), bytes_per_id(tokenizer)
    # One pass over the ids: their counts where each id's bytes are known (the largest id with them), else the
    # largest id alone.
    counts = None if widths is None else id_counts(ids)
    largest = largest_id(ids) if counts is None else len(counts) - 1
    if largest >= tokenizer.vocab_size:
        raise MtbenchError(f"{folder}: val.bin holds id {largest:,}, past the {tokenizer.vocab_size:,} ids of the "
                           f"model ({label})")
    return TokenStream(ids, None if widths is None else TokenWidths(ids, widths)), \
        None if widths is None else int(counts @ widths[:len(counts)])


def vocabulary_size(largest, asked, default=None):
    """The model's vocabulary: `asked` (--vocab-size) where given, which must hold every id; else `default`
    (meta.pkl's vocab_size or characters, as nanoGPT takes it), else the largest id and one, rounded up to a
    multiple of 64 as nanoGPT rounds GPT-2's."""
    if asked is None and default is not None:
        return default
    if asked is None:
        return math.ceil((largest + 1) / VOCABULARY_MULTIPLE) * VOCABULARY_MULTIPLE
    if asked <= largest:
        raise MtbenchError(f"--vocab-size {asked} is too small for the token files: they hold id {largest}")
    return asked


def file_fingerprint(ids):
    """A digest of a token file's size and of 64 places spread over it: what guards --resume against other data,
    read in a moment from a file of many GBs."""
    digest = hashlib.sha256(f"{ids.dtype.name}:{len(ids)}".encode())
    sample = FINGERPRINT_SAMPLE_BYTES // ids.dtype.itemsize
    for start in range(0, len(ids), max(len(ids) // FINGERPRINT_SAMPLES, 1)):
        digest.update(np.asarray(ids[start:start + sample]).tobytes())
    return digest.hexdigest()[:16]


class TokenIds(Tokenizer):
    """The ids of token files: a vocabulary size, and text only where meta.pkl gave each id its `characters`.
    Saved beside a trained model so that it loads; without characters it refuses what needs text (a prompt)."""
    kind = "token-ids"

    def __init__(self, vocab_size, characters=None):
        self.vocab_size = vocab_size
        self.characters = characters
        self.index = {text: i for i, text in enumerate(characters or ())}
        self.fingerprint = f"token-ids-{vocab_size}" + ("" if characters is None else "-" + hashlib.sha256(
            "\n".join(characters).encode("utf-8")).hexdigest()[:16])

    def encode_text(self, text):
        if self.characters is None:
            raise MtbenchError("the model was trained on token files, which carry no tokenizer: it takes no text "
                               "prompt")
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise MtbenchError(f"{''.join(unknown)!r}: not among the characters of the token files' meta.pkl")
        return [self.index[character] for character in text]

    def text_ids(self):
        """How many ids stand for text: meta.pkl's characters (the rows past them pad the vocabulary)."""
        return None if self.characters is None else len(self.characters)

    def bytes_per_id(self):
        if self.characters is None:
            return None
        # The ids past the characters (--vocab-size padded, as nanoGPT pads to a multiple of 64) stand for no text.
        widths = np.zeros(max(self.vocab_size, len(self.characters)), np.uint8)
        widths[:len(self.characters)] = utf8_widths(self.characters)
        return widths

    def decode_text(self, ids):
        if self.characters is None:
            raise MtbenchError("the model was trained on token files, which carry no tokenizer: its ids have no text")
        return "".join(self.characters[i] if i < len(self.characters) else "\ufffd" for i in map(int, ids))

    def describe(self):
        described = {"type": self.kind, "vocab_size": self.vocab_size, "fingerprint": self.fingerprint}
        if self.characters is not None:
            described["characters"] = f"{len(self.characters)}, from {META_FILE}"
        return described

    def save(self, directory):
        write_json_atomic(os.path.join(directory, SAVED_NAME), {"type": self.kind, "vocab_size": self.vocab_size,
                                                                "characters": self.characters})
