"""The translation task: sentence pairs in, BLEU and chrF (sacrebleu) of the test translations out. The loss
counts the target tokens (the source is what is translated), and so does tokens/s."""

import dataclasses
import os
from dataclasses import dataclass

from mtbench import Evaluator, ModelFamily, MtbenchError, Task, TaskData, hookimpl
from mtbench.runner.config import TrainConfig, decoding_name
from mtbench.runner.data.batches import batches_per_epoch, encode_split, training_batches, untrained_examples
from mtbench.runner.data.corpus import load_corpus
from mtbench.runner.data.corpus_report import corpus_report, report_lines
from mtbench.runner.data.formats import ReadOptions
from mtbench.runner.files import write_text_atomic
from mtbench.runner.results.schema import sidecar_paths

TRAIN_LOSS_SAMPLE = 500  # training pairs (of those within --max-len) scored with the final weights, as val and test are
METRICS = ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "test_loss", "test_accuracy",
           "bleu", "chrf", "bleu_signature", "chrf_signature", "test_sentences_scored", "decoding")
# Options of the language-modelling task, which translation does not take (their value when not given).
LANGUAGE_MODEL_OPTIONS = {"block_size": None, "tokenizer": None, "target_loss": None, "sample_prompt": None,
                          "sample_tokens": 100, "eval_stride": None}


# Options a file given beside them replaces: (option, the file's, what the file does instead).
REPLACED_BY_FILES = (("dataset", "data_file", "--data reads the corpus instead"),
                     ("valid_size", "valid_file", "--valid gives the validation pairs instead of a split of the corpus"),
                     ("test_size", "test_file", "--test gives the test pairs instead of a split of the corpus"))
CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


class TranslationTask(Task):
    name = "translation"
    description = "sentence pairs (a parallel corpus); scored by BLEU and chrF of the test translations"
    metrics = METRICS
    quality_figures = ("train_loss", "val_loss", "test_loss", "train_accuracy", "val_accuracy", "test_accuracy",
                       "bleu", "chrf")
    validation_metric = "bleu"
    higher_is_better = True
    result_files = ("hypotheses_file", "references_file")

    def check(self, config):
        self.refuse_options(config, LANGUAGE_MODEL_OPTIONS, f"is an option of language models; the "
                                                            f"'{config.model_family[0]}' model family is trained on "
                                                            f"translation")
        # The columns and languages, checked where `evaluate` checks them too (a language model refuses them whole).
        ReadOptions(config.src_col, config.tgt_col, config.src_lang, config.tgt_lang)
        if config.measure_only and config.beam != 1:
            raise MtbenchError(f"--beam {config.beam} decodes the test set, which --measure-only skips")
        for option, by, instead in REPLACED_BY_FILES:  # set apart from its default, and then not used
            if getattr(config, by) and getattr(config, option) != CONFIG_DEFAULTS[option]:
                raise MtbenchError(f"--{option.replace('_', '-')} {getattr(config, option)} is not used: {instead}; "
                                   f"give one of them")
        if config.beam == 1 and config.length_penalty != 0.6:
            raise MtbenchError(f"--length-penalty {config.length_penalty:g} weighs beam search's hypotheses by length; "
                               f"greedy decoding (--beam 1) has none to weigh: give --beam N")
        if trains_own_tokenizer(config):  # its vocabulary is known now: at most --vocab-size pieces
            given = "--vocab-size" if config.vocab_size_given else f"the preset {config.preset}'s"
            refuse_beam_past(config.beam, config.vocab_size, f"the vocabulary's {config.vocab_size:,} tokens "
                                                            f"({given})")

    def read(self, config, registry, progress):
        return load_corpus(config, registry, progress)

    def prepare(self, config, corpus, tokenizer):
        """The family's tokenizer, or mtbench's joint sentencepiece model trained (or loaded) on the training
        pairs; every split encoded, pairs over --max-len dropped and counted."""
        from mtbench.runner.data.tokenizer import load_or_train_tokenizer
        own = tokenizer is None
        tokenizer = tokenizer or load_or_train_tokenizer(corpus.train, config.vocab_size, config.cache_dir)
        short = own and tokenizer.vocab_size < config.vocab_size  # sentencepiece takes what the corpus supports
        refuse_beam_past(config.beam, tokenizer.vocab_size, f"the {tokenizer.vocab_size:,} tokens of the run's "
                         f"tokenizer" + (f" (the training pairs support no more of --vocab-size "
                                         f"{config.vocab_size:,})" if short else ""))
        train, valid, test = [encode_split(pairs, tokenizer, config.max_len)
                              for pairs in (corpus.train, corpus.valid, corpus.test)]
        # The first pairs that training takes: the first of the corpus would lose those over --max-len (418 of 500
        # on `tiny`), and score a few dozen.
        train_eval = train.head(TRAIN_LOSS_SAMPLE)
        if len(valid) == 0 or len(test) == 0:
            raise MtbenchError(f"every validation or test pair is longer than --max-len {config.max_len} tokens "
                               f"(a side with its end token)")
        splits = {"train": train, "valid": valid, "test": test}
        report = corpus_report(corpus, splits, config.max_len,
                               untrained_examples(train, config.rows_for, config.max_len))
        record = {"corpus": corpus.name, "origin": corpus.origin, "pairs": corpus.sizes(),
                  "dropped_too_long": report["dropped"]["too_long"], **report, "tokenizer": tokenizer.describe()}
        if own:  # what a small corpus may have left it short of (`short_vocabulary_warning`)
            record["vocab_size_asked"] = config.vocab_size
        lines = report_lines(corpus.name, report)
        if short:
            lines.append(f"  vocabulary {tokenizer.vocab_size:,} pieces: the training pairs support no more of "
                         f"--vocab-size {config.vocab_size:,}")
        return TaskData(tokenizer, {**splits, "train_eval": train_eval, "corpus": corpus},
                        training_fingerprint(tokenizer, corpus), record, lines)

    def batches(self, data, config, skip=0):
        try:
            yield from training_batches(data.splits["train"], config.rows_for, config.max_len, config.seed, skip)
        except ValueError as error:
            raise MtbenchError(f"{error}; lower {rows_options(config)}") from None

    def batches_per_epoch(self, data, config):
        return batches_per_epoch(data.splits["train"], config.rows_for, config.max_len)

    def evaluator(self, model, data, config, compile_inference):
        from mtbench.runner.evaluation.decoding import make_decoder
        decoder = make_decoder(model, data.tokenizer.special, config.beam, config.length_penalty)
        return TranslationEvaluator(model, data, config, compile_inference(decoder))

    def load_tokenizer(self, directory, description):
        from mtbench.runner.data.tokenizer import SAVED_NAME, JointTokenizer
        return JointTokenizer.from_file(os.path.join(directory, SAVED_NAME))


