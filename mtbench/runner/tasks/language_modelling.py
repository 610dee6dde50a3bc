"""The language-modelling task: a token stream cut into blocks of --block-size; the loss over every position (each
predicts the next token), and tokens/s counts them all. Scored by the loss of validation and test, their
perplexity, and bits per byte, which compares models whose tokens differ (bytes, characters, subwords)."""

import functools
import math
import os
from dataclasses import dataclass

from mtbench import Evaluator, MtbenchError, Task, TaskData, hookimpl
from mtbench.figures import short_vocabulary_warning
from mtbench.runner.data.text import (TOKENIZERS, Text, TokenStream, evaluated_bytes, evaluation_batches,
                                      load_text_tokenizer, read_text, sha256_hex, split_ranges, text_tokenizer,
                                      token_stream, training_batches, batches_per_epoch, NotUtf8)
from mtbench.runner.data.token_files import (KEPT_FOLDER, META_FILE, TOKEN_FILES, TokenFiles, TokenIds, TokenWidths,
                                             bytes_per_id, file_fingerprint, id_counts, is_token_folder,
                                             kept_largest_of_folder, named_token_file, read_token_files,
                                             vocabulary_size)

SPLITS = ("train", "valid", "test")
METRIC_SPLITS = {"train": "train", "valid": "val", "test": "test"}
METRICS = tuple(f"{name}_{figure}" for name in METRIC_SPLITS.values()
                for figure in ("loss", "accuracy", "perplexity", "bits_per_byte", "tokens_evaluated", "bytes_evaluated"))
# Translation's options, which a language model does not take (their value when not given).
TRANSLATION_OPTIONS = {"max_tokens": None, "beam": 1, "length_penalty": 0.6, "valid_file": None, "test_file": None,
                       "src_lang": None, "tgt_lang": None, "src_col": 1, "tgt_col": 2, "target_bleu": None,
                       "max_pairs": None}


