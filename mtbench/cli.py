"""The command line: parsing and presentation only; the work is in mtbench.runner."""

import functools
import json
import math
import os
import re
import sys
import time
import traceback
import warnings

import click
from rich.console import Console
from rich.table import Table

# mtbench's own deprecations are a plugin's author's to see, and a plugin's module is never __main__, where
# Python's filters alone show a DeprecationWarning.
warnings.filterwarnings("default", r"mtbench\.", DeprecationWarning)

from mtbench.plugins import manager as plugins
from mtbench.errors import MtbenchError, ReportingFailed
from mtbench.plugins.api import PLUGIN_API_VERSION
from mtbench.keras_models.presets import GPT_PRESETS, PRESETS
from mtbench.runner.loop.recipe import CLIP_CHOICES, DECAY_CHOICES
from mtbench.runner.config import (ATTENTION_CHOICES, COMPILE_MODES, DEFAULT_LOG_EVERY, DEFAULT_TIMING_WINDOW,
                                   DTYPE_CHOICES, DTYPES, INIT_SCHEMES, INPUT_FILE_KEYS, MATMUL_PRECISIONS,
                                   MAX_NEW_TOKENS, PIPELINE_SCHEDULES, REMAT_POLICIES, STEP_CHOICES, TrainConfig)
from mtbench.runner.results.parity import FLOAT32_PARITY_TOLERANCE, PARITY_STEPS, PARITY_TOLERANCE
from mtbench.runner.results.report import SWEEP_KEYS

EVAL_STRIDE_HELP = ("A language model's evaluation windows of --block-size tokens, each N tokens after the one before "
                    "and scoring only its last N, so that every token after the first block is predicted from at "
                    "least block - N + 1 tokens of context (a whole block at N = 1)")
PARITY_TOLERANCE_HELP = (f"Largest relative loss difference allowed between runs of the same dtype [default: "
                         f"{FLOAT32_PARITY_TOLERANCE:g} for float32, step by step; {PARITY_TOLERANCE:g} for 16-bit "
                         f"runs, over 10-step means, their first 5 steps step by step to a quarter of it].")

def _fail(message, code):
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def handle_errors(command):
    """One line and a non-zero exit for every failure; the traceback only with --debug."""

    @functools.wraps(command)
    def wrapper(*args, debug=False, **kwargs):
        try:
            return command(*args, **kwargs)
        except MtbenchError as error:
            if debug:
                traceback.print_exc()
            _fail(_naming_the_config_file(str(error)), error.exit_code)
        except KeyboardInterrupt as stop:  # a child's run stopped by a SIGTERM passed on to it says 143
            _fail(str(stop) or "interrupted", getattr(stop, "exit_code", 130))
        except Exception as error:  # an mtbench bug or a framework failure: still one line unless --debug
            if debug:
                traceback.print_exc()
            name = click.get_current_context().info_name  # --debug is the command's option, not mtbench's
            _fail(f"{type(error).__name__}: {error} (rerun with `mtbench {name} ... --debug` for the traceback)", 1)

    return click.option("--debug", is_flag=True, help="Show the traceback of a failure.")(wrapper)


def _check_not_read_here(out, *reads):
    """Refuses an --out that is a file this command reads besides the run's own (`TrainConfig.input_files`):
    --config's, a run file, even with --overwrite."""
    from mtbench.runner.results.output import check_not_read
    context = click.get_current_context(silent=True)
    config_file = context and context.meta.get("mtbench.config_file")
    check_not_read(out, [path for path in (config_file, *reads) if path])


def _naming_the_config_file(message):
    """`message` about a value that --config's file gave, not the command line (it names the flag first: '--steps
    must be at least 1, got -1'), said of the file, as the file's other errors are: the user typed no --steps.
    A message that names its flags later ('give --steps or --epochs, not both') is said of the file where the file
    gave every one of them."""
    context = click.get_current_context(silent=True)
    path = context and context.meta.get("mtbench.config_file")
    if not path:
        return message
    options = {opt: param for param in context.command.params if isinstance(param, click.Option)
               for opt in param.opts}
    named = [options[flag] for flag in re.findall(r"--[a-z0-9-]+\b", message) if flag in options]
    from_file = lambda param: context.get_parameter_source(param.name) == click.core.ParameterSource.DEFAULT_MAP
    if re.match(r"--[a-z0-9-]+\b", message):
        return f"--config {path}: {message[2:]}" if named and from_file(named[0]) else message
    return f"--config {path}: {message}" if named and all(map(from_file, named)) else message


def _warn_broken_plugins(registry):
    for warning in registry.warnings:
        click.echo(f"Warning: {warning}", err=True)
    registry.echo_warnings = True  # later ones (a hook failing during the run) as they happen


def _extras_help():
    try:  # help must render even when a plugin is broken
        extras = plugins.registry().extras
        if not extras:
            return " None installed."
        return " Installed: " + "; ".join(f"{e.name} ({', '.join(e.backends)})" for e in extras.values()) + "."
    except Exception:
        return ""


