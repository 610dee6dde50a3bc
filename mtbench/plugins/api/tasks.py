"""Tasks: what a run trains on and how it is scored. A model family declares its task (`ModelFamily.task`); the
runner's stages ask the task what to read, how to batch it, what tokens/s counts and what to evaluate, so the
runner has no branch per task. Register one from `mtbench_register_tasks`.

The stages call, in this order: `check` (before anything is imported), `read` (before the framework is imported:
a bad file fails in a second), `prepare` (with the tokenizer the model family brings, or None), then `batches`
and `batches_per_epoch` for training, and, with the trained model, `evaluator` once: its `validate` at every
--eval-every step and its `evaluate` once training completed."""

from dataclasses import dataclass, field

from mtbench.errors import MtbenchError


@dataclass
class TaskData:
    """A task's prepared data: the tokenizer the model is built for, the task's own splits, and what the result
    and the terminal show of them."""
    tokenizer: object        # a `Tokenizer` (its `vocab_size` sizes the model; saved beside a trained model)
    splits: dict             # the task's own: {'train': ..., 'valid': ..., 'test': ...}
    fingerprint: str         # changes whenever the training data would (guards --resume)
    record: dict             # the result's `data` section: what was read, kept and how it was split
    lines: list = field(default_factory=list)  # printed before training


class Evaluator:
    """A trained model's scoring, made once per run (`Task.evaluator`)."""

    def validate(self):
        """{figure: value} on the validation split with the weights so far; it holds the task's
        `validation_metric`."""
        raise NotImplementedError

    def evaluate(self, phase):
        """(metrics, sidecar) once training completed: `metrics` fills the result's `metrics` (every key of
        `Task.metrics`); `sidecar` {result key: value} adds top-level entries (files written beside the result).
        `phase(name)` is a context that times a part of the evaluation apart (`timing.phases_s`)."""
        raise NotImplementedError

    def before_training(self):
        """The test figures of the starting weights, for a pretrained family (what fine-tuning is measured
        against), or None."""
        return None


class Task:
    """A kind of training and its scoring. `metrics` are the keys its evaluation fills (null in a partial
    result); `quality_figures` the keys of `mtbench.FIGURES` its tables show; `validation_metric` what
    --eval-every measures and a --target-* aims at (`higher_is_better` says which way is better)."""
    name = ""
    description = ""
    metrics = ()
    quality_figures = ()
    validation_metric = ""
    higher_is_better = True
    # Top-level result keys of the files `Evaluator.evaluate` writes beside the result (null until it does).
    result_files = ()

    def check(self, config):
        """Raises `MtbenchError` with one line for an option this task does not take (before anything is
        imported)."""

    def refuse_options(self, config, unset, why, flags=None):
        """A helper for `check`: raises `MtbenchError` for the first option of `unset` ({configuration key: its value
        when not given}) that `config` sets, as '--FLAG WHY'; `flags` names a key's flag where it is not the key
        with dashes ({'data_file': 'data'})."""
        for name, value in unset.items():
            if getattr(config, name) != value:
                raise MtbenchError(f"--{(flags or {}).get(name, name.replace('_', '-'))} {why}")

    def read(self, config, registry, progress):
        """The raw data (the task's own type), read before the framework is imported. `registry` looks up
        datasets (`registry.lookup('datasets', name)`); `progress(done, total)` reports reading."""
        raise NotImplementedError

    def prepare(self, config, raw, tokenizer):
        """The `TaskData` of `raw`: `tokenizer` is the model family's own, or None for the task's default."""
        raise NotImplementedError

    def batches(self, data, config, skip=0):
        """Endless (epoch, `Batch`) of the training split, the same on every backend for one seed; `skip`
        passes over the first batches (a resumed run). A batch's `weight` marks the tokens the loss counts, and
        tokens/s counts them. A batch is one step's: `config.rows_for(length)` rows, --grad-accum's micro-batches
        together, which the train step splits."""
        raise NotImplementedError

    def batches_per_epoch(self, data, config):
        raise NotImplementedError

    def evaluator(self, model, data, config, compile_inference):
        """The `Evaluator` of `model` on `data`; `compile_inference(fn)` compiles a function that calls the model
        the way the backend runs inference fastest."""
        raise NotImplementedError

    def load_tokenizer(self, directory, description):
        """The tokenizer `Tokenizer.save` wrote into a saved model's `directory` (`description`: what
        `describe()` recorded), for a family that brings none."""
        raise NotImplementedError(f"task '{self.name}' cannot reload a saved tokenizer")
