"""mtbench's own tokenizer: a joint sentencepiece model for source and target, trained on the training split and
cached by a hash of everything that shapes it. (A pretrained model family brings its own, `ModelFamily.tokenizer`.)"""

import hashlib
import io
import os
import shutil

import sentencepiece as spm

from mtbench.plugins.api import SpecialTokens, Tokenizer
from mtbench.runner.files import write_bytes_atomic

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
JOINT_SPECIAL = SpecialTokens(pad=PAD_ID, eos=EOS_ID, start=BOS_ID)
TOKENIZER_VERSION = "unigram-v1"
SAVED_NAME = "tokenizer.model"  # the file name in a saved model's directory


class JointTokenizer(Tokenizer):
    special = JOINT_SPECIAL

    def __init__(self, model_bytes, path):
        self.processor = spm.SentencePieceProcessor(model_proto=model_bytes)
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
        """For each sentence, (ids, the UTF-8 byte offset in it where each piece's text begins). A piece's own bytes
        are not the text's (sentencepiece folds runs of whitespace into one '▁'); its offsets into the text are."""
        return [([piece.id for piece in encoded.pieces], [piece.begin for piece in encoded.pieces])
                for encoded in self.processor.encode(list(sentences), return_type="proto")]

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


def load_or_train_sentencepiece(sentences, digest, vocab_size, cache_dir):
    """The sentencepiece model cached under `digest` (a hash of everything that shapes it), or one trained on
    `sentences()` and cached."""
    path = os.path.join(cache_dir, "tokenizers", f"spm-{vocab_size}-{digest[:16]}.model")
    if os.path.exists(path):
        return JointTokenizer.from_file(path)
    model = io.BytesIO()
    sentences = sentences()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size, model_type="unigram",
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, character_coverage=1.0,
        # A small corpus may not support the requested vocabulary: take what it supports instead of failing.
        hard_vocab_limit=False, num_threads=os.cpu_count() or 1, minloglevel=2,
        input_sentence_size=2_000_000, shuffle_input_sentence=True)
    write_bytes_atomic(path, model.getvalue())
    return JointTokenizer(model.getvalue(), path)
