"""mtbench's sentencepiece training: every line of the text reaches the trainer (long ones cut, not dropped), a
large corpus is sampled the same way in every process, and a text it cannot train on is a one-line error."""

import numpy as np
import pytest
import sentencepiece as spm

import mtbench.runner.data.tokenizer as tokenizer_module
from mtbench.errors import MtbenchError
from mtbench.runner.data.text import text_tokenizer
from mtbench.runner.data.tokenizer import load_or_train_sentencepiece, short_pieces, training_sentences

WORDS = ["commencement", "parole", "lumière", "ténèbres", "abîme", "esprit", "eaux", "jour", "nuit", "soir", "matin",
         "firmament", "terre", "mer", "herbe", "semence", "fruit", "étoiles", "oiseaux", "poissons"]


def test_a_text_of_one_long_line_trains_a_tokenizer_that_knows_all_of_it(tmp_path):
    """text8 is one line of 100 MB; sentencepiece leaves out every sentence over 4,192 bytes without a word, so it
    trained on nothing (an error) or, beside short lines, on those alone (a third of the text <unk>)."""
    rng = np.random.default_rng(0)
    long_line = " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 6000))  # ~ 45 KB, no line break
    text = ("court\n" * 50 + long_line + "\n").encode("utf-8")
    tokenizer = text_tokenizer("sentencepiece", text, 200, str(tmp_path))
    stream = tokenizer.stream(text)
    assert stream.unknown == 0 and stream.token_bytes.sum() == len(text)
    assert tokenizer.decode_text(stream.ids) == text.decode("utf-8")


def test_long_lines_are_cut_at_whitespace_or_between_characters_into_pieces_sentencepiece_keeps():
    words = " ".join(f"mot{i}" for i in range(3000))
    pieces = list(short_pieces(words))
    sizes = [len(piece.encode("utf-8")) for piece in pieces]
    assert max(sizes) <= 4000 and min(sizes[:-1]) >= 4000 - len(" mot2999")  # each cut at the limit's last space
    assert " ".join(pieces) == words and not any(piece.startswith(" ") for piece in pieces)
    no_spaces = "é" * 5000  # 10,000 bytes of two-byte characters: cut between characters
    assert [len(piece.encode("utf-8")) for piece in short_pieces(no_spaces)] == [4000, 4000, 2000]


def test_a_large_corpus_is_sampled_with_a_fixed_seed_in_its_order_and_the_trainer_samples_nothing(monkeypatch,
                                                                                                 tmp_path):
    """sentencepiece's own sampling (input_sentence_size) draws with a seed of its own: two processes trained two
    tokenizers of one corpus. mtbench draws the sample and hands the trainer that alone."""
    monkeypatch.setattr(tokenizer_module, "TRAINING_SENTENCES", 50)
    sentences = [f"{WORDS[i % len(WORDS)]} {i}" for i in range(400)]
    sample = list(training_sentences(lambda: sentences))
    assert len(sample) == 50 and sample == list(training_sentences(lambda: iter(sentences)))
    assert [sentences.index(s) for s in sample] == sorted(sentences.index(s) for s in sample)  # in their order
    assert len(set(sample)) == 50 and sample != sentences[:50]
    asked = {}
    train = spm.SentencePieceTrainer.train

    def recording(**options):
        asked.update(options, sentences=list(options["sentence_iterator"]))
        options["sentence_iterator"] = iter(asked["sentences"])
        return train(**options)
    monkeypatch.setattr(tokenizer_module.spm.SentencePieceTrainer, "train", recording)
    load_or_train_sentencepiece(lambda: sentences, "sampled", 60, str(tmp_path))
    assert asked["sentences"] == sample and asked["input_sentence_size"] == 0
    assert asked["shuffle_input_sentence"] is False


@pytest.mark.parametrize("sentences, vocab_size, expected", [
    (["the quick brown fox jumps over the lazy dog"] * 20, 20,
     r"^--vocab-size 20 is too small for this text: its characters and the special pieces need \d+ ids; give "
     r"--vocab-size \d+ or more$"),
    (["", "   "], 100, r"^there is no text to train a tokenizer on \(the training split has no line that is not "
                      r"blank\)$"),
])
def test_a_text_sentencepiece_cannot_train_on_is_a_one_line_error(tmp_path, sentences, vocab_size, expected):
    with pytest.raises(MtbenchError, match=expected):
        load_or_train_sentencepiece(lambda: sentences, f"refused-{vocab_size}", vocab_size, str(tmp_path))
    assert not (tmp_path / "tokenizers").exists() or not list((tmp_path / "tokenizers").iterdir())  # nothing cached


