"""A language model's continuation (`mtbench.runner.evaluation.sampling`): the next token drawn at any temperature,
and the text a continuation adds to its prompt as each tokenizer decodes it."""

import numpy as np

from mtbench.runner.data.text import ByteTokenizer, CharTokenizer, text_tokenizer
from mtbench.runner.evaluation.sampling import continued_text, next_token

TEXT = "\n".join(f"the quick brown fox jumps over the lazy dog number {i} and the quick cat sleeps" for i in range(300))


def test_a_tiny_temperature_draws_the_most_likely_token_as_greedy_decoding_does():
    """Divided by 1e-320 before the largest was taken off, the logits overflowed and numpy refused probabilities of
    NaN."""
    logits = np.array([1.0, 3.0, 2.0, -1e4])
    rng = np.random.default_rng(0)
    for temperature in (1e-320, 1e-300, 1e-8):
        assert [next_token(logits, temperature, None, rng) for _ in range(20)] == [1] * 20
        assert next_token(logits, temperature, 2, rng) == 1
    assert next_token(logits, 0, None, rng) == 1
    drawn = {next_token(logits, 100.0, None, rng) for _ in range(200)}
    assert drawn == {0, 1, 2}  # a high temperature draws the others too (the fourth is e^-100 away)


def test_a_sentencepiece_continuation_keeps_the_space_its_first_piece_begins_with(tmp_path):
    """Sentencepiece decodes a text's first '▁' as nothing: decoded alone, the continuation of 'the quick' lost the
    space before 'jumps' ('the quickjumps')."""
    tokenizer = text_tokenizer("sentencepiece", TEXT.encode(), 80, str(tmp_path))
    prompt = tokenizer.encode_text("the quick")
    whole = tokenizer.encode_text("the quick jumps over")
    assert whole[:len(prompt)] == prompt
    generated = whole[len(prompt):]
    assert tokenizer.decode_text(generated) == "jumps over"  # what the continuation printed before
    assert continued_text(tokenizer, prompt, generated) == " jumps over"


def test_byte_and_character_continuations_are_their_own_text():
    for tokenizer in (ByteTokenizer(), CharTokenizer(TEXT)):
        prompt, generated = tokenizer.encode_text("the quick"), tokenizer.encode_text(" fox\nthe")
        assert continued_text(tokenizer, prompt, generated) == " fox\nthe"
    byte = ByteTokenizer()
    # The prompt ends inside a character: its text is not how the whole begins, so the continuation is its own.
    prompt, generated = byte.encode_text("café")[:-1], byte.encode_text("é!")[1:]
    assert continued_text(byte, prompt, generated) == "\ufffd!"


def test_a_character_vocabulary_is_not_recorded_as_a_padded_byte_vocabulary():
    assert CharTokenizer("abc").describe() == {"type": "char", "vocab_size": 4,
                                               "fingerprint": CharTokenizer("cab").fingerprint}
    assert ByteTokenizer(320).describe()["padded_from"] == 256


def test_a_padded_vocabulary_draws_only_the_ids_that_stand_for_text():
    """GPT-2 small at the byte level has 50,304 rows and 256 bytes: an untrained model drew the padding rows, and
    decoded them as replacement characters."""
    from mtbench.runner.data.token_files import TokenIds
    from mtbench.runner.evaluation.sampling import continuation, drawable_ids
    rows = 50304
    favours_padding = lambda x: np.where(np.arange(rows) >= 256, 10.0, 0.0)[None, None, :].repeat(x.shape[1], 1)
    for temperature, top_k in ((0, None), (1.0, None), (1.0, 5)):
        drawn = continuation(favours_padding, [104, 105], 8, 20, temperature, top_k, np.random.default_rng(0),
                             drawable_ids(ByteTokenizer(rows)))
        assert len(drawn) == 20 and max(drawn) < 256
    assert drawable_ids(ByteTokenizer(rows)) == 256 and drawable_ids(CharTokenizer("ab")) == 3
    assert drawable_ids(TokenIds(128, list("abc"))) == 3 and drawable_ids(TokenIds(128)) is None
    assert max(continuation(favours_padding, [1], 8, 5, 0, None, np.random.default_rng(0))) >= 256  # unmasked


def test_a_character_vocabulary_never_draws_its_unknown_character():
    """A model of a few steps drew the char tokenizer's <unk> (id 0, which no training text is), printed as U+FFFD
    in its sample: nanoGPT's vocabulary has no such id to draw."""
    from mtbench.runner.evaluation.sampling import continuation, drawable_ids, unknown_id
    tokenizer = CharTokenizer("ab")
    favours_unknown = lambda x: np.array([10.0, 0.0, 1.0])[None, None, :].repeat(x.shape[1], 1)
    for temperature, top_k in ((0, None), (1.0, None), (1.0, 2)):
        drawn = continuation(favours_unknown, [1], 8, 20, temperature, top_k, np.random.default_rng(0),
                             drawable_ids(tokenizer), unknown_id(tokenizer))
        assert len(drawn) == 20 and 0 not in drawn
    assert continuation(favours_unknown, [1], 8, 3, 0, None, np.random.default_rng(0)) == [0, 0, 0]  # unmasked
    assert unknown_id(ByteTokenizer()) is None
