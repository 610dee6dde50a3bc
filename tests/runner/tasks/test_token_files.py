"""nanoGPT's token files (`train.bin`, `val.bin`: uint16 ids, as its prepare.py writes them) as a language model's
data: read from disk as batches need them, split as nanoGPT splits them, scored per token."""

import collections
import json
import math
import os
import pickle

import numpy as np
import pytest

from conftest import assert_refused_in_one_line, run_cli
from result_keys import undocumented_keys
from mtbench.errors import MtbenchError
from mtbench.runner.data.text import TokenStream, evaluated_bytes, evaluated_tokens
from mtbench.runner.config import TrainConfig
from mtbench.runner.data import token_files
from mtbench.runner.data.token_files import (id_counts, is_token_folder, largest_id, read_characters,
                                            read_token_files, vocabulary_size)
from mtbench.runner.results.schema import schema_errors
from mtbench.runner.tasks.language_modelling import prepare_token_files
from tests.runner.tasks.test_language_model_cli import TINY_GPT, bible_verses


def token_folder(folder, train_ids, val_ids, others=(), meta=None):
    folder.mkdir(exist_ok=True)
    np.asarray(train_ids, np.uint16).tofile(folder / "train.bin")
    np.asarray(val_ids, np.uint16).tofile(folder / "val.bin")
    for name in others:
        (folder / name).write_text("not read\n")
    if meta is not None:
        with open(folder / "meta.pkl", "wb") as f:
            pickle.dump(meta, f)
    return folder


def shakespeare_char_prepare(text, folder):
    """What nanoGPT's data/shakespeare_char/prepare.py writes for `text`, but with id 0 a character the text lacks
    (as mtbench's character tokenizer keeps id 0 for <unk>): the first 90 % of the characters train."""
    characters = ["\0", *sorted(set(text))]
    stoi = {c: i for i, c in enumerate(characters)}
    ids = [stoi[c] for c in text]
    cut = int(len(ids) * 0.9)
    meta = {"vocab_size": len(characters), "itos": dict(enumerate(characters)), "stoi": stoi}
    return token_folder(folder, ids[:cut], ids[cut:], meta=meta), characters


def test_the_files_are_read_by_the_ranges_batches_take_and_their_ids_size_the_vocabulary(tmp_path):
    written = np.random.default_rng(0).integers(0, 50257, 3000)
    folder = token_folder(tmp_path / "owt", written, [1, 2, 3, 4], others=["input.txt", "prepare.py"])
    assert is_token_folder(str(folder)) and not is_token_folder(str(tmp_path))
    (folder / "val.bin").rename(tmp_path / "val.bin")
    assert is_token_folder(str(folder))  # one file alone is read as one of them, and refused
    with pytest.raises(MtbenchError, match="val.bin: no such file; nanoGPT's token files are train.bin and val.bin "
                                           "together"):
        read_token_files(str(folder))
    (tmp_path / "val.bin").rename(folder / "val.bin")
    files = read_token_files(str(folder))
    assert "input.txt, prepare.py not read" in files.origin and files.characters is None
    assert list(np.asarray(files.val)) == [1, 2, 3, 4] and len(files.train) == 3000
    # A range of a range is read from its place in the file, into a batch's rows as nanoGPT's get_batch takes them.
    part = files.train[1000:2000]
    assert len(part) == 1000 and len(part[990:5000]) == 10
    rows = np.zeros((2, 8), np.int32)
    for row, start in enumerate((3, 990)):
        rows[row, :min(8, len(part) - start)] = part[start:start + 8]
    assert rows.tolist() == [written[1003:1011].tolist(), [*written[1990:2000].tolist()[:8]]]
    counts = id_counts(files.train, chunk=7)
    assert len(counts) == written.max() + 1 and (counts == np.bincount(written)).all()
    assert largest_id(files.train, chunk=7) == written.max() and largest_id(part) == written[1000:2000].max()
    # GPT-2's ids (up to 50,256) make nanoGPT's padded 50,304 rows; a char model's 65 make 128.
    assert vocabulary_size(50256, None) == 50304 and vocabulary_size(64, None) == 128
    assert vocabulary_size(64, 65) == 65  # --vocab-size, as nanoGPT's meta.pkl gives shakespeare_char's
    with pytest.raises(MtbenchError, match="--vocab-size 64 is too small for the token files: they hold id 64"):
        vocabulary_size(64, 64)