class OutputWithoutReader:
    """sys.stdout, where a reader that leaves early (`| head`) ends the output, not the command: the rest goes to
    the null device and the command ends with its own exit status. click ended it at once with status 1 and no
    word, which a CI shell with `pipefail` read as a failed gate that had passed."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_the_null_device()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_the_null_device()

    def _to_the_null_device(self):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class OneLineErrors(click.Group):
    """Usage errors in one line too (click's default repeats the usage text above the error)."""

    def main(self, *args, **kwargs):
        if not isinstance(sys.stdout, OutputWithoutReader) and hasattr(sys.stdout, "fileno"):
            sys.stdout = OutputWithoutReader(sys.stdout)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.Abort:
            _fail("interrupted", 130)
        except click.ClickException as error:
            _fail(error.format_message(), error.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=OneLineErrors)
@click.version_option(package_name="mtbench")
def main():
    """Train one Keras 3 Transformer (translation or a language model) on JAX or PyTorch and report honest
    figures."""


class _GivenPath(click.Path):
    """click.Path that refuses an empty string, which the run read as the option not given: `--data ''` trained
    the built-in corpus, `--resume ''` a new run, `--cache-dir ''` wrote into the working directory."""

    def convert(self, value, param, ctx):
        if value == "":
            self.fail("'' names no file or folder: give one, or leave the option out", param, ctx)
        return super().convert(value, param, ctx)


class _FloatNamingItsVariable(click.ParamType):
    """A float that, read from the option's environment variable, names the variable where it is no number: the
    user gave no flag."""
    name = "float"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        try:
            return float(value)
        except ValueError:
            from_environment = ctx and ctx.get_parameter_source(param.name) == click.core.ParameterSource.ENVIRONMENT
            self.fail(f"{param.envvar}={value!r} is not a number" if from_environment
                      else f"{value!r} is not a valid float", param, ctx)


def _stack(options):
    """One decorator applying `options` as if stacked above the command in the order listed."""

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def _parameter_names(options):
    """The names of the parameters that `options` (click decorators) give a command, in their order."""
    return tuple(parameter.name for parameter in reversed(_stack(options)(lambda: None).__click_params__))


# Off a terminal (a CI log, a pipe) rich assumes 80 columns and cuts a table's cells with "…": the intervals,
# dates and commits a log is kept for. There, unless COLUMNS says otherwise, tables are as wide as they need.
UNCUT_WIDTH = 1000


def output_console(**options):
    """rich's Console, as wide as its tables need where it writes to no terminal."""
    console = Console(markup=False, **options)  # user text as given: a path "corp[red].tsv" is no markup
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = UNCUT_WIDTH
    return console


CORPUS_OPTIONS = (
    click.option("--valid", "valid_file", type=_GivenPath(), metavar="CORPUS",
                 help="Validation pairs in any --data format, instead of a split of the training data."),
    click.option("--test", "test_file", type=_GivenPath(), metavar="CORPUS",
                 help="Test pairs in any --data format, or sacrebleu:NAME for a sacrebleu test set already in its "
                      "local cache (e.g. sacrebleu:wmt14)."),
    click.option("--src-col", type=int, metavar="N", default=1, show_default=True,
                 help="TSV column of the source (1-based)."),
    click.option("--tgt-col", type=int, metavar="N", default=2, show_default=True,
                 help="TSV column of the target (1-based)."),
    click.option("--src-lang", metavar="LANG",
                 help="Source language: the JSONL key, the Moses file suffix, the sacrebleu pair."),
    click.option("--tgt-lang", metavar="LANG", help="Target language (as --src-lang)."),
)

# The options that make up a run's configuration, shared by `train`, `init-weights` and `compare` (which
# passes them on to every run), so the three cannot drift apart.
RUN_CONFIGURATION_OPTIONS = (
    click.option("--model", "model_name", default="transformer", show_default=True, metavar="NAME[:DIR]",
                 help="Model family: transformer (mtbench's, sized by --preset and the size flags), gpt (a decoder-only "
                      "language model, scored by perplexity and bits per byte), marian:DIR (a MarianMT checkpoint "
                      "directory as transformers saves it, fine-tuned) or gpt2:DIR (a GPT-2 checkpoint directory, "
                      "fine-tuned as a language model with its own tokenizer; sized by it, --preset sets the rest)."),
    click.option("--dataset", default="bible-en-fr", show_default=True, help="Registered dataset (see `mtbench plugins`)."),
    click.option("--data", "data_file", type=_GivenPath(dir_okay=True), metavar="CORPUS",
                 help="Your corpus instead of --dataset: FILE.tsv, FILE.jsonl (each may be .gz) or a Moses PREFIX "
                      "(PREFIX.SRC and PREFIX.TGT, with --src-lang/--tgt-lang); for a language model a text FILE, a "
                      "folder of .txt files, or a folder of nanoGPT's token files (train.bin, val.bin)."),
    click.option("--preset", default="small", show_default=True,
                 help=f"Model size: {', '.join(PRESETS)} (transformer); {', '.join(GPT_PRESETS)} (gpt); a plugin's "
                      f"model family may bring its own."),
    click.option("--steps", type=int, help="Training steps (default: per preset; transformer tiny 40, small 450, base 2000; gpt tiny 40, small 300, char 5000, gpt2-small 2000)."),
    click.option("--epochs", type=float, help="Train for this many passes over the training split instead of --steps; sentence pairs train in full batches only, a length bucket's remainder waiting for the next epoch's shuffle."),
    click.option("--batch-size", type=int, default=64, show_default=True, help="Rows per step: sentence pairs, or a language model's blocks of --block-size tokens (evaluation batches too)."),
    click.option("--grad-accum", type=int, metavar="N", default=1, show_default=True, help="Gradient accumulation, as nanoGPT's gradient_accumulation_steps: each step sums the gradients of N micro-batches of --batch-size rows (or --max-tokens tokens) and updates once, inside the compiled step on JAX; tokens/s and MFU count the whole step."),
    click.option("--max-tokens", type=int, metavar="N", help="Token batching, as fairseq's: each length bucket's training batches get as many rows as fit N tokens of padded length (a multiple of 8 from 8 rows), instead of --batch-size rows."),
    click.option("--timing-window", type=int, metavar="N", default=DEFAULT_TIMING_WINDOW, show_default=True, help="Steady steps between device synchronisations (losses are read then too); a step's time is its window's mean. 1: every step alone. The first step of each shape is always timed alone."),
    click.option("--log-every", type=int, metavar="N", default=DEFAULT_LOG_EVERY, show_default=True, help="Off a terminal (a file, a pipe), a line every N steps: step, loss, learning rate, step time, tokens/s; and one per validation. On a terminal the bar."),
    click.option("--learning-rate", type=float, default=1e-3, show_default=True),
    click.option("--warmup-steps", type=int, default=100, show_default=True),
    click.option("--min-learning-rate", type=float, metavar="LR", help="The cosine schedule's floor (default: a tenth of --learning-rate)."),
    click.option("--lr-decay-steps", type=int, metavar="N", help="The step at which the cosine decay reaches its floor, counted from the first step as nanoGPT's lr_decay_iters; later steps train at the floor (default: the run's last step)."),
    click.option("--weight-decay", type=float, help="AdamW's decoupled weight decay (default: the model family's: transformer 0.01, gpt 0.1)."),
    click.option("--weight-decay-on", type=click.Choice(DECAY_CHOICES), help="Which variables decay: all, or matrices (2-D and larger: biases and norms left out, as nanoGPT) (default: transformer all, gpt matrices)."),
    click.option("--adam-beta1", type=float, help="Adam's beta1 (default 0.9)."),
    click.option("--adam-beta2", type=float, help="Adam's beta2 (default: transformer 0.98, gpt 0.95, gpt char 0.99)."),
    click.option("--adam-epsilon", type=float, help="Adam's epsilon (default: transformer 1e-9, gpt 1e-8)."),
    click.option("--clip", type=click.Choice(CLIP_CHOICES), help="Gradient clipping: per-variable (each gradient on its own, Keras's clipnorm), global (their joint norm, as nanoGPT and Hugging Face) or none (default: transformer per-variable, gpt global)."),
    click.option("--clip-norm", type=float, help="The norm gradients are clipped to (default 1.0)."),
    click.option("--max-pairs", type=int, help="Use only the first N pairs of the corpus."),
    click.option("--valid-size", type=int, default=500, show_default=True),
    click.option("--test-size", type=int, default=500, show_default=True),
    click.option("--vocab-size", type=int, help="Sentencepiece vocabulary (default: the preset's): the most pieces it learns; a text too small for that many gets fewer, said on the console and in the result's warnings."),
    click.option("--max-len", type=int, help="Tokens per side, counting its end token; longer pairs are dropped (default: the preset's). For a language model (--model gpt) it is the --block-size: give one of them, not both."),
    click.option("--block-size", type=int, metavar="N", help="A language model's block: tokens per row, its positions (default: the preset's; a pretrained checkpoint's own, gpt2:DIR's n_positions)."),
    click.option("--tokenizer", type=click.Choice(["byte", "char", "sentencepiece"]), help="A language model's tokens: byte (vocabulary 256, default), char (the training split's characters; --preset char's default) or sentencepiece (--vocab-size)."),
    click.option("--eval-stride", type=int, metavar="N", help=EVAL_STRIDE_HELP + " (default: the block: consecutive blocks from the split's start, each token scored once; nanoGPT's estimate_loss draws random windows)."),
    click.option("--layers", type=int, metavar="N", help="Encoder and decoder layers each; a language model's blocks (default: the preset's)."),
    click.option("--encoder-layers", type=int, metavar="N", help="Encoder layers (default: the preset's)."),
    click.option("--decoder-layers", type=int, metavar="N", help="Decoder layers (default: the preset's)."),
    click.option("--d-model", type=int, metavar="N", help="Model dimension (default: the preset's)."),
    click.option("--heads", type=int, metavar="N", help="Attention heads; must divide --d-model (default: the preset's)."),
    click.option("--ff-dim", type=int, metavar="N", help="Feed-forward dimension (default: the preset's)."),
    click.option("--dropout", type=float, metavar="RATE", help="Dropout rate (default: the preset's)."),
    click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="auto", show_default=True,
                 help="Keras dtype policy: auto (mixed_bfloat16 where the device computes bfloat16 natively, a CUDA "
                      "GPU of compute capability 8.0 or more, an AMD MI100 or later, or a TPU, as their best users "
                      "train; float32 elsewhere) or "
                      "one policy. What ran is recorded."),
    click.option("--matmul-precision", type=click.Choice(MATMUL_PRECISIONS), default="highest", show_default=True,
                 help="float32 matmuls on both backends: highest (true float32) or high (TF32 on GPUs that have it; "
                      "XLA's own default there, not torch's). Recorded, and MFU divides by that arithmetic's peak."),
    click.option("--attention", type=click.Choice(ATTENTION_CHOICES), default="auto", show_default=True,
                 help="Attention kernels: auto (fused where the device has them, as their best users train: the "
                      "flash-attention extra on a GPU in 16 bits, else unfused), fused (the extra; refused where it "
                      "cannot run) or unfused (the same plain operations on both backends). What ran is recorded."),
    click.option("--step", type=click.Choice(STEP_CHOICES), default="auto", show_default=True,
                 help="The train step: auto (compiled where its best users compile it: JAX's always; torch's on a "
                      "CUDA GPU, by the torch-compile extra, where the run's extras allow), compiled (torch: the "
                      "extra on every device) or eager (torch's step uncompiled; compare: no compiled twins). What "
                      "ran is recorded."),
    click.option("--measure-only", is_flag=True, default=False,
                 help="Benchmark mode: train and time only; skip validation, the final evaluation, the test "
                      "translation and saving the model (the result's quality figures are n/a)."),
    click.option("--profile", "profile_steps", type=int, default=0, metavar="N",
                 help="Trace N steady steps with the backend's own profiler (jax.profiler, torch.profiler) into "
                      "RESULT.run/profile, in a window of their own, timed apart from the steady figures, and say "
                      "how busy the device was and which operations took longest; Perfetto (ui.perfetto.dev) opens "
                      "both backends' traces. 0: none."),
    click.option("--compile-mode", type=click.Choice(COMPILE_MODES),
                 help="torch.compile mode for the torch-compile extra (default: default; for the compiled torch run "
                      "that compare adds on a CUDA GPU, reduce-overhead: CUDA graphs)."),
    click.option("--tensor-parallel-size", type=int, metavar="N",
                 help="Devices on the model axis of the tensor-parallel extra (default: all of them); the others make "
                      "a data axis, a data x model mesh."),
    click.option("--pipeline-parallel-size", type=int, metavar="N",
                 help="Processes (JAX: devices) on the stage axis of the pipeline-parallel extra (default: all of "
                      "them); the others make a data axis, a data x stage mesh."),
    click.option("--pipeline-micro-batches", type=int, metavar="N",
                 help="Parts of each batch the pipeline-parallel extra sends through its stages (default: 4 a stage)."),
    click.option("--pipeline-schedule", type=click.Choice(PIPELINE_SCHEDULES),
                 help="The pipeline-parallel extra's schedule: 1f1b (a forward and a backward in turn once the "
                      "pipeline is full, at most a micro-batch a stage held: torch's default) or gpipe (every "
                      "forward, then every backward: JAX's, its only one)."),
    click.option("--remat-policy", type=click.Choice(REMAT_POLICIES),
                 help="What the remat extra recomputes in the backward pass: full (every block's activations, the "
                      "default) or matmuls (all but the matrix products' outputs, which it keeps: torchtitan's "
                      "selective, JAX's dots_saveable)."),
    click.option("--seed", type=int, default=0, show_default=True, help="Initial weights and batch order."),
    click.option("--init", type=click.Choice(list(INIT_SCHEMES)),
                 help="How the initial weights are drawn (with numpy, the same on every backend): glorot (Glorot-"
                      "uniform kernels), gpt2 (GPT-2's and nanoGPT's normal(0, 0.02), residual projections scaled "
                      "down), torch (torch.nn's layer defaults) or flax (Flax's) (default: the model family's: "
                      "transformer glorot, gpt gpt2)."),
    click.option("--beam", type=int, default=1, show_default=True, metavar="N",
                 help="Translate the validation and test sets with beam search over N hypotheses (1: greedy)."),
    click.option("--length-penalty", type=float, default=0.6, show_default=True, metavar="ALPHA",
                 help="Beam search's length normalisation ((5 + length) / 6) ** ALPHA."),
    click.option("--cache-dir", type=_GivenPath(file_okay=False), help="Prepared corpora, tokenizers and tokenized text (default ~/.cache/mtbench)."),
    # A run's option, so that compare gives it to every run (and to the process drawing their weights): a cold
    # compile on one side only is no comparison.
    click.option("--no-compile-cache", "compile_cache", is_flag=True, flag_value=False, default=True,
                 help="Compile from scratch and keep nothing: no persistent compilation cache (CACHE_DIR/compile)."),
    click.option("--report-to", metavar="NAMES", help="Experiment trackers that follow the run as it trains, comma-separated: tensorboard, mlflow, wandb or a plugin's (default: none)."),
    click.option("--logging-dir", type=_GivenPath(file_okay=False),
                 help="The trackers' local files (default: in the run directory, RESULT.run; MLflow's store in the "
                      "result's folder)."),
    click.option("--price-per-hour", type=_FloatNamingItsVariable(), metavar="USD", envvar="MTBENCH_PRICE_PER_HOUR", help="What the machine costs per hour, for the result's cost section (also MTBENCH_PRICE_PER_HOUR)."),
) + CORPUS_OPTIONS
run_configuration_options = _stack(RUN_CONFIGURATION_OPTIONS)




