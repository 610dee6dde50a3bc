"""The translation task's own decisions, on its methods: the figures it names, and which options its refusals name."""

from types import SimpleNamespace

import pytest

from mtbench.errors import MtbenchError
from mtbench.figures import shown_figures
from mtbench.runner.config import TrainConfig
from mtbench.runner.data.batches import EncodedSplit
from mtbench.runner.data.tokenizer import JOINT_SPECIAL
from mtbench.runner.tasks.translation import TranslationTask


def test_each_splits_loss_and_token_accuracy_is_a_figure_the_task_names(tiny_runs):
    """A run scores its final weights on a sample of the training pairs as on the validation and test sets; each
    of the six scores is a figure its tables show (the train accuracy was recorded and shown nowhere)."""
    result = tiny_runs["jax"]["result"]
    task, shown = TranslationTask(), {figure.key for figure in shown_figures([result])}
    for split in ("train", "val", "test"):
        for score in ("loss", "accuracy"):
            key = f"{split}_{score}"
            assert isinstance(result["metrics"][key], float), key
            assert key in task.metrics and key in task.quality_figures and key in shown, key


def short_pairs(count):
    """`count` encoded pairs of 5 tokens a side: all in the shortest length bucket."""
    return EncodedSplit(sources=[[5] * 5] * count, targets=[[6] * 5] * count, pair_index=list(range(count)),
                        dropped_too_long=0, special=JOINT_SPECIAL)


@pytest.mark.parametrize("flags, rows, named", [
    ({"batch_size": 64}, "64 rows", "lower --batch-size"),
    ({"batch_size": 8, "grad_accum": 8}, "64 rows", "lower --batch-size or --grad-accum"),
    ({"max_tokens": 2048}, "128 rows of 16 tokens, 64 rows of 32 tokens, 40 rows of 48 tokens", "lower --max-tokens")])
def test_too_few_pairs_for_a_batch_names_only_the_options_that_set_its_rows(flags, rows, named, tmp_path):
    """It said 'lower --batch-size or --max-tokens' to a run that gave no --max-tokens: its rows came from
    `TrainConfig.rows_for`, a function whether or not --max-tokens was given."""
    config = TrainConfig(max_len=48, out=str(tmp_path / "r.json"), **flags)
    data = SimpleNamespace(splits={"train": short_pairs(10)})
    with pytest.raises(MtbenchError) as refused:
        next(TranslationTask().batches(data, config))
    assert str(refused.value) == f"no length bucket holds a full batch ({rows}; 10 training pairs); {named}"


def test_the_train_loss_scores_the_first_pairs_that_training_takes(tmp_path):
    """The train loss is scored on the first 500 training pairs within --max-len, as validation and test are
    within it: it took the corpus's first 500 and then dropped the long ones (82 were left on `tiny`)."""
    from mtbench.runner.data.corpus import Corpus
    long_pairs = [(f"{i} " + "the house of the many long words " * 4, f"{i} " + "la maison des nombreux mots " * 4)
                  for i in range(400)]
    short = [(f"house {i}", f"maison {i}") for i in range(700)]
    none = {"train": 0, "valid": 0, "test": 0}
    corpus = Corpus(name="made", origin="this test", train=long_pairs + short, valid=short[:5], test=short[5:10],
                    dropped={"empty_side": none, "duplicate": none})
    config = TrainConfig(max_len=16, vocab_size=100, cache_dir=str(tmp_path), out=str(tmp_path / "r.json"))
    data = TranslationTask().prepare(config, corpus, None)
    scored = data.splits["train_eval"]
    assert len(scored) == 500 and scored.dropped_too_long == 0
    assert data.tokenizer.decode(scored.targets) == [target for _, target in short[:500]]
    assert data.splits["train"].dropped_too_long == 400  # the long pairs are too long to train on at all


def test_a_beam_past_the_vocabulary_sentencepiece_learned_is_refused_before_the_pairs_are_encoded(tmp_path):
    """--beam within --vocab-size, past the pieces a small corpus supports: the run trained to its end, then its
    beam search asked for more hypotheses than there are tokens. Refused once the tokenizer exists (the refusal of
    a beam past --vocab-size itself, before anything is imported, is in tests/test_cli_bad_input.py)."""
    from mtbench.runner.data.corpus import Corpus
    pairs = [(f"house {i}", f"maison {i}") for i in range(60)]
    none = {"train": 0, "valid": 0, "test": 0}
    corpus = Corpus(name="made", origin="this test", train=pairs, valid=pairs[:5], test=pairs[5:10],
                    dropped={"empty_side": none, "duplicate": none})
    config = TrainConfig(max_len=16, vocab_size=1000, beam=900, cache_dir=str(tmp_path), out=str(tmp_path / "r.json"))
    TranslationTask().check(config)  # within --vocab-size
    with pytest.raises(MtbenchError) as refused:
        TranslationTask().prepare(config, corpus, None)
    pieces = TranslationTask().prepare(TrainConfig(**{**vars(config), "beam": 1}), corpus, None).tokenizer.vocab_size
    assert pieces < 900
    assert str(refused.value) == (f"--beam 900 is more hypotheses than the {pieces:,} tokens of the run's tokenizer "
                                  f"(the training pairs support no more of --vocab-size 1,000); give at most {pieces}")


def test_a_family_with_a_tokenizer_of_its_own_is_not_held_to_the_presets_vocabulary(tmp_path):
    """A pretrained checkpoint's vocabulary is its own (MarianMT's 58,101 tokens), not the preset's 1,000 that
    --vocab-size would have set: its beam is held to its tokenizer once that is read."""
    out = str(tmp_path / "r.json")
    TranslationTask().check(TrainConfig(preset="tiny", model_name="marian:DIR", beam=2000, out=out))
    with pytest.raises(MtbenchError, match=r"--beam 2,000 is more hypotheses than the vocabulary's 1,000 tokens "
                                           r"\(the preset tiny's\); give at most 1,000"):
        TranslationTask().check(TrainConfig(preset="tiny", beam=2000, out=out))
