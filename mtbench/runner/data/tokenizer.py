"""mtbench's own tokenizer: a joint sentencepiece model for source and target, trained on the training split and
cached by a hash of everything that shapes it. (A pretrained model family brings its own, `ModelFamily.tokenizer`.)"""

import functools
import hashlib
import io
import itertools
import os
import re
import shutil

import numpy as np
import sentencepiece as spm

from mtbench.errors import MtbenchError
from mtbench.plugins.api import SpecialTokens, Tokenizer
from mtbench.runner.files import read_cache_file, write_cache_file

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
JOINT_SPECIAL = SpecialTokens(pad=PAD_ID, eos=EOS_ID, start=BOS_ID)
# v2: trained on TRAINING_THREADS threads, not the machine's cores (v1's models differed between machines).
# v3: long lines cut to pieces sentencepiece keeps, and a large corpus sampled with a fixed seed (v2's dropped
# lines over 4,192 bytes unseen, and sampled over 2 M lines with a seed of its own: two processes differed).
TOKENIZER_VERSION = "unigram-v3"
# sentencepiece splits its corpus among its threads, and the model it learns depends on their number (38 % of the
# default corpus's sentences encoded differently on 1 thread and on 2): a fixed number gives every machine one
# tokenizer, so the same seed makes the same batches on a machine of any size.
TRAINING_THREADS = 8
SAVED_NAME = "tokenizer.model"  # the file name in a saved model's directory
# sentencepiece leaves out, silently, every sentence longer than its max_sentence_length (4,192 bytes): a text of a
# paragraph a line, or of one line (text8), would train a tokenizer on its short lines alone, or on nothing.
LONGEST_TRAINING_SENTENCE = 4000  # bytes
# The most sentences a tokenizer is trained on (sentencepiece's own default), drawn with a fixed seed.
TRAINING_SENTENCES = 2_000_000


class JointTokenizer(Tokenizer):
    special = JOINT_SPECIAL

    def __init__(self, model_bytes, path):
        # sentencepiece takes no bytes at all for a model without pieces (and says so on stderr when asked its
        # size), whose every id then fails far from here; other bytes that are no model it refuses
        try:
            self.processor = spm.SentencePieceProcessor(model_proto=model_bytes) if model_bytes else None
        except RuntimeError:
            self.processor = None
        if self.processor is None or not self.processor.get_piece_size():
            raise MtbenchError(f"{path}: not a sentencepiece model ({len(model_bytes):,} bytes)")
        self.path = path
        self.fingerprint = os.path.basename(path)

    @classmethod
    def from_file(cls, path):
        with open(path, "rb") as f:
            return cls(f.read(), path)

    @property
    def vocab_size(self):
        return self.processor.get_piece_size()

    def encode(self, sentences):
        return self.processor.encode(list(sentences), out_type=int)

    encode_source = encode_target = encode

    def encode_with_starts(self, sentences):
        """(ids, starts, counts) of `sentences` encoded one after another: each piece's id, the UTF-8 byte offset in
        its sentence where the piece's text begins, and each sentence's number of pieces. Where decoding the ids
        gives the sentence back, the pieces' bytes are the sentence's and the offsets are summed from them; elsewhere
        (sentencepiece folds runs of whitespace into one '▁', normalizes some characters, has no piece for others)
        they are sentencepiece's own, read from its protos, which take ten times as long."""
        sentences = list(sentences)
        encoded = self.processor.encode(sentences, out_type=int)
        counts = np.fromiter(map(len, encoded), np.int64, len(encoded))
        ids = np.fromiter(itertools.chain.from_iterable(encoded), np.int32, int(counts.sum()))
        piece_bytes, after_space = self._piece_bytes
        widths = piece_bytes[ids]
        nonempty, offsets = counts > 0, np.cumsum(counts) - counts  # each sentence's first piece, if it has one
        firsts = offsets[nonempty]
        widths[firsts] -= after_space[ids[firsts]]  # the '▁' sentencepiece puts before each sentence is no byte of it
        before = np.cumsum(widths) - widths
        starts = before - np.repeat(before[firsts], counts[nonempty])
        summed = np.zeros(len(sentences), np.int64)
        summed[nonempty] = np.add.reduceat(widths, firsts) if len(firsts) else 0
        sentence_bytes = np.fromiter((len(s.encode("utf-8")) for s in sentences), np.int64, len(sentences))
        decoded = self.processor.decode(encoded)
        unlike = [i for i, (sentence, text) in enumerate(zip(sentences, decoded))
                  if text != sentence or summed[i] != sentence_bytes[i]]
        if unlike:
            protos = self.processor.encode([sentences[i] for i in unlike], return_type="proto")
            for i, proto in zip(unlike, protos):
                starts[offsets[i]:offsets[i] + counts[i]] = [piece.begin for piece in proto.pieces]
        return ids, starts, counts

    @functools.cached_property
    def _piece_bytes(self):
        """For each id, the bytes of its piece's text ('▁' a space), and 1 where the piece begins with '▁'."""
        pieces = [self.processor.id_to_piece(i) for i in range(self.vocab_size)]
        return (np.array([len(piece.replace("\u2581", " ").encode("utf-8")) for piece in pieces], np.int64),
                np.array([piece.startswith("\u2581") for piece in pieces], np.int64))

    def decode(self, ids_batch):
        return self.processor.decode([list(ids) for ids in ids_batch])

    def describe(self):
        return {"type": "sentencepiece-unigram", "vocab_size": self.vocab_size, "file": self.path,
                "special": self.special.to_dict()}

    def save(self, directory):
        shutil.copyfile(self.path, os.path.join(directory, SAVED_NAME))