class LanguageModellingTask(Task):
    name = "language-modelling"
    description = ("a text as one token stream (bytes, characters or sentencepiece), split 90/5/5 in order, or "
                   "nanoGPT's token files; scored by loss, perplexity and bits per byte")
    metrics = METRICS
    quality_figures = ("train_loss", "val_loss", "test_loss", "val_perplexity", "test_perplexity",
                       "val_bits_per_byte", "test_bits_per_byte")
    validation_metric = "loss"
    higher_is_better = False

    def check(self, config):
        self.refuse_options(config, TRANSLATION_OPTIONS, f"is an option of translation; the "
                                                         f"'{config.model_family[0]}' model family is a language model",
                            flags={"valid_file": "valid", "test_file": "test"})
        if config.tokenizer not in (None, *TOKENIZERS):
            raise MtbenchError(f"unknown --tokenizer '{config.tokenizer}'; choose one of {', '.join(TOKENIZERS)}")
        kind = config.tokenizer or "byte"
        if named_token_file(config.data_file):
            raise MtbenchError(f"{config.data_file}: one of nanoGPT's token files; --data takes the folder that holds "
                               f"{' and '.join(TOKEN_FILES.values())}")
        if is_token_folder(config.data_file):
            if config.tokenizer is not None:  # --sample-prompt waits for `prepare`: a model family may bring one
                raise MtbenchError(f"{config.data_file} holds token files (train.bin, val.bin), which carry no "
                                   f"tokenizer: --tokenizer does not apply")
            return
        if kind != "sentencepiece" and config.vocab_size_given:
            raise MtbenchError(f"--vocab-size sizes a sentencepiece vocabulary (--tokenizer sentencepiece); the {kind} "
                               f"tokenizer's vocabulary is its own")

    def read(self, config, registry, progress):
        if is_token_folder(config.data_file):
            return read_token_files(config.data_file)
        return read_text(config, registry, progress)

    def prepare(self, config, text, tokenizer):
        """Splits the text in order (training, validation, test), builds the tokenizer on the training split
        (unless the family brings one) and tokenizes every split; token files are split as they are."""
        if isinstance(text, TokenFiles):
            return prepare_token_files(text, config, tokenizer)
        # Cut between characters whatever the tokenizer (the default byte one too): models of every tokenizer are
        # then scored on the same bytes, and the default is the same run as --tokenizer byte.
        ranges = split_ranges(text.data)
        parts = {split: text.data[start:end] for split, (start, end) in ranges.items()}
        # The training split hashed once, for its tokenizer, its kept stream and the run's data fingerprint.
        train_digest = sha256_hex(parts["train"])
        trained = tokenizer is None  # mtbench's own, not the model family's
        tokenizer = tokenizer or text_tokenizer(config.tokenizer or "byte", parts["train"], config.vocab_size,
                                                config.cache_dir, config.model.byte_vocab_size, train_digest)
        streams, read = {}, []
        for split, part in parts.items():
            digest = train_digest if split == "train" else None
            try:
                streams[split], was_read = token_stream(tokenizer, part, config.cache_dir, digest)
            except NotUtf8 as error:  # a split's stream counts from the split's start: say where in the text
                raise NotUtf8(ranges[split][0] + error.position, error.reason) from None
            read += [split] if was_read else []
        block = config.max_len
        check_blocks(streams, block, text.name, "a longer text")
        record = {"corpus": text.name, "origin": text.origin, "split": "contiguous: train, validation, test",
                  "bytes": {split: end - start for split, (start, end) in ranges.items()},
                  "byte_ranges": {split: list(span) for split, span in ranges.items()},
                  "tokens": {split: len(stream) for split, stream in streams.items()},
                  "unknown_characters": {split: stream.unknown for split, stream in streams.items()},
                  "block_size": block, "tokenizer": tokenizer.describe()}
        own_pieces = trained and getattr(tokenizer, "kind", None) == "sentencepiece"
        if own_pieces:  # what a small text may have left it short of (`short_vocabulary_warning`)
            record["vocab_size_asked"] = config.vocab_size
        lines = [f"text {text.name}: {len(text.data):,} bytes; train {record['bytes']['train']:,}, valid "
                 f"{record['bytes']['valid']:,}, test {record['bytes']['test']:,} (contiguous, in that order)",
                 *([f"  {text.folder_line()}"] if isinstance(text, Text) and text.files is not None else []),
                 f"  {tokenizer.describe()['type']} tokens: vocabulary {tokenizer.vocab_size:,}; train "
                 f"{len(streams['train']):,}, valid {len(streams['valid']):,}, test {len(streams['test']):,}"
                 + (f" (read from {os.path.join(config.cache_dir, 'tokens')})" if read else "")]
        short = short_vocabulary_warning(record)
        if short:
            lines.append(f"  warning: {short}")
        unknown = sum(stream.unknown for stream in streams.values())
        if unknown:
            what = (f"<unk> piece{'s' * (unknown != 1)} (one or more characters each)"
                    if getattr(tokenizer, "kind", None) == "sentencepiece" else f"character{'s' * (unknown != 1)}")
            lines.append(f"  {unknown:,} {what} of the text {'are' if unknown != 1 else 'is'} not in the training "
                         f"split's vocabulary (<unk>)")
        lines += prompt_warning_lines(config, tokenizer)
        fingerprint = f"{tokenizer.fingerprint}-{len(parts['train'])}-{train_digest[:16]}"
        return TaskData(tokenizer, streams, fingerprint, record, lines)

    def batches(self, data, config, skip=0):
        return training_batches(data.splits["train"], config.rows_for(config.max_len), config.max_len, config.seed,
                                skip)

    def batches_per_epoch(self, data, config):
        return batches_per_epoch(data.splits["train"], config.rows_for(config.max_len), config.max_len)

    def evaluator(self, model, data, config, compile_inference):
        return LanguageModelEvaluator(model, data, config, compile_inference)

    def load_tokenizer(self, directory, description):
        return load_text_tokenizer(directory, description)


def prompt_warning_lines(config, tokenizer):
    """The console's warning where --sample-prompt holds tokens the run's tokenizer has no id for, as `generate`
    warns of its prompt: every sample then continues a text the model cannot read."""
    from mtbench.runner.evaluation.sampling import unknown_prompt_tokens, unknown_prompt_warning
    prompt = getattr(config, "sample_prompt", None)
    if not prompt:
        return []
    unread = unknown_prompt_warning(unknown_prompt_tokens(tokenizer, prompt), len(tokenizer.encode_text(prompt)),
                                    "--sample-prompt's")
    return [f"  warning: {unread}"] if unread else []


def check_blocks(streams, block, name, longer):
    """Refuses splits shorter than one block and its next token, naming the data and what would do."""
    for split, stream in streams.items():
        if len(stream) < block + 1:
            raise MtbenchError(f"{name}: the {split} split has {len(stream)} token{'s' * (len(stream) != 1)}, fewer "
                               f"than one block of --block-size {block} and its next token ({block + 1}); give "
                               f"{longer} or a smaller --block-size")


