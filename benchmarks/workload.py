"""The workload every benchmark and baseline trains on: mtbench's real batches, its model and its optimizer.

Native baselines are only comparable when they see the very batches, initial weights and optimizer settings
mtbench's step sees, so all of them come from here, and the optimizer settings are read back from the Keras
optimizer that `compile_model` built rather than restated."""

import dataclasses
from dataclasses import dataclass

from mtbench.runner.data.batches import encode_split, training_batches
from mtbench.runner.config import TrainConfig
from mtbench.runner.data.corpus import load_corpus
from mtbench.runner.data.tokenizer import load_or_train_tokenizer


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW with linear warm-up from 0 and cosine decay to `alpha * learning_rate`; gradients clipped to
    `clipnorm` each on its own (`clip` 'per-variable', Keras's `clipnorm`), all together ('global') or not at all
    ('none'); decoupled weight decay on every variable (`decay` 'all') or on the matrices alone ('matrices')."""
    learning_rate: float
    warmup_steps: int
    decay_steps: int
    alpha: float
    weight_decay: float
    beta_1: float
    beta_2: float
    epsilon: float
    clipnorm: float
    clip: str = "per-variable"
    decay: str = "all"

    @classmethod
    def of_keras_optimizer(cls, optimizer):
        schedule = optimizer._learning_rate  # the schedule object; `learning_rate` reads its current value
        clip = "per-variable" if optimizer.clipnorm else "global" if optimizer.global_clipnorm else "none"
        # `compile_model` excludes exactly the vectors when the recipe decays the matrices alone.
        decay = "matrices" if getattr(optimizer, "_exclude_from_weight_decay", None) else "all"
        return cls(learning_rate=float(schedule.warmup_target), warmup_steps=int(schedule.warmup_steps),
                   decay_steps=int(schedule.decay_steps), alpha=float(schedule.alpha),
                   weight_decay=float(optimizer.weight_decay), beta_1=float(optimizer.beta_1),
                   beta_2=float(optimizer.beta_2), epsilon=float(optimizer.epsilon),
                   clipnorm=float(optimizer.clipnorm or optimizer.global_clipnorm or 0.0), clip=clip, decay=decay)

    @classmethod
    def of_config(cls, config, total_steps):
        """The settings `mtbench train` gives its Keras optimizer for `config` over `total_steps`, without keras."""
        from mtbench.runner.loop.recipe import optimizer_recipe
        recipe = optimizer_recipe(config, total_steps)
        return cls(**{name: recipe[name] for name in ("learning_rate", "warmup_steps", "decay_steps", "alpha",
                                                       "weight_decay", "beta_1", "beta_2", "epsilon", "clip",
                                                       "decay")},
                   clipnorm=recipe["clip_norm"])

    def decays(self, shape):
        """Whether a variable of `shape` (Keras's layout) is decayed."""
        return self.decay == "all" or len(shape) >= 2


@dataclass
class Workload:
    config: TrainConfig
    vocab_size: int
    batches: list  # mtbench `Batch` objects, in the order training would see them
    text: object = None  # a language model's `TaskData`: its tokenizer and encoded splits (validation's blocks)

    @property
    def model_shape(self):
        return dataclasses.replace(self.config.model, vocab_size=self.vocab_size)


def prepare_workload(config, steps, length=None):
    """The first `steps` training batches mtbench would train on for `config`; with `length`, only batches of
    that bucket length (one compiled shape, so every timed step does the same work). A language model's
    (`--model gpt`) batches all have its block's length."""
    if config.model_family[0] == "gpt":
        return prepare_text_workload(config, steps)
    from mtbench.plugins import manager as plugins
    corpus = load_corpus(config, plugins.registry(), progress=lambda done, total: None)
    tokenizer = load_or_train_tokenizer(corpus.train, config.vocab_size, config.cache_dir)
    split = encode_split(corpus.train, tokenizer, config.max_len)
    batches = []
    for epoch, batch in training_batches(split, config.batch_size, config.max_len, config.seed):
        if epoch > 0 and not batches:
            break  # a whole pass over the data held no batch of that length: there is none to find
        if length is None or batch.shape[1] == length:
            batches.append(batch)
        if len(batches) == steps:
            break
    return Workload(config=config, vocab_size=tokenizer.vocab_size, batches=batches)


def prepare_text_workload(config, steps):
    """The first `steps` batches the language-modelling task trains `config`'s model on: its tokens (bytes by
    default, `config.tokenizer` else, built on the training split as `mtbench train` builds them) of the text's
    training split (`config.data_file`, else the built-in corpus's source side), random windows of
    `config.max_len` tokens; and the task's data, whose validation split a reference is scored on."""
    from itertools import islice

    from mtbench.plugins import manager as plugins
    from mtbench.runner.data.text import read_text
    from mtbench.runner.tasks.language_modelling import LanguageModellingTask
    task = LanguageModellingTask()
    data = task.prepare(config, read_text(config, plugins.registry(), progress=lambda done, total: None), None)
    batches = [batch for _, batch in islice(task.batches(data, config), steps)]
    return Workload(config=config, vocab_size=data.tokenizer.vocab_size, batches=batches, text=data)


def prepare_benchmark(config, steps, length, fused_attention=False):
    """What a benchmark process sets up first: keras imported on `config.backend` (as `mtbench train` imports
    it), the workload of `steps` batches of bucket `length`, and the run context. With `fused_attention`, the
    attention kernels are the fused ones where the flash-attention extra could run here (as `--attention auto`
    chooses), else the plain ones. Returns (keras, backend, run, workload)."""
    from types import SimpleNamespace

    from mtbench.plugins import manager as plugins
    from mtbench import RunContext
    from mtbench.runner.setup import choose_attention_kernels, import_keras, read_model_family, set_matmul_precision
    backend = plugins.registry().backends[config.backend]
    keras = import_keras(config, backend)
    workload = prepare_workload(config, steps, length=length)
    if not workload.batches:
        raise SystemExit(f"no batch of length {length} in the corpus; try another --length")
    # The model's shape, as a run knows it before building: what a dispatcher choosing by its inputs is asked about.
    run = RunContext(config=config, backend=backend, device=backend.device_info(), model_shape=workload.model_shape)
    # What the family tells a run before its model is built: the attention probabilities it drops, which fused
    # kernels refuse (the flash-attention extra's check below, as in `mtbench train`).
    read_model_family(run, plugins.registry().lookup("models", config.model_family[0]))
    # The arithmetic and attention kernels `mtbench train` sets, for every contestant of the process alike.
    run.matmul_precision = set_matmul_precision(backend, config.matmul_precision)
    if fused_attention:
        flash = plugins.registry().extras.get("flash-attention")
        if flash is not None and backend.name in flash.backends and flash.unavailable_reason(run) is None:
            flash.before_model(run)  # the model options a run with the extra builds with
    run.attention = choose_attention_kernels(run, SimpleNamespace(backend=backend, registry=plugins.registry()))
    return keras, backend, run, workload


def drawn_weights(model, config):
    """mtbench's numpy draw of `model`'s weights for `config`, by the scheme a run of it draws with (--init, else
    its model family's)."""
    from mtbench.keras_models.initialization import initial_weights
    from mtbench.plugins import manager
    from mtbench.runner.setup import drawn_init
    family = manager.registry().lookup("models", config.model_family[0])
    return initial_weights(model, config.seed, drawn_init(config, family).init)


def build_keras_model(keras, workload, total_steps, flash_attention=False):
    """mtbench's model with its numpy-drawn initial weights, compiled by mtbench's own `compile_model`, under
    the workload's dtype policy (keras must already be imported with the wanted backend); `flash_attention`:
    the causal attention's model option (`run.model_options`: True asks Keras for the fused kernel, None leaves
    the backend's dispatcher to pick among the fused kernels it holds the process to)."""
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.initialization import assign_weights
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.runner.setup import compile_model
    keras.utils.set_random_seed(workload.config.seed)
    keras.config.set_dtype_policy(workload.config.dtype)
    build = build_gpt if workload.config.model_family[0] == "gpt" else build_transformer
    model = build(workload.model_shape, flash_attention=flash_attention)
    assign_weights(model, drawn_weights(model, workload.config))
    compile_model(keras, model, workload.config, total_steps, {})
    return model
