"""The corpus formats, the held-out files and the corpus report, on the functions that read and count them."""

import gzip
import json
import os

import numpy as np
import pytest

from mtbench.errors import MtbenchError
from mtbench.runner.data.batches import EncodedSplit
from mtbench.runner.data.corpus_report import corpus_report, report_lines
from mtbench.runner.data.corpus import split_corpus
from mtbench.runner.data.formats import ReadOptions, describe, detect_format, read_pairs
from mtbench.runner.data.tokenizer import JOINT_SPECIAL

EN_FR = ReadOptions(src_lang="en", tgt_lang="fr")


def test_tsv_columns_are_chosen_and_gzip_is_read(tmp_path):
    lines = "id\ten\tlicense\tfr\n" + "".join(f"{i}\tgood morning {i}\tCC-BY\tbonjour {i}\n" for i in range(3))
    path = tmp_path / "export.tsv.gz"
    path.write_bytes(gzip.compress(lines.encode()))
    pairs = read_pairs(str(path), ReadOptions(src_col=2, tgt_col=4))
    assert pairs[0] == ("en", "fr") and pairs[1:] == [(f"good morning {i}", f"bonjour {i}") for i in range(3)]
    assert detect_format(str(path), ReadOptions()) == "tsv"


def test_tsv_tolerates_a_byte_order_mark_crlf_and_blank_lines(tmp_path):
    path = tmp_path / "windows.tsv"
    path.write_bytes("\ufeffa b\tc d\r\n\r\nsecond\tzweite\r\n".encode())
    assert read_pairs(str(path), ReadOptions()) == [("a b", "c d"), ("", ""), ("second", "zweite")]


def test_moses_pair_is_read_line_by_line_and_either_side_may_be_gzipped(tmp_path):
    (tmp_path / "corpus.en.gz").write_bytes(gzip.compress(b"one\ttab inside\ntwo\n"))
    (tmp_path / "corpus.fr").write_text("un\ndeux\n")
    prefix = str(tmp_path / "corpus")
    assert detect_format(prefix, EN_FR) == "moses"
    assert read_pairs(prefix, EN_FR) == [("one\ttab inside", "un"), ("two", "deux")]
    assert describe(prefix, EN_FR) == f"Moses pair {prefix}.en.gz + {prefix}.fr"


