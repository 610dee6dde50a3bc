"""Corpus reading, cleaning, splitting and batching, on the real built-in corpus where it matters."""

import itertools
import json
import os
import subprocess
import sqlite3
import sys

import numpy as np
import pytest

from conftest import MACHINE_CPUS
from mtbench.errors import MtbenchError
from mtbench.plugins.datasets.bible_dataset import BibleDataset, clean_verse
from mtbench.runner.config import TrainConfig
from mtbench.runner.data.batches import (batches_per_epoch, bucket_lengths, encode_split, evaluation_batches,
                                         training_batches, untrained_examples)
from mtbench.runner.data.corpus import check_file_options, load_dataset_pairs, split_corpus
from mtbench.runner.data.formats import read_tsv
from mtbench.runner.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, load_or_train_tokenizer


@pytest.fixture(scope="module")
def bible_pairs(cache_dir):
    return load_dataset_pairs(BibleDataset("en", "fr"), cache_dir, progress=lambda done, total: None)


def test_bible_corpus_is_aligned_by_verse(bible_pairs):
    assert len(bible_pairs) == 31102
    assert bible_pairs[0] == ("In the beginning God created the heavens and the earth.",
                              "Au commencement, Dieu créa les cieux et la terre.")
    assert all(s and t for s, t in bible_pairs)


def test_bible_cleaning_removes_markup(bible_pairs):
    assert not any("`" in s or "[" in s for s, _ in bible_pairs)
    assert not any(t.startswith("(") and ":" in t[:8] for _, t in bible_pairs)
    assert clean_verse("(7:26) L'Éternel  dit") == "L'Éternel dit"
    assert clean_verse("God`s [even] first -[fruits]") == "God's even first -fruits"


