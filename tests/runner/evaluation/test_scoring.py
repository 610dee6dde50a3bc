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
    # A side tagged with its region or script, as OPUS corpora and Moses file names tag it, is still Chinese.
    for tagged in ("zh_CN", "zh-Hans", "ZH"):
        tagged_bleu, _, tagged_signature, _ = score(hypotheses, references, tagged)
        assert (tagged_bleu, tagged_signature) == (bleu, signature), tagged


@pytest.mark.parametrize("language", ["ja", "ko"])
def test_japanese_or_korean_targets_without_sacrebleus_tokenizer_say_what_bleu_took(language):
    """Without sacrebleu's extra for the language, BLEU fell back to 13a (a sentence one word) and only the
    signature's `tok:13a` said so."""
    import importlib.util

    from mtbench.runner.evaluation.scoring import bleu_tokenizer_note
    signature = score(["こんにちは 世界"], ["こんにちは 世界"], language)[2]
    if importlib.util.find_spec({"ja": "MeCab", "ko": "mecab_ko"}[language]) is None:  # sacrebleu[ja], [ko]
        assert "tok:13a" in signature
        assert bleu_tokenizer_note(language) == (
            f"BLEU tokenized the {language} targets with 13a, which takes a sentence written without spaces for one "
            f"word: sacrebleu's own tokenizer for {language} needs pip install 'sacrebleu[{language}]'")
    else:
        assert f"tok:{language}-mecab" in signature and bleu_tokenizer_note(language) is None
    assert bleu_tokenizer_note("zh") is bleu_tokenizer_note("fr") is bleu_tokenizer_note(None) is None


def test_chinese_or_japanese_targets_of_no_known_language_say_that_bleu_read_each_sentence_as_one_word():
    """A --data file of Chinese targets, its languages not given, was scored with 13a: BLEU 0.00 beside sacrebleu's
    24.2 with its Chinese tokenizer, and no warning. The words that would say so are the evaluation's own."""
    from types import SimpleNamespace

    from mtbench.runner.evaluation.scoring import bleu_tokenizer_note
    from mtbench.runner.inference import evaluate_translator
    chinese = [(english, "".join(WORDS[word] for word in english.split()))
               for english in ("I love big fish", "you see he eat fish", "she love water cat")]
    hypotheses = [target[:-1] + "水" for _, target in chinese]  # one character of each wrong
    translator = SimpleNamespace(translate=lambda sources, batch_size, progress: hypotheses, source_label="run.json",
                                 backend="jax", config=SimpleNamespace(dtype="float32", max_len=32),
                                 decoding="greedy", truncated=0)
    scores, _ = evaluate_translator(translator, chinese, 8)
    # each sentence one word to 13a, and none right; Chinese's tokenizer sees each character
    assert "tok:13a" in scores["bleu_signature"] and scores["bleu"] == 0
    assert evaluate_translator(translator, chinese, 8, target_lang="zh")[0]["bleu"] > 0
    assert scores["bleu_note"] == (
        "BLEU tokenized the targets with 13a, which takes a sentence written without spaces for one word, and most "
        "of their characters are Chinese or Japanese: give the target language (--tgt-lang zh or ja) for "
        "sacrebleu's tokenizer of it, or read chrF")
    assert evaluate_translator(translator, chinese, 8, target_lang="zh")[0]["bleu_note"] is None
    assert bleu_tokenizer_note(None, ["こんにちは 世界"]) == scores["bleu_note"]
    # French, Korean (written with spaces) and a few Chinese words in French sentences are scored as they are
    assert bleu_tokenizer_note(None, ["nous sommes là", "le 中文 mot"]) is None
    assert bleu_tokenizer_note(None, ["안녕하세요 세계"]) is bleu_tokenizer_note(None, []) is None


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
    result = json.loads(out.read_text())
    # the BLEU of the very sentences the run wrote, each reference a target of the corpus
    hypotheses, references = (open(result[key], encoding="utf-8").read().splitlines()
                              for key in ("hypotheses_file", "references_file"))
    chinese = {line.rstrip("\n").split("\t")[1] for line in lines}
    assert len(hypotheses) == len(references) == result["metrics"]["test_sentences_scored"] > 0
    assert set(references) <= chinese
    assert "tok:zh" in result["metrics"]["bleu_signature"]
    assert result["metrics"]["bleu"] == pytest.approx(BLEU(tokenize="zh").corpus_score(hypotheses, [references]).score)
    test_lines = sorted(lines)[:10]
    (tmp_path / "test.tsv").write_text("".join(test_lines), encoding="utf-8")
    proc = run_cli("evaluate", str(out), "--test", str(tmp_path / "test.tsv"), "--out", str(tmp_path / "scores.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    scores = json.loads((tmp_path / "scores.json").read_text())
    hypotheses = open(scores["hypotheses_file"], encoding="utf-8").read().splitlines()
    references = [line.rstrip("\n").split("\t")[1] for line in test_lines]
    assert "tok:zh" in scores["bleu_signature"] and len(hypotheses) == 10
    assert scores["bleu"] == pytest.approx(BLEU(tokenize="zh").corpus_score(hypotheses, [references]).score)


def test_the_loss_and_accuracy_are_pooled_over_the_real_tokens_of_every_batch():
    """The test loss and accuracy are means over real target tokens, whatever batch holds them: a batch of nine
    real tokens weighs nine, not as much as one of 96. Held against numpy's log-softmax of the model's logits."""
    from conftest import tiny_jax_gpt
    from mtbench.runner.data.text import window_batch
    from mtbench.runner.evaluation.scoring import mean_loss
    model = tiny_jax_gpt()
    ids = np.random.default_rng(0).integers(0, 256, size=100).astype(np.int32)
    batches = [window_batch(ids, [0, 10, 20], 32, rows=4), window_batch(ids, [90], 32, rows=4)]  # and filler rows
    assert [int(b.weight.sum()) for b in batches] == [96, 9]
    losses, hits = [], []
    for batch in batches:
        logits = np.asarray(model(batch.inputs, training=False), np.float64)
        log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        real = batch.weight > 0
        losses.extend(-np.take_along_axis(log_probs, batch.target_output[..., None], -1)[..., 0][real])
        hits.extend((logits.argmax(-1) == batch.target_output)[real])
    loss, accuracy, tokens = mean_loss(model, batches)
    assert tokens == 105
    assert loss == pytest.approx(np.mean(losses), rel=1e-5) and accuracy == pytest.approx(np.mean(hits), abs=1e-6)