def prepare_token_files(files, config, family_tokenizer=None):
    """nanoGPT's splits: train.bin trains; val.bin's first half validates and its second half tests. The model's
    vocabulary is meta.pkl's or holds every id of both (`vocabulary_size`), or is that of the tokenizer the model
    family brings (a pretrained GPT-2 reading ids its own tokenizer made), which then reads and writes the run's
    text. Each token's bytes are known (bits per byte) from meta.pkl's characters or from the family's tokenizer
    (`bytes_per_id`), else they are not (a meta.pkl of vocab_size alone decodes nothing)."""
    half = len(files.val) // 2
    ids = {"train": files.train, "valid": files.val[:half], "test": files.val[half:]}
    characters, meta_size = files.characters, files.vocab_size
    # Counted where meta's characters give each id its bytes (a character-level text's files are small); else the
    # largest id is all there is to find, kept for the next run of the same files.
    counts = None if characters is None else {split: id_counts(split_ids) for split, split_ids in ids.items()}
    largest, kept = (max(len(split_counts) for split_counts in counts.values()) - 1, []) if counts else \
        kept_largest_of_folder(files, config.cache_dir)
    if characters is not None and largest >= len(characters):
        raise MtbenchError(f"{files.folder}: the token files hold id {largest}, which {META_FILE} gives no character "
                           f"(it has {len(characters)})")
    if characters is None and meta_size is not None and largest >= meta_size:
        raise MtbenchError(f"{files.folder}: the token files hold id {largest:,}, past the {meta_size:,} ids of "
                           f"{META_FILE}'s vocab_size")
    if family_tokenizer is not None and largest >= family_tokenizer.vocab_size:
        raise MtbenchError(f"{files.folder}: the token files hold id {largest}, past the "
                           f"{family_tokenizer.vocab_size:,} ids of the model's own tokenizer")
    if config.sample_prompt is not None and characters is None and family_tokenizer is None:
        raise MtbenchError(f"{config.data_file} holds token files (train.bin, val.bin), which carry no tokenizer: "
                           f"--sample-prompt does not apply" + (f": its {META_FILE} gives their vocabulary size, not "
                                                                f"each id's text ('itos')" if meta_size else ""))
    if family_tokenizer is not None:
        tokenizer = family_tokenizer
    else:
        asked = config.vocab_size if config.vocab_size_given else None
        tokenizer = TokenIds(vocabulary_size(largest, asked, meta_size), characters)
    widths = bytes_per_id(tokenizer)
    if widths is not None and counts is None:
        # A family's token files may be GPT-2's 17 GB of OpenWebText: only val.bin's halves are counted.
        counts = {"train": None} | {split: id_counts(ids[split]) for split in ("valid", "test")}
    streams = {split: TokenStream(split_ids, None if widths is None else TokenWidths(split_ids, widths))
               for split, split_ids in ids.items()}
    block = config.max_len
    check_blocks(streams, block, files.folder, "longer token files")
    record = {"corpus": files.name, "origin": files.origin,
              "split": "token files: train.bin trains, val.bin's first half validates, its second half tests",
              "bytes": None if widths is None else {
                  split: None if split_counts is None else int(split_counts @ widths[:len(split_counts)])
                  for split, split_counts in counts.items()},
              "tokens": {split: len(stream) for split, stream in streams.items()},
              "token_ranges": {"train": [0, len(files.train)], "valid": [0, half], "test": [half, len(files.val)]},
              "largest_id": largest, "block_size": block, "tokenizer": tokenizer.describe()}
    known = "no bytes per token, so no bits per byte" if widths is None else f"characters from {META_FILE}" \
        if characters is not None else f"each token's bytes from the model's {tokenizer.describe()['type']} tokenizer"
    sized = f" ({META_FILE}'s vocab_size)" if characters is None and family_tokenizer is None and \
        meta_size == tokenizer.vocab_size else ""
    lines = [f"token files {files.name}: train.bin {len(files.train):,} tokens; val.bin {len(files.val):,} (first half "
             f"validates, second half tests); ids up to {largest:,}, vocabulary {tokenizer.vocab_size:,}{sized}; "
             f"{known}"]
    if kept:
        lines.append(f"  largest id of {' and '.join(kept)} read from {os.path.join(config.cache_dir, KEPT_FOLDER)}")
    lines += prompt_warning_lines(config, tokenizer)
    fingerprint = f"{tokenizer.fingerprint}-{file_fingerprint(files.train)}"
    return TaskData(tokenizer, streams, fingerprint, record, lines)


