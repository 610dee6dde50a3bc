"""The configuration of one training run: every knob that can change a figure is here, and all of it is
written beside the figures."""

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field

from mtbench.errors import MtbenchError
from mtbench.keras_models.initialization import INIT_SCHEMES  # noqa: F401 (re-exported: --init's choices)
from mtbench.keras_models.presets import GPT_PRESETS, PRESETS, PRESETS_BY_FAMILY, presets_for
from mtbench.figures import SIZE_KEYS
from mtbench.runner.data.formats import SACREBLEU_PREFIX
from mtbench.runner.data.token_files import is_token_folder
from mtbench.runner.loop.recipe import check_recipe_options

DEFAULT_STEPS = {"tiny": 40, "small": 450, "base": 2000}
# A language model's steps by preset: "char" trains as long as nanoGPT's Shakespeare-character run.
DEFAULT_STEPS_BY_FAMILY = {"gpt": {"tiny": 40, "small": 300, "char": 5000, "gpt2-small": 2000}}
DEFAULT_STEPS_BY_FAMILY["gpt2"] = DEFAULT_STEPS_BY_FAMILY["gpt"]
LANGUAGE_MODELLING = "language-modelling"
MAX_VOCABULARY = 2 ** 31 - 1  # token ids are 32-bit integers (sentencepiece's, the batches')
# The longest continuation of a prompt (generate's, --sample-prompt's): each token is a forward pass of the model, and
# the text prints once whole (10**20 tokens ran on without a word).
MAX_NEW_TOKENS = 100_000
# A plugin family's preset that says no steps (`ModelFamily.default_steps`) trains as long as its task's "small".
FALLBACK_PRESET = "small"


def plugin_family(name):
    """The registered model family `name` that is not built in, or None (then the run's family check names it)."""
    if name in PRESETS_BY_FAMILY:
        return None
    from mtbench.plugins.manager import registry
    return registry().models.get(name)


def family_presets(name):
    """{preset name: ModelPreset} that --preset chooses from for the model family `name`: a built-in family's own;
    a plugin's family's `presets` (plugin API 1.15), else its task's (a language model's are gpt's)."""
    family = plugin_family(name)
    if family is None:
        return presets_for(name)
    return getattr(family, "presets", None) or (GPT_PRESETS if family.task == LANGUAGE_MODELLING else PRESETS)


def checkpoint_block_size(model_name):
    """The block a pretrained checkpoint `--model NAME:DIR` is trained and read in where neither --block-size nor
    --max-len is given: its family's `default_block_size(DIR)`, the checkpoint's own context (GPT-2's 1,024, where
    nanoGPT fine-tunes it); None for the preset's (a family without a path, one that says none, or an unknown
    family, which the run's family check names)."""
    name, _, path = model_name.partition(":")
    if not path:
        return None
    from mtbench.plugins.manager import registry
    plugins = registry()
    family = plugins.models.get(name)
    if family is None:
        return None
    with plugins.plugin_code("models", name):
        return family.default_block_size(path)


def family_default_steps(name, preset):
    """The steps of a run of `preset` that gives neither --steps nor --epochs."""
    family = plugin_family(name)
    own = (getattr(family, "default_steps", None) or {}) if family is not None else {}
    if preset in own:
        return own[preset]
    language_model = name in DEFAULT_STEPS_BY_FAMILY or (family is not None and family.task == LANGUAGE_MODELLING)
    defaults = DEFAULT_STEPS_BY_FAMILY["gpt"] if language_model else DEFAULT_STEPS
    return defaults.get(preset, defaults[FALLBACK_PRESET])
# The model's shape from flags, over the preset's: config field -> ModelPreset field (`layers` sets both stacks).
SIZE_FIELDS = {"d_model": "d_model", "heads": "num_heads", "encoder_layers": "encoder_layers",
               "decoder_layers": "decoder_layers", "ff_dim": "ff_dim", "dropout": "dropout"}