def test_read_tsv_keeps_every_pair(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("a b\tc d\r\nsecond\tzweite\n")
    assert read_tsv(str(path)) == [("a b", "c d"), ("second", "zweite")]


def test_read_tsv_names_the_bad_line(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("a\tb\nc\td\te\n")
    with pytest.raises(MtbenchError, match=r"pairs.tsv:2: expected 2 tab-separated columns .* found 3"):
        read_tsv(str(path))


def test_split_is_deterministic_disjoint_and_independent_of_order_of_calls(bible_pairs):
    first = split_corpus(bible_pairs[:3000], 100, 200, "x", "y")
    second = split_corpus(bible_pairs[:3000], 100, 200, "x", "y")
    assert first.test == second.test and first.valid == second.valid
    assert len(first.test) == 200 and len(first.valid) == 100
    assert not set(first.test) & set(first.train) and not set(first.valid) & set(first.train)


def test_split_removes_duplicates_before_splitting():
    pairs = [("same", "pareil")] * 50 + [(f"s{i}", f"t{i}") for i in range(20)]
    corpus = split_corpus(pairs, 2, 2, "x", "y")
    assert sum(corpus.sizes().values()) == 21


@pytest.fixture(scope="module")
def encoded(bible_pairs, cache_dir):
    train = bible_pairs[:2000]
    tokenizer = load_or_train_tokenizer(train, 500, cache_dir)
    return tokenizer, encode_split(train, tokenizer, 48)


def test_tokenizer_round_trips_and_is_cached(bible_pairs, cache_dir, encoded):
    tokenizer, _ = encoded
    again = load_or_train_tokenizer(bible_pairs[:2000], 500, cache_dir)
    assert again.path == tokenizer.path
    sentence = bible_pairs[5][1]
    assert tokenizer.decode(tokenizer.encode([sentence])) == [sentence]
    assert tokenizer.vocab_size == 500


@pytest.mark.skipif(not MACHINE_CPUS or len(MACHINE_CPUS) < 2, reason="needs a machine with 2 CPUs or more")
def test_the_tokenizer_is_the_same_on_a_machine_of_any_size(bible_pairs, tmp_path):
    """sentencepiece's model depends on the threads it trains on: trained on as many as the machine's cores, two
    machines made two tokenizers of one corpus (and other batches from one seed). Here in processes that may run
    on one CPU and on all of the machine's (not only this worker's share of them)."""
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps(bible_pairs[:2000]))
    program = ("import json, os, sys\nfrom mtbench.runner.data.tokenizer import load_or_train_tokenizer\n"
               "os.sched_setaffinity(0, json.loads(sys.argv[1]))\n"
               # the machine's size as either count would tell it: os.cpu_count ignores the affinity
               "os.cpu_count = lambda: len(os.sched_getaffinity(0))\n"
               "pairs = [tuple(pair) for pair in json.load(open(sys.argv[2]))]\n"
               "print(load_or_train_tokenizer(pairs, 500, sys.argv[3]).path)\n")
    models = []
    for taken in (MACHINE_CPUS[:1], MACHINE_CPUS):
        proc = subprocess.run([sys.executable, "-c", program, json.dumps(taken), str(pairs),
                               str(tmp_path / f"cpus-{len(taken)}")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        with open(proc.stdout.strip().splitlines()[-1], "rb") as f:
            models.append(f.read())
    assert models[0] == models[1]


def test_length_filter_and_special_tokens(encoded):
    _, split = encoded
    assert split.dropped_too_long > 0
    assert all(len(s) <= 48 and s[-1] == EOS_ID for s in split.sources)
    assert all(len(t) + 1 <= 48 for t in split.targets)


def test_training_batches_use_fixed_shapes_and_mask_padding(encoded):
    _, split = encoded
    batches = training_batches(split, 16, 48, seed=3)
    seen_shapes = set()
    for _ in range(40):
        _, batch = next(batches)
        seen_shapes.add(batch.shape)
        assert batch.shape[0] == 16 and batch.shape[1] in bucket_lengths(48)
        assert (batch.target_input[:, 0] == BOS_ID).all()
        assert ((batch.target_output != PAD_ID) == (batch.weight > 0)).all()
        shifted = batch.target_input[:, 1:] != PAD_ID  # teacher forcing: input j+1 is output j
        np.testing.assert_array_equal(batch.target_input[:, 1:][shifted], batch.target_output[:, :-1][shifted])
        lengths = batch.weight.sum(axis=1).astype(int)
        assert (batch.target_output[np.arange(16), lengths - 1] == EOS_ID).all()
    assert len(seen_shapes) <= len(bucket_lengths(48))


def test_token_batching_fills_each_bucket_up_to_max_tokens(encoded, tmp_path):
    _, split = encoded
    config = TrainConfig(max_tokens=700, max_len=48, out=str(tmp_path / "r.json"))
    # 700 tokens: 43 rows of 16 (rounded down to 40), 21 of 32 (16), 14 of 48 (8).
    assert [config.rows_for(length) for length in bucket_lengths(48)] == [40, 16, 8]
    counts = {}
    epoch_batches = batches_per_epoch(split, config.rows_for, 48)
    for epoch, batch in itertools.islice(training_batches(split, config.rows_for, 48, seed=3), epoch_batches):
        rows, length = batch.shape
        assert epoch == 0 and rows * length <= 700 and rows == config.rows_for(length)
        assert (batch.index >= 0).all(), "training batches are full: no filler rows"
        counts[length] = counts.get(length, 0) + 1
    assert len(counts) >= 2, "several buckets, each with its own number of rows"
    assert TrainConfig(max_len=48, out=str(tmp_path / "r.json")).rows_for(16) == 64  # --batch-size otherwise
    with pytest.raises(MtbenchError, match="cannot hold one row"):
        TrainConfig(max_tokens=40, max_len=48, out=str(tmp_path / "r.json"))


def split_of_lengths(lengths):
    """Pairs whose source and target are `lengths` tokens each (the target's EOS one more)."""
    from mtbench.runner.data.batches import EncodedSplit
    from mtbench.runner.data.tokenizer import JOINT_SPECIAL
    return EncodedSplit(sources=[[5] * n for n in lengths], targets=[[6] * n for n in lengths],
                        pair_index=list(range(len(lengths))), dropped_too_long=0, special=JOINT_SPECIAL)


def test_a_bucket_short_of_a_batch_passes_its_pairs_to_the_next_longer_one_where_they_train():
    # Batches of 4 rows: the 16-token bucket holds 3 pairs, the 32-token one 6 (with them 9: two batches), the
    # 48-token one 2, which nothing longer takes: they never train, and are counted.
    split = split_of_lengths([10] * 3 + [25] * 6 + [40] * 2)
    assert batches_per_epoch(split, 4, 48) == 2
    assert untrained_examples(split, 4, 48) == 2
    ten_epochs = [batch for _, batch in itertools.islice(training_batches(split, 4, 48, seed=3), 20)]
    assert {batch.shape for batch in ten_epochs} == {(4, 32)}
    # Every short pair trains, padded to 32 (each epoch one of the 9 waits for the next); the longest never.
    assert {int(i) for batch in ten_epochs for i in batch.index} == set(range(9))
    assert untrained_examples(split, 2, 48) == 0 and batches_per_epoch(split, 2, 48) == 5  # each bucket full


def test_same_seed_same_batches(encoded):
    _, split = encoded
    a, b, c = (training_batches(split, 16, 48, seed=s) for s in (7, 7, 8))
    first_a, first_b, first_c = (next(g)[1] for g in (a, b, c))
    np.testing.assert_array_equal(first_a.source, first_b.source)
    assert not np.array_equal(first_a.index, first_c.index)


def test_evaluation_batches_hold_every_example_once(encoded):
    _, split = encoded
    indices = np.concatenate([b.index for b in evaluation_batches(split, 64, 48)])
    real = indices[indices >= 0]
    assert sorted(real.tolist()) == list(range(len(split)))


class DatasetWithATab:
    """A dataset plugin whose second pair holds a tab inside its source sentence."""
    name = "tabbed"

    def missing_reason(self):
        return None

    def fingerprint(self):
        return "tabbed-1"

    def read_pairs(self, progress):
        return [("In the beginning", "Au commencement"), ("God\tcreated", "Dieu créa"), ("light", "lumière")]


def test_a_dataset_sentence_holding_a_tab_is_refused_before_anything_is_cached(tmp_path):
    """The cache is a tab-separated file: written with the tab, it read back as a broken file of mtbench's own (its
    path in the error), and stayed, failing every later run."""
    with pytest.raises(MtbenchError, match=r"^pair 2's source sentence holds a tab \('God\\tcreated'\.\.\.\): give "
                                           r"each sentence on one line, without tabs$"):
        load_dataset_pairs(DatasetWithATab(), str(tmp_path), progress=None)
    assert not (tmp_path / "datasets").exists() or not list((tmp_path / "datasets").iterdir())


@pytest.mark.parametrize("languages, refused", [
    ({"src_lang": "en", "tgt_lang": "fr"}, None),
    ({"src_lang": "en", "tgt_lang": "de"}, "--tgt-lang de: "),  # the side that differs alone: both were named
    ({"src_lang": "fr", "tgt_lang": "en"}, "--src-lang fr --tgt-lang en: "),
])
def test_a_language_beside_a_dataset_is_refused_by_the_side_it_is_not(languages, refused):
    config = TrainConfig(**languages)
    if refused is None:
        check_file_options(config, BibleDataset("en", "fr"))
        return
    with pytest.raises(MtbenchError) as error:
        check_file_options(config, BibleDataset("en", "fr"))
    assert str(error.value).startswith(refused) and str(error.value).endswith("(its pairs are en -> fr)")


# What a run trains and is scored on, made in a process of its own: the data's fingerprint, the first training
# batches and every evaluation split, as one sha256.
DATA_DIGEST = """
import dataclasses, hashlib, itertools, json, sys
import numpy as np
from rich.console import Console
from mtbench.plugins.manager import registry
from mtbench.runner.config import TrainConfig
from mtbench.runner.loop.timing import Stopwatch
from mtbench.runner.setup import choose_plugins
from mtbench.runner.training import prepare_data, read_data

config = TrainConfig(**json.loads(sys.argv[1]))
plugins, stopwatch = choose_plugins(config, registry()), Stopwatch()
data = prepare_data(config, plugins, read_data(config, plugins, Console(quiet=True), stopwatch), stopwatch)
digest = hashlib.sha256()

def feed(value):
    if isinstance(value, np.ndarray):
        digest.update(str(value.dtype).encode() + np.ascontiguousarray(value).tobytes())
    elif dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            feed(field.name)
            feed(getattr(value, field.name))
    elif isinstance(value, dict):
        for key in sorted(value):
            feed(key)
            feed(value[key])
    elif isinstance(value, (list, tuple)):
        for item in value:
            feed(item)
    else:
        assert isinstance(value, (str, bytes, int, float, type(None))), type(value)
        digest.update(repr(value).encode())

feed(data.fingerprint)
feed(data.splits)
for _, batch in itertools.islice(plugins.task.batches(data, config), 40):
    feed(batch)
print(digest.hexdigest())
"""


@pytest.mark.parametrize("model, options", [
    ("transformer", {"preset": "tiny", "max_pairs": 4000, "valid_size": 100, "test_size": 100, "max_len": 48,
                     "batch_size": 32}),
    ("gpt", {"preset": "tiny", "batch_size": 8})])
def test_processes_of_other_hash_seeds_make_the_same_data_and_batches(model, options, tmp_path):
    """Python draws a string hash seed for each process (so for each run of a compare): set or dict order that
    followed it would give two backends other batches, or another tokenizer, from one seed. Each process trains
    its tokenizer in a cache of its own."""
    digests = []
    for seed in ("0", "12345"):
        config = {"model_name": model, **options, "cache_dir": str(tmp_path / f"cache-{seed}"),
                  "out": str(tmp_path / "unused.json")}
        proc = subprocess.run([sys.executable, "-c", DATA_DIGEST, json.dumps(config)], capture_output=True,
                              text=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        digests.append(proc.stdout.strip().splitlines()[-1])
    assert digests[0] == digests[1]


def test_a_dataset_cache_cut_short_is_prepared_again_not_read_as_a_smaller_corpus(tmp_path):
    """The prepared pairs are kept with their sha256: a file cut at a line's end (a killed copy, a full disk) read
    as a smaller corpus under the dataset's name, and one cut inside a line failed on its columns."""
    from mtbench.plugins.api import Dataset

    class Numbers(Dataset):
        name = "numbers"
        reads = 0

        def read_pairs(self, progress):
            Numbers.reads += 1
            return [(f"{i} one", f"{i} un") for i in range(100)]

    dataset, cache = Numbers(), str(tmp_path)
    pairs = load_dataset_pairs(dataset, cache, progress=None)
    assert len(pairs) == 100 and Numbers.reads == 1
    assert load_dataset_pairs(dataset, cache, progress=None) == pairs and Numbers.reads == 1  # read from the cache
    [cached] = (tmp_path / "datasets").glob("numbers-*.tsv")
    for cut in (cached.read_bytes()[:600].rpartition(b"\n")[0] + b"\n", cached.read_bytes()[:601]):
        cached.write_bytes(cut)
        assert load_dataset_pairs(dataset, cache, progress=None) == pairs
    assert Numbers.reads == 3


def test_the_built_in_corpus_is_prepared_again_when_its_database_changes_at_the_same_size(tmp_path, monkeypatch):
    """The cache of prepared pairs was keyed by the database's size, which SQLite keeps through an edit (whole
    pages): a corrected verse would have been read from the pairs prepared before it."""
    from mtbench.plugins.datasets import bible_dataset
    database = tmp_path / "bible.db"
    connection = sqlite3.connect(database)
    connection.execute("CREATE TABLE bible (bbName TEXT, bNumber INT, cNumber INT, vNumber INT, vText TEXT)")
    connection.executemany("INSERT INTO bible VALUES (?, 1, 1, ?, ?)",
                           [(edition, verse, f"verse {verse} of {edition}") for edition in ("4", "l")
                            for verse in range(1, 4)])
    connection.commit()
    monkeypatch.setattr(bible_dataset, "bible_db_path", lambda: str(database))
    dataset = bible_dataset.BibleDataset("en", "fr")
    assert load_dataset_pairs(dataset, str(tmp_path), progress=lambda *_: None)[0] == ("verse 1 of 4", "verse 1 of l")
    size = database.stat().st_size
    connection.execute("UPDATE bible SET vText = 'verse 1, corrected' WHERE bbName = '4' AND vNumber = 1")
    connection.commit()
    connection.close()
    assert database.stat().st_size == size
    assert load_dataset_pairs(dataset, str(tmp_path), progress=lambda *_: None)[0] == ("verse 1, corrected",
                                                                                        "verse 1 of l")


def test_a_dataset_that_gives_no_pairs_is_named_and_its_empty_read_never_cached(tmp_path):
    """An empty read was cached: the run failed naming a cache file and the task, and kept failing once the plugin
    was fixed (the empty file served as the dataset's pairs)."""
    from mtbench.errors import RunFailure
    from mtbench.plugins.api import Dataset
    from mtbench.plugins.manager import Registry
    from mtbench.runner.files import write_cache_file

    class Pairs(Dataset):
        name = "sometimes-empty"
        pairs = []

        def read_pairs(self, progress):
            return list(self.pairs)

    registry = Registry()
    registry.provider[("datasets", Pairs.name)] = "theirs"
    dataset, cache = Pairs(), str(tmp_path)
    with pytest.raises(RunFailure) as error:
        load_dataset_pairs(dataset, cache, lambda done, total: None,
                           lambda: registry.plugin_code("datasets", dataset.name))
    assert str(error.value) == ("dataset 'sometimes-empty' of plugin 'theirs' failed: ValueError: read_pairs gave no "
                                "pairs")
    assert not list(tmp_path.rglob("*.tsv"))
    dataset.pairs = [("a b", "x y")]  # fixed, as the fingerprint stays
    assert load_dataset_pairs(dataset, cache, lambda done, total: None) == [("a b", "x y")]
    # An empty file an earlier mtbench cached is read again.
    [kept] = [name for name in os.listdir(tmp_path / "datasets") if name.endswith(".tsv")]
    write_cache_file(str(tmp_path / "datasets" / kept), b"")
    assert load_dataset_pairs(dataset, cache, lambda done, total: None) == [("a b", "x y")]
