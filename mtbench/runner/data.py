"""The corpus: read it (a registered dataset or a TSV file), cache the cleaned pairs, split it deterministically."""

import hashlib
import os
from dataclasses import dataclass

import numpy as np

from mtbench.errors import MtbenchError
from mtbench.runner.files import write_text_atomic

SPLIT_SEED = 1234  # fixed apart from --seed: changing the training seed must not change the test set


@dataclass
class Corpus:
    name: str
    origin: str
    train: list
    valid: list
    test: list

    def sizes(self):
        return {"train": len(self.train), "valid": len(self.valid), "test": len(self.test)}


def read_tsv(path):
    """Reads `source TAB target` lines; any malformed line is an error naming the file and line."""
    if not os.path.exists(path):
        raise MtbenchError(f"{path}: no such file")
    if os.path.isdir(path):
        raise MtbenchError(f"{path}: is a directory, expected a TSV file")
    try:
        with open(path, "rb") as f:
            raw_lines = f.read().split(b"\n")
    except OSError as error:
        raise MtbenchError(f"{path}: cannot read: {error.strerror}") from None
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    pairs = []
    for number, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as error:
            raise MtbenchError(f"{path}:{number}: not valid UTF-8 (byte {error.start + 1})") from None
        columns = line.split("\t")
        if len(columns) != 2:
            raise MtbenchError(f"{path}:{number}: expected 2 tab-separated columns (source, target), "
                               f"found {len(columns)}")
        source, target = columns[0].strip(), columns[1].strip()
        if not source or not target:
            raise MtbenchError(f"{path}:{number}: empty {'source' if not source else 'target'} sentence")
        pairs.append((source, target))
    if not pairs:
        raise MtbenchError(f"{path}: the file is empty")
    return pairs


def _write_tsv(path, pairs):
    write_text_atomic(path, "".join(f"{s}\t{t}\n" for s, t in pairs))


def load_dataset_pairs(dataset, cache_dir, progress):
    """The dataset's cleaned pairs, prepared once into the cache directory."""
    reason = dataset.missing_reason()
    if reason:
        raise MtbenchError(f"dataset '{dataset.name}': {reason}")
    key = hashlib.sha256(dataset.fingerprint().encode()).hexdigest()[:12]
    cached = os.path.join(cache_dir, "datasets", f"{dataset.name}-{key}.tsv")
    if not os.path.exists(cached):
        pairs = [(s, t) for s, t in dataset.read_pairs(progress) if s and t]
        _write_tsv(cached, pairs)
    return read_tsv(cached)


def split_corpus(pairs, valid_size, test_size, name, origin):
    """A fixed random split (the same for every seed and backend). Exact duplicates are removed first so a
    test pair cannot also sit in the training split."""
    unique = list(dict.fromkeys(pairs))
    if len(unique) < valid_size + test_size + 1:
        raise MtbenchError(f"{name}: {len(unique)} distinct pairs cannot be split into {valid_size} validation, "
                           f"{test_size} test and at least 1 training pair; lower --valid-size/--test-size")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(unique))
    test = [unique[i] for i in order[:test_size]]
    valid = [unique[i] for i in order[test_size:test_size + valid_size]]
    train = [unique[i] for i in order[test_size + valid_size:]]
    return Corpus(name=name, origin=origin, train=train, valid=valid, test=test)


def load_corpus(config, datasets, progress):
    if config.data_file:
        pairs, origin = read_tsv(config.data_file), os.path.abspath(config.data_file)
    else:
        if config.dataset not in datasets:
            raise MtbenchError(f"unknown dataset '{config.dataset}'; available: {', '.join(sorted(datasets))}")
        dataset = datasets[config.dataset]
        pairs, origin = load_dataset_pairs(dataset, config.cache_dir, progress), dataset.description
    if config.max_pairs:
        pairs = pairs[:config.max_pairs]
    return split_corpus(pairs, config.valid_size, config.test_size, config.corpus_name, origin)