def trains_own_tokenizer(config):
    """Whether the run's model family trains mtbench's sentencepiece model (of at most --vocab-size pieces) rather
    than bringing a tokenizer of its own (a pretrained checkpoint's)."""
    from mtbench.plugins.manager import registry
    family = registry().models.get(config.model_family[0])
    return family is not None and type(family).tokenizer is ModelFamily.tokenizer


def refuse_beam_past(beam, vocabulary, tokens):
    """--beam over the `vocabulary` (`tokens`, in words) refused before training: beam search keeps more hypotheses
    than there are tokens to extend them by, and its decoding ran out of memory once the whole run had trained."""
    if beam > vocabulary:
        raise MtbenchError(f"--beam {beam:,} is more hypotheses than {tokens}; give at most {vocabulary:,}")


def rows_options(config):
    """The options that set this run's rows of a training batch, as `TrainConfig.rows_for` counts them."""
    options = ["--max-tokens" if config.max_tokens is not None else "--batch-size"]
    if config.grad_accum > 1:
        options.append("--grad-accum")
    return " or ".join(options)


def training_fingerprint(tokenizer, corpus):
    """The tokenizer's fingerprint (mtbench's own is named by a hash of the training pairs) and the pairs'."""
    from mtbench.runner.data.tokenizer import JointTokenizer, pairs_digest
    if isinstance(tokenizer, JointTokenizer):
        return tokenizer.fingerprint  # its file name already hashes the training pairs
    return f"{tokenizer.fingerprint}-{pairs_digest(corpus.train)[:16]}"


@dataclass
class TranslationEvaluator(Evaluator):
    model: object
    data: TaskData
    config: object
    decode: object

    def translate(self, split):
        """Translates the validation or test split and scores it against its reference sentences."""
        from mtbench.runner.evaluation.scoring import translate_and_score
        corpus = self.data.splits["corpus"]
        pairs = corpus.valid if split == "valid" else corpus.test
        return translate_and_score(self.decode, self.data.tokenizer, self.data.splits[split], pairs,
                                   self.config.decode_batch_size, self.config.max_len, corpus.target_lang)

    def validate(self):
        scores = self.translate("valid")
        return {"bleu": scores.bleu, "chrf": scores.chrf}

    def before_training(self):
        scores = self.translate("test")
        return {"bleu": scores.bleu, "chrf": scores.chrf, "bleu_signature": scores.bleu_signature,
                "chrf_signature": scores.chrf_signature, "split": "test"}

    def evaluate(self, phase):
        """Loss and token accuracy of the final weights on the first training pairs, validation and test;
        the test translations' BLEU and chrF; the hypotheses and references written beside the result."""
        from mtbench.runner.evaluation.scoring import bleu_tokenizer_note, split_losses
        splits = self.data.splits
        with phase("evaluate"):
            metrics = split_losses(self.model, {"train": splits["train_eval"], "val": splits["valid"],
                                                "test": splits["test"]}, self.config.batch_size, self.config.max_len)
        with phase("translate"):
            scores = self.translate("test")
        hypotheses_file, references_file = sidecar_paths(self.config.out)
        write_text_atomic(hypotheses_file, "".join(h + "\n" for h in scores.hypotheses))
        write_text_atomic(references_file, "".join(r + "\n" for r in scores.references))
        metrics.update({"bleu": scores.bleu, "chrf": scores.chrf, "bleu_signature": scores.bleu_signature,
                        "chrf_signature": scores.chrf_signature, "test_sentences_scored": len(scores.hypotheses),
                        "decoding": decoding_name(self.config.beam, self.config.length_penalty)})
        warnings = [bleu_tokenizer_note(splits["corpus"].target_lang, scores.references)]
        if scores.hypotheses and not any(h.strip() for h in scores.hypotheses):
            warnings.insert(0, "the model produced no words for any test sentence: BLEU and chrF score empty output")
        if any(warnings):
            metrics["quality_warning"] = "; ".join(filter(None, warnings))
        return metrics, {"hypotheses_file": os.path.abspath(hypotheses_file),
                         "references_file": os.path.abspath(references_file)}


@hookimpl
def mtbench_register_tasks(register):
    register(TranslationTask())