def test_the_smallest_vocabulary_the_error_names_trains(tmp_path):
    sentences = ["the quick brown fox jumps over the lazy dog"] * 20
    with pytest.raises(MtbenchError) as refused:
        load_or_train_sentencepiece(lambda: sentences, "small", 20, str(tmp_path))
    smallest = int(str(refused.value).rsplit("--vocab-size ", 1)[1].split()[0])
    assert smallest == len(set("".join(sentences))) + 4  # the characters, and pad, unk, bos and eos
    assert load_or_train_sentencepiece(lambda: sentences, "smallest", smallest, str(tmp_path)).vocab_size == smallest


def test_a_model_trained_with_other_options_is_cached_apart(tmp_path):
    """Under one digest, a model trained with NFKC must not be read back for a caller that asked for the text as
    it is: the options are part of the cache's key."""
    sentences = [f"{WORDS[i % len(WORDS)]}  ﬁ {i}" for i in range(300)]  # runs of spaces, a ligature NFKC splits
    folded = load_or_train_sentencepiece(lambda: sentences, "one-text", 60, str(tmp_path))
    kept = load_or_train_sentencepiece(lambda: sentences, "one-text", 60, str(tmp_path),
                                       normalization_rule_name="identity", remove_extra_whitespaces=False)
    assert folded.path != kept.path and len(list((tmp_path / "tokenizers").glob("*.model"))) == 2
    assert "ﬁ" in kept.processor.decode(kept.processor.encode("ﬁ")) and "ﬁ" not in folded.processor.decode(
        folded.processor.encode("ﬁ"))


@pytest.mark.parametrize("content", [b"", b"not a model", b"\x08\x01"])
def test_a_file_that_is_no_sentencepiece_model_is_refused_where_it_is_read(tmp_path, capfd, content):
    """An empty tokenizer.model in a saved model was taken as a model of no pieces: Keras warnings, then an
    IndexError far from the file."""
    path = tmp_path / "tokenizer.model"
    path.write_bytes(content)
    with pytest.raises(MtbenchError, match=f"^{path}: not a sentencepiece model \\({len(content)} bytes\\)$"):
        tokenizer_module.JointTokenizer.from_file(str(path))
    assert capfd.readouterr().err == ""


def test_a_cached_tokenizer_that_is_no_model_is_trained_again(tmp_path):
    """The cache is made from the corpus: a file there that is no model (a copy cut short) is made again, where
    a saved model's own tokenizer.model is refused."""
    sentences = ["the quick brown fox jumps over the lazy dog", "a sentence of other words"] * 20
    trained = load_or_train_sentencepiece(lambda: sentences, "cut", 40, str(tmp_path))
    model_bytes = open(trained.path, "rb").read()
    open(trained.path, "wb").close()
    again = load_or_train_sentencepiece(lambda: sentences, "cut", 40, str(tmp_path))
    assert again.path == trained.path and open(again.path, "rb").read() == model_bytes
    assert again.encode(sentences[:1]) == trained.encode(sentences[:1])


def test_a_cached_tokenizer_cut_short_to_fewer_pieces_is_trained_again(tmp_path):
    """A copy cut at a piece's end still loads, with fewer pieces: it was used as it was, and the run said the corpus
    supported no more of --vocab-size. The model is kept with its sha256; one that differs is made again."""
    sentences = ["the quick brown fox jumps over the lazy dog", "a sentence of other words"] * 20
    trained = load_or_train_sentencepiece(lambda: sentences, "cut", 40, str(tmp_path))
    model_bytes = open(trained.path, "rb").read()
    fewer = load_or_train_sentencepiece(lambda: sentences, "fewer", 32, str(tmp_path / "other"))
    with open(trained.path, "wb") as cut:  # a model that loads, of fewer pieces than the one kept there
        cut.write(open(fewer.path, "rb").read())
    assert tokenizer_module.JointTokenizer.from_file(trained.path).vocab_size == 32 < trained.vocab_size
    again = load_or_train_sentencepiece(lambda: sentences, "cut", 40, str(tmp_path))
    assert again.vocab_size == trained.vocab_size and open(again.path, "rb").read() == model_bytes