# Long enough that the host queues steps ahead of a GPU, short enough that losses and figures stay fresh.
DEFAULT_TIMING_WINDOW = 10
DEFAULT_LOG_EVERY = 10
DTYPES = ("float32", "bfloat16", "float16", "mixed_bfloat16", "mixed_float16")
# --dtype auto: 16-bit matmuls where the device computes bfloat16 natively (as nanoGPT and JAX's GPU users train),
# float32 elsewhere; the run's configuration then holds the dtype chosen (`choices.choose_dtype`).
DTYPE_CHOICES = ("auto", *DTYPES)
AUTO_16_BIT = "mixed_bfloat16"
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# float32 matmuls: 'highest' is true float32 on both backends, 'high' lets both use TF32 (XLA's default on a GPU,
# not torch's). Set alike on both so that the arithmetic compared is the same.
MATMUL_PRECISIONS = ("highest", "high")
# The attention kernels: fused where the device has them (auto: the flash-attention extra where it can run, as its
# best users train), fused always (the extra; a refusal where it cannot run), or unfused on every device (the same
# plain operations on both backends).
ATTENTION_CHOICES = ("auto", "fused", "unfused")
FUSED_ATTENTION_EXTRA = "flash-attention"
# The train step: compiled where the backend's best users compile it (auto: JAX's step always is; torch's joins the
# torch-compile extra on a CUDA GPU, where its extras allow), compiled everywhere, or eager (a backend whose step
# compiles only through that extra).
STEP_CHOICES = ("auto", "compiled", "eager")
COMPILED_STEP_EXTRA = "torch-compile"
# Options that size what one extra does: refused without it (they would change nothing, and the result would say
# they were given). `setup.check_extra_options`.
EXTRA_OPTIONS = {"tensor_parallel_size": "tensor-parallel", "remat_policy": "remat",
                 "pipeline_micro_batches": "pipeline-parallel", "pipeline_schedule": "pipeline-parallel",
                 "pipeline_parallel_size": "pipeline-parallel"}
# What the remat extra recomputes: every block's activations, or all but its matrix products' outputs (kept).
REMAT_POLICIES = ("full", "matmuls")
# The pipeline-parallel extra's schedules: one forward and one backward in turn once the pipeline is full (at most a
# stage's count of micro-batches held), or every forward, then every backward (all of them held: GPipe).
PIPELINE_SCHEDULES = ("1f1b", "gpipe")


def comma_separated(text, option, item, kind):
    """The names of a comma-separated option (`option`'s `text`), each stripped; an empty entry between or after
    the commas refused, naming it `item` and what goes there `kind` (a run or a tracker left out by a slip of the
    keyboard would go unnoticed); no names for a text of blanks."""
    names = [name.strip() for name in text.split(",")]
    if text.strip() and not all(names):
        raise MtbenchError(f"{option} {text!r}: an empty {item} (two commas in a row, or one at an end); give a "
                           f"{kind} between each two")
    return [name for name in names if name]


def default_cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mtbench")


# The options that name a file a run reads (`TrainConfig.input_files`).
INPUT_FILE_KEYS = ("data_file", "valid_file", "test_file", "initial_weights")