def _train_config(warn=True, **options):
    return TrainConfig.from_options(**_command_line_wins(options, warn))


# Options of which a run takes one: where the command line gives one and --config the other, the command line's wins.
ONE_OF = (("steps", "epochs"), ("block_size", "max_len"), ("target_bleu", "target_loss"))


def _command_line_wins(options, warn=True):
    """`options` without what --config set of a pair in ONE_OF whose other half the command line gave; a list
    --config set that the command line's flags replace (`--extra`) is said (where `warn`: by one process of a
    run's several), not merged."""
    context = click.get_current_context()
    source = context.get_parameter_source
    for param in context.command.params:
        configured = (context.default_map or {}).get(param.name)
        if warn and getattr(param, "multiple", False) and configured \
                and source(param.name) == click.core.ParameterSource.COMMANDLINE:
            click.echo(f"Warning: {param.opts[0]} on the command line replaces --config's "
                       f"{param.opts[0].lstrip('-')} = {list(configured)!r}", err=True)
    for pair in ONE_OF:
        given = [name for name in pair if name in options and source(name) == click.core.ParameterSource.COMMANDLINE]
        for name in pair if len(given) == 1 else ():
            if name not in given and name in options and source(name) == click.core.ParameterSource.DEFAULT_MAP:
                options[name] = None
    return options


def _as_arguments(configuration):
    """The command-line arguments that give a child process the same run configuration, by the options of the
    command running: for `init-weights`, and `train` in another environment's mtbench from before run files."""
    params = {param.name: param for param in click.get_current_context().command.params}
    arguments = []
    for name, value in configuration.items():
        param = params[name]
        flag = param.opts[0]
        if value is None:
            continue
        if param.is_flag:  # given where the value is the flag's own (--no-save-model: save_model False)
            arguments += [flag] if value == (param.flag_value if isinstance(param.flag_value, bool) else True) else []
        elif param.multiple:
            arguments += [text for item in value for text in (flag, str(item))]
        else:
            arguments += [flag, str(value)]
    return arguments

# Validation along the way, and what it may stop or show: options of `train`, and of `compare`, which passes them on
# to every run.
VALIDATION_OPTIONS = (
    click.option("--eval-every", type=int, metavar="N",
                 help="Evaluate the validation split every N steps (BLEU; a language model's loss), recorded under "
                      "`target`."),
    click.option("--target-bleu", type=float, metavar="X",
                 help="Stop when validation BLEU reaches this (needs --eval-every)."),
    click.option("--target-loss", type=float, metavar="X",
                 help="Stop when a language model's validation loss falls to this (needs --eval-every)."),
    click.option("--sample-prompt", metavar="TEXT",
                 help="At each validation, print a language model's continuation of TEXT (needs --eval-every; "
                      "nanoGPT's sampling: temperature 0.8, top-k 200, seeded by --seed)."),
    click.option("--sample-tokens", type=int, metavar="N", default=100, show_default=True,
                 help=f"Tokens of each --sample-prompt continuation, at most {MAX_NEW_TOKENS:,} (as generate's "
                      f"--max-new-tokens)."),
)
VALIDATION_KEYS = _parameter_names(VALIDATION_OPTIONS)
validation_options = _stack(VALIDATION_OPTIONS)

