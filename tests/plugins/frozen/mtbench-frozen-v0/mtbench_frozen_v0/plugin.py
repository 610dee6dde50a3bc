"""FROZEN (see README.md): written against mtbench's plugin guide before the plugin API had a version. Do not
edit; mtbench must keep running it as it is."""

import json
import os

from mtbench import Extra, KerasTrainStep, ModelFamily, Reporter, hookimpl

LOG_ENV = "MTBENCH_FROZEN_LOG"


def append_line(record):
    path = os.environ.get(LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


class OneLine(Reporter):
    """The README's reporter, as it was written before `report` took `complete`."""
    name = "frozen-oneline"
    description = "one line per run"

    def report(self, result, console):
        bleu = result["metrics"]["bleu"]
        console.print(f"FROZEN-ONELINE {result['backend']}: {result['timing']['steps']} steps, "
                      f"BLEU {'n/a' if bleu is None else f'{bleu:.2f}'}", highlight=False, soft_wrap=True)


class CsvTracker(Reporter):
    """The guide's tracker outline."""
    name = "frozen-csv"
    description = "experiment tracker: one CSV line per figure, in the run directory"

    def start(self, run):
        folder = run.logging_dir or run.directory
        os.makedirs(folder, exist_ok=True)
        self.file = open(os.path.join(folder, "figures.csv"), "a", encoding="utf-8")

    def log(self, metrics, step):
        for name, value in metrics.items():
            self.file.write(f"{step},{name},{value}\n")
        self.file.flush()

    def report(self, result, console, complete):
        self.file.close()


class CountingKerasStep(KerasTrainStep):
    name = "frozen-counted-keras"

    def __init__(self, model, state):
        super().__init__(model)
        self.state = state

    def __call__(self, x, y, sample_weight):
        self.state["calls"] += 1
        return super().__call__(x, y, sample_weight)


class CountSteps(Extra):
    """An extra of the time before `make_train_step` received the step chosen so far: it replaces the step."""
    name = "frozen-count"
    description = "trains with Keras's own step and counts its calls"
    backends = ("jax", "torch")

    def make_train_step(self, run, model):
        run.extras_state[self.name] = {"calls": 0}
        return CountingKerasStep(model, run.extras_state[self.name])


class FrozenTransformer(ModelFamily):
    """A model family with the methods the guide listed: mtbench's Transformer under another name."""
    name = "frozen-transformer"
    description = "mtbench's Transformer, as a plugin family of the unversioned API"

    def check(self, path, config):
        pass

    def tokenizer(self, path, config):
        return None

    def build(self, run, path, tokenizer, max_len):
        import dataclasses

        from mtbench.keras_models.transformer import build_transformer
        shape = dataclasses.replace(run.config.model, vocab_size=tokenizer.vocab_size, max_len=max_len)
        return build_transformer(shape, **run.model_options), shape

    def pretrained_weights(self, path, model):
        return None

    def save(self, path, model_shape, directory):
        return {}

    def load_saved(self, directory, description):
        return None, None


def batch_counter(config):
    import keras

    class BatchCounter(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1

        def on_train_end(self, logs=None):
            append_line({"kind": "callback", "backend": config.backend, "batches": self.batches})

    return BatchCounter()


@hookimpl
def mtbench_register_reporters(register):
    register(OneLine())
    register(CsvTracker())


@hookimpl
def mtbench_register_extras(register):
    register(CountSteps())


@hookimpl
def mtbench_register_models(register):
    register(FrozenTransformer())


@hookimpl
def mtbench_keras_callbacks(config):
    if os.environ.get(LOG_ENV) is None:
        return None
    return [batch_counter(config)]