def perplexity_of(loss):
    """e to the mean loss, or None (JSON has no infinity) where that is no finite float: a loss blown up past 709
    nats, still finite (so the run trained on), would raise OverflowError in the evaluation after training."""
    try:
        perplexity = math.exp(loss)
    except OverflowError:
        return None
    return perplexity if math.isfinite(perplexity) else None


def stream_scores(model, stream, rows, block, text_bytes, stride=None):
    """Loss, accuracy, perplexity and bits per byte of `model` (compiled with the run's loss) predicting the first
    `text_bytes` bytes of `stream`, in windows of `block` tokens from its start `stride` apart (default: consecutive
    blocks), `rows` to a batch."""
    from mtbench.runner.evaluation.scoring import mean_loss
    loss, accuracy, tokens = mean_loss(model, evaluation_batches(stream, rows, block, text_bytes, stride))
    predicted_bytes = evaluated_bytes(stream, text_bytes)
    return {"loss": loss, "accuracy": accuracy, "perplexity": perplexity_of(loss),
            # None too where the tokens scored stand for no byte (a token file's id that decodes to nothing).
            "bits_per_byte": loss * tokens / math.log(2) / predicted_bytes if predicted_bytes else None,
            "tokens_evaluated": int(tokens),
            "bytes_evaluated": None if predicted_bytes is None else round(predicted_bytes)}


@dataclass
class LanguageModelEvaluator(Evaluator):
    """Scores consecutive blocks from the start of a split: the text of --valid-size blocks of --block-size bytes
    of validation (and of the training split, for a training loss comparable to them), --test-size of test. A
    budget of bytes, so that a byte model and a sentencepiece one are scored on the same text."""
    model: object
    data: TaskData
    config: object
    compile_inference: object = None  # fn -> the backend's compiled fn (`Task.evaluator`'s), for --sample-prompt

    def scores(self, split):
        stream, block = self.data.splits[split], self.config.max_len
        budget = (self.config.test_size if split == "test" else self.config.valid_size) * block
        prefix = METRIC_SPLITS[split]
        return {f"{prefix}_{figure}": value for figure, value in
                stream_scores(self.model, stream, self.config.batch_size, block, budget, self.config.eval_stride).items()}

    def validate(self):
        """The validation figures, and with --sample-prompt the model's continuation of the prompt (`sample`)."""
        scores = self.scores("valid")
        figures = {"loss": scores["val_loss"], "perplexity": scores["val_perplexity"],
                   "bits_per_byte": scores["val_bits_per_byte"]}
        if self.config.sample_prompt is not None:
            figures["sample"] = self.sample(self.config.sample_prompt)
        return figures

    @functools.cached_property
    def logits(self):
        """x -> the model's logits as numpy, compiled once on the first --sample-prompt."""
        from mtbench.runner.evaluation.sampling import numpy_logits
        return numpy_logits(self.model, self.compile_inference)

    def sample(self, prompt):
        """The prompt and its continuation drawn as nanoGPT's sample.py draws (the same draws every validation)."""
        import numpy as np
        from mtbench.runner.evaluation.sampling import (SAMPLE_TEMPERATURE, SAMPLE_TOP_K, continuation,
                                                        continued_text, drawable_ids, unknown_id)
        tokenizer = self.data.tokenizer
        ids = tokenizer.encode_text(prompt)
        if not len(ids):
            raise MtbenchError(f"--sample-prompt {prompt!r} has no token of this tokenizer")
        tokens = continuation(self.logits, ids, self.config.max_len, self.config.sample_tokens,
                              SAMPLE_TEMPERATURE, SAMPLE_TOP_K, np.random.default_rng(self.config.seed),
                              drawable_ids(tokenizer), unknown_id(tokenizer))
        return prompt + continued_text(tokenizer, ids, tokens)

    def before_training(self):
        """The test figures of the starting weights (a pretrained model's, before it is fine-tuned): what the run's
        test figures are held against."""
        scores = self.scores("test")
        return {figure: scores[f"test_{figure}"] for figure in
                ("loss", "perplexity", "bits_per_byte", "tokens_evaluated", "bytes_evaluated")} | {"split": "test"}

    def evaluate(self, phase):
        metrics = {}
        with phase("evaluate"):
            for split in SPLITS:
                metrics.update(self.scores(split))
        return metrics, {}


@hookimpl
def mtbench_register_tasks(register):
    register(LanguageModellingTask())
