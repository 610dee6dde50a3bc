"""Text for language models, without a framework: contiguous splits cut between characters, the three tokenizers,
the bytes each token stands for (what bits per byte divides by), and blocks drawn alike for every backend."""

import os

import numpy as np
import pytest

from mtbench.errors import MtbenchError
from mtbench.runner.data.text import (ByteTokenizer, CharTokenizer, evaluated_bytes, evaluation_batches,
                                      split_ranges, text_tokenizer, training_batches)

TEXT = ("Au commencement était la Parole. " * 40 + "Ünïcödé — ✓\n" * 20).encode("utf-8")


def test_the_splits_are_contiguous_in_order_and_never_cut_a_character():
    ranges = split_ranges(TEXT)
    assert ranges["train"][0] == 0 and ranges["train"][1] == ranges["valid"][0]
    assert ranges["valid"][1] == ranges["test"][0] and ranges["test"][1] == len(TEXT)
    for start, end in ranges.values():
        TEXT[start:end].decode("utf-8")  # raises if a character were cut
    held_out = ranges["test"][1] - ranges["test"][0]
    assert abs(held_out - 0.05 * len(TEXT)) < 4  # 5 %, moved at most to the next character's start


def test_byte_and_character_tokens_carry_the_bytes_they_stand_for():
    byte_stream = ByteTokenizer().stream(TEXT)
    assert len(byte_stream) == len(TEXT) and byte_stream.token_bytes.sum() == len(TEXT)
    chars = CharTokenizer(TEXT.decode("utf-8")[:200])  # only some characters: the others are <unk>
    stream = chars.stream(TEXT)
    assert stream.token_bytes.sum() == len(TEXT)
    assert stream.unknown == sum(1 for c in TEXT.decode("utf-8") if c not in TEXT.decode("utf-8")[:200])
    assert chars.decode_text(chars.encode_text("Parole.")) == "Parole."
    assert stream.token_bytes.max() == 3  # '—' and '✓' are three bytes each in UTF-8


def test_the_character_level_refuses_bytes_that_are_not_utf8_and_says_where():
    with pytest.raises(MtbenchError, match="not UTF-8 at byte 5"):
        text_tokenizer("char", b"hello\xff world", None, None)


def test_sentencepiece_text_round_trips_lines(tmp_path):
    tokenizer = text_tokenizer("sentencepiece", TEXT * 3, 60, str(tmp_path))
    stream = tokenizer.stream(TEXT)
    assert stream.token_bytes.sum() == len(TEXT)
    # The record names the model file a resumed run must find, as the byte and character tokenizers name theirs.
    assert tokenizer.describe()["fingerprint"] == os.path.basename(tokenizer.describe()["file"])
    assert tokenizer.decode_text(tokenizer.encode_text("la Parole\nla Parole")) == "la Parole\nla Parole"


def test_sentencepiece_tokens_stand_for_the_bytes_of_their_own_text(tmp_path):
    """The first lines' tokens (and the line break after them) stand for those lines' bytes, not for a share of
    the whole text's: here the first lines are plain ASCII and the rest mostly 3-byte characters, so a share would
    count the first blocks' bytes far off. Whitespace sentencepiece drops (runs, a blank line) is counted too."""
    head = "  Au commencement  était la Parole.\n   \n" * 30
    text = (head + "— ✓ — ✓ ☃\n" * 60).encode("utf-8")
    tokenizer = text_tokenizer("sentencepiece", text * 3, 60, str(tmp_path))
    stream = tokenizer.stream(text)
    assert stream.token_bytes.sum() == len(text)
    tokens_of_head = len(tokenizer.encode_text(head[:-1])) + 1  # and the line break that ends it
    assert stream.token_bytes[:tokens_of_head].sum() == len(head.encode("utf-8"))
    np.testing.assert_array_equal(stream.ids, tokenizer.encode_text(text.decode("utf-8")))