def test_character_files_padded_to_a_vocabulary_of_128_keep_their_bytes(tmp_path):
    """nanoGPT pads a character model's vocabulary to a multiple of 64 (--vocab-size 128 for shakespeare_char's
    65): the ids past meta.pkl's characters stand for no text, and each split's bytes are still its text's (it was
    refused: the tokenizer's bytes_per_id() covered 65 of its 128 ids)."""
    text = "Et Dieu dit : Que la lumière soit ! Et la lumière fut. " * 40
    folder, characters = shakespeare_char_prepare(text, tmp_path / "chars")
    config = TrainConfig(model_name="gpt", preset="tiny", vocab_size=128, max_len=16, data_file=str(folder),
                         cache_dir=str(tmp_path / "cache"))
    data = prepare_token_files(read_token_files(str(folder)), config)
    assert data.tokenizer.vocab_size == 128 and len(characters) < 64
    # The preset's own size, given, is the vocabulary too (it was taken as not given: meta.pkl's characters').
    given = TrainConfig(model_name="gpt", preset="tiny", vocab_size=2000, max_len=16, data_file=str(folder),
                        cache_dir=str(tmp_path / "cache"))
    assert given.preset_model.vocab_size == 2000
    assert prepare_token_files(read_token_files(str(folder)), given).tokenizer.vocab_size == 2000
    cut = int(len(text) * 0.9)
    held_out = text[cut:]
    half = len(held_out) // 2
    assert data.record["bytes"] == {"train": len(text[:cut].encode()), "valid": len(held_out[:half].encode()),
                                    "test": len(held_out[half:].encode())}
    assert data.record["bytes"]["valid"] > half  # è is two bytes


def test_the_largest_id_of_each_file_is_kept_for_the_next_run_until_the_file_changes(tmp_path, monkeypatch):
    val = [7, 50256, *range(3, 21)]  # two halves of 10 ids: a block of 8 and its next token each
    folder = token_folder(tmp_path / "owt", np.random.default_rng(0).integers(0, 50000, 5000), val)
    config = TrainConfig(model_name="gpt", preset="tiny", block_size=8, cache_dir=str(tmp_path / "cache"))
    first = prepare_token_files(read_token_files(str(folder)), config)
    assert first.record["largest_id"] == 50256 and first.tokenizer.vocab_size == 50304
    assert not any("read from" in line for line in first.lines)
    # The next run reads each file's largest id back, not the file.
    monkeypatch.setattr(token_files, "largest_id", lambda ids, chunk=0: pytest.fail(f"{ids.path} was read again"))
    again = prepare_token_files(read_token_files(str(folder)), config)
    assert again.record == first.record and again.fingerprint == first.fingerprint
    assert f"  largest id of train.bin and val.bin read from {tmp_path / 'cache' / 'token-files'}" in again.lines
    monkeypatch.undo()
    # val.bin written again, the same size with another largest id, an hour later: read again, train.bin not.
    before = os.stat(folder / "val.bin")
    np.asarray([7, 60000, *val[2:]], np.uint16).tofile(folder / "val.bin")
    os.utime(folder / "val.bin", ns=(before.st_atime_ns, before.st_mtime_ns + 3600 * 10 ** 9))
    changed = prepare_token_files(read_token_files(str(folder)), config)
    assert changed.record["largest_id"] == 60000 and changed.tokenizer.vocab_size == 60032
    assert f"  largest id of train.bin read from {tmp_path / 'cache' / 'token-files'}" in changed.lines


def test_a_file_cut_short_after_the_run_started_is_named_not_read_as_zeros(tmp_path):
    files = read_token_files(str(token_folder(tmp_path / "data", np.arange(1000), np.arange(10))))
    with open(tmp_path / "data" / "train.bin", "r+b") as f:
        f.truncate(1200)
    assert list(np.asarray(files.train[590:600])) == list(range(590, 600))
    with pytest.raises(MtbenchError, match="train.bin: ended at byte 1,200, before the ids it held as the run started"):
        np.asarray(files.train[595:605])


