"""The corpus: read it (a registered dataset or the user's files), cache a dataset's pairs, drop what cannot be
trained on (counting why), and split it deterministically unless validation and test files are given."""

import contextlib
import dataclasses
import hashlib
import os
from dataclasses import dataclass, field

import numpy as np

from mtbench.errors import MtbenchError
from mtbench.runner.files import read_cache_file, write_cache_file
from mtbench.runner.data.formats import LINE_BREAKS, ReadOptions, describe, read_pairs, read_tsv

SPLIT_SEED = 1234  # fixed apart from --seed: changing the training seed must not change the test set


@dataclass
class Corpus:
    name: str
    origin: str
    train: list
    valid: list
    test: list
    sources: dict = field(default_factory=dict)  # split -> where its pairs come from
    read: dict = field(default_factory=dict)     # split -> pairs read for it (a split of the training data: none)
    dropped: dict = field(default_factory=dict)  # reason -> {split: pairs dropped}
    target_lang: str = None  # the targets' language where known (its BLEU tokenizes as sacrebleu does it)

    def sizes(self):
        return {"train": len(self.train), "valid": len(self.valid), "test": len(self.test)}


def _write_tsv(path, pairs):
    write_cache_file(path, "".join(f"{s}\t{t}\n" for s, t in pairs).encode("utf-8"))


def load_dataset_pairs(dataset, cache_dir, progress, plugin_code=contextlib.nullcontext):
    """The dataset's cleaned pairs, prepared once into the cache directory. The dataset's own code runs inside
    `plugin_code()` (the registry's, which names the dataset and its plugin in any error it raises)."""
    with plugin_code():
        reason = dataset.missing_reason()
        if reason:
            raise MtbenchError(reason)
        # v2: empty pairs are cached too, so the corpus report counts them.
        key = hashlib.sha256(f"v2:{dataset.fingerprint()}".encode()).hexdigest()[:12]
    cached = os.path.join(cache_dir, "datasets", f"{dataset.name}-{key}.tsv")
    # Prepared again unless the file holds what was written (its sha256 beside it): one cut at a line's end read
    # as a smaller corpus under the dataset's name.
    # An empty file is read again too: an earlier mtbench cached an empty read, which failed every run after.
    if not read_cache_file(cached):
        with plugin_code():
            pairs = [(s.strip(), t.strip()) for s, t in dataset.read_pairs(progress)]
            if not pairs:  # the plugin's mistake, named with it: cached, it would stay the dataset's pairs
                raise ValueError("read_pairs gave no pairs")
            _refuse_line_breaks(pairs)
        _write_tsv(cached, pairs)
    return read_tsv(cached)


def _refuse_line_breaks(pairs):
    """A sentence is one line of the cache's tab-separated file (and of every format mtbench reads): a tab or a line
    break inside one would shift or split the pairs read back."""
    for number, pair in enumerate(pairs, start=1):
        for side, sentence in zip(("source", "target"), pair):
            found = next((name for character, name in (("\t", "a tab"), *LINE_BREAKS) if character in sentence), None)
            if found:
                raise MtbenchError(f"pair {number}'s {side} sentence holds {found} ({sentence[:40]!r}...): give each "
                                   f"sentence on one line, without tabs")


def drop_empty_pairs(pairs):
    """(the pairs with both a source and a target sentence, how many were left out)."""
    kept = [(s, t) for s, t in pairs if s and t]
    return kept, len(pairs) - len(kept)