def test_jsonl_in_the_hugging_face_translation_layout(tmp_path):
    records = [{"id": 7, "translation": {"de": "eins", "en": " one ", "fr": "un"}},
               {"translation": {"en": "two", "fr": ""}}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert read_pairs(str(path), EN_FR) == [("one", "un"), ("two", "")]
    assert read_pairs(str(path), ReadOptions(src_lang="fr", tgt_lang="en")) == [("un", "one"), ("", "two")]


def test_a_sentence_holding_a_line_break_is_refused_with_its_file_and_line(tmp_path):
    """Each sentence is one line of the references file beside the result: an escaped newline in JSONL (or a lone
    carriage return in a TSV or Moses line, a line break to text-mode readers) made it two, and sacrebleu refused a
    references file longer than the hypotheses. The built-in datasets are refused alike."""
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text(json.dumps({"translation": {"en": "one", "fr": "un"}}) + "\n"
                     + json.dumps({"translation": {"en": "two", "fr": "deux\nlignes"}}) + "\n")
    with pytest.raises(MtbenchError, match=r'pairs.jsonl:2: the target \("fr"\) sentence holds a line break '
                                           r"\('deux\\nlignes'\.\.\.\): give each sentence on one line$"):
        read_pairs(str(jsonl), EN_FR)
    tsv = tmp_path / "pairs.tsv"
    tsv.write_bytes(b"one\tun\r\nIn the beginning\rGod\tAu commencement\n")  # a CRLF's CR is the line's end
    with pytest.raises(MtbenchError, match=r"pairs.tsv:2: the source sentence holds a carriage return"):
        read_pairs(str(tsv), ReadOptions())
    (tmp_path / "moses.en").write_text("one\ntwo\n")
    (tmp_path / "moses.fr").write_bytes(b"un\ndeux\rlignes\n")
    with pytest.raises(MtbenchError, match=r"moses.fr:2: the target sentence holds a carriage return"):
        read_pairs(str(tmp_path / "moses"), EN_FR)
    # leading and trailing ones are whitespace, stripped as ever
    jsonl.write_text(json.dumps({"translation": {"en": "one\n", "fr": "\r\nun"}}) + "\n")
    assert read_pairs(str(jsonl), EN_FR) == [("one", "un")]


def test_a_moses_side_given_as_the_file_or_a_prefix_without_languages_says_how_to_give_the_pair(tmp_path):
    """A Moses side given as --data was read as TSV ('expected at least 2 tab-separated columns'), and the prefix
    without languages was 'no such file'; both now say how a Moses pair is given."""
    (tmp_path / "base.en").write_text("In the beginning\n")
    (tmp_path / "base.fr.gz").write_bytes(gzip.compress("Au commencement\n".encode()))
    side, prefix = str(tmp_path / "base.en"), str(tmp_path / "base")
    with pytest.raises(MtbenchError) as refused:
        read_pairs(side, EN_FR)
    assert str(refused.value) == (f"{side}:1: expected at least 2 tab-separated columns (--src-col 1, --tgt-col 2), "
                                  f"found 1; {side} is one side of a Moses pair ({prefix}.fr.gz beside it): give their "
                                  f"prefix, {prefix}, with --src-lang en --tgt-lang fr")
    with pytest.raises(MtbenchError, match=r"with --src-lang and --tgt-lang \(en, fr\)$"):
        read_pairs(side, ReadOptions())
    with pytest.raises(MtbenchError) as refused:
        read_pairs(prefix, ReadOptions())
    assert str(refused.value) == (f"{prefix}: no such file; {prefix}.en and {prefix}.fr.gz exist: a Moses pair is "
                                  f"given as their prefix with --src-lang and --tgt-lang (en, fr)")
    assert read_pairs(prefix, EN_FR) == [("In the beginning", "Au commencement")]
    # A TSV file's error names no pair where the name's suffix is a file's kind, or no other side lies beside it.
    (tmp_path / "notes.txt").write_text("one column\n")
    (tmp_path / "notes.csv").write_text("")
    (tmp_path / "alone.de").write_text("one column\n")
    for lonely in ("notes.txt", "alone.de", "absent"):
        with pytest.raises(MtbenchError) as refused:
            read_pairs(str(tmp_path / lonely), ReadOptions())
        assert "Moses" not in str(refused.value)


@pytest.fixture
def sacrebleu_cache(tmp_path, monkeypatch):
    """sacrebleu's cache moved to tmp_path/sacrebleu (its datasets keep the folder they were made with), and its
    downloads refused as a machine without a network refuses them, files left behind included."""
    from sacrebleu.dataset import DATASETS, base
    cache = tmp_path / "sacrebleu"
    for dataset in DATASETS.values():
        monkeypatch.setattr(dataset, "_outdir", str(cache / dataset.name))
        monkeypatch.setattr(dataset, "_rawdir", str(cache / dataset.name / "raw"))

    def offline(url, dest_path, **_):
        raise OSError(f"URLError: sacrebleu tried to download {url}")
    monkeypatch.setattr(base, "download_file", offline)
    return cache


def test_an_xml_sacrebleu_set_is_read_from_the_cache_against_sacrebleu_s_reference_and_never_downloaded(
        sacrebleu_cache):
    """Sets of wmt21 on are WMT's XML: sacrebleu's fieldnames() parses the raw XML, downloading it first, so mtbench
    ended in 'Error: URLError' (leaving a lock file) where wmt14 says the set is not cached. Cached, the reference is
    the one sacrebleu scores cs-en against (its metadata's B, not the XML's first translator A)."""
    with pytest.raises(MtbenchError, match=r"^sacrebleu test set wmt22 cs-en is not in sacrebleu's cache .* mtbench "
                                           r"never downloads; fetch it once"):
        read_pairs("sacrebleu:wmt22", ReadOptions(src_lang="cs", tgt_lang="en"))
    assert not sacrebleu_cache.exists(), "nothing written: no raw folder, no lock file"
    wmt22 = sacrebleu_cache / "wmt22"
    wmt22.mkdir(parents=True)
    for field, lines in (("src", "Na počátku\nBůh\n"), ("ref-A", "At first\nGod\n"),
                         ("ref-B", "In the beginning\nGod\n"), ("docid", "d1\nd1\n"), ("origlang", "cs\ncs\n")):
        (wmt22 / f"wmt22.cs-en.{field}").write_text(lines)
    assert read_pairs("sacrebleu:wmt22", ReadOptions(src_lang="cs", tgt_lang="en")) == [
        ("Na počátku", "In the beginning"), ("Bůh", "God")]
    assert sorted(os.listdir(wmt22)) == ["wmt22.cs-en.docid", "wmt22.cs-en.origlang", "wmt22.cs-en.ref-A",
                                         "wmt22.cs-en.ref-B", "wmt22.cs-en.src"]


def test_split_uses_held_out_files_and_counts_what_it_drops():
    train = [(f"s{i}", f"t{i}") for i in range(30)] + [("s0", "t0"), ("", "t"), ("s", "")]
    valid = [("v1", "w1"), ("", "w2")]
    corpus = split_corpus(train, 5, 4, "mine", "train.tsv", held_out={"valid": valid},
                          sources={"valid": "valid.tsv"})
    assert corpus.valid == [("v1", "w1")]
    assert len(corpus.test) == 4 and len(corpus.train) == 26
    assert corpus.dropped == {"empty_side": {"train": 2, "valid": 1}, "duplicate": {"train": 1, "valid": 0}}
    assert corpus.read == {"train": 33, "valid": 2}
    assert corpus.sources == {"train": "train.tsv", "valid": "valid.tsv", "test": "a split of the training data"}


def encoded(kept, lengths, dropped_too_long=0):
    return EncodedSplit(sources=[[5]] * kept, targets=[[6]] * kept, pair_index=list(range(kept)),
                        dropped_too_long=dropped_too_long, special=JOINT_SPECIAL,
                        token_lengths=np.array(lengths).reshape(-1, 2))


def test_corpus_report_counts_drops_lengths_and_test_sources_seen_in_training():
    train = [("same source", "t1"), ("other", "t2"), ("third", "t3")]
    test = [("same source", "a different target"), ("new", "nouveau")]
    corpus = split_corpus(train, 0, 0, "c", "o", held_out={"valid": [("v", "w")], "test": test})
    splits = {"train": encoded(2, [[3, 4], [5, 6], [60, 2]], dropped_too_long=1),
              "valid": encoded(1, [[1, 1]]), "test": encoded(2, [[2, 2], [3, 3]])}
    report = corpus_report(corpus, splits, max_len=48, untrained=1)
    assert report["kept"] == {"train": 2, "valid": 1, "test": 2} and report["untrained"] == 1
    assert report["dropped"]["too_long"] == {"train": 1, "valid": 0, "test": 0}
    assert report["token_lengths"]["source"] == {"mean": pytest.approx(68 / 3), "median": 5.0,
                                                 "p95": pytest.approx(54.5), "max": 60}
    assert report["test_sources_in_train"] == 1 and report["test_sources_checked"] == 2
    lines = report_lines("c", report)
    assert lines[0] == "corpus c: read train 3, valid 1, test 2; kept train 2, valid 1, test 2"
    # --max-len counts the end token: the words say so. Counts of one are singular.
    assert "  dropped 1 longer than --max-len 48 tokens with their end token (train 1)" in lines
    assert "  1 training pair in no batch: the longest length bucket holds fewer than a batch's rows" in lines
    assert not any("in no batch" in line for line in report_lines("c", corpus_report(corpus, splits, max_len=48)))
    assert lines[-1] == "  test sources also in the training data: 1 of 2"


@pytest.mark.slow
def test_every_format_together_end_to_end(tmp_path, cache_dir):
    """Moses training pairs (one side gzipped), JSONL validation and a WMT test set from a sacrebleu cache laid
    out as sacrebleu lays it out; the run reads them all and reports what it kept."""
    from conftest import run_cli
    from mtbench.plugins.datasets.bible_dataset import BibleDataset
    from mtbench.runner.data.corpus import load_dataset_pairs
    pairs = load_dataset_pairs(BibleDataset("en", "fr"), cache_dir, progress=lambda done, total: None)
    train, valid = pairs[:1500], pairs[1500:1560]
    test = pairs[1560:1590] + pairs[:3]  # three test sources that also occur in the training data
    (tmp_path / "train.en.gz").write_bytes(gzip.compress("".join(s + "\n" for s, _ in train).encode()))
    (tmp_path / "train.fr").write_text("".join(t + "\n" for _, t in train))
    (tmp_path / "valid.jsonl").write_text("".join(
        json.dumps({"translation": {"en": s, "fr": t}}) + "\n" for s, t in valid))
    wmt14 = tmp_path / "sacrebleu" / "wmt14"
    wmt14.mkdir(parents=True)
    fields = {"src": [s for s, _ in test], "ref": [t for _, t in test], "docid": ["d1"] * len(test),
              "genre": ["news"] * len(test), "origlang": ["en"] * len(test)}
    for field, lines in fields.items():
        (wmt14 / f"wmt14.en-fr.{field}").write_text("".join(line + "\n" for line in lines))

    out = str(tmp_path / "formats.json")
    # torch's eager step: what is read does not depend on the backend, and a JAX run would compile its programs for a
    # vocabulary no other test trains.
    proc = run_cli("train", "--backend", "torch", "--step", "eager", "--preset", "tiny", "--steps", "3",
                   "--batch-size", "32", "--max-len", "48",
                   "--vocab-size", "20000", "--data", str(tmp_path / "train"), "--valid", str(tmp_path / "valid.jsonl"),
                   "--test", "sacrebleu:wmt14", "--src-lang", "en", "--tgt-lang", "fr",
                   "--cache-dir", cache_dir, "--out", out, env={"SACREBLEU": str(tmp_path / "sacrebleu")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        data = json.load(f)["data"]
    assert data["sources"] == {"train": f"Moses pair {tmp_path}/train.en.gz + {tmp_path}/train.fr",
                               "valid": f"JSONL file {tmp_path}/valid.jsonl", "test": "sacrebleu test set wmt14 en-fr"}
    assert data["read"] == {"train": 1500, "valid": 60, "test": 33}
    assert data["pairs"]["valid"] == 60 and data["pairs"]["test"] == 33
    assert data["test_sources_in_train"] == 3
    assert data["kept"]["test"] == 33 - data["dropped"]["too_long"]["test"] > 0
    with open(out.replace(".json", ".ref.txt")) as f:
        references = f.read().splitlines()
    assert len(references) == data["kept"]["test"] and set(references) <= set(fields["ref"])
    assert "test sources also in the training data: 3 of 33" in proc.stdout
    # 1,500 pairs support fewer pieces than asked: the run says so, and records what it trained.
    real = data["tokenizer"]["vocab_size"]
    assert real < 20000 and (f"vocabulary {real:,} pieces: the training pairs support no more of --vocab-size "
                             f"20,000") in proc.stdout