def test_evaluation_of_ids_without_bytes_counts_its_budget_in_tokens():
    stream = TokenStream(np.arange(1000, dtype=np.uint16), None)
    assert evaluated_tokens(stream, 320) == 320 and evaluated_bytes(stream, 320) is None
    assert evaluated_tokens(stream, 5000) == 999  # token 0 is only read


@pytest.mark.slow
def test_a_split_of_ids_that_stand_for_no_byte_has_no_bits_per_byte(tmp_path, cache_dir):
    """meta.pkl may give an id the empty string: a split of it alone holds no byte to divide by (it ended the run
    with a ZeroDivisionError after training)."""
    folder = token_folder(tmp_path / "data", np.arange(5000) % 3, np.zeros(400),
                          meta={"vocab_size": 3, "itos": {0: "", 1: "a", 2: "b"}, "stoi": {"": 0, "a": 1, "b": 2}})
    # torch's eager step: a JAX run would compile its programs for a vocabulary of 3, which no other test trains.
    proc = run_cli("train", "--backend", "torch", "--step", "eager", *TINY_GPT, "--data", str(folder), "--steps", "4",
                   "--valid-size", "2", "--test-size", "2", "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "r.json").read_text())["metrics"]
    for split in ("val", "test"):
        assert metrics[f"{split}_bytes_evaluated"] == 0 and metrics[f"{split}_tokens_evaluated"] > 0
        assert metrics[f"{split}_bits_per_byte"] is None and math.isfinite(metrics[f"{split}_loss"])


@pytest.mark.parametrize("train_bytes, args, message", [
    (b"\x01\x00\x02", [], "train.bin: 3 bytes, not a whole number of uint16 token ids (nanoGPT's prepare.py writes "
                          "uint16)"),
    (b"", [], "train.bin: the file holds no token"),
    (np.arange(100, dtype=np.uint16).tobytes(), ["--tokenizer", "byte"],
     "holds token files (train.bin, val.bin), which carry no tokenizer: --tokenizer does not apply"),
    (np.arange(100, dtype=np.uint16).tobytes(), ["--sample-prompt", "And", "--eval-every", "1"],
     "which carry no tokenizer: --sample-prompt does not apply"),
    (np.arange(100, dtype=np.uint16).tobytes(), ["--block-size", "64"],
     "the valid split has 50 tokens, fewer than one block of --block-size 64 and its next token (65)"),
])
def test_token_files_it_cannot_train_on_are_refused_in_one_line(tmp_path, cache_dir, train_bytes, args, message):
    folder = token_folder(tmp_path / "data", [], np.arange(100))
    (folder / "train.bin").write_bytes(train_bytes)
    proc = run_cli("train", "--model", "gpt", "--preset", "tiny", "--data", str(folder), "--steps", "2", *args,
                   "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"))
    assert_refused_in_one_line(proc, message)
    assert not (tmp_path / "r.json").exists()


def test_a_token_file_named_alone_is_refused_not_read_as_text(tmp_path, cache_dir):
    """train.bin given as --data was read as a text of bytes, two a token id, and trained on."""
    folder = token_folder(tmp_path / "data", np.arange(100), np.arange(100))
    proc = run_cli("train", "--model", "gpt", "--preset", "tiny", "--data", str(folder / "train.bin"), "--steps", "2",
                   "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"))
    assert_refused_in_one_line(proc, f"{folder / 'train.bin'}: one of nanoGPT's token files; --data takes the folder "
                                     f"that holds train.bin and val.bin")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow  # two training processes, 15-35 s each