def split_corpus(pairs, valid_size, test_size, name, origin, held_out=None, sources=None):
    """The training pairs and a fixed random split (the same for every seed and backend) for each of the
    validation and test sets not given in `held_out` ({split: pairs read from its own file}). Pairs with an
    empty side are dropped; exact duplicates in the training data are removed before splitting, so a test pair
    cannot also sit in the training split. Held-out files are kept as they are apart from empty pairs."""
    held_out = held_out or {}
    read = {"train": len(pairs)}
    dropped = {"empty_side": {}, "duplicate": {}}
    kept, dropped["empty_side"]["train"] = drop_empty_pairs(pairs)
    unique = list(dict.fromkeys(kept))
    dropped["duplicate"]["train"] = len(kept) - len(unique)
    if pairs and not unique:
        raise MtbenchError(f"{name}: no pair has both a source and a target sentence")
    valid_size = 0 if "valid" in held_out else valid_size
    test_size = 0 if "test" in held_out else test_size
    if len(unique) < valid_size + test_size + 1:
        raise MtbenchError(f"{name}: {len(unique)} distinct pairs cannot be split into {valid_size} validation, "
                           f"{test_size} test and at least 1 training pair; lower --valid-size/--test-size")
    order = np.random.default_rng(SPLIT_SEED).permutation(len(unique))
    splits = {"test": [unique[i] for i in order[:test_size]],
              "valid": [unique[i] for i in order[test_size:test_size + valid_size]]}
    train = [unique[i] for i in order[test_size + valid_size:]]
    for split, split_pairs in held_out.items():
        read[split] = len(split_pairs)
        splits[split], dropped["empty_side"][split] = drop_empty_pairs(split_pairs)
        dropped["duplicate"][split] = 0
        if not splits[split]:
            raise MtbenchError(f"{(sources or {}).get(split, split)}: no pair has both a source and a target "
                               "sentence")
    sources = {"train": origin, "valid": "a split of the training data", "test": "a split of the training data",
               **(sources or {})}
    return Corpus(name=name, origin=origin, train=train, valid=splits["valid"], test=splits["test"],
                  sources=sources, read=read, dropped=dropped)


def read_options(config, dataset=None):
    """How the user's files are read; a registered dataset lends its languages to sacrebleu test sets."""
    src_lang, tgt_lang = config.src_lang, config.tgt_lang
    if not src_lang and dataset is not None:
        src_lang, tgt_lang = dataset.source_lang or None, dataset.target_lang or None
    return ReadOptions(src_col=config.src_col, tgt_col=config.tgt_col, src_lang=src_lang, tgt_lang=tgt_lang)


def registered_dataset(registry, name):
    """The dataset plugin `name`; a path given to --dataset is an unknown name that says how a file is read."""
    try:
        return registry.lookup("datasets", name)
    except MtbenchError as error:
        if os.sep in name or os.path.exists(name):
            raise MtbenchError(f"{error}; a file is read with --data {name}", error.exit_code) from None
        raise


def check_file_options(config, dataset):
    """Refuses the options that say how a file is read where no file is read: a registered dataset's pairs come
    as they are, and a run that recorded --src-lang fr --tgt-lang en beside en -> fr pairs would say it did."""
    if config.valid_file or config.test_file:
        return
    columns = (("--src-col", config.src_col, 1), ("--tgt-col", config.tgt_col, 2))
    given = [(flag, value) for flag, value, default in columns if value != default]
    sides = (("--src-lang", config.src_lang, dataset.source_lang), ("--tgt-lang", config.tgt_lang, dataset.target_lang))
    given += [(flag, value) for flag, value, its_own in sides if value and value != (its_own or None)]
    if given:
        pairs = f" (its pairs are {dataset.source_lang} -> {dataset.target_lang})" if dataset.source_lang else ""
        raise MtbenchError(f"{' '.join(f'{flag} {value}' for flag, value in given)}: these say how --data, --valid "
                           f"and --test files are read; the dataset '{dataset.name}' reads none{pairs}")


def load_corpus(config, registry, progress):
    dataset = None if config.data_file else registered_dataset(registry, config.dataset)
    if dataset is not None:
        check_file_options(config, dataset)
    options = read_options(config, dataset)
    if dataset is None:
        pairs, origin = read_pairs(config.data_file, options), describe(config.data_file, options)
    else:
        plugin_code = lambda: registry.plugin_code("datasets", dataset.name)
        pairs, origin = load_dataset_pairs(dataset, config.cache_dir, progress, plugin_code), dataset.description
    if config.max_pairs:
        pairs = pairs[:config.max_pairs]
    files = {split: path for split, path in (("valid", config.valid_file), ("test", config.test_file)) if path}
    held_out = {split: read_pairs(path, options) for split, path in files.items()}
    sources = {split: describe(path, options) for split, path in files.items()}
    corpus = split_corpus(pairs, config.valid_size, config.test_size, config.corpus_name, origin, held_out, sources)
    return dataclasses.replace(corpus, target_lang=options.tgt_lang)
