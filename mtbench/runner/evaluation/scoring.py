"""Scoring: token-level loss and accuracy on a split, and BLEU/chrF of the test translations (greedy or beam
search) with sacrebleu."""

import re
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from mtbench.runner.data.batches import evaluation_batches
from mtbench.runner.evaluation.decoding import translate


def mean_loss(model, batches):
    """(loss, accuracy, tokens): loss and accuracy per token the loss counts over `batches` (each weighted by
    its tokens), with the model's compiled loss and metric."""
    loss_sum = correct_sum = tokens = 0.0
    for batch in batches:
        logs = model.test_on_batch(batch.inputs, batch.target_output, sample_weight=batch.weight, return_dict=True)
        n = batch.target_tokens
        loss_sum += float(logs["loss"]) * n
        correct_sum += float(logs["accuracy"]) * n
        tokens += n
    return loss_sum / tokens, correct_sum / tokens, tokens


def loss_and_accuracy(model, split, batch_size, max_len):
    """Loss and accuracy per real target token over the whole split."""
    loss, accuracy, _ = mean_loss(model, evaluation_batches(split, batch_size, max_len))
    return loss, accuracy


def split_losses(model, splits, batch_size, max_len):
    """Loss and token accuracy of each split, as metrics: {'train_loss': ..., 'train_accuracy': ..., ...}
    for `splits` {'train': ..., 'val': ..., 'test': ...}."""
    metrics = {}
    for name, split in splits.items():
        metrics[f"{name}_loss"], metrics[f"{name}_accuracy"] = loss_and_accuracy(model, split, batch_size, max_len)
    return metrics


@dataclass
class TranslationScores:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    hypotheses: list
    references: list


def primary_language(target_lang):
    """The language of a code as sacrebleu names it: `zh` of `zh_CN`, `zh-Hans` or `ZH`, as OPUS corpora and
    Moses file suffixes tag their sides (sacrebleu picks a language's tokenizer on `zh`, `ja` or `ko` alone, and
    gave the others 13a); None for None."""
    return target_lang and re.split("[-_]", target_lang)[0].lower()


def _language_bleu(target_lang):
    """sacrebleu's BLEU tokenizing as sacrebleu does for the targets' language, or None where its tokenizer for
    the language is not installed (ja-mecab or ko-mecab without sacrebleu[ja] or [ko])."""
    try:
        return BLEU(trg_lang=primary_language(target_lang) or "")
    except RuntimeError:
        return None


def bleu_metric(target_lang=None):
    """sacrebleu's BLEU, tokenizing as sacrebleu does for the targets' language: Chinese's own tokenizer (13a would
    see a sentence as one word), Japanese's and Korean's where sacrebleu's extras for them are installed, else 13a;
    the signature says which."""
    bleu = _language_bleu(target_lang)
    return BLEU() if bleu is None else bleu


# Han characters and Japanese kana: scripts written without spaces between words, which 13a reads as one word a
# sentence (Korean separates its words with spaces).
UNSPACED_SCRIPTS = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def bleu_tokenizer_note(target_lang=None, references=()):
    """What BLEU's tokenizer made of targets it cannot split into words, in words, else None: where sacrebleu's
    tokenizer for the targets' language is not installed (Japanese's, Korean's), or where the language is not
    known and most of the `references`' characters are Chinese or Japanese (BLEU near 0 whatever the model)."""
    if target_lang is None:
        characters = "".join(references).replace(" ", "")
        if characters and len(UNSPACED_SCRIPTS.findall(characters)) > len(characters) / 2:
            return ("BLEU tokenized the targets with 13a, which takes a sentence written without spaces for one "
                    "word, and most of their characters are Chinese or Japanese: give the target language "
                    "(--tgt-lang zh or ja) for sacrebleu's tokenizer of it, or read chrF")
        return None
    if _language_bleu(target_lang) is not None:
        return None
    return (f"BLEU tokenized the {target_lang} targets with 13a, which takes a sentence written without spaces "
            f"for one word: sacrebleu's own tokenizer for {target_lang} needs pip install "
            f"'sacrebleu[{primary_language(target_lang)}]'")


def score(hypotheses, references, target_lang=None):
    bleu, chrf = bleu_metric(target_lang), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return bleu_score.score, chrf_score.score, str(bleu.get_signature()), str(chrf.get_signature())


def translate_and_score(decode, tokenizer, split, pairs, batch_size, max_len, target_lang=None):
    """Translates the encoded split and scores it against the original target sentences (not a
    detokenised copy of them): the score is what a user of the translations would get."""
    hypotheses = tokenizer.decode(translate(decode, split.sources, batch_size, max_len, split.special))
    references = [pairs[i][1] for i in split.pair_index]
    bleu, chrf, bleu_signature, chrf_signature = score(hypotheses, references, target_lang)
    return TranslationScores(bleu, chrf, bleu_signature, chrf_signature, hypotheses, references)