def pairs_digest(pairs, prefix=""):
    digest = hashlib.sha256(prefix.encode())
    for source, target in pairs:
        digest.update(f"{source}\t{target}\n".encode())
    return digest.hexdigest()


def load_or_train_tokenizer(train_pairs, vocab_size, cache_dir):
    digest = pairs_digest(train_pairs, prefix=f"{TOKENIZER_VERSION}:{vocab_size}\n")
    return load_or_train_sentencepiece(lambda: [s for pair in train_pairs for s in pair], digest, vocab_size,
                                       cache_dir)


def load_or_train_sentencepiece(sentences, digest, vocab_size, cache_dir, **options):
    """The sentencepiece model cached under `digest` (a hash of everything else that shapes it) and `options`, or
    one trained on `sentences()` with sentencepiece's further `options` and cached."""
    if options:  # two callers' options for one text make two models
        digest = hashlib.sha256(f"{digest}:{sorted(options.items())!r}".encode()).hexdigest()
    path = os.path.join(cache_dir, "tokenizers", f"spm-{vocab_size}-{digest[:16]}.model")
    # A copy cut at a piece's end still loads, with fewer pieces: it passed for the model asked for (a vocabulary
    # of 500 said to be all the corpus supports of 1,000). Only the bytes written are read back.
    kept = read_cache_file(path)
    if kept is not None:
        try:
            return JointTokenizer(kept, path)
        except MtbenchError:  # no model: made again, as where there was none
            pass
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=training_sentences(sentences), model_writer=model, vocab_size=vocab_size,
            model_type="unigram", pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, character_coverage=1.0,
            # A small corpus may not support the requested vocabulary: take what it supports instead of failing.
            hard_vocab_limit=False, num_threads=TRAINING_THREADS, minloglevel=2,
            max_sentence_length=LONGEST_TRAINING_SENTENCE * 2,  # what training_sentences gives, with room
            input_sentence_size=0, shuffle_input_sentence=False,  # training_sentences has sampled, reproducibly
            **options)
    except RuntimeError as error:
        raise MtbenchError(training_failure(str(error), vocab_size)) from None
    write_cache_file(path, model.getvalue())
    return JointTokenizer(model.getvalue(), path)


def training_sentences(sentences):
    """What a tokenizer is trained on, an iterator (a large corpus is never held): `sentences()`'s lines, each
    cut into pieces of at most LONGEST_TRAINING_SENTENCE bytes, and of more than TRAINING_SENTENCES pieces a sample
    drawn with a fixed seed (in their order), so that every process and machine trains the same model.
    `sentences` is called twice: the pieces are counted here, so that a text that cannot be read fails here and
    not inside the trainer, then given."""
    count = blank = 0
    for piece in _cut_lines(sentences):
        count += 1
        blank += not piece.strip()
    if blank == count:  # sentencepiece's own refusal of it differs between its versions
        raise MtbenchError(NO_TEXT)
    if count <= TRAINING_SENTENCES:
        return _cut_lines(sentences)
    kept = np.sort(np.random.default_rng(0).choice(count, TRAINING_SENTENCES, replace=False))
    return _pieces_at(_cut_lines(sentences), iter(kept.tolist()))


def _pieces_at(pieces, indices):
    """The pieces at `indices` (increasing)."""
    wanted = next(indices)
    for index, piece in enumerate(pieces):
        if index == wanted:
            yield piece
            wanted = next(indices, None)
            if wanted is None:
                return


def _cut_lines(sentences):
    return itertools.chain.from_iterable(map(short_pieces, sentences()))


def short_pieces(sentence, longest=LONGEST_TRAINING_SENTENCE):
    """`sentence` cut into pieces of at most `longest` UTF-8 bytes, each at the last whitespace before the limit
    (within a word longer than that, at a character's edge)."""
    data = sentence.encode("utf-8")
    start = 0
    while len(data) - start > longest:
        window = data[start:start + longest + 1]
        cut = max(window.rfind(b" "), window.rfind(b"\t"))
        if cut <= 0:
            cut = longest
            while data[start + cut] & 0xC0 == 0x80:  # not inside a character
                cut -= 1
        yield data[start:start + cut].decode("utf-8")
        start += cut
        while start < len(data) and data[start] in b" \t":
            start += 1
    if start < len(data):
        yield data[start:].decode("utf-8")


NO_TEXT = "there is no text to train a tokenizer on (the training split has no line that is not blank)"


def training_failure(message, vocab_size):
    """sentencepiece's refusal to train, in a line that says what to change."""
    needed = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", message)
    if needed:
        return (f"--vocab-size {vocab_size} is too small for this text: its characters and the special pieces "
                f"need {needed.group(1)} ids; give --vocab-size {needed.group(1)} or more")
    if "sentences_.empty()" in message or "all_chars_count" in message:
        return NO_TEXT
    return f"sentencepiece could not train a tokenizer of --vocab-size {vocab_size}: {message.strip().splitlines()[-1]}"
