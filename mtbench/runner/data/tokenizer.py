"""A joint sentencepiece model for source and target, trained on the training split and cached by a hash of
everything that shapes it."""

import hashlib
import io
import os

import sentencepiece as spm

from mtbench.runner.files import write_bytes_atomic

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
TOKENIZER_VERSION = "unigram-v1"


class Tokenizer:
    def __init__(self, model_bytes, path):
        self.processor = spm.SentencePieceProcessor(model_proto=model_bytes)
        self.path = path

    @property
    def vocab_size(self):
        return self.processor.get_piece_size()

    def encode(self, sentences):
        return self.processor.encode(list(sentences), out_type=int)

    def decode(self, ids_batch):
        return self.processor.decode([list(ids) for ids in ids_batch])


def load_or_train_tokenizer(train_pairs, vocab_size, cache_dir):
    digest = hashlib.sha256()
    digest.update(f"{TOKENIZER_VERSION}:{vocab_size}\n".encode())
    for source, target in train_pairs:
        digest.update(f"{source}\t{target}\n".encode())
    path = os.path.join(cache_dir, "tokenizers", f"spm-{vocab_size}-{digest.hexdigest()[:16]}.model")
    if os.path.exists(path):
        with open(path, "rb") as f:
            return Tokenizer(f.read(), path)
    model = io.BytesIO()
    sentences = [s for pair in train_pairs for s in pair]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size, model_type="unigram",
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, character_coverage=1.0,
        # A small corpus may not support the requested vocabulary: take what it supports instead of failing.
        hard_vocab_limit=False, num_threads=os.cpu_count() or 1, minloglevel=2,
        input_sentence_size=2_000_000, shuffle_input_sentence=True)
    write_bytes_atomic(path, model.getvalue())
    return Tokenizer(model.getvalue(), path)