def test_training_blocks_are_the_seeds_and_a_resumed_run_gets_the_same_ones():
    stream = ByteTokenizer().stream(TEXT)
    first = [batch for _, batch in zip(range(5), training_batches(stream, 4, 16, seed=3))]
    resumed = [batch for _, batch in zip(range(2), training_batches(stream, 4, 16, seed=3, skip=3))]
    assert len(resumed) == 2
    for (_, a), (_, b) in zip(first[3:], resumed):
        for name in ("target_input", "target_output", "weight", "index"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    for _, batch in first:  # each row is the text's block at its start, and the block after it by one
        for row, start in enumerate(batch.index):
            np.testing.assert_array_equal(batch.target_input[row], stream.ids[start:start + 16])
            np.testing.assert_array_equal(batch.target_output[row], stream.ids[start + 1:start + 17])
    other_seed = [batch for _, batch in zip(range(5), training_batches(stream, 4, 16, seed=4))]
    assert [list(b.index) for _, b in other_seed] != [list(b.index) for _, b in first]
    _, batch = first[0]
    assert batch.source is None and batch.inputs == (batch.target_input,)
    assert batch.target_tokens == 4 * 16  # every position counts in the loss and in tokens/s
    np.testing.assert_array_equal(batch.target_input[:, 1:], batch.target_output[:, :-1])  # the next token


def test_evaluation_predicts_every_token_once_and_counts_its_bytes():
    stream = CharTokenizer(TEXT.decode("utf-8")).stream(TEXT)
    batches = list(evaluation_batches(stream, rows=3, block=50, text_bytes=10 ** 6))
    assert sum(batch.target_tokens for batch in batches) == len(stream) - 1
    predicted = np.concatenate([batch.target_output[batch.weight > 0] for batch in batches])
    np.testing.assert_array_equal(predicted, stream.ids[1:])
    assert evaluated_bytes(stream, 10 ** 6) == len(TEXT) - int(stream.token_bytes[0])
    # TEXT begins "Au commencement", a byte a character: 12 bytes are the 12 characters after the first.
    assert sum(b.target_tokens for b in evaluation_batches(stream, 3, 5, text_bytes=12)) == 12


@pytest.mark.parametrize("stride", [1, 5, 15, 16])
def test_windows_a_stride_apart_predict_every_token_once_from_up_to_a_block_before_it(stride):
    """--eval-stride: the first window scores its every position; each later one starts `stride` tokens on and
    scores only its last `stride`, so a token after the first block reads at least block - stride + 1 tokens (with a
    stride of 1, the whole block before it)."""
    stream, block = ByteTokenizer().stream(TEXT[:300]), 16
    predicted, read = [], []
    for batch in evaluation_batches(stream, 4, block, 10 ** 6, stride):
        rows, positions = np.nonzero(batch.weight)
        for row, position in zip(rows, positions):
            start = batch.index[row]
            np.testing.assert_array_equal(batch.target_input[row, :position + 1], stream.ids[start:start + position + 1])
            predicted.append(start + position + 1)  # the token the position predicts
            read.append(position + 1)
        np.testing.assert_array_equal(batch.target_output[rows, positions], stream.ids[[s + p + 1 for s, p in
                                                                                          zip(batch.index[rows],
                                                                                              positions)]])
    assert predicted == list(range(1, len(stream)))
    assert read[:block] == list(range(1, block + 1))
    assert min(read[block:]) == block - stride + 1 and max(read[block:]) == block


def test_evaluation_scores_the_same_text_whatever_the_tokens(tmp_path):
    """A budget of bytes: the byte, character and sentencepiece models predict the same bytes of a text whose
    characters are 3 bytes each (a sentencepiece token stands for several), up to the last token's end."""
    text = (("— ✓ ☃ " * 10)[:-1] + "\n").encode("utf-8") * 30
    streams = {"byte": ByteTokenizer().stream(text), "char": CharTokenizer(text.decode("utf-8")).stream(text),
               "sentencepiece": text_tokenizer("sentencepiece", text * 3, 40, str(tmp_path)).stream(text)}
    scored = {}
    for kind, stream in streams.items():
        tokens = sum(batch.target_tokens for batch in evaluation_batches(stream, 4, 16, text_bytes=640))
        scored[kind] = (tokens, evaluated_bytes(stream, 640))
    # Each character is 3 bytes, a space or line break 1: a token never ends more than 3 bytes short of the budget.
    assert all(637 <= text_bytes <= 640 for _, text_bytes in scored.values()), scored
    assert scored["byte"][0] == 640 > scored["char"][0] > scored["sentencepiece"][0]


def test_every_tokenizer_is_scored_on_the_same_bytes_the_default_byte_one_included():
    """The splits are cut between characters for the byte tokenizer too, named or by default: a byte model and a
    character model are scored on the same text (a cut inside 'é' gave the byte model one byte more)."""
    from types import SimpleNamespace
    from mtbench.runner.tasks.language_modelling import LanguageModellingTask
    data = "a".encode() * 89 + "é".encode() * 6  # the validation/test cut lands inside an 'é'
    text = SimpleNamespace(data=data, name="accents", origin="test")
    ranges = {}
    for tokenizer in (None, "byte", "char"):
        config = SimpleNamespace(tokenizer=tokenizer, vocab_size=None, cache_dir=None, max_len=1,
                                 model=SimpleNamespace(byte_vocab_size=256))
        prepared = LanguageModellingTask().prepare(config, text, None)
        ranges[tokenizer] = prepared.record["byte_ranges"]
    assert ranges[None] == ranges["byte"] == ranges["char"]
    assert ranges["byte"]["valid"] == [91, 97]  # 101 bytes, 5 held out each: cuts at 91 and 96 (inside an 'é': 97)


def test_a_sentencepiece_preparation_hashes_each_split_once(tmp_path, monkeypatch):
    """The training split's one sha256 keys its tokenizer, its kept stream and the run's data fingerprint (each
    hashed it again before), on the run that trains the tokenizer and on the one that reads it back alike."""
    import hashlib
    from types import SimpleNamespace

    import mtbench.runner.data.text as text_module
    from mtbench.runner.tasks.language_modelling import LanguageModellingTask
    hashed = []

    class Counted:
        def __init__(self, data=b""):
            self.digest = hashlib.sha256()
            self.update(data)

        def update(self, data):
            hashed.append(bytes(data))
            self.digest.update(data)

        def hexdigest(self):
            return self.digest.hexdigest()

    monkeypatch.setattr(text_module, "hashlib", SimpleNamespace(sha256=Counted))
    text = SimpleNamespace(data=TEXT * 20, name="parole", origin="test")
    config = SimpleNamespace(tokenizer="sentencepiece", vocab_size=60, cache_dir=str(tmp_path), max_len=8,
                             model=SimpleNamespace(byte_vocab_size=256))
    fingerprints = []
    for trained_or_read in ("trained", "read"):
        hashed.clear()
        prepared = LanguageModellingTask().prepare(config, text, None)
        fingerprints.append(prepared.fingerprint)
        # Beside the text's splits: the keys' own short texts, and the sentencepiece model (the streams' key).
        of_the_text = sum(len(data) for data in hashed if len(data) > 100 and data in text.data)
        assert of_the_text == len(text.data), trained_or_read
    assert "read from" in prepared.lines[1] and fingerprints[0] == fingerprints[1]


class CountingProcessor:
    """A sentencepiece processor that counts the sentences whose protos (piece offsets) it was asked for."""

    def __init__(self, processor):
        self.processor, self.proto_sentences = processor, []

    def encode(self, sentences, **kwargs):
        if kwargs.get("return_type") == "proto":
            self.proto_sentences += sentences
        return self.processor.encode(sentences, **kwargs)

    def __getattr__(self, name):
        return getattr(self.processor, name)


@pytest.mark.parametrize("lines_at_once", [1 << 18, 7])  # the text in one batch of lines, or nearly a line a batch
def test_sentencepiece_token_bytes_are_sentencepieces_offsets_read_only_where_pieces_differ_from_the_text(
        tmp_path, monkeypatch, lines_at_once):
    """Each token stands for the bytes from its piece's offset in the text to the next one's, as sentencepiece's own
    offsets say. Lines that decode back to themselves take their pieces' bytes instead (ten times faster): only the
    others (here, each with a character the model has no piece for) ask sentencepiece for offsets. The model keeps
    the text as it is (no NFKC, runs of spaces kept), so a line of spaces alone decodes back to itself."""
    import mtbench.runner.data.text as text_module
    monkeypatch.setattr(text_module, "LINES_AT_ONCE", lines_at_once)
    plain = ["Au commencement était la Parole.", "", "la Parole était avec Dieu ✓", " ", "la  Parole   était "]
    unlike = ["  deux  espaces ", "pleine\u3000largeur \uff21", "tab\tici", "\u2603 inconnu", "fin  "]
    lines = [*plain * 20, *unlike, *plain]
    text = "\n".join(lines).encode("utf-8")
    tokenizer = text_tokenizer("sentencepiece", "\n".join(plain * 30).encode("utf-8"), 40, str(tmp_path))
    counting = tokenizer.joint.processor = CountingProcessor(tokenizer.joint.processor)
    stream = tokenizer.stream(text)
    assert sorted(counting.proto_sentences) == sorted(unlike)  # and no plain line
    # What sentencepiece says, line by line: each piece from its offset, the line break from its line's end.
    starts, line_start = [], 0
    for proto, line in zip(counting.processor.encode(lines, return_type="proto"), lines):
        starts += [line_start + piece.begin for piece in proto.pieces] + [line_start + len(line.encode("utf-8"))]
        line_start += len(line.encode("utf-8")) + 1
    edges = np.maximum.accumulate([0, *starts[1:-1], len(text)])
    np.testing.assert_array_equal(stream.token_bytes, np.diff(edges))
    np.testing.assert_array_equal(stream.ids, tokenizer.encode_text(text.decode("utf-8")))


def test_a_sentencepiece_stream_is_kept_and_read_back_for_the_same_text_and_model_only(tmp_path):
    from mtbench.runner.data.text import token_stream
    text = TEXT * 2
    tokenizer = text_tokenizer("sentencepiece", text * 3, 60, str(tmp_path))
    made, read = token_stream(tokenizer, text, str(tmp_path))
    assert not read
    kept, read = token_stream(tokenizer, text, str(tmp_path))
    assert read and kept.ids.dtype == made.ids.dtype == np.uint8  # a vocabulary of 60: one byte an id
    assert kept.token_bytes.dtype == made.token_bytes.dtype == np.uint8
    np.testing.assert_array_equal(kept.ids, made.ids)
    np.testing.assert_array_equal(kept.token_bytes, made.token_bytes)
    assert not token_stream(tokenizer, text[:-1], str(tmp_path))[1]  # another text
    other = text_tokenizer("sentencepiece", "Et la Parole était Dieu.\n".encode() * 90, 40, str(tmp_path))
    assert not token_stream(other, text, str(tmp_path))[1]  # another model
    for path in (tmp_path / "tokens").iterdir():
        path.write_bytes(path.read_bytes()[:100])  # cut short: tokenized again, and kept again
    assert not token_stream(tokenizer, text, str(tmp_path))[1] and token_stream(tokenizer, text, str(tmp_path))[1]
    assert not token_stream(CharTokenizer("ab"), text, str(tmp_path))[1]  # a tokenizer as fast as reading
    assert len(list((tmp_path / "tokens").iterdir())) == 3  # the two texts by the first model, one by the other


@pytest.mark.parametrize("bytes_at_once", [1 << 24, 3])  # 28 bytes of text in one part, or cut every 3 bytes
def test_the_character_stream_gives_each_character_its_id_and_its_utf8_bytes(monkeypatch, bytes_at_once):
    import mtbench.runner.data.text as text_module
    monkeypatch.setattr(text_module, "BYTES_AT_ONCE", bytes_at_once)
    text = "héllo ✓ 😀 \U0010ffff wörld\n"
    stream = CharTokenizer("hélo ").stream(text.encode("utf-8"))
    tokenizer = CharTokenizer("hélo ")
    np.testing.assert_array_equal(stream.ids, [tokenizer.index.get(c, 0) for c in text])
    np.testing.assert_array_equal(stream.token_bytes, [1, 2, 1, 1, 1, 1, 3, 1, 4, 1, 4, 1, 1, 2, 1, 1, 1, 1])
    assert stream.unknown == 8  # ✓, 😀, U+10FFFF, w, ö, r, d and the line break
    assert CharTokenizer("").stream(b"ab").unknown == 2 and len(CharTokenizer("a").stream(b"")) == 0
    with pytest.raises(MtbenchError, match="not UTF-8 at byte 26"):  # where in the split, whichever part it is in
        tokenizer.stream(text.encode("utf-8")[:-2] + b"\xff\n")


def test_a_sentencepiece_stream_is_made_a_batch_of_lines_at_a_time(tmp_path, monkeypatch):
    """A sentencepiece stream holds its tokens (ids and bytes in their narrow types) and one batch's work beyond
    them, whatever the length of the text: the whole text decoded, its lines listed and every token's int64 place
    took 24 bytes a byte of a 7 MB text. A line that is not UTF-8 is named by its byte in the split, whichever batch
    it is in."""
    import tracemalloc

    import mtbench.runner.data.text as text_module
    tokenizer = text_tokenizer("sentencepiece", TEXT * 3, 60, str(tmp_path))

    def beyond_the_tokens(text):
        tracemalloc.start()
        try:
            stream = tokenizer.stream(text)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        held = stream.ids.nbytes + stream.token_bytes.nbytes
        assert stream.token_bytes.sum() == len(text) and held <= 2 * len(stream)
        return held, peak - held

    (shorter, beyond_shorter), (longer, beyond_longer) = (beyond_the_tokens(TEXT * n) for n in (2000, 4000))
    # Twice the text (3.5 MB, then 7): what the stream needs beyond its tokens grows by less than they do (the
    # batches' pieces as they are joined), not by 20 bytes a byte of text.
    assert beyond_longer - beyond_shorter < longer - shorter, (beyond_shorter, beyond_longer, shorter, longer)
    monkeypatch.setattr(text_module, "LINES_AT_ONCE", 100)
    broken = TEXT + b"fin\n\xff\n"
    with pytest.raises(MtbenchError, match=f"not UTF-8 at byte {len(TEXT) + 4}"):
        tokenizer.stream(broken)


def test_a_byte_stream_and_its_evaluation_hold_next_to_nothing_beyond_the_text():
    """enwik9 at the byte level is a billion tokens: a byte stream is a view of the text, and evaluation sums the
    bytes of a prefix about its budget, not of the split (int32 ids, float64 sizes and their sum took 20 bytes a
    byte of text)."""
    import tracemalloc
    text = TEXT * 4000  # 7 MB
    tracemalloc.start()
    try:
        stream = ByteTokenizer().stream(text)
        batches = list(evaluation_batches(stream, rows=4, block=64, text_bytes=1000))
        text_bytes = evaluated_bytes(stream, 1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100_000, peak
    assert len(stream) == len(text) and sum(b.target_tokens for b in batches) == 1000 and text_bytes == 1000
    assert stream.token_bytes.sum() == len(text)


def test_a_sentencepiece_model_keeps_the_text_as_it_is_and_counts_what_it_has_no_piece_for(tmp_path):
    """Bits per byte divides by the text's own bytes: the pieces must stand for the text itself, not for NFKC's
    folding of it ('ﬁ' into 'fi', runs of spaces into one), and a character the model has no piece for is <unk>,
    counted as the character tokenizer counts its own."""
    text = "la ﬁn  du   jour\nun ﬁl d'or\n".encode("utf-8")
    tokenizer = text_tokenizer("sentencepiece", text * 20, 40, str(tmp_path))
    stream = tokenizer.stream(text)
    assert stream.unknown == 0 and tokenizer.decode_text(stream.ids) == text.decode("utf-8")
    unseen = tokenizer.stream("la ☃ ﬁn ☃\n".encode("utf-8"))
    assert unseen.unknown == 2 and unseen.token_bytes.sum() == len("la ☃ ﬁn ☃\n".encode("utf-8"))


def prepared_text(data, tokenizer, tmp_path, vocab_size=None, sample_prompt=None, name="book"):
    from types import SimpleNamespace
    from mtbench.runner.data.text import Text
    from mtbench.runner.tasks.language_modelling import LanguageModellingTask
    config = SimpleNamespace(tokenizer=tokenizer, vocab_size=vocab_size, cache_dir=str(tmp_path), max_len=8,
                             model=SimpleNamespace(byte_vocab_size=256), sample_prompt=sample_prompt)
    text = data if isinstance(data, Text) else Text(name, "test", data)
    return LanguageModellingTask().prepare(config, text, None)


def test_a_sentencepiece_vocabulary_short_of_the_size_asked_is_said_on_the_console_and_warned_in_the_result(
        tmp_path):
    """sentencepiece learns what a small text holds (hard_vocab_limit off): --vocab-size 5000 on this text gave the
    model fewer rows while config.vocab_size said 5000, and nothing said so."""
    import sentencepiece as spm
    from mtbench.figures import run_warnings
    prepared = prepared_text(TEXT * 3, "sentencepiece", tmp_path, vocab_size=5000)
    learned = spm.SentencePieceProcessor(model_file=prepared.record["tokenizer"]["file"]).get_piece_size()
    assert learned < 5000 and prepared.tokenizer.vocab_size == learned
    expected = f"vocabulary {learned:,} pieces where --vocab-size asked 5,000: the training text holds no more"
    assert f"  warning: {expected}" in prepared.lines
    assert prepared.record["vocab_size_asked"] == 5000
    result = {"timing": {}, "env": {}, "data": prepared.record}  # what run_warnings reads of a result's data
    assert expected in run_warnings(result)
    enough = prepared_text(TEXT * 3, "sentencepiece", tmp_path, vocab_size=learned - 2)
    assert enough.tokenizer.vocab_size == learned - 2 and not any("--vocab-size asked" in line for line in enough.lines)
    assert not any("--vocab-size" in warning for warning in run_warnings({**result, "data": enough.record}))
    assert "vocab_size_asked" not in prepared_text(TEXT, "char", tmp_path).record  # no size is asked of it


def test_a_folder_is_read_case_blind_in_name_order_and_says_how_many_files_and_what_it_left_out(tmp_path):
    """A folder's upper-case .TXT files and its subfolders were left out without a word, and the origin said
    '1 .txt files'."""
    from mtbench.runner.data.text import read_text_path
    folder = tmp_path / "f2"
    (folder / "sub").mkdir(parents=True)
    (folder / "b-two.TXT").write_bytes(b"Second part.\n" * 20)
    (folder / "a-one.txt").write_bytes(b"First part.\n" * 20)
    (folder / "sub" / "c-three.txt").write_bytes(b"Not read.\n")
    (folder / "notes.md").write_bytes(b"Not read either.\n")
    text = read_text_path(str(folder))
    assert text.data == b"First part.\n" * 20 + b"Second part.\n" * 20 and text.files == 2
    assert text.origin == f"2 .txt files of {folder}, concatenated in name order"
    assert text.left_out == ("notes.md", "sub/")
    line = text.folder_line()
    assert line.startswith(f"2 .txt files of {folder}, concatenated in name order; left out: notes.md, sub/ (")
    assert f"  {line}" in prepared_text(text, "byte", tmp_path).lines  # on the console, under the text's line
    (folder / "b-two.TXT").unlink()
    alone = read_text_path(str(folder))
    assert alone.origin == f"1 .txt file of {folder}, concatenated in name order"
    (folder / "a-one.txt").unlink()
    with pytest.raises(MtbenchError) as refused:
        read_text_path(str(folder))
    assert str(refused.value).startswith(f"{folder}: the folder holds no .txt file (left out: notes.md, sub/ (")
    single = tmp_path / "book.txt"
    single.write_bytes(b"One file.\n")
    assert read_text_path(str(single)).folder_line() is None  # a file names itself: nothing was left out


def test_a_sample_prompt_of_characters_the_tokenizer_lacks_is_warned_of_as_generate_warns(tmp_path):
    """`generate` said how many of its prompt's tokens were <unk>; train --sample-prompt said nothing, and every
    sample continued a prompt the model could not read."""
    english = ("In the beginning God created the heaven and the earth. " * 40).encode()
    prompt = "日本 Café"
    unknown = sum(character not in english.decode() for character in prompt)  # 日, 本, C and é
    prepared = prepared_text(english, "char", tmp_path, sample_prompt=prompt)
    assert (f"  warning: {unknown} of --sample-prompt's {len(prompt)} tokens are unknown to the model's tokenizer "
            f"(read as <unk>): the model continues a text it cannot read") in prepared.lines
    read = prepared_text(english, "char", tmp_path, sample_prompt="the earth")
    assert not any("--sample-prompt" in line for line in read.lines)


def test_the_count_of_characters_not_in_the_vocabulary_reads_as_one_or_many(tmp_path):
    """'1 characters of the text are not in ...'."""
    one = prepared_text(("In the beginning was the Word. " * 40 + "€").encode(), "char", tmp_path)
    assert "  1 character of the text is not in the training split's vocabulary (<unk>)" in one.lines
    two = prepared_text(("In the beginning was the Word. " * 40 + "€€").encode(), "char", tmp_path)
    assert "  2 characters of the text are not in the training split's vocabulary (<unk>)" in two.lines


def test_the_char_preset_reads_a_text_by_its_characters_unless_told_otherwise(tmp_path):
    """`--preset char` is nanoGPT's shakespeare_char model: on a text it trained bytes unless --tokenizer char was
    given too. Its characters are the default now, recorded in the configuration as what ran; --tokenizer still
    chooses, token files keep their ids, and the other presets read bytes."""
    from mtbench.plugins import manager
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import resolve_model, resolve_task
    registry = manager.registry()
    (tmp_path / "input.txt").write_bytes(TEXT)
    folder = tmp_path / "ids"
    folder.mkdir()
    for name in ("train.bin", "val.bin"):
        np.arange(200, dtype=np.uint16).tofile(folder / name)

    def prepared(data_file, **options):
        config = TrainConfig(model_name="gpt", data_file=str(data_file), block_size=8, cache_dir=str(tmp_path),
                             **options)
        task = resolve_task(resolve_model(config, registry)[0], config, registry)
        return config, task.prepare(config, task.read(config, registry, None), None)
    config, data = prepared(tmp_path / "input.txt", preset="char")
    assert config.tokenizer == config.to_dict()["tokenizer"] == "char" == data.record["tokenizer"]["type"]
    config, data = prepared(tmp_path / "input.txt", preset="char", tokenizer="byte")
    assert config.tokenizer == "byte" == data.record["tokenizer"]["type"]
    config, data = prepared(folder, preset="char")
    assert config.tokenizer is None and data.record["tokenizer"]["type"] == "token-ids"
    config, data = prepared(tmp_path / "input.txt", preset="tiny")
    assert config.tokenizer is None and data.record["tokenizer"]["type"] == "byte"
    # A result of an earlier mtbench, whose char preset read the text's bytes, is read (rerun, resumed) as it ran.
    recorded = prepared(tmp_path / "input.txt", preset="char")[0].to_dict()
    assert TrainConfig.from_dict(recorded).tokenizer == "char"
    assert TrainConfig.from_dict({**recorded, "tokenizer": None}).tokenizer == "byte"
    assert TrainConfig.from_dict({**recorded, "tokenizer": None, "data_file": str(folder)}).tokenizer is None