def test_a_texts_bytes_as_token_files_train_and_score_as_the_byte_model_of_that_text(tmp_path, cache_dir):
    text = ("\n".join(bible_verses(3000)) + "\n").encode("utf-8")
    (tmp_path / "bible.txt").write_bytes(text)
    common = [*TINY_GPT, "--steps", "12", "--eval-every", "6", "--cache-dir", cache_dir]
    proc = run_cli("train", "--backend", "jax", *common, "--data", str(tmp_path / "bible.txt"),
                   "--out", str(tmp_path / "bytes.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_bytes = json.loads((tmp_path / "bytes.json").read_text())
    # The same bytes as nanoGPT's files: the byte run's training split, then its validation and test splits, of
    # equal length, which val.bin's two halves are.
    (train_start, train_end), (valid_start, valid_end), (test_start, test_end) = (
        by_bytes["data"]["byte_ranges"][split] for split in ("train", "valid", "test"))
    assert valid_end - valid_start == test_end - test_start and valid_end == test_start
    folder = token_folder(tmp_path / "bible", np.frombuffer(text[train_start:train_end], np.uint8),
                          np.frombuffer(text[valid_start:test_end], np.uint8))
    proc = run_cli("train", "--backend", "jax", *common, "--data", str(folder), "--vocab-size", "256",
                   "--out", str(tmp_path / "ids.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_ids = json.loads((tmp_path / "ids.json").read_text())
    assert schema_errors(by_ids) == [] and undocumented_keys(by_ids) == []
    assert "token files bible: train.bin" in proc.stdout and "no bits per byte" in proc.stdout
    assert by_ids["data"]["tokenizer"]["type"] == "token-ids" and by_ids["data"]["largest_id"] < 128
    assert by_ids["data"]["tokens"] == by_bytes["data"]["tokens"]
    # The same batches of the same ids through the same weights.
    assert [h["loss"] for h in by_ids["history"]] == pytest.approx([h["loss"] for h in by_bytes["history"]],
                                                                   rel=1e-6)
    for split in ("val", "test"):
        ids, text_bytes = by_ids["metrics"], by_bytes["metrics"]
        assert ids[f"{split}_loss"] == pytest.approx(text_bytes[f"{split}_loss"], rel=1e-6)
        assert ids[f"{split}_tokens_evaluated"] == text_bytes[f"{split}_tokens_evaluated"] == 10 * 32
        assert ids[f"{split}_perplexity"] == pytest.approx(math.exp(ids[f"{split}_loss"]), rel=1e-6)
        # The files do not say which bytes a token stands for.
        assert ids[f"{split}_bits_per_byte"] is None and ids[f"{split}_bytes_evaluated"] is None
    # Scored on the folder's val.bin, its table has no bytes to show (it showed 0).
    proc = run_cli("evaluate", str(tmp_path / "ids.json"), "--test", str(folder), "--out", str(tmp_path / "e.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "e.json").read_text())["bytes_evaluated"] is None
    assert "n/a (the ids' bytes are not known)" in " ".join(proc.stdout.split()), proc.stdout
    # Its saved model has no text to continue from.
    proc = run_cli("generate", str(tmp_path / "ids.json"), "--prompt", "In the beginning")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == ["Error: the model was trained on token files, which carry no "
                                                "tokenizer: it takes no text prompt"]


def test_meta_pkl_gives_each_id_its_character_and_runs_no_code(tmp_path):
    folder, characters = shakespeare_char_prepare("To be, or not to be: été\n", tmp_path / "chars")
    assert read_characters(str(folder)) == characters == read_token_files(str(folder)).characters
    # A pickle naming a class (which unpickling would call) is not read.
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"itos": collections.OrderedDict(enumerate(characters))}, f)
    with pytest.raises(MtbenchError, match="meta.pkl: not read, as it is not a pickle of numbers, strings, lists and "
                                           "dicts alone \\(it names collections.OrderedDict\\)"):
        read_characters(str(folder))
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 3, "itos": {1: "a"}}, f)
    with pytest.raises(MtbenchError, match="not nanoGPT's meta.pkl, whose 'itos' gives every id from 0 its character"):
        read_characters(str(folder))


def test_a_meta_pkl_of_vocab_size_alone_sizes_the_vocabulary_of_ids_it_cannot_decode(tmp_path):
    """The token files of a tokenizer of one's own come with `{'vocab_size': N}` alone, which nanoGPT's train.py
    reads for its model (it was refused: 'not nanoGPT's meta.pkl'): the ids train with that vocabulary, and what
    needs their text (bits per byte, a prompt, a sample) says it has none, as for files without a meta.pkl."""
    folder = token_folder(tmp_path / "own", np.arange(3000) % 90, np.arange(400) % 90, meta={"vocab_size": 100})
    files = read_token_files(str(folder))
    assert files.characters is None and files.vocab_size == 100 and "meta.pkl" in files.origin
    config = TrainConfig(model_name="gpt", preset="tiny", block_size=8, data_file=str(folder),
                         cache_dir=str(tmp_path / "cache"))
    data = prepare_token_files(files, config)
    assert data.tokenizer.vocab_size == 100 and data.record["bytes"] is None  # not the 128 its ids round up to
    assert "vocabulary 100 (meta.pkl's vocab_size); no bytes per token, so no bits per byte" in data.lines[0]
    with pytest.raises(MtbenchError, match="carry no tokenizer: it takes no text prompt"):
        data.tokenizer.encode_text("And")
    given = TrainConfig(model_name="gpt", preset="tiny", block_size=8, data_file=str(folder), vocab_size=128,
                        cache_dir=str(tmp_path / "cache"))
    assert prepare_token_files(files, given).tokenizer.vocab_size == 128  # --vocab-size pads it, as nanoGPT's 50304
    stream, total_bytes = token_files.held_out_ids(str(folder), data.tokenizer, "the model")  # `evaluate`'s
    assert len(stream) == 400 and stream.token_bytes is None and total_bytes is None
    prompted = TrainConfig(model_name="gpt", preset="tiny", block_size=8, data_file=str(folder),
                           sample_prompt="And", eval_every=1, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(MtbenchError, match="--sample-prompt does not apply: its meta.pkl gives their vocabulary size, "
                                           "not each id's text \\('itos'\\)"):
        prepare_token_files(files, prompted)
    past = token_folder(tmp_path / "past", np.arange(3000) % 120, np.arange(400) % 90, meta={"vocab_size": 100})
    with pytest.raises(MtbenchError, match="the token files hold id 119, past the 100 ids of meta.pkl's vocab_size"):
        prepare_token_files(read_token_files(str(past)), given)
    for meta in ({"stoi": {}}, {"vocab_size": 0}, {"vocab_size": "100"}, [100]):
        token_folder(folder, np.arange(3000) % 90, np.arange(400) % 90, meta=meta)
        with pytest.raises(MtbenchError, match="not nanoGPT's meta.pkl, whose 'vocab_size' gives the number of ids "
                                               "\\(and 'itos' each one's character\\)"):
            read_token_files(str(folder))


def split_alike(lines, held_out_lines):
    """(training text, held-out text) of `lines`: nanoGPT's split is 90/10 of its tokens, mtbench's of a text 90/5/5
    of the bytes, so a text whose held-out twentieths are one passage (the last `held_out_lines` lines) twice splits
    alike both ways; its training part is padded with line breaks to 18 of them."""
    held_out = "".join(line + "\n" for line in lines[-held_out_lines:])
    twentieth = len(held_out.encode("utf-8"))
    train_text = ""
    for line in lines[:-held_out_lines]:
        if len((train_text + line + "\n").encode("utf-8")) > 18 * twentieth:
            break
        train_text += line + "\n"
    return train_text + "\n" * (18 * twentieth - len(train_text.encode("utf-8"))), held_out


@pytest.mark.slow  # two training processes, 15-35 s each
def test_shakespeare_char_files_with_their_meta_train_as_the_character_model_of_that_text(tmp_path, cache_dir):
    """French verses (é, à: two bytes each) as nanoGPT's prepare.py for shakespeare_char leaves them: the same
    run, loss for loss and in bits per byte, as `--tokenizer char` on the text, and it samples text."""
    from mtbench.plugins.datasets.bible_dataset import BibleDataset
    verses = [target for _, (_, target) in zip(range(3000), BibleDataset("en", "fr").read_pairs(lambda *_: None))]
    train_text, held_out = split_alike(verses, 150)
    twentieth = len(held_out.encode("utf-8"))
    text = train_text + held_out + held_out
    (tmp_path / "verses.txt").write_text(text, encoding="utf-8")
    common = [*TINY_GPT, "--steps", "12", "--eval-every", "6", "--cache-dir", cache_dir]
    proc = run_cli("train", "--backend", "jax", *common, "--data", str(tmp_path / "verses.txt"), "--tokenizer",
                   "char", "--out", str(tmp_path / "chars.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_text = json.loads((tmp_path / "chars.json").read_text())
    assert by_text["data"]["byte_ranges"] == {"train": [0, 18 * twentieth], "valid": [18 * twentieth, 19 * twentieth],
                                              "test": [19 * twentieth, 20 * twentieth]}
    assert by_text["data"]["unknown_characters"] == {"train": 0, "valid": 0, "test": 0}
    folder, characters = shakespeare_char_prepare(text, tmp_path / "shakespeare_char")
    stoi = {c: i for i, c in enumerate(characters)}
    token_folder(folder, [stoi[c] for c in train_text], [stoi[c] for c in held_out + held_out])
    proc = run_cli("train", "--backend", "jax", *common, "--data", str(folder), "--sample-prompt", "Et Dieu",
                   "--out", str(tmp_path / "ids.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    by_ids = json.loads((tmp_path / "ids.json").read_text())
    assert schema_errors(by_ids) == [] and undocumented_keys(by_ids) == []
    assert by_ids["data"]["tokenizer"]["vocab_size"] == len(characters) == by_text["data"]["tokenizer"]["vocab_size"]
    assert by_ids["data"]["bytes"] == by_text["data"]["bytes"]
    assert [h["loss"] for h in by_ids["history"]] == pytest.approx([h["loss"] for h in by_text["history"]],
                                                                   rel=1e-6)
    for figure in ("loss", "bits_per_byte", "tokens_evaluated", "bytes_evaluated"):
        for split in ("val", "test"):
            assert by_ids["metrics"][f"{split}_{figure}"] == pytest.approx(by_text["metrics"][f"{split}_{figure}"],
                                                                           rel=1e-6), (split, figure)
    assert by_ids["metrics"]["val_bytes_evaluated"] > by_ids["metrics"]["val_tokens_evaluated"]  # é is two bytes
    samples = [evaluation["sample"] for evaluation in by_ids["target"]["evaluations"]]
    assert len(samples) == 2 and all(sample.startswith("Et Dieu") and len(sample) > len("Et Dieu")
                                     for sample in samples)
    # The saved model keeps the characters: it continues a prompt on the other backend.
    proc = run_cli("generate", str(tmp_path / "ids.json"), "--prompt", "Et Dieu", "--max-new-tokens", "20",
                   "--backend", "torch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("Et Dieu") and len(proc.stdout.rstrip("\n")) > len("Et Dieu")
    # ... and scores the folder's val.bin (the held-out passage twice) by its characters' bytes, the file named as its
    # folder would be (the file was read as a text of bytes; the byte test above names the folder itself); its
    # train.bin is refused, and a text it cannot score.
    proc = run_cli("evaluate", str(tmp_path / "ids.json"), "--test", str(folder / "val.bin"), "--out",
                   str(tmp_path / "e.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = json.loads((tmp_path / "e.json").read_text())
    assert scores["bytes"] == 2 * twentieth and scores["tokens_evaluated"] == 2 * len(held_out) - 1
    assert_refused_in_one_line(run_cli("evaluate", str(tmp_path / "ids.json"), "--test", str(folder / "train.bin")),
                               f"{folder / 'train.bin'}: one of nanoGPT's token files; a model is scored on the "
                               f"val.bin of their folder: give the folder or its val.bin")
    assert scores["bits_per_byte"] == pytest.approx(
        scores["loss"] * scores["tokens_evaluated"] / math.log(2) / scores["bytes_evaluated"], rel=1e-6)
    refused = run_cli("evaluate", str(tmp_path / "ids.json"), "--test", str(tmp_path / "verses.txt"))
    assert_refused_in_one_line(refused, "trained on token files, whose ids no tokenizer here makes from text; it "
                                        "scores the val.bin of a folder of token files, not a text")