@dataclass
class TrainConfig:
    backend: str = "jax"
    extras: tuple = ()
    dataset: str = "bible-en-fr"
    data_file: str = None          # a TSV file (source TAB target) used instead of a registered dataset
    preset: str = "small"
    model_name: str = "transformer"  # --model: a model family, NAME or NAME:PATH (marian:DIR)
    steps: int = None              # default: DEFAULT_STEPS of the preset, unless epochs is given
    epochs: float = None
    batch_size: int = 64
    grad_accum: int = 1            # micro-batches of --batch-size rows (or --max-tokens) a step sums gradients over
    max_tokens: int = None         # token batching: rows per length bucket chosen so rows x length <= this
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    # The optimizer over the model family's recipe (None: the family's; mtbench/runner/loop/recipe.py).
    weight_decay: float = None
    weight_decay_on: str = None    # all | matrices (weights of 2 or more dimensions: biases and norms left out)
    adam_beta1: float = None
    adam_beta2: float = None
    adam_epsilon: float = None
    min_learning_rate: float = None  # the cosine schedule's floor (default: the family's share of the peak)
    lr_decay_steps: int = None     # the step the decay reaches the floor at (nanoGPT's lr_decay_iters; default: the last)
    clip: str = None               # per-variable | global | none
    clip_norm: float = None
    max_pairs: int = None          # keep only the first N pairs of the corpus (before the split)
    valid_size: int = 500
    test_size: int = 500
    vocab_size: int = None         # default: the preset's
    vocab_size_given: bool = None  # whether --vocab-size was given (a value equal to the preset's is still asked for)
    max_len: int = None            # tokens per side, special tokens included; default: a checkpoint's, the preset's
    block_size: int = None         # a language model's block (its positions): sets max_len
    tokenizer: str = None          # a language model's tokens: byte (default), char or sentencepiece
    eval_stride: int = None        # a language model's evaluation windows move this many tokens (None: a block)
    # The model's size over the preset's (None: the preset's): --layers sets both stacks.
    layers: int = None
    encoder_layers: int = None
    decoder_layers: int = None
    d_model: int = None
    heads: int = None
    ff_dim: int = None
    dropout: float = None
    dtype: str = "float32"  # DTYPE_CHOICES; the command line's default is auto, resolved before plugins see it
    matmul_precision: str = "highest"  # float32 matmuls: 'highest' (true float32) or 'high' (TF32), both backends
    attention: str = "auto"        # ATTENTION_CHOICES: fused kernels where the device has them, always, or never
    step: str = "auto"             # STEP_CHOICES: a compiled step where its best users compile it, always, or never
    timing_window: int = DEFAULT_TIMING_WINDOW  # steady steps between device synchronisations (1: every step)
    log_every: int = DEFAULT_LOG_EVERY  # off a terminal, a training line every N steps (on one, the bar)
    compile_mode: str = "default"  # torch.compile's mode, for the torch-compile extra
    tensor_parallel_size: int = None  # the tensor-parallel extra's model axis (None: every device)
    remat_policy: str = None       # REMAT_POLICIES, for the remat extra (None: full)
    pipeline_micro_batches: int = None  # the pipeline-parallel extra's parts of a batch (None: 4 a stage)
    pipeline_parallel_size: int = None  # the pipeline-parallel extra's stages (None: every process)
    pipeline_schedule: str = None  # PIPELINE_SCHEDULES, for the pipeline-parallel extra (None: 1f1b)
    seed: int = 0
    init: str = None               # the scheme the weights are drawn with (None: the model family's; INIT_SCHEMES)
    initial_weights: str = None    # a weights file (.npz by variable path) instead of the numpy draw from seed
    decode_batch_size: int = 128
    beam: int = 1                  # hypotheses per sentence when translating; 1 is greedy decoding
    length_penalty: float = 0.6    # beam search's length normalisation exponent (GNMT)
    cache_dir: str = field(default_factory=default_cache_dir)
    compile_cache: bool = True     # keep compiled programs under cache_dir/compile for later runs (--no-compile-cache)
    out: str = None                # result JSON; default mtbench-results/<time>-<backend>.json
    overwrite: bool = False
    save_model: bool = True        # keep the final weights (and what rebuilds the model) in the run directory
    measure_only: bool = False     # benchmark mode: train and time only; no validation, evaluation, translation, saving
    profile_steps: int = 0         # steady steps traced by the backend's profiler (runner/loop/profiling.py); 0: none
    # Reading the user's corpus (mtbench/runner/formats.py)
    valid_file: str = None         # validation pairs in any format, instead of a split of the training data
    test_file: str = None          # test pairs in any format, or sacrebleu:NAME
    src_col: int = 1               # TSV columns, 1-based
    tgt_col: int = 2
    src_lang: str = None           # JSONL keys, Moses suffixes, sacrebleu language pair
    tgt_lang: str = None
    # Long runs: checkpoints (mtbench/runner/checkpoints.py) and time to target quality (target.py)
    checkpoint_every: int = None   # steps between checkpoints; None: only when interrupted
    keep_checkpoints: int = 3
    eval_every: int = None         # steps between validation BLEU evaluations
    target_bleu: float = None      # stop once validation BLEU reaches it
    target_loss: float = None      # stop once the validation loss falls to it (language models)
    sample_prompt: str = None      # a language model's continuation of this text at each validation
    sample_tokens: int = 100       # the continuation's length
    # Where the run is reported while it trains, and what it costs (docs/commands.md)
    report_to: tuple = ()          # experiment trackers (reporter names); "none" or empty: none
    logging_dir: str = None        # the trackers' local files; None: each tracker's default (--logging-dir's help)
    run_group: str = None          # the trackers' group of this run (compare sets it to the comparison's name)
    price_per_hour: float = None   # USD per hour of the machine, for the result's cost section

    def __post_init__(self):
        self.extras = tuple(self.extras)
        twice = sorted({extra for extra in self.extras if self.extras.count(extra) > 1})
        if twice:
            raise MtbenchError(f"extra '{twice[0]}' is given twice; give each extra once")
        self.report_to = self.report_to or ()
        if isinstance(self.report_to, str):
            self.report_to = comma_separated(self.report_to, "--report-to", "name", "tracker")
        self.report_to = tuple(name for name in dict.fromkeys(self.report_to) if name and name != "none")
        if self.model_name.endswith(":"):  # 'gpt:' trained the family's fresh model, as if no path were meant
            raise MtbenchError(f"--model {self.model_name}: give the checkpoint's directory after the colon, or "
                               f"the family's name alone")
        presets = family_presets(self.model_family[0])
        if self.preset not in presets:
            raise MtbenchError(f"unknown preset '{self.preset}' for --model {self.model_family[0]}; choose one of "
                               f"{', '.join(presets)}")
        model = presets[self.preset]
        if self.block_size is not None:
            if self.max_len is not None and self.max_len != self.block_size:
                raise MtbenchError("give --block-size or --max-len, not both")
            self.max_len = self.block_size
        if self.vocab_size_given is None:
            self.vocab_size_given = self.vocab_size is not None
        if self.vocab_size is None:
            self.vocab_size = model.vocab_size
        if self.max_len is None:
            self.max_len = checkpoint_block_size(self.model_name) or model.max_len
        if self.steps is None and self.epochs is None:
            self.steps = family_default_steps(self.model_family[0], self.preset)
        if self.steps is not None and self.epochs is not None:
            raise MtbenchError("give --steps or --epochs, not both")
        if self.dtype not in DTYPE_CHOICES:
            raise MtbenchError(f"unknown dtype '{self.dtype}'; choose one of {', '.join(DTYPE_CHOICES)}")
        if self.attention not in ATTENTION_CHOICES:
            raise MtbenchError(f"unknown --attention '{self.attention}'; choose one of {', '.join(ATTENTION_CHOICES)}")
        if self.attention == "unfused" and FUSED_ATTENTION_EXTRA in self.extras:
            raise MtbenchError(f"--attention unfused contradicts --extra {FUSED_ATTENTION_EXTRA}; give one of them")
        if self.attention == "fused" and FUSED_ATTENTION_EXTRA not in self.extras:
            self.extras = (*self.extras, FUSED_ATTENTION_EXTRA)
        if self.step not in STEP_CHOICES:
            raise MtbenchError(f"unknown --step '{self.step}'; choose one of {', '.join(STEP_CHOICES)}")
        if self.step == "eager" and COMPILED_STEP_EXTRA in self.extras:
            raise MtbenchError(f"--step eager contradicts --extra {COMPILED_STEP_EXTRA}; give one of them")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise MtbenchError(f"unknown matmul precision '{self.matmul_precision}'; choose one of "
                               f"{', '.join(MATMUL_PRECISIONS)}")
        if self.measure_only and (self.eval_every is not None or self.target is not None):
            raise MtbenchError("--measure-only skips validation; it cannot take --eval-every, --target-bleu or "
                               "--target-loss")
        if self.compile_mode not in COMPILE_MODES:
            raise MtbenchError(f"unknown compile mode '{self.compile_mode}'; choose one of {', '.join(COMPILE_MODES)}")
        if self.remat_policy not in (None, *REMAT_POLICIES):
            raise MtbenchError(f"unknown remat policy '{self.remat_policy}'; choose one of {', '.join(REMAT_POLICIES)}")
        if self.pipeline_schedule not in (None, *PIPELINE_SCHEDULES):
            raise MtbenchError(f"unknown pipeline schedule '{self.pipeline_schedule}'; choose one of "
                               f"{', '.join(PIPELINE_SCHEDULES)}")
        # Not --vocab-size: its bound is 16 (below), and a second of 1 here answered 0 and 1 with two rules.
        for name in ("batch_size", "steps", "valid_size", "test_size", "max_len",
                     "decode_batch_size", "beam", "max_pairs", "checkpoint_every", "keep_checkpoints",
                     "eval_every", "max_tokens", "timing_window", "log_every", "grad_accum", "sample_tokens",
                     "tensor_parallel_size", "eval_stride", "pipeline_micro_batches",
                     "pipeline_parallel_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                option = self.length_option if name == "max_len" else f"--{name.replace('_', '-')}"
                raise MtbenchError(f"{option} must be at least 1, got {value}")
        if not 0 <= self.seed < 2 ** 32:  # numpy's generators take no other
            raise MtbenchError(f"--seed must be from 0 to {2 ** 32 - 1}, got {self.seed}")
        # Written `not 0 < x < inf` so that NaN, which every comparison answers False, is refused too.
        if self.epochs is not None and not 0 < self.epochs < math.inf:
            raise MtbenchError(f"--epochs must be a positive finite number, got {self.epochs}")
        if not 0 < self.learning_rate < math.inf:
            raise MtbenchError(f"--learning-rate must be a positive finite number, got {self.learning_rate}")
        if not 0 <= self.length_penalty < math.inf:
            raise MtbenchError(f"--length-penalty must be a finite number, not negative, got {self.length_penalty}")
        if self.price_per_hour is not None and not 0 <= self.price_per_hour < math.inf:
            raise MtbenchError(f"--price-per-hour must be a finite number, not negative, got {self.price_per_hour}")
        check_recipe_options(self)
        if self.profile_steps < 0:
            raise MtbenchError(f"--profile must not be negative, got {self.profile_steps}")
        if self.warmup_steps < 0:
            raise MtbenchError(f"--warmup-steps must not be negative, got {self.warmup_steps}")
        if self.vocab_size < 16:
            raise MtbenchError(self._small_vocabulary_refusal())
        if self.vocab_size > MAX_VOCABULARY:  # sentencepiece failed on it only once the corpus was read
            raise MtbenchError(f"--vocab-size must be at most {MAX_VOCABULARY:,} (a 32-bit token id), got "
                               f"{self.vocab_size:,}")
        if self.max_len < 8:
            raise MtbenchError(f"{self.length_option} must be at least 8, got {self.max_len}")
        if self.eval_stride is not None and self.eval_stride > self.max_len:
            raise MtbenchError(f"--eval-stride {self.eval_stride} exceeds {self.length_option} {self.max_len}: the "
                               f"tokens between windows would never be scored")
        if self.max_tokens is not None and self.max_tokens < self.max_len:
            raise MtbenchError(f"--max-tokens {self.max_tokens} cannot hold one row of {self.length_option} "
                               f"{self.max_len} tokens; give at least {self.max_len}")
        self._check_corpus_and_long_run_options()
        self._check_model_size()
        if self.out is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            self.out = os.path.join("mtbench-results", f"{stamp}-{self.backend}.json")
        # The files a run reads, recorded absolute: its result read from another folder (a rerun of a shared result)
        # names the same files.
        for key in INPUT_FILE_KEYS:
            path = getattr(self, key)
            if path and not path.startswith(SACREBLEU_PREFIX):
                setattr(self, key, os.path.abspath(path))

    def _small_vocabulary_refusal(self):
        """The vocabulary under 16 refused, named where it came from: --vocab-size, or the preset (a plugin's
        family's own; the built-in presets have larger ones)."""
        if self.vocab_size_given:
            return f"--vocab-size must be at least 16, got {self.vocab_size}"
        family = self.model_family[0]
        from mtbench.plugins.manager import registry
        plugin = registry().provider.get(("models", family)) if plugin_family(family) else None
        return (f"preset '{self.preset}' of model family '{family}'" + (f" (plugin '{plugin}')" if plugin else "")
                + f" has a vocabulary of {self.vocab_size}; the vocabulary must be at least 16 (--vocab-size sets "
                  f"another)")

    def input_files(self):
        """The files the run reads (its corpus, validation and test files, initial weights): a result written over
        one would lose it, --overwrite or not."""
        return tuple(getattr(self, key) for key in INPUT_FILE_KEYS if getattr(self, key))

    def _check_corpus_and_long_run_options(self):
        if self.target_bleu is not None and not 0 < self.target_bleu <= 100:
            raise MtbenchError(f"--target-bleu must be in (0, 100], got {self.target_bleu}")
        if self.target_loss is not None and not 0 < self.target_loss < math.inf:
            raise MtbenchError(f"--target-loss must be a positive finite number, got {self.target_loss}")
        if self.target_bleu is not None and self.target_loss is not None:
            raise MtbenchError("give --target-bleu or --target-loss, not both")
        if self.sample_prompt is not None and self.eval_every is None:
            raise MtbenchError("--sample-prompt needs --eval-every N: the sample is printed at each validation")
        if self.sample_prompt == "":
            raise MtbenchError("--sample-prompt is empty: give the text to continue")
        if self.target is not None and self.eval_every is None:
            flag = "--target-bleu" if self.target_bleu is not None else "--target-loss"
            raise MtbenchError(f"{flag} needs --eval-every N: how often to evaluate the validation split")
        if None not in (self.eval_every, self.steps) and self.epochs is None and self.eval_every > self.steps:
            raise MtbenchError(f"--eval-every {self.eval_every} exceeds --steps {self.steps}: no validation would run "
                               f"while training")
        if self.sample_tokens != 100 and self.sample_prompt is None:
            raise MtbenchError("--sample-tokens is the length of --sample-prompt's continuation; give --sample-prompt")
        if self.sample_tokens > MAX_NEW_TOKENS:
            raise MtbenchError(f"--sample-tokens must be at most {MAX_NEW_TOKENS:,} (a forward pass of the model a "
                               f"token, at every validation), got {self.sample_tokens:,}")
        if self.logging_dir is not None and not self.report_to:
            raise MtbenchError("--logging-dir is where --report-to's trackers write; give --report-to")

    def _check_model_size(self):
        """Impossible shapes end here, before anything is built."""
        for name in SIZE_KEYS:
            value = getattr(self, name)
            if value is not None and name != "dropout" and value < 1:
                raise MtbenchError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if self.layers is not None and (self.encoder_layers is not None or self.decoder_layers is not None):
            raise MtbenchError("give --layers (both stacks), or --encoder-layers/--decoder-layers, not both")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise MtbenchError(f"--dropout must be in [0, 1), got {self.dropout}")
        model = self.model
        if model.d_model % model.num_heads:
            raise MtbenchError(f"--d-model {model.d_model} is not divisible by --heads {model.num_heads}: each "
                               f"head needs a whole share of the model dimension")

    def rows_for(self, length):
        """Rows of a training step's batch whose bucket is `length` tokens long: --grad-accum micro-batches of
        --batch-size rows, or with --max-tokens of as many as fit (a multiple of 8 from 8 rows on, the shapes tensor
        cores and device counts divide)."""
        if self.max_tokens is None:
            return self.batch_size * self.grad_accum
        rows = self.max_tokens // length
        return (rows - rows % 8 if rows >= 8 else rows) * self.grad_accum

    def size_overrides(self):
        """{ModelPreset field: value} that the size flags set over the preset."""
        overrides = {SIZE_FIELDS[name]: getattr(self, name) for name in SIZE_FIELDS if getattr(self, name) is not None}
        if self.d_model is not None and self.ff_dim is None:
            # The feed-forward keeps the preset's width per model dimension (4x in GPT-2 and nanoGPT, whose
            # `n_embd` alone sets it): `--d-model 64` on `char` is nanoGPT's 64-wide model, not one of 1,536 units.
            preset = self.preset_model
            overrides["ff_dim"] = max(1, round(self.d_model * preset.ff_dim / preset.d_model))
        if self.layers is not None:
            overrides.update(decoder_layers=self.layers, **({} if self.decoder_only else {"encoder_layers": self.layers}))
        return overrides

    @property
    def target(self):
        """(metric, value) of the quality a run stops at (--target-bleu, --target-loss), or None."""
        if self.target_bleu is not None:
            return "bleu", self.target_bleu
        if self.target_loss is not None:
            return "loss", self.target_loss
        return None

    @property
    def preset_model(self):
        """The preset --preset names for the run's model family, as it is (`model` with the run's flags over it)."""
        return family_presets(self.model_family[0])[self.preset]

    @property
    def model(self):
        """The model shape: the preset with this run's size flags, vocabulary and length."""
        return dataclasses.replace(self.preset_model, vocab_size=self.vocab_size, max_len=self.max_len,
                                   **self.size_overrides())

    @property
    def decoder_only(self):
        return self.preset_model.encoder_layers == 0

    @property
    def length_option(self):
        """The option the length was set by, or is set by for this model: --block-size where it was given or the
        model is decoder-only, else --max-len."""
        return "--block-size" if self.block_size is not None or self.decoder_only else "--max-len"

    @property
    def model_family(self):
        """(family name, path or None) of --model NAME[:PATH]."""
        name, _, path = self.model_name.partition(":")
        return name, (path or None)

    @property
    def corpus_name(self):
        return os.path.basename(self.data_file) if self.data_file else self.dataset

    @classmethod
    def from_options(cls, **options):
        """The configuration of a command's options: an option not given (None) leaves the field's default."""
        return cls(**{name: value for name, value in options.items() if value is not None})

    @classmethod
    def recorded_in(cls, path, data):
        """`from_dict` of the configuration recorded in the file `path` (a run file, a saved model's description);
        one that cannot be read is named with its file."""
        try:
            return cls.from_dict(data)
        except (MtbenchError, TypeError) as error:
            raise MtbenchError(f"{path}: {error}") from None

    @classmethod
    def from_dict(cls, data):
        """The configuration `to_dict` wrote; its derived `model` entry is rebuilt from the preset, and `task`
        (which a result records) follows from the model family."""
        names = {f.name for f in dataclasses.fields(cls)}
        # Written before the family recipes: those runs trained with translation's recipe, whatever the model.
        legacy = {"weight_decay_on": "all", "adam_beta1": 0.9, "adam_beta2": 0.98, "adam_epsilon": 1e-9,
                  "clip": "per-variable", "clip_norm": 1.0}
        if "clip" not in data:
            data = {**legacy, "min_learning_rate": 0.1 * data.get("learning_rate", 1e-3), **data}
        # Written before --init: every run drew mtbench's first scheme.
        data = {"init": "glorot", **data}
        # Written before --attention existed: those runs attended unfused unless the extra was given.
        data = {"attention": "unfused" if FUSED_ATTENTION_EXTRA not in data.get("extras", ()) else "auto", **data}
        # Written before --step: torch's step was compiled only where the extra was given.
        eager = data.get("backend") == "torch" and COMPILED_STEP_EXTRA not in data.get("extras", ())
        data = {"step": "eager" if eager else "auto", **data}
        # Written before gpt's char preset read a text by its characters where --tokenizer was not given: by bytes.
        if data.get("model_name") == "gpt" and data.get("preset") == "char" and "tokenizer" in data and \
                data["tokenizer"] is None and not is_token_folder(data.get("data_file")):
            data = {**data, "tokenizer": "byte"}
        unknown = sorted(set(data) - names - {"model", "task"})
        if unknown:
            raise MtbenchError(f"unknown configuration keys {', '.join(unknown)} (written by another mtbench "
                               "version?)")
        cls._check_recorded_types(data)
        config = cls(**{key: value for key, value in data.items() if key in names})
        if "vocab_size_given" not in data:  # written before it was: a vocabulary other than the preset's was given
            config.vocab_size_given = config.vocab_size != config.preset_model.vocab_size
        return config

    @classmethod
    def _check_recorded_types(cls, data):
        """A recorded configuration (a run file, a result, a resumed run's) whose values are not of their fields'
        kinds is refused by key, where it failed deep inside the run ('float' object cannot be interpreted as an
        integer, blamed on a plugin). null stands for the default where the default is null."""
        kinds = {int: (int,), float: (int, float), str: (str,), bool: (bool,), tuple: (list, tuple)}
        for field_ in dataclasses.fields(cls):
            value, wanted = data.get(field_.name), kinds.get(field_.type)
            defaults_to_null = field_.default is None
            if field_.name not in data or wanted is None or (value is None and defaults_to_null):
                continue
            wrong = not isinstance(value, wanted) or (isinstance(value, bool) and bool not in wanted) or (
                field_.type is tuple and not all(isinstance(item, str) for item in value))
            if wrong:
                kind = {tuple: "a list of names", bool: "true or false", int: "an integer", float: "a number",
                        str: "a string"}[field_.type]
                raise MtbenchError(f"{field_.name}: {json.dumps(value)} is not {kind}")

    def to_dict(self):
        data = dataclasses.asdict(self)
        data["extras"] = list(self.extras)
        data["report_to"] = list(self.report_to)
        data["model"] = self.model.to_dict()
        return data


def decoding_name(beam, length_penalty):
    """How a run translates, as results and reports name it."""
    return "greedy" if beam == 1 else f"beam {beam}, length penalty {length_penalty:g}"
