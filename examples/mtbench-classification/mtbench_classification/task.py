"""The task `classification`: labelled examples in, one class out. A model returns logits (rows, 1, classes) for a
batch of `rows` examples, so each example is one "token" of mtbench's token-mean cross-entropy and mtbench's own
train steps (jax's jitted step, torch's eager step) train it unchanged; tokens/s counts examples. Scored by the
loss and accuracy of the training, validation and test splits; --eval-every validates by accuracy."""

import dataclasses
from dataclasses import dataclass

from mtbench import Evaluator, MtbenchError, Task, TaskData

from mtbench_classification import digits

DATASETS = {digits.NAME: digits.DESCRIPTION}
SPLIT_PREFIX = {"train": "train", "valid": "val", "test": "test"}
METRICS = (*(f"{prefix}_{figure}" for prefix in SPLIT_PREFIX.values() for figure in ("loss", "accuracy")),
           "val_examples", "test_examples")
# The options of translation and language modelling, which a classifier does not take (their value when not given).
OTHER_TASKS_OPTIONS = {"data_file": None, "max_pairs": None, "max_tokens": None, "beam": 1, "valid_file": None,
                       "test_file": None, "src_lang": None, "tgt_lang": None, "target_bleu": None,
                       "block_size": None, "tokenizer": None, "target_loss": None}
FLAGS = {"data_file": "data"}  # the option's flag, where it is not its name


def step_rows(config):
    """The examples of a training step: --grad-accum micro-batches of --batch-size (the train step splits them), as
    `config.rows_for` gives a step of one-token rows."""
    return config.rows_for(1)


def dataset_default(config):
    """mtbench's --dataset when none is given (a translation corpus): the classification task reads its own."""
    return next((f.default for f in dataclasses.fields(config) if f.name == "dataset"), None)


class ClassificationTask(Task):
    name = "classification"
    description = (f"labelled examples, one class each (--dataset {', '.join(DATASETS)}: {digits.DESCRIPTION}); "
                   f"scored by loss and accuracy")
    metrics = METRICS
    quality_figures = ("train_loss", "val_loss", "test_loss", "train_accuracy", "val_accuracy", "test_accuracy")
    validation_metric = "accuracy"
    higher_is_better = True

    def check(self, config):
        self.refuse_options(config, OTHER_TASKS_OPTIONS, f"is not an option of classification; the "
                                                         f"'{config.model_family[0]}' model family is a classifier",
                            FLAGS)
        if config.dataset not in DATASETS and config.dataset != dataset_default(config):
            raise MtbenchError(f"--dataset {config.dataset}: the classification task reads "
                               f"{', '.join(DATASETS)}, not a translation corpus")

    def read(self, config, registry, progress):
        return digits.read_digits()

    def prepare(self, config, raw, tokenizer):
        """The pixel encoding (or the family's own), the fixed split, every split encoded."""
        encoding = tokenizer or digits.PixelEncoding(int(raw.labels.max()) + 1)
        splits = {split: encoding.encode(raw.images[index], raw.labels[index])
                  for split, index in digits.split_indices(len(raw.labels)).items()}
        train = splits["train"]
        if step_rows(config) > len(train):
            accumulated = f" x --grad-accum {config.grad_accum}" if config.grad_accum > 1 else ""
            raise MtbenchError(f"--batch-size {config.batch_size}{accumulated} is more than the {len(train):,} "
                               f"training examples of {raw.name}")
        sizes = {split: len(examples) for split, examples in splits.items()}
        record = {"corpus": raw.name, "origin": raw.origin,
                  "split": (f"a fixed shuffle (numpy seed {digits.SPLIT_SEED}), the same for every --seed: "
                            f"{digits.HELD_OUT_FRACTION:.0%} test, {digits.HELD_OUT_FRACTION:.0%} validation, the "
                            f"rest training"),
                  "examples": sizes,
                  "class_counts": {split: [int((examples.labels == c).sum()) for c in range(encoding.vocab_size)]
                                   for split, examples in splits.items()},
                  "tokenizer": encoding.describe()}
        lines = [f"{raw.name}: {len(raw.labels):,} images of 8x8 pixels, {encoding.vocab_size} classes "
                 f"(scikit-learn's UCI optical digits, not MNIST); train {sizes['train']:,}, valid "
                 f"{sizes['valid']:,}, test {sizes['test']:,}"]
        return TaskData(encoding, splits, digits.fingerprint(encoding, train), record, lines)

    def batches(self, data, config, skip=0):
        return digits.training_batches(data.splits["train"], step_rows(config), config.seed, skip)

    def batches_per_epoch(self, data, config):
        return digits.batches_per_epoch(data.splits["train"], step_rows(config))

    def evaluator(self, model, data, config, compile_inference):
        return ClassificationEvaluator(model, data, config)

    def load_tokenizer(self, directory, description):
        return digits.load_encoding(directory)


@dataclass
class ClassificationEvaluator(Evaluator):
    """Loss and accuracy with the model's compiled loss and metric: every training example, at most --valid-size
    validation and --test-size test examples (from each split's start)."""
    model: object
    data: TaskData
    config: object

    def scores(self, split):
        limit = {"valid": self.config.valid_size, "test": self.config.test_size}.get(split)
        loss_sum = correct = examples = 0.0
        for batch in digits.evaluation_batches(self.data.splits[split], self.config.batch_size, limit):
            logs = self.model.test_on_batch(batch.inputs, batch.target_output, sample_weight=batch.weight,
                                            return_dict=True)
            count = batch.target_tokens
            loss_sum += float(logs["loss"]) * count
            correct += float(logs["accuracy"]) * count
            examples += count
        prefix = SPLIT_PREFIX[split]
        return {f"{prefix}_loss": loss_sum / examples, f"{prefix}_accuracy": correct / examples}, int(examples)

    def validate(self):
        scores, _ = self.scores("valid")
        return {"accuracy": scores["val_accuracy"], "loss": scores["val_loss"]}

    def evaluate(self, phase):
        metrics = {}
        with phase("evaluate"):
            for split, prefix in SPLIT_PREFIX.items():
                scores, examples = self.scores(split)
                metrics.update(scores)
                if split != "train":
                    metrics[f"{prefix}_examples"] = examples
        return metrics, {}
