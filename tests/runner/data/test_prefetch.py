"""Batches built ahead in a background thread: the same items in the same order, built before they are asked
for (while the current step runs), a failure raised where its item was wanted, and a thread that stops."""

import threading

import pytest

from mtbench.plugins.datasets.bible_dataset import BibleDataset
from mtbench.runner.data.batches import encode_split, training_batches
from mtbench.runner.data.corpus import load_dataset_pairs
from mtbench.runner.data.tokenizer import load_or_train_tokenizer
from mtbench.runner.data.prefetch import Prefetched


@pytest.fixture(scope="module")
def tiny_split(cache_dir):
    pairs = load_dataset_pairs(BibleDataset("en", "fr"), cache_dir, progress=lambda done, total: None)[:2000]
    return encode_split(pairs, load_or_train_tokenizer(pairs, 500, cache_dir), 48)


def test_items_come_in_order_and_are_built_ahead():
    built = []
    asked = threading.Event()

    def source():
        for i in range(10):
            built.append(i)
            yield i

    batches = Prefetched(source(), depth=2)
    first = next(batches)
    # While the consumer holds item 0 (its step running), the thread has built the next ones.
    for _ in range(200):
        if len(built) >= 3:
            break
        asked.wait(0.01)
    assert first == 0 and built[:3] == [0, 1, 2]
    assert [first, *batches] == list(range(10))


def test_a_failure_of_the_source_is_raised_where_its_item_was_wanted():
    def source():
        yield "a"
        raise ValueError("no length bucket holds a full batch")

    batches = Prefetched(source())
    assert next(batches) == "a"
    with pytest.raises(ValueError, match="no length bucket"):
        next(batches)
    with pytest.raises(StopIteration):
        next(batches)


def test_close_stops_an_endless_source():
    def endless():
        i = 0
        while True:
            yield i
            i += 1

    batches = Prefetched(endless())
    assert next(batches) == 0
    batches.close()
    assert not batches._thread.is_alive()
    with pytest.raises(StopIteration):
        next(batches)


def test_real_batches_through_the_thread_equal_the_generators(tiny_split):
    plain = training_batches(tiny_split, 8, 48, seed=3)
    ahead = Prefetched(training_batches(tiny_split, 8, 48, seed=3))
    for _ in range(12):
        (epoch_a, a), (epoch_b, b) = next(plain), next(ahead)
        assert epoch_a == epoch_b and a.shape == b.shape
        assert (a.source == b.source).all() and (a.weight == b.weight).all() and (a.index == b.index).all()
    ahead.close()
