"""BLEU as sacrebleu computes it for the targets' language: a Chinese sentence is no single word."""

import json

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from conftest import run_cli
from mtbench.runner.evaluation.scoring import score

WORDS = {"I": "我", "you": "你", "love": "爱", "see": "看", "he": "他", "she": "她", "big": "大", "dog": "狗",
         "cat": "猫", "eat": "吃", "fish": "鱼", "water": "水"}


def test_chinese_targets_are_tokenized_as_sacrebleu_tokenizes_chinese():
    hypotheses, references = ["我爱你", "他看大狗"], ["我爱你", "他看猫"]
    bleu, _, signature, _ = score(hypotheses, references, "zh")
    expected = BLEU(tokenize="zh").corpus_score(hypotheses, [references])
    assert "tok:zh" in signature and bleu == expected.score > 0
    as_words = BLEU(tokenize="13a").corpus_score(hypotheses, [references]).score  # each sentence one "word"
    assert score(hypotheses, references)[0] == as_words != bleu
    assert "tok:13a" in score(hypotheses, references, "fr")[2]


@pytest.mark.slow  # a training run and an evaluation: 20 s
def test_a_run_and_evaluate_score_an_english_to_chinese_corpus_by_its_characters(tmp_path, cache_dir):
    rng = np.random.default_rng(0)
    english = list(WORDS)
    lines = set()
    while len(lines) < 400:
        sentence = list(rng.choice(english, size=rng.integers(2, 6)))
        lines.add(f"{' '.join(sentence)}\t{''.join(WORDS[word] for word in sentence)}\n")
    (tmp_path / "en-zh.tsv").write_text("".join(sorted(lines)), encoding="utf-8")
    out = tmp_path / "r.json"
    proc = run_cli("train", "--backend", "jax", "--preset", "tiny", "--data", str(tmp_path / "en-zh.tsv"),
                   "--src-lang", "en", "--tgt-lang", "zh", "--vocab-size", "64", "--steps", "4", "--valid-size", "20",
                   "--test-size", "20", "--cache-dir", cache_dir, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tok:zh" in json.loads(out.read_text())["metrics"]["bleu_signature"]
    (tmp_path / "test.tsv").write_text("".join(sorted(lines)[:10]), encoding="utf-8")
    proc = run_cli("evaluate", str(out), "--test", str(tmp_path / "test.tsv"), "--out", str(tmp_path / "scores.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tok:zh" in json.loads((tmp_path / "scores.json").read_text())["bleu_signature"]