long_run_options = _stack([
    click.option("--checkpoint-every", type=int, metavar="N",
                 help="Write a checkpoint every N steps (always on Ctrl-C/SIGTERM)."),
    click.option("--keep-checkpoints", type=int, metavar="K", default=3, show_default=True,
                 help="Checkpoints kept (the last)."),
    click.option("--resume", "resume_dir", type=_GivenPath(), metavar="RUN_DIR",
                 help="Continue the run in RUN_DIR (RESULT.run) from its last checkpoint, with its configuration."),
    *VALIDATION_OPTIONS,
])

# How the frameworks' collectives word a peer that is gone (gloo, NCCL, JAX's coordination service).
LOST_PROCESS = re.compile(r"gloo|nccl|connection (reset|closed|refused)|heartbeat|coordination service|"
                          r"timed? ?out", re.IGNORECASE)

def _finite(context, parameter, value):
    """A float option's value, refused where it is NaN or infinite (NaN passes click's ranges: every comparison
    with it is False)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number, got {value}")
    return value


process_options = _stack([
    click.option("--coordinator", metavar="HOST:PORT",
                 help="Several processes without torchrun or SLURM: where process 0 serves the others (with "
                      "--num-processes and --process-id)."),
    click.option("--num-processes", type=int, metavar="N", help="How many processes the run has (see --coordinator)."),
    click.option("--process-id", type=int, metavar="I", help="This process's number, 0 to N-1 (see --coordinator)."),
    click.option("--process-timeout", type=click.IntRange(min=1), default=300, show_default=True, metavar="SECONDS",
                 help="How long a process waits for the others (to start, or in a collective) before it stops "
                      "with an error."),
])
PROCESS_OPTIONS = ("coordinator", "num_processes", "process_id", "process_timeout")

# With --resume the run's own configuration is used: only these may be given beside it (and where the
# processes meet, which is the launch's, not the run's).
ALLOWED_WITH_RESUME = ("resume_dir", "reporters", "debug", "save_model", *PROCESS_OPTIONS)
# With --run-file the file is the whole configuration: beside it only how the run is reported and launched, and
# leave to replace the result it names.
ALLOWED_WITH_RUN_FILE = ("run_file", "reporters", "debug", "overwrite", *PROCESS_OPTIONS)


def _refuse_options_beside(allowed, why):
    ctx = click.get_current_context()
    given = [param.opts[0] for param in ctx.command.params if param.name not in allowed
             and ctx.get_parameter_source(param.name) in (click.core.ParameterSource.COMMANDLINE,
                                                         click.core.ParameterSource.DEFAULT_MAP)]
    if given:
        raise MtbenchError(f"{why}; drop {', '.join(given)}")


def _reporter_names(reporters):
    """--report NAME ...: 'none' reports nothing (as Hugging Face's --report_to none), so it stands alone."""
    others = [name for name in reporters if name != "none"]
    if others and len(others) < len(reporters):
        raise MtbenchError(f"--report none reports nothing; it cannot stand beside --report {others[0]}")
    return others


def _require_reporting_succeeded(failures):
    """Reporters, trackers and extras' records fail in isolation (the run and its result go on); the command then
    ends with every failure, each said once, on its last line."""
    if len(failures) == 1:
        raise ReportingFailed(failures[0])
    if failures:
        raise ReportingFailed(f"{len(failures)} reporting failures: " +
                              "; ".join(f"({number}) {failure}" for number, failure in enumerate(failures, 1)))


# Text options that a --config file may also give as a list, and what joins its items.
JOINED_IN_CONFIG = {"matrix": ";", "backends": ",", "report_to": ","}


def _config_file_options(ctx):
    """{key: FileOption} of every option of the command but --config: the keys a --config file may hold, each
    the flag's own name without its dashes (`batch-size`, `no-save-model`)."""
    from mtbench.runner.config_file import FileOption

    def converter(param):
        def convert(value):
            try:
                return param.type.convert(value, param, ctx)
            except click.BadParameter as error:
                raise ValueError(error.message) from None
        return convert

    options = {}
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name == "config_file":
            continue
        key = max(param.opts, key=len).lstrip("-")
        if param.is_flag:  # `key = true` gives the flag (--no-save-model sets save_model to False)
            given = param.flag_value if isinstance(param.flag_value, bool) else True
            options[key] = FileOption(param.name, bool, on_value=given, off_value=not given)
        else:
            kind = (int if isinstance(param.type, click.types.IntParamType) else
                    float if isinstance(param.type, click.types.FloatParamType) else str)
            options[key] = FileOption(param.name, kind, param.multiple, joined_by=JOINED_IN_CONFIG.get(param.name),
                                      convert=converter(param))
    return options


def _apply_config_file(ctx, param, path):
    """--config FILE: the file's keys become the command's defaults, so the flags given still win."""
    if path is None:
        return
    from mtbench.runner.config_file import read_config_file
    try:
        defaults = read_config_file(path, _config_file_options(ctx))
    except MtbenchError as error:
        raise click.UsageError(str(error)) from None
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta["mtbench.config_file"] = path


config_option = click.option(
    "--config", "config_file", type=_GivenPath(dir_okay=False), metavar="FILE.toml", is_eager=True,
    expose_value=False, callback=_apply_config_file,
    help="Options from a TOML file whose keys are the flags' own names (batch-size = 64, extra = [\"torch-compile\"], "
         "measure-only = true); flags given on the command line win over it (a repeatable flag such as --extra "
         "replaces the file's list, with a warning).")


report_option = click.option(
    "--report", "reporters", multiple=True, metavar="NAME",
    help="Reporter to hand every result to, complete or partial (repeatable; see `mtbench plugins`).")


@main.command()
@config_option
@click.option("--backend", default="jax", show_default=True, help="Backend plugin: jax, torch, or a third-party one.")
@click.option("--extra", "extras", multiple=True, help="Backend extra (repeatable)." + _extras_help())
@run_configuration_options
@click.option("--initial-weights", type=_GivenPath(dir_okay=False), help="Start from this weights file (.npz by variable path, see `mtbench init-weights`) instead of the draw from --seed.")
@click.option("--out", type=click.Path(dir_okay=False), help="Result JSON (default mtbench-results/<time>-<backend>.json).")
@click.option("--overwrite", is_flag=True, help="Replace an existing result file and its RESULT.run/ folder "
              "(emptied as training starts).")
@click.option("--report", "reporters", multiple=True, default=("summary",), show_default=True, metavar="NAME",
              help="Reporter to hand the result to, complete or partial (repeatable; 'table' for every figure, "
                   "'none' for none).")
@click.option("--run-group", metavar="NAME", help="Group this run with others in the trackers (compare sets it).")
@click.option("--no-save-model", "save_model", is_flag=True, flag_value=False, default=True,
              help="Do not keep the final weights in the run directory (RESULT.run/model).")
@long_run_options
@click.option("--run-file", type=_GivenPath(dir_okay=False), metavar="RUN.json",
              help="Train the configuration in this file (as compare and rerun write one for each run) instead of "
                   "the options'.")
@process_options
@handle_errors
def train(reporters, resume_dir, run_file, save_model, coordinator, num_processes, process_id, process_timeout,
          **options):
    """Train, evaluate and time the Transformer on one backend (in several processes under torchrun, SLURM or
    --coordinator: one model, data parallel)."""
    from mtbench.runner.launch import read_launch
    launch = read_launch(coordinator, num_processes, process_id, process_timeout)
    try:
        _train(reporters, resume_dir, run_file, save_model, launch, options)
    except MtbenchError as error:
        if launch.num_processes > 1:
            error.args = (f"process {launch.process_id} of {launch.num_processes}: {error}",)
        raise
    except (RuntimeError, OSError, ValueError) as error:
        if launch.num_processes == 1 or not LOST_PROCESS.search(str(error)):
            raise
        # A collective that failed mid-run: another process died or cannot be reached (its launcher names it).
        first_line = next(line for line in str(error).splitlines() if LOST_PROCESS.search(line))
        click.echo(f"Error: process {launch.process_id} of {launch.num_processes}: stopped, as the run's other "
                   f"processes cannot be reached ({first_line.strip()[:300]})", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # Not sys.exit: at exit the frameworks wait to leave the group, and a gone process makes JAX's
        # coordination client abort the process with a screenful of C++ log over this line.
        os._exit(1)


def _train(reporters, resume_dir, run_file, save_model, launch, options):
    from mtbench.runner.loop.checkpoints import open_run
    from mtbench.runner.training import run_training
    registry = plugins.registry()
    if launch.is_first:
        _warn_broken_plugins(registry)
    resume = None
    if resume_dir:
        _refuse_options_beside(ALLOWED_WITH_RESUME, "--resume continues a run with its own configuration")
        resume = open_run(resume_dir)
        config = resume.config
        config.save_model = config.save_model and save_model
    elif run_file:
        from mtbench.runner.run_file import read_run_file
        _refuse_options_beside(ALLOWED_WITH_RUN_FILE, "--run-file holds the run's whole configuration")
        config = read_run_file(run_file)
        # Whether to replace an existing result is this command's to say: a run file records the command that wrote it.
        config.overwrite = options["overwrite"]
    else:
        from mtbench.runner.setup import check_trackers
        config = _train_config(warn=launch.is_first, save_model=save_model, **options)
        check_trackers(config.report_to, registry)
    _check_not_read_here(config.out, run_file)
    from mtbench.runner.results.run_result import eager_torch_note
    console = output_console()
    result, failures = run_training(config, registry, console, resume=resume,
                                    reporter_names=_reporter_names(reporters), launch=launch)
    if launch.is_first:
        note = eager_torch_note(result)
        if note:
            console.print(note, highlight=False, soft_wrap=True)
        console.print(f"result: {config.out}")
    _require_reporting_succeeded(failures)


@main.command("init-weights")
@click.option("--backend", default="jax", show_default=True, help="Backend whose keras builds the model to name its variables.")
@run_configuration_options
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The weights file to write (.npz).")
@click.option("--overwrite", is_flag=True, help="Replace an existing file.")
@handle_errors
def init_weights(backend, out, overwrite, **configuration):
    """Write the initial weights of a configuration (drawn with numpy from --seed) to a backend-neutral .npz,
    for `mtbench train --initial-weights`."""
    from mtbench.runner.init_weights import write_initial_weights
    registry = plugins.registry()
    _warn_broken_plugins(registry)
    config = _train_config(backend=backend, **configuration)
    console = output_console(stderr=True)
    sha256 = write_initial_weights(config, registry, console, out, overwrite)
    click.echo(f"initial weights: {out} (sha256 {sha256})")


MATRIX_HELP = (
    "The runs as backend+extra+extra[@N][:flag=value,...], separated by ';': 'torch;torch+torch-compile;jax', "
    "'jax:d-model=128;jax:d-model=256' (the size flags), "
    "'jax:batch-size=16;torch:batch-size=16;jax:batch-size=64;torch:batch-size=64' (a sweep, of any of "
    + ", ".join(key.replace("_", "-") for key in SWEEP_KEYS) + "), 'torch;torch:python=/path/venv/bin/python' "
    "(another environment's interpreter: other versions), or 'torch;torch+ddp@2' (2 processes under torchrun; the "
    "table adds their scaling efficiency). Instead of --backends and --extra.")


@main.command()
@config_option
@click.option("--backends", help="Comma-separated backends, one run each (default: jax,torch).")
@click.option("--extra", "extras", multiple=True, help="Extra for every run (repeatable)." + _extras_help())
@click.option("--matrix", help=MATRIX_HELP)
@click.option("--repeats", default="1", show_default=True, help="Run everything N times; timings show median and min-max. 'auto': repeat until every tokens/s interval is within --repeats-width, or --repeats-budget runs out.")
@click.option("--repeats-width", default="3%", show_default=True, help="--repeats auto: the half width every tokens/s interval must come within.")
@click.option("--repeats-budget", type=float, default=1800, show_default=True, metavar="SECONDS", help="--repeats auto: no repeat starts that would end past this many seconds.")
@click.option("--aa", is_flag=True, help="Run the baseline twice in each repeat, interleaved (an A/A): its difference from itself is the noise floor, recorded and held to every verdict.")
@click.option("--baseline", help="The run speed-ups are measured against (default: the first).")
@run_configuration_options
@click.option("--out", type=click.Path(dir_okay=False), help="Combined JSON (default mtbench-results/<time>-compare.json); the runs' files go into a folder beside it.")
@click.option("--overwrite", is_flag=True, help="Replace existing result files.")
@click.option("--parity-steps", type=int, default=PARITY_STEPS, show_default=True, help="Steps whose training loss the parity check compares.")
@click.option("--parity-tolerance", type=float, default=None, help=PARITY_TOLERANCE_HELP)
@validation_options
@report_option
@handle_errors
def compare(backends, extras, matrix, repeats, repeats_width, repeats_budget, aa, baseline, out, overwrite, parity_steps,
            parity_tolerance, reporters, **configuration):
    """Train the same configuration on several backends (and extras), each in its own process from one weights
    file; check that their losses agree, and compare their figures."""
    from mtbench.runner.orchestration.compare import ComparePlan, check_repeats_and_parity, run_compare
    from mtbench.runner.orchestration.runs import plan_comparison
    from mtbench.runner.results.parity import require_parity
    from mtbench.runner.results.output import check_output_path
    from mtbench.runner.results.report import context_lines, rich_table
    from mtbench.runner.setup import resolve_reporters
    repeats, auto = _compare_repeats(repeats, repeats_width, repeats_budget)
    check_repeats_and_parity(repeats, auto, parity_steps, parity_tolerance)
    registry = plugins.registry()
    _warn_broken_plugins(registry)
    chosen_reporters = resolve_reporters(_reporter_names(reporters), registry)
    if out is None:  # --out '' is refused below, as train's is, not taken for the default
        out = os.path.join("mtbench-results", time.strftime("%Y%m%d-%H%M%S") + "-compare.json")
    # before the devices are asked (a child that imports the frameworks: seconds)
    _check_not_read_here(out)
    check_output_path(out, overwrite, reads=[configuration.get(key) for key in INPUT_FILE_KEYS])
    planned = plan_comparison(backends, extras, matrix, _command_line_wins(configuration), registry)
    configuration.pop("compile_mode")
    # Validation is the runs' own (`train` takes it, `init-weights` does not): in their run files, apart from the
    # arguments every child is given.
    validation = {key: configuration.pop(key) for key in VALIDATION_KEYS}
    plan = ComparePlan(planned.specs, repeats, baseline, _as_arguments(configuration), out, overwrite, parity_steps,
                       parity_tolerance, chosen_reporters, planned.interpreters, aa, auto,
                       options={**configuration, **validation}, train_arguments=_as_arguments(validation))
    console = output_console()
    for line in planned.lines:
        console.print(line, highlight=False)
    comparison, _, failures = run_compare(plan, registry, console)
    console.print(rich_table(comparison, title="mtbench compare"))
    for line in context_lines(comparison):
        console.print(line, highlight=False)
    console.print(f"result: {out}")
    require_parity(comparison, out)
    _require_reporting_succeeded(failures)


def _given_on_command_line(*names):
    """The options among `names` (parameter names) given on the command line, as flags."""
    source = click.get_current_context().get_parameter_source
    return [f"--{name.replace('_', '-')}" for name in names if source(name) == click.core.ParameterSource.COMMANDLINE]


def _compare_repeats(repeats, width, budget):
    """(repeats, AutoRepeats or None) of compare's --repeats N or auto."""
    from mtbench.runner.orchestration.compare import AutoRepeats
    from mtbench.runner.results.verdicts import parse_percent
    if repeats.strip().lower() == "auto":
        return None, AutoRepeats(parse_percent(width, "--repeats-width"), budget)
    for flag in _given_on_command_line("repeats_width", "repeats_budget"):
        raise MtbenchError(f"{flag} is an option of --repeats auto; this compare runs --repeats {repeats}")
    try:
        return int(repeats), None
    except ValueError:
        raise MtbenchError(f"--repeats: '{repeats}' is neither a number of repeats nor 'auto'") from None


@main.command()
@click.argument("results", nargs=-1, type=click.Path())
@click.option("--history", type=_GivenPath(), metavar="DIR", help="Instead of RESULTS: the train results of one configuration in DIR over time (versions, commits, dates), tokens/s with its interval, the change from the point before, and the steps beyond the noise (--plot draws them).")
@click.option("--format", "output_format", type=click.Choice(["table", "markdown", "csv", "json"]), default="table", show_default=True)
@click.option("--baseline", help="The run speed-ups are measured against (default: the first); or OLD.json, a result or compare JSON: each run of RESULTS against the same run there, tokens/s, step, compile, train and total times each with its interval.")
@click.option("--fail-if-slower", metavar="PERCENT", help="With --baseline OLD.json: exit with code 1 when a run's tokens/s is more than PERCENT (5%) below OLD's, its whole interval past it (a step 1.20x slower is 16.7% fewer tokens/s), or a run cannot be judged (a side of 2 repeats cannot).")
@click.option("--plot", type=click.Path(dir_okay=False), help="Also draw loss curves and tokens/s into this PNG.")
@click.option("--force", is_flag=True, help="Report runs whose configurations differ beyond backend, extras, dtype, the size flags and the sweep keys.")
@click.option("--parity-steps", type=int, default=PARITY_STEPS, show_default=True)
@click.option("--parity-tolerance", type=float, default=None, help=PARITY_TOLERANCE_HELP)
@report_option
@handle_errors
def report(results, history, output_format, baseline, fail_if_slower, plot, force, parity_steps, parity_tolerance,
           reporters):
    """Show saved results (single-run or compare JSONs) side by side; --report hands each run to a reporter.
    With --baseline OLD.json, hold each run against the same run of OLD (a regression gate with --fail-if-slower).
    With --history DIR, follow one configuration's tokens/s over time."""
    if plot is not None:
        from mtbench.runner.results.plots import check_plot_path
        check_plot_path(plot)
    # Options a history or a regression gate has no use for: taken without a word, they would seem to apply.
    parity_options = _given_on_command_line("parity_steps", "parity_tolerance")
    if history is not None:
        given = [name for name, value in (("RESULTS", results), ("--baseline", baseline),
                                          ("--fail-if-slower", fail_if_slower), ("--report", reporters),
                                          ("--force", force)) if value] + parity_options
        if given:
            raise MtbenchError(f"--history DIR reads the results in DIR alone: drop {', '.join(given)}")
        return _report_history(history, output_format, plot)
    if not results:
        raise MtbenchError("give RESULTS (result or compare JSON files) or --history DIR")
    if baseline == "":  # taken for no baseline, it held the runs against the first
        raise MtbenchError("--baseline '': give a run's label, or OLD.json to hold the runs against")
    chosen_reporters, registry = _chosen_reporters(reporters)
    if baseline and (baseline.endswith(".json") or os.path.isfile(baseline)):
        if parity_options:
            raise MtbenchError(f"{', '.join(parity_options)}: --baseline OLD.json holds each run against OLD's "
                               f"figures, with no parity check")
        return _report_against_file(results, baseline, output_format, fail_if_slower, plot, force,
                                    chosen_reporters, registry)
    if fail_if_slower is not None:
        raise MtbenchError("--fail-if-slower needs --baseline OLD.json, the results to hold the runs against" +
                           (f" ({baseline} is a label, or a folder: no result file)" if baseline else ""))
    from mtbench.runner.results.parity import check_parity_options
    check_parity_options(parity_steps, parity_tolerance)
    from mtbench.runner.results import report as reporting
    runs = reporting.load_runs(results)
    recorded = None if baseline else reporting.recorded_baseline(results)
    parity = reporting.recorded_parity(results)  # the compare's gate, where the command line gives none
    if "--parity-steps" not in parity_options:
        parity_steps = parity.get("steps", parity_steps)
    if "--parity-tolerance" not in parity_options:
        parity_tolerance = parity.get("tolerance")
    comparison = reporting.build_comparison(runs, baseline=baseline or recorded, force=force,
                                            parity_steps=parity_steps, parity_tolerance=parity_tolerance,
                                            noise_floor=reporting.recorded_noise_floor(results),
                                            baseline_named_by=f"{results[0]}: its baseline" if recorded else
                                            "--baseline")
    if plot:
        from mtbench.runner.results.plots import comparison_figure, save_figure
        save_figure(comparison_figure(comparison), plot)
    _print_report(output_format, reporting, comparison, reporting.context_lines(comparison))
    if plot:
        click.echo(f"plot: {plot}", err=True)
    _require_reporting_succeeded(_hand_to_reporters(runs, chosen_reporters, registry, output_format))


def _chosen_reporters(reporters):
    """(the --report reporters, the registry that runs them), checked before any work; ([], None) without any."""
    if not reporters:
        return [], None
    from mtbench.runner.setup import resolve_reporters
    registry = plugins.registry()
    _warn_broken_plugins(registry)
    return resolve_reporters(_reporter_names(reporters), registry), registry


def _hand_to_reporters(runs, reporters, registry, output_format):
    """Each run to each reporter, its trackers' files beside the run's own result file; the reporters' failures."""
    from mtbench.runner.results.reporting import run_reporters
    failures = []
    for run in runs if reporters else ():
        # Beside machine-readable output, reporters write to stderr so that stdout stays parseable.
        failures += run_reporters(reporters, registry, run.result, output_console(stderr=output_format != "table"),
                                  run.path)
    return failures


def _print_report(output_format, rendering, value, lines):
    """`value` as `rendering` (the module of its kind of report) renders it: the table and the `lines` below it on
    the terminal, else markdown, CSV or JSON on stdout."""
    if output_format == "table":
        console = output_console()
        console.print(rendering.rich_table(value))
        for line in lines:
            console.print(line, highlight=False)
    else:
        render = {"markdown": rendering.to_markdown, "csv": rendering.to_csv, "json": rendering.to_json}
        click.echo(render[output_format](value), nl=False)


def _report_history(directory, output_format, plot):
    from mtbench.runner.results import history as histories
    found = histories.build_history(directory)
    if plot:
        from mtbench.runner.results.plots import history_figure, save_figure
        save_figure(history_figure(found), plot)
    _print_report(output_format, histories, found, found.lines())
    if plot:
        click.echo(f"plot: {plot}", err=True)


def _report_against_file(results, baseline, output_format, fail_if_slower, plot, force, reporters, registry):
    from mtbench.runner.results import regression
    from mtbench.runner.results.verdicts import parse_percent
    if plot:
        raise MtbenchError("--plot draws a comparison, not a report against --baseline OLD.json")
    threshold = None if fail_if_slower is None else parse_percent(fail_if_slower, "--fail-if-slower")
    held = regression.build_regression(results, baseline, force, threshold)
    _print_report(output_format, regression, held, held.lines())
    # The new runs go to --report's reporters, as without a baseline (they were dropped without a word).
    failures = _hand_to_reporters(held.new_runs, reporters, registry, output_format)
    regression.require_not_slower(held)
    _require_reporting_succeeded(failures)


@main.command()
@click.argument("result", type=click.Path())
@click.option("--out", type=click.Path(dir_okay=False), help="The new result JSON (default mtbench-results/<time>-rerun-<backend>.json); for a compare JSON, its combined JSON, the runs' files in a folder beside it.")
@click.option("--overwrite", is_flag=True, help="Replace existing result files.")
@click.option("--parity-steps", type=click.IntRange(min=1), metavar="N", help="Steps of the two loss curves held to each other (default: a compare JSON's own, else 50; past the run's last step: the whole curve).")
@handle_errors
def rerun(result, out, overwrite, parity_steps):
    """Train the run of RESULT (a result JSON, or every run of a compare JSON) again: the same configuration, from
    the same weights file where it is still there unchanged; then show both side by side, naming every
    difference in versions, hardware, configuration and figures."""
    from mtbench.runner.orchestration.rerun import rerun_results
    written = rerun_results(result, out, overwrite, output_console(), parity_steps)
    click.echo(f"result: {written}")


MODEL_ARGUMENT = click.argument("model", metavar="MODEL", type=click.Path())
INFERENCE_DTYPE = click.option(
    "--dtype", type=click.Choice(DTYPES),
    help="The Keras dtype policy to run the model in (default: the one it trained in; a pretrained checkpoint: float32).")
inference_options = _stack([
    click.option("--backend", help="Backend to translate on (default: the one that trained the model)."),
    INFERENCE_DTYPE,
    click.option("--beam", type=click.IntRange(min=1), metavar="N", help="Beam search over N hypotheses, 1 greedy (default: the run's)."),
    click.option("--length-penalty", type=click.FloatRange(min=0), metavar="ALPHA", callback=_finite,
                 help="Beam search's length penalty (default: the run's)."),
    click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True, help="Sentences decoded together (a language model's evaluate: blocks scored together)."),
])


def _cut_text(count, what, max_len):
    """'3 sentences were longer than the model's 48 tokens and were cut' (`what`: sentence, source), one singular."""
    were = "was" if count == 1 else "were"
    return f"{count} {what}{'s' * (count != 1)} {were} longer than the model's {max_len} tokens and {were} cut"


def _translation_progress(total):
    """A progress bar on stderr, so stdout holds only the translations; on a terminal only, since on a file or pipe
    a transient bar shows nothing but leaves an empty line."""
    from rich.progress import Progress
    console = output_console(stderr=True)
    progress = Progress(console=console, transient=True, disable=not console.is_terminal)
    task = progress.add_task("translating", total=total)
    return progress, lambda done: progress.update(task, completed=done)


@main.command()
@MODEL_ARGUMENT
@click.option("--prompt", required=True, help="The text to continue.")
@click.option("--backend", help="Generate on this backend (default: the one that trained the model).")
@click.option("--max-new-tokens", type=click.IntRange(1, MAX_NEW_TOKENS), default=200, show_default=True, metavar="N",
              help=f"Tokens to continue the prompt by, at most {MAX_NEW_TOKENS:,}: each is a forward pass of the "
                   f"model over its block, and the text prints once whole.")
@click.option("--temperature", type=click.FloatRange(min=0), default=1.0, show_default=True, callback=_finite,
              help="Divides the logits before sampling; 0 takes the most likely token (greedy).")
@click.option("--top-k", type=click.IntRange(min=1), help="Sample from the K most likely tokens only.")
@click.option("--seed", type=click.IntRange(0, 2 ** 32 - 1), default=0, show_default=True, help="The sampling's random draws (numpy).")
@click.option("--block-size", type=click.IntRange(min=1), metavar="N",
              help="A pretrained checkpoint's window of tokens (MODEL NAME:DIR; default: its own positions, "
                   "GPT-2's 1,024).")
@INFERENCE_DTYPE
@handle_errors
def generate(model, prompt, backend, max_new_tokens, temperature, top_k, seed, block_size, dtype):
    """Continue --prompt with a trained language model (--model gpt), on either backend: MODEL is a result JSON, a
    run directory (RESULT.run), its saved model, or a pretrained checkpoint as NAME:DIR (gpt2:DIR). Prints the
    prompt and its continuation."""
    from mtbench.runner.evaluation.sampling import printable, unknown_prompt_warning
    from mtbench.runner.inference import generate_text
    if not prompt:  # known before the model is opened (a prompt its tokenizer encodes to nothing is found after)
        raise MtbenchError("--prompt is empty: give the text to continue")
    if temperature == 0 and top_k is not None:
        raise MtbenchError("--top-k samples among the K most likely tokens; --temperature 0 takes the most likely "
                           "one: drop --top-k")
    registry = plugins.registry()
    _warn_broken_plugins(registry)
    text, record = generate_text(model, registry, prompt, backend, max_new_tokens, temperature, top_k, seed,
                                 block_size, dtype)
    click.echo(printable(prompt + text))
    unread = unknown_prompt_warning(record["prompt_unknown_tokens"], record["prompt_tokens"])
    if unread:
        click.echo(f"Warning: {unread}", err=True)
    new = record["new_tokens"]
    click.echo(f"{new} token{'s' * (new != 1)} by {record['model']} on {record['backend']} in {record['dtype']} "
               f"({record['sampling']}) in {record['seconds']:.2f} s", err=True)


@main.command()
@MODEL_ARGUMENT
@click.argument("file", required=False, type=click.File("rb"))
@inference_options
@handle_errors
def translate(model, file, backend, dtype, beam, length_penalty, batch_size):
    """Translate FILE (or stdin), one sentence a line, to stdout, with a trained model: MODEL is a result JSON, a
    run directory (RESULT.run), its saved model (RESULT.run/model), one of its checkpoints, or a pretrained
    checkpoint as it was published, NAME:DIR (marian:DIR, gpt2:DIR)."""
    from mtbench.runner.data.formats import text_line
    from mtbench.runner.inference import open_translator
    registry = plugins.registry()
    _warn_broken_plugins(registry)
    translator = open_translator(model, registry, backend, beam, length_penalty, dtype)
    try:
        # Read in binary and split on "\n" alone, as the corpus readers do: text mode's universal newlines also split
        # at a lone "\r" inside a sentence, and the translations no longer stood beside their lines.
        lines = [text_line(raw, number) for number, raw in enumerate(file or click.get_binary_stream("stdin"), 1)]
    except UnicodeDecodeError:
        raise MtbenchError(f"{'stdin' if file is None else file.name}: not valid UTF-8; expected one sentence a "
                           f"line") from None
    progress, advance = _translation_progress(len(lines))
    with progress:
        translations = translator.translate(lines, batch_size, advance)
    click.echo("".join(f"{text}\n" for text in translations), nl=False)
    if translator.truncated:
        click.echo(f"Warning: {_cut_text(translator.truncated, 'sentence', translator.config.max_len)}", err=True)


@main.command()
@MODEL_ARGUMENT
@click.option("--test", "test_file", required=True, type=_GivenPath(), metavar="CORPUS",
              help="Test pairs in any --data format of `train`, or sacrebleu:NAME; for a language model, a text file, "
                   "a folder of .txt files, or a folder of nanoGPT's token files (its val.bin scored; or that val.bin).")
@_stack(CORPUS_OPTIONS[2:])
@inference_options
@click.option("--eval-stride", type=int, metavar="N", help=EVAL_STRIDE_HELP + " (default: the run's).")
@click.option("--block-size", type=click.IntRange(min=1), metavar="N",
              help="A pretrained checkpoint's window of tokens (MODEL NAME:DIR; default: its own positions, "
                   "GPT-2's 1,024).")
@click.option("--out", type=click.Path(dir_okay=False), help="Also write the scores (JSON) and the hypotheses beside them.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file.")
@handle_errors
def evaluate(model, test_file, src_col, tgt_col, src_lang, tgt_lang, backend, dtype, beam, length_penalty,
             batch_size, eval_stride, block_size, out, overwrite):
    """Score a trained model (see `translate` for MODEL) on another test set: BLEU and chrF with sacrebleu; a
    language model (`--model gpt`) by loss, perplexity and bits per byte on every token of a text."""
    from mtbench.runner.data.corpus import drop_empty_pairs
    from mtbench.runner.data.formats import ReadOptions, read_pairs
    from mtbench.runner.files import write_json_atomic, write_text_atomic
    from mtbench.runner.inference import evaluate_translator, model_task, open_translator, with_trained_languages
    from mtbench.runner.results.output import SCORES_KIND, check_not_read, check_output_path
    from mtbench.runner.results.schema import sidecar_paths
    if out is not None:  # --out '' too: refused, where it wrote nothing and ended 0
        check_output_path(out, overwrite, kind=SCORES_KIND, reads=(model, test_file))
    registry = plugins.registry()
    try:
        read_options = ReadOptions(src_col, tgt_col, src_lang, tgt_lang)  # refused before a model is looked for
    except MtbenchError:
        if _task_or_none(model, registry) != "language-modelling":
            raise
        read_options = None  # a language model's evaluate refuses them as translation's options
    _warn_broken_plugins(registry)
    task = model_task(model, registry)
    if task == "language-modelling":
        return _evaluate_language_model(model, test_file, backend, batch_size, eval_stride, block_size, out, registry,
                                        dtype)
    for option, given in (("--eval-stride", eval_stride), ("--block-size", block_size)):
        if given is not None:
            raise MtbenchError(f"{option} is an option of language models; {model} is a {task} model")
    hypotheses_file = sidecar_paths(out)[0] if out else None
    if hypotheses_file:
        check_not_read(hypotheses_file, (model, test_file), beside=out)
    if hypotheses_file and os.path.exists(hypotheses_file) and not overwrite:
        raise MtbenchError(f"{hypotheses_file}: already exists (--out {out} writes its hypotheses there); pass "
                           f"--overwrite to replace it")
    read_options = with_trained_languages(model, registry, read_options)
    pairs, empty = drop_empty_pairs(read_pairs(test_file, read_options))  # as a run leaves them out of its test set
    if not pairs:
        raise MtbenchError(f"{test_file}: holds no sentence pairs" + (f" with both sides ({empty} have an empty "
                                                                      f"side)" if empty else ""))
    translator = open_translator(model, registry, backend, beam, length_penalty, dtype)
    progress, advance = _translation_progress(len(pairs))
    with progress:
        scores, hypotheses = evaluate_translator(translator, pairs, batch_size, advance, read_options.tgt_lang)
    scores["test"], scores["empty_pairs_left_out"] = test_file, empty
    table = Table(title="mtbench evaluate")
    for column in ("test set", "sentences", "BLEU", "chrF", "decoding", "backend", "dtype"):
        table.add_column(column)
    table.add_row(test_file, str(scores["sentences"]), f"{scores['bleu']:.2f}", f"{scores['chrf']:.2f}",
                  scores["decoding"], scores["backend"], scores["dtype"])
    console = output_console()
    console.print(table)
    console.print(f"model: {scores['model']}", highlight=False, soft_wrap=True)
    console.print(f"BLEU signature: {scores['bleu_signature']}\nchrF signature: {scores['chrf_signature']}",
                  highlight=False, soft_wrap=True)
    if scores["bleu_note"]:
        console.print(f"warning: {scores['bleu_note']}", highlight=False, soft_wrap=True)
    if empty:
        console.print(f"{empty} pair{'s' * (empty != 1)} with an empty side left out, as a run leaves them out of its "
                      f"test set", highlight=False)
    if scores["sources_truncated"]:
        console.print(_cut_text(scores["sources_truncated"], "source", scores["max_len"]), highlight=False)
    if out:
        write_text_atomic(hypotheses_file, "".join(h + "\n" for h in hypotheses))
        write_json_atomic(out, {**scores, "hypotheses_file": hypotheses_file})
        console.print(f"scores: {out}")


def _task_or_none(model, registry):
    from mtbench.runner.inference import model_task
    try:
        return model_task(model, registry)
    except MtbenchError:
        return None


def _evaluate_language_model(model, text_file, backend, batch_size, stride, block_size, out, registry, dtype):
    from mtbench.runner.files import write_json_atomic
    from mtbench.runner.inference import score_text
    source = click.get_current_context().get_parameter_source
    for name in ("src_col", "tgt_col", "src_lang", "tgt_lang", "beam", "length_penalty"):
        if source(name) == click.core.ParameterSource.COMMANDLINE:
            raise MtbenchError(f"--{name.replace('_', '-')} is an option of translation; {model} is a language model")
    scores = score_text(model, registry, text_file, backend, batch_size, stride, block_size, dtype)
    table = Table(title="mtbench evaluate")
    for column in ("text", "tokens", "bytes", "windows", "loss", "perplexity", "bits per byte", "backend", "dtype"):
        table.add_column(column)
    bits, evaluated_bytes = scores["bits_per_byte"], scores["bytes_evaluated"]
    table.add_row(text_file, f"{scores['tokens_evaluated']:,}",
                  "n/a (the ids' bytes are not known)" if evaluated_bytes is None else f"{evaluated_bytes:,}",
                  f"{scores['block_size']} tokens, {scores['stride']} apart", f"{scores['loss']:.4f}",
                  "n/a (past a float's range)" if scores["perplexity"] is None else f"{scores['perplexity']:.2f}",
                  "n/a" if bits is None else f"{bits:.4f}", scores["backend"],
                  scores["dtype"])
    console = output_console()
    console.print(table)
    console.print(f"model: {scores['model']}", highlight=False, soft_wrap=True)
    if scores["unknown_characters"]:
        unknown = scores["unknown_characters"]
        console.print(f"{unknown:,} <unk> token{'s' * (unknown != 1)} in the text (characters not in the model's "
                      f"vocabulary)", highlight=False)
    if out:
        write_json_atomic(out, scores)
        console.print(f"scores: {out}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--calibrate", is_flag=True, help="Measure each backend's matmul peak (the MFU denominator on CPUs) and cache it.")
@click.option("--cache-dir", type=_GivenPath(file_okay=False), help="Where the measured peaks are cached (default ~/.cache/mtbench).")
@handle_errors
def env(as_json, calibrate, cache_dir):
    """Versions, devices and the plugins that would load (imports each framework, never keras)."""
    from mtbench.runner.config import default_cache_dir
    from mtbench.runner.measurement.environment import calibrate_peaks, describe_environment, environment_rows
    if cache_dir is not None and not calibrate:  # without it, nothing reads or writes the cache: dropped unsaid
        raise MtbenchError("--cache-dir is where --calibrate caches the peaks it measures; give --calibrate")
    registry = plugins.registry()
    description = describe_environment(registry)
    if calibrate:
        calibrate_peaks(description, registry, cache_dir or default_cache_dir())
    if as_json:
        click.echo(json.dumps(description, indent=2))
        return
    table = Table(title="mtbench env")
    for column in ("", "name", "value"):
        table.add_column(column)
    for row in environment_rows(description):
        table.add_row(*row)  # the console reads no markup: "mtbench[jax-cuda]" as given
    output_console().print(table)


@main.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@handle_errors
def list_plugins(as_json):
    """List every plugin, loaded or not, with its status, hooks and what it provides, and the extras that can
    run on this machine."""
    from mtbench.runner.measurement.availability import extras_availability
    registry = plugins.registry()
    rows = plugins.plugin_descriptions()
    extras = extras_availability(registry)
    if as_json:
        click.echo(json.dumps({"plugin_api_version": PLUGIN_API_VERSION, "plugins": rows, "extras": extras,
                               "warnings": registry.warnings,
                               "load_plugins": os.environ.get(plugins.LOAD_PLUGINS_ENV)}, indent=2))
        return
    _warn_broken_plugins(registry)
    table = Table(title=f"mtbench plugins (plugin API {PLUGIN_API_VERSION})")
    for column in ("plugin", "package", "status", "hooks", "provides"):
        # A hook's name is one word a user copies into a plugin: whole on one line, the prose beside it folds.
        table.add_column(column, overflow="fold", no_wrap=column == "hooks")
    for row in rows:
        provides = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in row["provides"].items())
        name = row["name"] + (" (built-in)" if row["builtin"] else "")
        status = "\n".join([row["status"], *row["problems"], *row["deprecated"]])
        table.add_row(name, f"{row['package']} {row['version'] or '?'}", status, "\n".join(row["hooks"]), provides)
    console = output_console()
    console.print(table)
    extras_table = Table(title="extras on this machine (default run)")
    for column in ("extra", "backend", "available", "why not"):
        extras_table.add_column(column, overflow="fold")
    for row in extras:
        extras_table.add_row(row["extra"], row["backend"], "yes" if row["available"] else "no", row["reason"] or "")
    console.print(extras_table)
