"""One command for the GPU table: the ways mtbench trains, on whatever device this machine has, within a time
budget that one lent 10-minute session holds, as a markdown table and JSON written after every row.

    python benchmarks/gpu_matrix.py [--presets small] [--dtypes float32,mixed_bfloat16] [--runs jax,torch,...]
                                    [--rows 1,2,5-7] [--steps N] [--budget SECONDS] [--row-timeout SECONDS]
                                    [--out DIR] [-- TRAIN OPTIONS]

The rows. One preset (`small` where a backend sees a GPU, `tiny` on a CPU, so that CI and the tests run the same
code), in this order, the most important comparison first:

     1-3  mixed_bfloat16: `jax`, `torch+torch-compile` (compile mode default), `torch` (eager)
     4    mixed_bfloat16: `torch+torch-compile@reduce-overhead` (CUDA graphs, CUDA only)
     5-6  float32: `jax` with `--matmul-precision highest` (true float32) and `high` (TF32)
     7-9  mixed_bfloat16 with `--extra flash-attention`: `jax`, `torch+torch-compile`, `torch`
    10-11 float32: `torch+torch-compile` with `--matmul-precision highest` and `high`
    12-13 mixed_bfloat16: `best-by-hand-jax`, `best-by-hand-torch` (language models only)
    14    mixed_bfloat16: `jax-step-in-reference-loop` (language models only): row 7's step, mtbench's own, timed
          by benchmarks/best_gpt.py's loop (`--step mtbench`); beside rows 7 and 12 it tells the loop's share of a
          gap from the step's
    15    mixed_bfloat16: `torch+torch-compile+flash-attention@reduce-overhead`: row 8 in CUDA graphs (CUDA only),
          as XLA runs JAX's steps in command buffers by default
    16    mixed_bfloat16: `best-by-hand-torch@reduce-overhead` (language models only): row 13 in CUDA graphs

On a GPU the language-model presets come first and last: `gpt2-small` (GPT-2 small, 124 M parameters with its
padded 50,304-entry vocabulary, batch 16 x 1024) before `small`, `gpt-char` (nanoGPT's Shakespeare-character
shape, batch 64 x 256) after it. A language model runs rows 7, 8, 12, 13, 15, 16, 14, 1, 2, 3, 4, 9 in that
order: each backend's best way (fused attention; torch compiled), the best-by-hand references (benchmarks/best_gpt.py:
nanoGPT's recipe on torch, plain JAX with cuDNN attention, on the same batches from the same weights file), torch's
best way and nanoGPT's in CUDA graphs, then the fair default (unfused attention, the same arithmetic on both). The
column "step vs best by hand (same backend)" is a row's median step over its backend's reference row's (in CUDA
graphs where the row runs in them and that reference ran), with the peak device memory's ratio beside it. Below the
table, JAX against torch twice, by mtbench's fastest row of each and by the references, each a verdict with its 95 %
interval as `mtbench compare` gives one (ahead, or neither ahead beyond the noise), and whether mtbench gives the
references' verdict; a row in CUDA graphs counts there only where one ran on the other side too.

The float32 rows answer whether both backends, set alike, do the same arithmetic and what TF32 buys (JAX's own
default on a GPU is TF32, torch's true float32); JAX's pair comes first because it is cheap to compile. Every row
is `mtbench train --measure-only` (no validation, final evaluation, test translation or saved model), for --steps
steps (default 200 on a GPU, the preset's own on a CPU), and on a GPU with token batching sized for it
(`--max-tokens`: 16384 for `small`, 32768 for `base`, 4096 for `tiny`) unless the TRAIN OPTIONS after `--`, which
go to every run, give `--max-tokens` or `--batch-size`. `--presets`, `--dtypes`, `--runs` and `--rows` (the row
numbers above) choose a part of the plan.

How the figures are taken. First one short process asks each backend plugin what it runs on and, for every row,
whether its dtype and extras can run there (the checks `mtbench train` makes before it trains, for the row's own
preset and dtype). A row they rule out is listed as "skipped: why", as is a CUDA-graphs row without CUDA and a row
whose backend sees only a CPU in a GPU matrix. Then, per preset, `mtbench init-weights` writes one weights file,
and each remaining row is one `mtbench train` in its own process (keras fixes its backend at import, and a row's
crash or out-of-memory cannot touch the next), loading that file, in the order of the plan; `--repeats N`
(default 3 on a GPU, 1 on a CPU) runs the plan N times round-robin, as `mtbench compare` does, and a row's timing
figures are their medians over its repeats (a repeat the budget cuts is noted in `repeats_not_run`). Every figure is
mtbench's own, read from the row's result JSON (see docs/results.md for the clocks):

- `train step that ran`: the step that really ran (`train_step`), the attention implementation the decoder's
  causal and the padded attentions ran (`model.attention`), and what the extras recorded (`extras_record`: the
  compile mode and graph breaks of torch-compile, the fused kernels flash-attention found);
- `step ms (median)`: the median steady step, compilation and each batch shape's first step kept apart;
- `tokens/s`: real (non-padding) target tokens of the steady steps over their time;
- `compile s`: the first-of-shape steps' time beyond the steady median, summed over shapes;
- `MFU`: the steady steps' analytic FLOPs over their time, over the device's datasheet peak for the arithmetic
  (TF32's for `high`; on a CPU, the measured matmul peak);
- `peak device MiB`: the peak device memory the framework reports (n/a on a CPU);
- `parity`: the largest relative loss difference and where, over the first 50 steps, from the first row of the
  same preset, dtype and matmul precision (mtbench compare's check: float32 rows within 0.1 %, 16-bit rows within
  1 % by 10-step means); rows with dropout (`base`) are not checked;
- `row s`: the row's wall time, its process's start, data and compilation included. Below the table, where the
  rows' wall time went: processes starting and ending, keras and the devices starting, data and model build,
  compilation, steady steps and the rest (`wall_split_s` of each repeat in the JSON, from its result's timing).

The budget. `--budget SECONDS` bounds the whole command, counted from its start: a row (or a preset's weights
file) starts only if its estimated time fits in what is left, else it is listed as "cut: not started: it needs
about N s (how that was estimated), M s of the budget were left", and a later, cheaper row may still run. A row's
estimate is the wall time of the last row of its kind (jax, torch eager, torch compiled in one mode) on its preset;
else that of a row of its backend measured there, scaled by the ratio of the two kinds' first guesses; else a first
guess: the weights file's wall time (a process's start and data) plus a fixed allowance per kind (FIRST_GUESS_S).
A best-by-hand row whose row of mtbench (STANDS_BESIDE: 12 beside 7, 13 beside 8, 16 beside 15) is in the plan and
did not run is not started: it would be set beside nothing. A row still running when the budget ends is stopped
("stopped: ...", its log kept), so the command ends within the budget; `--row-timeout` stops a row that hangs.
`.gpukit/check.sh matrix 480` runs `--budget 480` inside one 10-minute device call. Rows cut or stopped are named
below the table with the command that runs just them (`--rows`).

What survives a killed run. Before the first row, and again whenever a row ends, `gpu-matrix.json` (the summary,
rows not yet run marked pending) and `gpu-matrix.md` (the table and the lines above and below it) are rewritten
in `--out`, and the row's table line is printed to stderr. SIGTERM or Ctrl-C stops the running row, marks it and
writes both files. Above the table: the device each backend ran on, the versions and the configuration every row
shares, from the results' `env` and `config`. Each row's result JSON and log go to `--out` too. The last line
printed is the summary as one JSON object. The exit status is 1 when a row failed (not when the budget cut it).

Why not one `mtbench compare --matrix`: compare gives every run the same train options, so it cannot hold two
torch-compile runs that differ in `--compile-mode` or rows of several dtypes; it stops at the first run that fails;
and it has no budget. The rows here are what compare's runs are (the same weights file, one `mtbench train` each,
the same parity check), launched one at a time so that each can be skipped, cut or fail on its own.
"""

import argparse
import functools
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # run as a script: `mtbench` from this checkout

BF16 = "mixed_bfloat16"
DTYPES = ("float32", BF16)
# The language-model rows (`--model gpt`), after the translation rows: nanoGPT's Shakespeare-character shape and
# GPT-2 small, as "preset names" of their own (family, preset).
MODEL_PRESETS = {"gpt-char": ("gpt", "char"), "gpt2-small": ("gpt", "gpt2-small")}
# GPT-2 small first: the comparison people publish, and the one the references' rows are for.
PRESETS_ON = {"gpu": ("gpt2-small", "small", "gpt-char"), "cpu": ("tiny",)}
# The rows of PLAN a language model runs, in the order it runs them: each backend's best way (fused attention,
# compiled), the best-by-hand references, then the fair default (unfused attention) on each way to train.
LANGUAGE_MODEL_ROWS = (7, 8, 12, 13, 15, 16, 14, 1, 2, 3, 4, 9)
# Rows x block tokens per training batch (--batch-size: a language model's blocks are all one length).
GPU_BATCH_SIZE = {"gpt-char": 64, "gpt2-small": 16}
GPU_REPEATS = 3  # each row's figures the median of three runs, interleaved with the other rows'
GPU_STEPS = 200  # enough steady steps for a stable median after compilation, few enough for one device call
# Tokens per training batch on a GPU (--max-tokens), per preset: batches that give the device real work (the
# measured `small` step at batch 64 is host-bound on an H100). A bucket short of a batch's rows passes its pairs
# to the next longer one: `tiny`'s, `small`'s and `base`'s 16-token pairs train padded to 32 at these sizes.
GPU_MAX_TOKENS = {"tiny": 4096, "small": 16384, "base": 32768}


def preset_arguments(preset):
    """The flags that choose a row's model: --preset, and --model for a language-model row."""
    family, name = MODEL_PRESETS.get(preset, (None, preset))
    return (["--model", family] if family else []) + ["--preset", name]
FLASH = "flash-attention"
COMPILE = "torch-compile"
REFERENCE = "best-by-hand"  # benchmarks/best_gpt.py's rows
# Keys of a result's `config` that differ from row to row by design, or name files: not part of the shared
# configuration printed above the table.
PER_ROW_CONFIG = ("backend", "extras", "dtype", "matmul_precision", "compile_mode", "initial_weights",
                  "initial_weights_sha256", "out", "overwrite", "preset", "model", "parameters", "vocab_size",
                  "max_len", "steps", "dropout")
# A row's first guess, in seconds beyond its process's start and data (the weights file's wall time): its
# compilations (two length buckets on `small`) and steps. Guesses, not measurements: each is replaced by the first
# measured row of its kind. On a GPU, about 1.5x what GPT-2 small's rows took on an H100 and an H200 (torch
# compiled: 41 s of compilation on the H100; 25-45 s beyond start and data on the H200, in CUDA graphs or not):
# guesses of 100-130 s cut every row of a fresh H200's 165 s table, where each took 43-61 s in all.
FIRST_GUESS_S = {
    "gpu": {"jax": 40, "torch eager": 20, "torch compiled default": 70, "torch compiled reduce-overhead": 70,
            "reference jax": 40, "reference torch": 60},
    "cpu": {"jax": 15, "torch eager": 10, "torch compiled default": 60, "torch compiled reduce-overhead": 60,
            "reference jax": 15, "reference torch": 10},
}
WEIGHTS_GUESS_S = {"gpu": 40, "cpu": 20}  # a weights file before one was written: a process's start and data


@dataclass(frozen=True)
class Way:
    """One way to train: a backend, its extras and torch.compile's mode; or (`reference`) the backend's
    best-by-hand language model of benchmarks/best_gpt.py, trained on the same batches from the same weights; or
    (`in_reference_loop`) mtbench's own step of the backend and extras, timed by that script's loop."""
    backend: str
    extras: tuple = ()
    compile_mode: str = None
    reference: bool = False
    in_reference_loop: bool = False

    @property
    def label(self):
        if self.reference:
            return f"{REFERENCE}-{self.backend}" + (f"@{self.compile_mode}" if self.compile_mode else "")
        if self.in_reference_loop:
            return f"{self.backend}-step-in-reference-loop"
        name = "+".join((self.backend, *self.extras))
        return f"{name}@{self.compile_mode}" if self.compile_mode else name

    @property
    def kind(self):
        """What its time is made of, for estimates: 'jax', 'torch eager', 'torch compiled MODE' or 'reference
        BACKEND'."""
        if self.reference or self.in_reference_loop:
            return f"reference {self.backend}"
        if self.backend != "torch":
            return self.backend
        if COMPILE not in self.extras:
            return "torch eager"
        return f"torch compiled {self.compile_mode or 'default'}"

    @property
    def language_model_only(self):
        """Run by benchmarks/best_gpt.py, which trains only the GPT."""
        return self.reference or self.in_reference_loop

    def train_arguments(self):
        arguments = ["--backend", self.backend]
        if self.reference:
            return arguments + (["--compile-mode", self.compile_mode] if self.compile_mode else [])
        if self.in_reference_loop:
            arguments += ["--step", "mtbench"]
        for extra in self.extras:
            arguments += ["--extra", extra]
        if FLASH not in self.extras:  # the fair default's rows: unfused on every device (auto would fuse on a GPU)
            arguments += ["--attention", "unfused"]
        if self.backend == "torch" and COMPILE not in self.extras:  # the eager rows (auto compiles on a GPU)
            arguments += ["--step", "eager"]
        return arguments + (["--compile-mode", self.compile_mode] if self.compile_mode else [])


WAYS = (
    Way("jax"),
    Way("torch"),
    Way("torch", (COMPILE,)),
    Way("torch", (COMPILE,), "reduce-overhead"),
    Way("jax", (FLASH,)),
    Way("torch", (FLASH,)),
    Way("torch", (COMPILE, FLASH)),
    Way("jax", reference=True),
    Way("torch", reference=True),
    Way("jax", (FLASH,), in_reference_loop=True),
    Way("torch", (COMPILE, FLASH), "reduce-overhead"),
    Way("torch", compile_mode="reduce-overhead", reference=True),
)
WAYS_BY_LABEL = {way.label: way for way in WAYS}

# (dtype, way, --matmul-precision or None for mtbench's default), in the order they run; a row's number is its
# place here (1-based), the same whatever part of the plan runs.
PLAN = (
    (BF16, "jax", None),
    (BF16, "torch+torch-compile", None),
    (BF16, "torch", None),
    (BF16, "torch+torch-compile@reduce-overhead", None),
    ("float32", "jax", "highest"),
    ("float32", "jax", "high"),
    (BF16, "jax+flash-attention", None),
    (BF16, "torch+torch-compile+flash-attention", None),
    (BF16, "torch+flash-attention", None),
    ("float32", "torch+torch-compile", "highest"),
    ("float32", "torch+torch-compile", "high"),
    (BF16, f"{REFERENCE}-jax", None),
    (BF16, f"{REFERENCE}-torch", None),
    (BF16, "jax-step-in-reference-loop", None),
    (BF16, "torch+torch-compile+flash-attention@reduce-overhead", None),  # CUDA graphs: as XLA's command buffers
    (BF16, f"{REFERENCE}-torch@reduce-overhead", None),  # nanoGPT's recipe in CUDA graphs: row 15's reference
)
# Each best-by-hand row and the row of mtbench's it is measured beside: a reference whose row did not run is not
# started (it would be set beside nothing, and the budget it takes is a further row's).
STANDS_BESIDE = {12: 7, 13: 8, 16: 15}


@dataclass(frozen=True)
class Row:
    preset: str
    dtype: str
    way: Way
    precision: str = None  # --matmul-precision; None: not given (mtbench's default)
    number: int = 0        # its place in PLAN

    @property
    def dtype_label(self):
        return f"{self.dtype} ({self.precision})" if self.precision else self.dtype

    @property
    def key(self):
        return f"{self.preset} {self.dtype_label} {self.way.label}"

    @property
    def probe_key(self):
        """The probe's refusals depend on the preset, dtype and way only."""
        return f"{self.preset} {self.dtype} {self.way.label}"

    @property
    def file_stem(self):
        return "-".join([self.preset, self.dtype, *([self.precision] if self.precision else []), self.way.label])

    def train_arguments(self):
        precision = ["--matmul-precision", self.precision] if self.precision else []
        return [*self.way.train_arguments(), *preset_arguments(self.preset), "--dtype", self.dtype, *precision]


# ---- what the machine can run (in a child process: a framework that touches the GPU keeps memory) ----------------

def probe_machine():
    """{"backends": {name: {"device": ...} or {"missing": why}}, "refusals": {row key: why not, or None}} for every
    preset, dtype and way: the checks `mtbench train` makes before training (`device_refusal`, as `start_backend`
    calls it), each for the row's own preset and dtype. Imports the frameworks, never keras."""
    from mtbench.errors import MtbenchError
    from mtbench.keras_models.presets import PRESETS
    from mtbench.plugins import manager as plugins
    from mtbench.plugins.api import RunContext
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import device_refusal, resolve_extras
    registry = plugins.registry()
    backends = {}
    for name in dict.fromkeys(way.backend for way in WAYS):
        backend = registry.backends.get(name)
        missing = (f"backend '{name}' is not installed as a plugin" if backend is None
                   else backend.missing_framework())
        backends[name] = {"missing": missing} if missing else {"device": backend.device_info()}
    refusals = {}
    for preset in (*PRESETS, *MODEL_PRESETS):
        family, name = MODEL_PRESETS.get(preset, ("transformer", preset))
        for dtype in DTYPES:
            for way in WAYS:
                if "device" not in backends[way.backend]:
                    continue
                backend = registry.backends[way.backend]
                config = TrainConfig(backend=way.backend, extras=way.extras, preset=name, dtype=dtype,
                                     model_name=family)
                run = RunContext(config=config, backend=backend, device=backends[way.backend]["device"],
                                 model_shape=config.model)
                try:
                    extras, unresolved = resolve_extras(way.extras, backend, registry), None
                except MtbenchError as error:
                    extras, unresolved = [], str(error)
                refusals[Row(preset, dtype, way).probe_key] = device_refusal(run, extras) or unresolved
    return {"backends": backends, "refusals": refusals}


def run_probe():
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # asking JAX for its devices must not claim the GPU's memory
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe"], capture_output=True, text=True,
                          env=env, cwd=REPOSITORY, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"asking the backends what this machine has failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def device_kind(probe):
    """'gpu' where any backend sees an accelerator (whose matrix it is), else 'cpu'."""
    kinds = {info["device"]["kind"] for info in probe["backends"].values() if "device" in info}
    return "cpu" if kinds <= {"cpu"} else "gpu"


# ---- the plan ---------------------------------------------------------------------------------------------------

def plan_rows(probe, presets=None, dtypes=DTYPES, ways=WAYS, numbers=None):
    """[(Row, why it is skipped or None)] in the order they run: by preset, then PLAN's order; `numbers` (row
    numbers) keeps only those."""
    kind = device_kind(probe)
    rows = []
    for preset in presets or PRESETS_ON[kind]:
        order = LANGUAGE_MODEL_ROWS if preset in MODEL_PRESETS else [
            number for number, (_, label, _) in enumerate(PLAN, start=1)
            if not WAYS_BY_LABEL[label].language_model_only]
        for number in order:
            dtype, label, precision = PLAN[number - 1]
            way = WAYS_BY_LABEL[label]
            if dtype not in dtypes or way not in ways or (numbers and number not in numbers):
                continue
            row = Row(preset, dtype, way, precision, number)
            rows.append((row, skip_reason(row, probe, kind)))
    return rows


def skip_reason(row, probe, kind):
    info = probe["backends"][row.way.backend]
    if "missing" in info:
        return info["missing"]
    device = info["device"]
    if kind != "cpu" and device["kind"] == "cpu":
        return (f"{row.way.backend} sees no GPU here ({device['name']}), and this matrix is the GPU's "
                f"(install the backend's CUDA build)")
    if row.way.compile_mode == "reduce-overhead" and device["kind"] != "gpu":
        return f"CUDA graphs need a CUDA device; {row.way.backend} runs on the {device['kind']} here"
    return probe["refusals"].get(row.probe_key)


def batching_options(preset, train_options, kind):
    """On a GPU, `--max-tokens` sized for it, unless the train options choose the batch themselves."""
    chosen = any(option.split("=")[0] in ("--max-tokens", "--batch-size") for option in train_options)
    if kind == "cpu" or chosen:
        return []
    if preset in MODEL_PRESETS:
        return ["--batch-size", str(GPU_BATCH_SIZE[preset])]
    return ["--max-tokens", str(GPU_MAX_TOKENS[preset])]


def kind_backend(kind):
    """The backend of a `Way.kind`: 'reference torch' and 'torch eager' are torch's."""
    return kind.split()[-1] if kind.startswith("reference ") else kind.split()[0]


class Estimates:
    """How long a row, or a preset's weights file, will take: measured where a row of its kind (or the weights
    file) already ran on its preset, else a first guess."""

    def __init__(self, kind):
        self.kind = kind
        self.weights_s = {}  # preset: the weights file's wall time
        self.rows = {}       # (preset, way kind): (wall time, key of the row it was measured on)

    def weights_file(self, preset):
        return self.weights_s.get(preset, WEIGHTS_GUESS_S[self.kind])

    def row(self, row):
        """(seconds, how they were estimated)."""
        kind = row.way.kind
        measured = self.rows.get((row.preset, kind))
        if measured:
            return measured[0], f"{measured[1]} took {measured[0]:.0f} s"
        guesses = FIRST_GUESS_S[self.kind]
        guess = guesses.get(kind, max(guesses.values()))
        # A row of the backend measured on this preset, scaled by the guesses' ratio: this machine's speed in place
        # of the guesses' (the guess for CUDA graphs cut an H200's row that took 60 s compiled without them).
        like = [(other, measured) for (preset, other), measured in self.rows.items()
                if preset == row.preset and other in guesses and kind_backend(other) == row.way.backend]
        if like and kind in guesses:
            other, (seconds, key) = min(like, key=lambda item: abs(math.log(guesses[item[0]] / guess)))
            factor = guess / guesses[other]
            return seconds * factor, (f"{key} took {seconds:.0f} s, x{factor:.2f} for {kind} (the first guesses' "
                                      f"ratio)")
        setup = self.weights_file(row.preset)
        source = "the weights file's" if row.preset in self.weights_s else "a guess"
        return setup + guess, f"a first guess for {kind}: {setup:.0f} s to start ({source}) + {guess} s"

    def ran(self, row, seconds):
        self.rows[(row.preset, row.way.kind)] = (seconds, row.key)


# ---- running the rows -------------------------------------------------------------------------------------------

class TimedOut(str):
    """run_mtbench's reason for a process it stopped at its timeout."""


MTBENCH = ("-m", "mtbench")
REFERENCE_SCRIPT = (os.path.join(REPOSITORY, "benchmarks", "best_gpt.py"),)


def run_mtbench(arguments, log_file, timeout, program=MTBENCH):
    """Runs `python -m mtbench ARGUMENTS` (or `program`, a script) in a fresh process, its output kept in
    `log_file`. Returns None, or why it failed in one line (a `TimedOut` when it was stopped at `timeout`
    seconds)."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}  # the backend plugin sets it
    try:
        proc = subprocess.run([sys.executable, *program, *arguments], capture_output=True, text=True,
                              env=env, cwd=REPOSITORY, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or ""
        if isinstance(output, bytes):  # what a killed child left is not always decoded
            output = output.decode(errors="replace")
        with open(log_file, "w", encoding="utf-8") as f:
            f.write(f"$ mtbench {' '.join(arguments)}\n# stopped after {timeout:.0f} s\n--- stdout\n{output}")
        return TimedOut(f"stopped after {timeout:.0f} s (log: {log_file})")
    with open(log_file, "w", encoding="utf-8") as f:
        f.write(f"$ mtbench {' '.join(arguments)}\n# exit code {proc.returncode}\n--- stdout\n{proc.stdout}"
                f"--- stderr\n{proc.stderr}")
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    last = lines[-1].removeprefix("Error: ") if lines else f"exit code {proc.returncode}, no error message"
    return f"{last} (log: {log_file})"


def what_ran(result):
    """In a few words, what the result records of how it trained: the attention each kind of training attention
    ran, and what each extra recorded (torch-compile's mode and graph breaks, flash-attention's kernels)."""
    parts = [result["description"]] if result.get("description") else []
    attention = (result.get("model") or {}).get("attention") or {}
    if "causal" in attention or "masked" in attention:
        parts.append(f"attention causal/masked {attention.get('causal')}/{attention.get('masked')}")
    for name, record in (result.get("extras_record") or {}).items():
        if name == COMPILE:
            parts.append(f"mode {record.get('mode')}, {record.get('graph_breaks')} graph breaks")
        elif name == FLASH:
            parts.append("kernels " + (", ".join(record.get("kernels") or []) or "none"))
        else:
            parts.append(name)
    return "; ".join(parts)


def figures(result):
    timing, memory = result["timing"], result["memory"]
    peak = memory.get("peak_device_bytes")
    median = timing.get("step_s_median")
    return {"train_step": result["train_step"], "extras_record": result.get("extras_record") or {},
            "what_ran": what_ran(result), "result_status": result["status"],
            "result_status_reason": result.get("status_reason"),
            "step_ms_median": None if median is None else median * 1e3, "tokens_per_s": timing.get("tokens_per_s"),
            "compile_s": timing.get("compile_s"), "mfu": result["utilization"].get("mfu"),
            "peak_device_mib": None if peak is None else peak / 2 ** 20, "steady_steps": timing.get("steady_steps"),
            "device": result["env"]["device"], "matmul_precision_set": matmul_precision_set(result)}


# Where a row's wall time goes, in the order a row spends it (see wall_split).
WALL_PARTS = {"process": "the process starting and ending", "backend": "keras and the devices starting",
              "peak": "the peak measured", "data_and_build": "data and model build", "compile": "compilation",
              "steady_steps": "steady steps", "rest": "the rest"}


def wall_split(result, wall_s):
    """The row's `wall_s` in WALL_PARTS, from its result's timing: outside the run (`total_s`, which leaves out the
    peak's measurement: a CPU's, once a machine), its phases before training, the compile time and the steady
    steps; "rest" is what is left (the first steps beyond their compilation, writing the result). What one process
    for several rows could save is the first two."""
    timing = result["timing"]
    phases = dict(timing.get("phases_s") or {})
    peak = phases.pop("peak", 0.0)
    split = {"process": wall_s - timing["total_s"] - peak if timing.get("total_s") is not None else 0.0,
             "backend": phases.pop("backend", 0.0), "peak": peak,
             "data_and_build": sum(seconds for phase, seconds in phases.items() if phase != "train"),
             "compile": timing.get("compile_s") or 0.0, "steady_steps": timing.get("steady_s") or 0.0}
    split["rest"] = wall_s - sum(split.values())
    return split


def wall_split_line(records):
    """One line: where the wall time of every row that ran went, summed over their repeats."""
    splits = [m["wall_split_s"] for r in records for m in r.get("measured", []) if m.get("wall_split_s")]
    if not splits:
        return None
    seconds = {part: sum(split[part] for split in splits) for part in WALL_PARTS}
    total = sum(seconds.values())
    parts = ", ".join(f"{label} {seconds[part]:.0f} s ({100 * seconds[part] / total:.0f} %)"
                      for part, label in WALL_PARTS.items())
    return (f"where the rows' {total:.0f} s went: {parts}; running several rows in one process would save at "
            f"most the first two")


def matmul_precision_set(result):
    """What each framework reported it set for float32 matmuls (`env.matmul_precision`, schema 4), or None."""
    recorded = result["env"].get("matmul_precision")
    return recorded.get("reported") if isinstance(recorded, dict) else recorded


def first_record(row, reason):
    record = {"row": row.number, "key": row.key, "preset": row.preset, "dtype": row.dtype,
              "matmul_precision": row.precision, "run": row.way.label}
    record.update(status="skipped" if reason else "pending", reason=reason)
    return record


def run_matrix(planned, args, train_options, kind, clock=None, started=None, publish=None):
    """Runs the planned rows within the budget (counted from `started`, default now); returns one record per row,
    in the plan's order, and the results of the rows that ran ({row key: [the result of each repeat]}).
    `publish(records, results, record)` is called before the first row and whenever a row ends (`record`: that
    row's)."""
    clock = clock or time.monotonic
    started = clock() if started is None else started
    publish = publish or (lambda records, results, record: None)
    estimates = Estimates(kind)
    records = [first_record(row, reason) for row, reason in planned]
    results, weights = {}, {}
    publish(records, results, None)
    runnable = [row for row, reason in planned if reason is None]
    repeats = args.repeats or 1
    record = None
    try:
        # Round-robin over the repeats, as mtbench compare runs them: a slow drift of the machine touches every
        # row alike; a row that did not run in the first repeat is not tried again.
        for repeat in range(1, repeats + 1):
            for (row, reason), record in zip(planned, records):
                if reason or (repeat > 1 and record["status"] != "ran"):
                    continue
                beside = counterpart_not_run(row, planned, records)
                if beside:
                    record.update(status="cut", reason=beside)
                    continue
                tag = f"[{runnable.index(row) + 1}/{len(runnable)}]" + (f" #{repeat}" if repeats > 1 else "")
                run_row(row, record, args, train_options + batching_options(row.preset, train_options, kind),
                        estimates, weights, results, lambda: args.budget - (clock() - started), clock, tag,
                        lambda: publish(records, results, None), repeat)
                publish(records, results, record)
    except KeyboardInterrupt:
        for other in records:
            if other["status"] == "running":
                other.update(status="stopped", reason="the matrix was interrupted while this row ran")
            elif other["status"] == "pending":
                other.update(status="cut", reason="the matrix was interrupted before it started")
        publish(records, results, record)
        raise
    return records, results


def counterpart_not_run(row, planned, records):
    """Why a best-by-hand row is not started: the row of mtbench's it stands beside (STANDS_BESIDE) is in the plan
    and did not run; or None."""
    number = STANDS_BESIDE.get(row.number)
    for (other, _), record in zip(planned, records):
        if number and other.number == number and (other.preset, other.dtype) == (row.preset, row.dtype) \
                and record["status"] != "ran":
            return (f"not started: row {number} ({other.way.label}), the row it is measured beside, did not run "
                    f"({record['status']})")
    return None


def run_row(row, record, args, options, estimates, weights, results, left, clock, tag, starting, repeat=1):
    """Writes the preset's weights file if it is the first row of it, then trains the row (its `repeat`th time);
    `record` says how it went: its figures are the medians over the repeats that ran. `left()`: the seconds of
    the budget left; `starting()` is called once the row is marked running."""
    if repeat > 1:  # the row ran before: a later repeat that cannot run is noted, the figures measured stand
        record.update(status="running")
        measured = record["measured"]
        give_up = lambda status, reason: record.update(
            status="ran", reason=None, repeats_not_run=[*record.get("repeats_not_run", []),
                                                        f"repeat {repeat} {status}: {reason}"])
    else:
        measured = record.setdefault("measured", [])
        give_up = lambda status, reason: record.update(status=status, reason=reason)
    need, basis = estimates.row(row)
    if row.preset not in weights:
        need += estimates.weights_file(row.preset)
        basis += f", and the preset's weights file first (about {estimates.weights_file(row.preset):.0f} s)"
    record["estimate_s"] = need
    if need > left():
        give_up("cut", f"not started: it needs about {need:.0f} s ({basis}); {max(left(), 0):.0f} s of the "
                       f"{args.budget:g} s budget were left")
        return
    preset_dir = os.path.join(args.out, row.preset)
    os.makedirs(preset_dir, exist_ok=True)
    record["status"] = "running"
    starting()
    if row.preset not in weights:
        path = os.path.join(preset_dir, "initial-weights.npz")
        print(f"{row.preset}: writing the initial weights every row of it loads", file=sys.stderr, flush=True)
        weights_started, timeout = clock(), min(args.row_timeout, left())
        failure = run_mtbench(["init-weights", "--backend", row.way.backend, *preset_arguments(row.preset), *options,
                               "--cache-dir", args.cache_dir, "--out", path, "--overwrite"],
                              path[:-len(".npz")] + ".log", timeout)
        estimates.weights_s[row.preset] = clock() - weights_started
        if isinstance(failure, TimedOut) and timeout < args.row_timeout:
            failure = TimedOut(f"the {args.budget:g} s budget ran out while it ran; {failure}")
        weights[row.preset] = (path, failure)
    path, weights_failure = weights[row.preset]
    if weights_failure:
        status = "stopped" if isinstance(weights_failure, TimedOut) else "failed"
        record.update(status=status, reason=f"mtbench init-weights: {weights_failure}")
        return
    print(f"{tag} {row.key} ...", file=sys.stderr, flush=True)
    row_started = clock()
    stem = row.file_stem + (f"-repeat{repeat}" if repeat > 1 else "")
    result_file = os.path.join(preset_dir, f"{stem}.json")
    row_options = ["--steps", str(args.steps)] if args.steps else []
    row_options += ["--profile", str(args.profile)] if args.profile else []  # mtbench train and the references
    timeout = min(args.row_timeout, left())
    if timeout <= 0:
        give_up("cut", f"not started: the weights file spent the {args.budget:g} s budget")
        return
    command, program = (([], REFERENCE_SCRIPT) if row.way.language_model_only else (["train"], MTBENCH))
    failure = run_mtbench([*command, *row.train_arguments(), *row_options, *options, "--cache-dir", args.cache_dir,
                           "--initial-weights", path, "--out", result_file, "--overwrite", "--report", "none",
                           "--measure-only"],
                          os.path.join(preset_dir, f"{stem}.log"), timeout, program)
    wall_s = clock() - row_started
    if repeat == 1:
        record.update(wall_s=wall_s, result_file=os.path.abspath(result_file))
    if isinstance(failure, TimedOut) and timeout < args.row_timeout:
        give_up("stopped", f"the {args.budget:g} s budget ran out {wall_s:.0f} s into the row (estimated at "
                           f"{need:.0f} s); {failure}")
        return
    if failure:
        give_up("failed", failure + (" (--row-timeout)" if isinstance(failure, TimedOut) else ""))
        return
    with open(result_file, encoding="utf-8") as f:
        result = json.load(f)
    results.setdefault(row.key, []).append(result)
    estimates.ran(row, wall_s)
    measured.append({**figures(result), "wall_s": wall_s, "wall_split_s": wall_split(result, wall_s)})
    record.update(status="ran", reason=None, **median_figures(measured))
    print(f"{tag} {row.key}: {record['wall_s']:.1f} s, {result['train_step']}", file=sys.stderr, flush=True)


# The figures a row reports as their median over its repeats.
MEDIAN_FIGURES = ("step_ms_median", "tokens_per_s", "compile_s", "mfu", "peak_device_mib", "wall_s")


def median_figures(measured):
    """The first repeat's record of what ran, with each of MEDIAN_FIGURES the median over the repeats."""
    import statistics
    medians = {}
    for key in MEDIAN_FIGURES:
        values = [figures[key] for figures in measured if figures.get(key) is not None]
        medians[key] = statistics.median(values) if values else None
    return {**measured[0], **medians, "repeats": len(measured)}


def parity_cell(pair, reference_run):
    """'0.11 % in steps 21-30 (10-step means) vs jax; steps 1-5: 0.04 %', each part saying where it is not
    within its tolerance."""
    from mtbench.runner.results.parity import percent
    text = (f"{percent(pair.max_relative_difference)} {pair.where()} vs {reference_run}"
            + ("" if pair.curve_within else f", NOT within {percent(pair.tolerance)}"))
    if pair.early_max_relative_difference is not None:
        text += (f"; steps 1-{pair.early_steps}: {percent(pair.early_max_relative_difference)}"
                 + ("" if pair.early_within else f", NOT within {percent(pair.early_tolerance)}"))
    return text


def add_parity(records, results):
    """Each row that ran gets mtbench compare's parity against the first row of its preset, dtype and matmul
    precision."""
    from mtbench.figures import run_dtype
    from mtbench.runner.results.parity import check_parity

    def arithmetic(result):  # --matmul-precision sets float32 matmuls only
        dtype = run_dtype(result)
        return f"{dtype} {result['config'].get('matmul_precision', 'highest')}" if dtype == "float32" else dtype

    for preset in dict.fromkeys(record["preset"] for record in records):
        ran = [r for r in records if r["preset"] == preset and r["status"] == "ran"]
        report = check_parity([(r["key"], results[r["key"]][0]) for r in ran], arithmetic)  # first repeat's losses
        reference_run = {r["key"]: r["run"] for r in ran}
        cells = {pair.run: parity_cell(pair, reference_run[pair.reference])
                 for pair in report.pairs}
        references = {pair.reference for pair in report.pairs}
        unchecked = dict(report.unchecked)
        for record in ran:
            if record["key"] in cells:
                record["parity"] = cells[record["key"]]
            elif record["key"] in references:
                record["parity"] = "reference"
            else:
                record["parity"] = "not checked: " + unchecked.get(record["key"], "no other run to compare with")


# ---- output -----------------------------------------------------------------------------------------------------

COLUMNS = ("#", "preset", "dtype", "run", "train step that ran", "step ms (median)", "tokens/s", "compile s", "MFU",
           "peak device MiB", "step vs best by hand (same backend)", "parity", "row s")
STATUS_COLUMN = COLUMNS.index("train step that ran")


def number(value, form):
    return "n/a" if value is None else format(value, form)


def table_row(record):
    dtype = record["dtype"] + (f" ({record['matmul_precision']})" if record.get("matmul_precision") else "")
    head = [str(record.get("row", "")), record["preset"], dtype, record["run"]]
    wall = number(record.get("wall_s"), ".0f") if "wall_s" in record else ""
    if record["status"] != "ran":
        why = f"{record['status']}: {record['reason']}" if record.get("reason") else record["status"]
        return head + [why] + [""] * (len(COLUMNS) - STATUS_COLUMN - 2) + [wall]
    step = record["train_step"] + (f" ({record['what_ran']})" if record["what_ran"] else "")
    if record["result_status"] != "completed":  # a diverged run's figures stand, but not as a finished run's
        step += f"; {record['result_status']}: {record['result_status_reason']}"
    return head + [step, number(record["step_ms_median"], ".1f"), number(record["tokens_per_s"], ",.0f"),
                   number(record["compile_s"], ".1f"),
                   "n/a" if record["mfu"] is None else f"{record['mfu'] * 100:.1f} %",
                   number(record["peak_device_mib"], ",.0f"), record.get("vs_best_by_hand", ""),
                   record.get("parity", ""), wall]


def table_line(record):
    return "| " + " | ".join(cell.replace("|", "/") for cell in table_row(record)) + " |"


def markdown_table(records):
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---" if i <= STATUS_COLUMN else "---:" for i in range(len(COLUMNS))) + "|"]
    return "\n".join(lines + [table_line(record) for record in records])


def shared_config(results):
    """The configuration every row that ran shares (what differs by design left out)."""
    configs = [repeats[0]["config"] for repeats in results.values()]
    if not configs:
        return {}
    return {key: value for key, value in configs[0].items()
            if key not in PER_ROW_CONFIG and all(config.get(key) == value for config in configs)}


@functools.lru_cache(maxsize=1)
def this_host():
    from mtbench.runner.measurement.environment import host_environment
    return host_environment()


def environment(results, probe):
    """Versions, host and the device each backend ran on: from the `env` of a row mtbench trained where one ran
    (a best-by-hand row's names its device alone), else from this process; the devices from the probe where no
    row of the backend ran."""
    firsts = [repeats[0] for repeats in results.values()]
    described = [result["env"] for result in firsts if "python" in result["env"]]
    env = dict(described[0]) if described else dict(this_host())
    for key in ("device", "backend_versions", "matmul_precision"):
        env.pop(key, None)
    devices = {}
    for name, info in probe["backends"].items():
        ran = [r for r in firsts if r["backend"] == name]
        devices[name] = ran[0]["env"]["device"] if ran else info.get("device", {"missing": info.get("missing")})
    return env, devices


def describe_device(device):
    if "missing" in device:
        return f"not available ({device['missing']})"
    return f"{device.get('count', 1)}x {device.get('name')} ({device.get('kind')})"


def rerun_commands(records, args, train_options):
    """For each preset, the command that runs just the rows the budget cut or stopped."""
    commands = []
    for preset in dict.fromkeys(r["preset"] for r in records):
        numbers = [str(r["row"]) for r in records if r["preset"] == preset and r["status"] in ("cut", "stopped")]
        if numbers:
            options = f" -- {' '.join(train_options)}" if train_options else ""
            commands.append(f"python3 benchmarks/gpu_matrix.py --presets {preset} --rows {','.join(numbers)} "
                            f"--budget {args.budget:g}{options}")
    return commands


def add_best_by_hand_ratios(records):
    """Each row that ran beside a best-by-hand reference of its preset, dtype and backend (of its compile mode where
    that ran) gets its steady step over the reference's, and its peak device memory over the reference's."""
    ran = {(r["preset"], r["dtype"], r["run"]): r for r in records if r["status"] == "ran"}
    for record in ran.values():
        way = WAYS_BY_LABEL[record["run"]]
        plain = ran.get((record["preset"], record["dtype"], f"{REFERENCE}-{way.backend}"))
        reference = ran.get((record["preset"], record["dtype"], f"{REFERENCE}-{way.backend}@{way.compile_mode}"),
                            plain)  # like for like: a row in CUDA graphs beside the reference in them
        if way.reference or reference is None or not (record["step_ms_median"] and reference["step_ms_median"]):
            continue
        record["best_by_hand"] = reference["key"]
        record["step_vs_best_by_hand"] = record["step_ms_median"] / reference["step_ms_median"]
        text = f"{record['step_vs_best_by_hand']:.2f}x"
        if record.get("peak_device_mib") and reference.get("peak_device_mib"):
            record["memory_vs_best_by_hand"] = record["peak_device_mib"] / reference["peak_device_mib"]
            text += f" (memory {record['memory_vs_best_by_hand']:.2f}x)"
        record["vs_best_by_hand"] = text + ("" if reference is plain else f" vs {reference['run']}")


def ranking(rows, results=None):
    """The fastest row of each backend among `rows` (records that ran), JAX against torch, or None without both
    backends: {'leader' ('jax', 'torch', or None where neither is ahead beyond the noise), 'faster' and 'ratio'
    (the faster backend and its speed over the other's), 'interval' ([low, high] of that ratio, or None),
    'steps_ms': {backend: median ms}, 'rows': {backend: run}, 'repeats', 'windows'}. The leader is
    called as `mtbench compare` calls a verdict: from the 95 % interval of the steady steps' ratio over the rows'
    repeats and the steady windows within each (`results`: {row key: [the result of each repeat]}); without the
    rows' results, by their medians alone."""
    from mtbench.runner.results.verdicts import call_of, ratio_interval, undetermined_reason
    fastest = {}
    for record in rows:
        backend = WAYS_BY_LABEL[record["run"]].backend
        if record["step_ms_median"] and (backend not in fastest
                                         or record["step_ms_median"] < fastest[backend]["step_ms_median"]):
            fastest[backend] = record
    if set(fastest) != {"jax", "torch"}:
        return None
    steps = {backend: record["step_ms_median"] for backend, record in sorted(fastest.items())}
    faster = min(steps, key=steps.get)
    rank = {"leader": faster, "faster": faster, "ratio": max(steps.values()) / min(steps.values()),
            "interval": None, "steps_ms": steps,
            "rows": {backend: record["run"] for backend, record in sorted(fastest.items())},
            "repeats": min(record.get("repeats", 1) for record in fastest.values()), "windows": None,
            "undetermined": None}
    sides = [(results or {}).get(fastest[backend].get("key"), []) for backend in ("jax", "torch")]
    interval = ratio_interval("step_s_median", *sides)
    if interval is not None:
        speed, low, high = interval.speed()  # JAX's speed over torch's, from their steady windows
        rank["leader"] = {"faster": "jax", "slower": "torch"}.get(call_of(interval))
        rank["undetermined"] = undetermined_reason(interval)  # one run a row: the noise between runs unmeasured
        rank["faster"] = "jax" if speed >= 1 else "torch"
        rank["ratio"], rank["interval"] = (speed, [low, high]) if speed >= 1 else (1 / speed, [1 / high, 1 / low])
        # Windows are resampled where each row is one run; over repeats, each repeat's figure holds its windows.
        rank["windows"] = min(interval.windows) if interval.windows else None
    return rank


def ranking_text(rank):
    """'jax ahead, 1.02x (1.01–1.03) (its row 37.0 ms, the other 37.6 ms)', or 'neither ahead beyond the noise,
    jax 1.01x (0.99–1.03) (...)' where the interval holds 1."""
    from mtbench.runner.results.verdicts import range_text
    span = f" ({range_text(*rank['interval'])})" if rank["interval"] else ""
    steps = ", ".join(f"{rank['rows'][b]} {rank['steps_ms'][b]:.1f} ms" for b in ("jax", "torch"))
    if rank.get("undetermined"):
        return f"undetermined ({rank['undetermined']}), {rank['faster']} {rank['ratio']:.2f}x{span} ({steps})"
    if rank["leader"] is None:
        return f"neither ahead beyond the noise, {rank['faster']} {rank['ratio']:.2f}x{span} ({steps})"
    return f"{rank['leader']} ahead, {rank['ratio']:.2f}x{span} ({steps})"


def like_for_like(ours, references):
    """(ours, references, left out): the rows in CUDA graphs (torch.compile's reduce-overhead) on one side are left
    out where none ran on the other, so that neither side's best is in them alone."""
    def graphs(rows):
        return [r for r in rows if WAYS_BY_LABEL[r["run"]].compile_mode == "reduce-overhead"]

    left_out = (graphs(references) if not graphs(ours) else []) + (graphs(ours) if not graphs(references) else [])
    return ([r for r in ours if r not in left_out], [r for r in references if r not in left_out], left_out)


def verdicts(records, results=None):
    """For each preset and dtype whose best-by-hand references both ran: JAX against torch as mtbench's fastest
    rows rank them and as the references do (`ranking`), and whether mtbench gives the references' verdict (the
    issue's goal: mtbench must not change the answer; 'neither ahead' is a verdict of its own). Each with its line
    of text."""
    from mtbench.runner.results.verdicts import MIN_WINDOWS  # fewer, and the bootstrap within a run is weak
    groups = {}
    for record in records:
        if record["status"] == "ran" and not WAYS_BY_LABEL[record["run"]].in_reference_loop:
            groups.setdefault((record["preset"], record["dtype"]), []).append(record)
    found = []
    for (preset, dtype), rows in groups.items():
        ours_rows, reference_rows, left_out = like_for_like(
            [r for r in rows if not WAYS_BY_LABEL[r["run"]].reference],
            [r for r in rows if WAYS_BY_LABEL[r["run"]].reference])
        ours, references = ranking(ours_rows, results), ranking(reference_rows, results)
        if ours is None or references is None:
            continue
        # None where either ranking is undetermined: whether mtbench changes the verdict is unknown.
        same = None if ours.get("undetermined") or references.get("undetermined") else \
            ours["leader"] == references["leader"]
        repeats = min(ours["repeats"], references["repeats"])
        if not (ours["interval"] and references["interval"]):
            basis = "medians, no interval" if repeats == 1 else f"medians of {repeats} runs, no interval"
        elif repeats == 1:
            basis = "one run a row: 95 % intervals of the noise within each run, not between runs"
        else:
            basis = f"{repeats} runs a row, 95 % intervals"
        windows = min(rank["windows"] or MIN_WINDOWS for rank in (ours, references))
        if windows < MIN_WINDOWS:
            basis += (f"; {windows} steady timing windows in a run, too few to resample (more --steps, or -- "
                      f"--timing-window N smaller)")
        if left_out:
            basis += (f"; left out, as CUDA graphs ran on one side only: "
                      f"{', '.join(r['run'] for r in left_out)}")
        line = (f"{preset} {dtype}, JAX against torch: mtbench's fastest rows put {ranking_text(ours)}; the "
                f"best-by-hand references put {ranking_text(references)}: "
                + {True: "the same verdict", False: "mtbench changes the verdict",
                   None: "whether mtbench changes the verdict is undetermined"}[same] + f" ({basis})")
        found.append({"preset": preset, "dtype": dtype, "mtbench": ours, "references": references,
                      "same_verdict": same, "line": line})
    return found


def summarize(records, results, probe, args, train_options, kind, elapsed_s, finished):
    add_parity(records, results)
    add_best_by_hand_ratios(records)
    env, devices = environment(results, probe)
    return {
        "kind": "gpu-matrix", "device_kind": kind, "finished": finished,
        "presets": list(dict.fromkeys(r["preset"] for r in records)), "steps": args.steps,
        "repeats": args.repeats or 1,
        "train_options": train_options, "budget_s": args.budget, "elapsed_s": elapsed_s,
        "cut": [r["key"] for r in records if r["status"] in ("cut", "stopped")],
        "rerun": rerun_commands(records, args, train_options),
        "devices": devices, "env": env, "config": shared_config(results),
        "clock": next((r[0]["timing"].get("clock") for r in results.values()), None),
        "wall_split": wall_split_line(records), "verdicts": verdicts(records, results),
        "profiles": profile_lines(records, results),
        "out": os.path.abspath(args.out), "rows": records,
    }


def profile_lines(records, results):
    """Where each profiled row's traced steps went (its first repeat's): how busy the device was, and its longest
    kernels, beside its reference's; and a row's kernels by kind against its reference's."""
    from mtbench.figures import kinds_against_text, profile_operations_text
    lines = []
    for record in records:
        if record["status"] == "ran" and (text := profile_operations_text(results[record["key"]][0])):
            lines.append(f"profile of row {record.get('row', '')} ({record['run']}): {text}")
            if record.get("best_by_hand") in results and (
                    against := kinds_against_text(results[record["key"]][0], results[record["best_by_hand"]][0])):
                reference = next(r for r in records if r["key"] == record["best_by_hand"])
                lines.append(f"row {record.get('row', '')} against {reference['run']}, kernels a step by kind: "
                             f"{against}")
    return lines


def report_lines(summary):
    """The report: what ran where, the table, and what the budget cut, as lines of markdown-friendly text."""
    env, budget = summary["env"], summary["budget_s"]
    steps = "the preset's own number of" if summary["steps"] is None else summary["steps"]
    state = "" if summary["finished"] else " (in progress: rows not yet run are pending)"
    lines = [f"mtbench training matrix on the {summary['device_kind']}: presets {', '.join(summary['presets'])}, "
             f"{steps} steps a row, the median of {summary.get('repeats', 1)} run(s) each, --measure-only, {summary['elapsed_s']:.0f} s of a {budget:g} s budget{state}"]
    lines += [f"device ({name}): {describe_device(device)}" for name, device in summary["devices"].items()]
    lines.append("versions: " + ", ".join(f"{key} {env[key]}" for key in
                                          ("python", "mtbench", "keras", "jax", "jaxlib", "torch", "numpy")
                                          if env.get(key))
                 + (f"; mtbench commit {env['mtbench_git_commit']}" if env.get("mtbench_git_commit") else ""))
    lines.append(f"host: {env.get('cpu_model')}, {env.get('cpu_count')} CPUs, {env.get('platform')}")
    lines.append("config shared by every row: "
                 + (", ".join(f"{k}={v}" for k, v in summary["config"].items()) or "-")
                 + (f"; train options: {' '.join(summary['train_options'])}" if summary["train_options"] else ""))
    if summary["clock"]:
        lines.append(f"clock: {summary['clock']}")
    lines += ["", markdown_table(summary["rows"]), ""]
    lines += [verdict["line"] for verdict in summary.get("verdicts", [])]
    lines += summary.get("profiles", [])
    if summary["cut"]:
        lines.append(f"cut by the budget ({budget:g} s): {', '.join(summary['cut'])}")
        lines += [f"to run them: {command}" for command in summary["rerun"]]
    if summary.get("wall_split"):
        lines.append(summary["wall_split"])
    lines.append(f"rows' results and logs: {summary['out']}")
    return lines


def write_report(summary, out):
    from mtbench.runner.files import write_text_atomic  # a reader (or a kill) never meets half a file
    write_text_atomic(os.path.join(out, "gpu-matrix.json"), json.dumps(summary, indent=2))
    write_text_atomic(os.path.join(out, "gpu-matrix.md"), "\n".join(report_lines(summary)) + "\n")


def parse_numbers(text):
    """'1,3,5-7' -> {1, 3, 5, 6, 7}; None where it is not that."""
    numbers = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        if not first.strip().isdigit() or (last and not last.strip().isdigit()):
            return None
        numbers.update(range(int(first), int(last or first) + 1))
    return numbers


def parse_args(argv):
    if "--" in argv:
        split = argv.index("--")
        argv, train_options = argv[:split], argv[split + 1:]
    else:
        train_options = []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=None,
                        help=f"comma-separated (default: {','.join(PRESETS_ON['gpu'])} on a GPU, "
                             f"{','.join(PRESETS_ON['cpu'])} on a CPU)")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--runs", default=",".join(WAYS_BY_LABEL),
                        help="comma-separated ways to train, of: " + ", ".join(WAYS_BY_LABEL))
    parser.add_argument("--rows", default=None, help=f"row numbers of the plan, e.g. 1,2,5-7 (1 to {len(PLAN)})")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps of every row (default: {GPU_STEPS} on a GPU, the preset's on a CPU)")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"times each row runs, round-robin over the rows; figures are medians (default: "
                             f"{GPU_REPEATS} on a GPU, 1 on a CPU)")
    parser.add_argument("--budget", type=float, default=3600.0,
                        help="seconds the whole command may take; rows that would not fit are cut (default 3600)")
    parser.add_argument("--row-timeout", type=float, default=1800.0, help="seconds before a row is stopped")
    parser.add_argument("--out", default=None,
                        help="folder for the table, the rows' results and logs (default "
                             "mtbench-results/gpu-matrix-<time>)")
    parser.add_argument("--cache-dir", default=None, help="mtbench's cache (default: mtbench train's)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="trace N steady steps of every row with its backend's profiler (mtbench train "
                             "--profile; the references alike), beside each row's result; timed apart")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = [label for label in args.runs.split(",") if label not in WAYS_BY_LABEL]
    if unknown:
        parser.error(f"--runs: {', '.join(unknown)} is none of {', '.join(WAYS_BY_LABEL)}")
    args.ways = [WAYS_BY_LABEL[label] for label in dict.fromkeys(args.runs.split(","))]
    args.dtype_list = [dtype for dtype in args.dtypes.split(",") if dtype]
    wrong = [dtype for dtype in args.dtype_list if dtype not in DTYPES]
    if wrong:
        parser.error(f"--dtypes: {', '.join(wrong)} is none of {', '.join(DTYPES)}")
    args.numbers = None if args.rows is None else parse_numbers(args.rows)
    if args.rows is not None and (not args.numbers or not args.numbers <= set(range(1, len(PLAN) + 1))):
        parser.error(f"--rows: '{args.rows}' is not row numbers from 1 to {len(PLAN)} such as 1,2,5-7")
    from mtbench.keras_models.presets import PRESETS
    args.preset_list = [preset for preset in (args.presets or "").split(",") if preset] or None
    wrong = [preset for preset in args.preset_list or () if preset not in (*PRESETS, *MODEL_PRESETS)]
    if wrong:
        parser.error(f"--presets: {', '.join(wrong)} is none of {', '.join((*PRESETS, *MODEL_PRESETS))}")
    if args.budget < 0 or args.row_timeout <= 0 or any(n is not None and n < 1 for n in (args.steps, args.repeats)):
        parser.error("--budget must be 0 or more, --row-timeout, --steps and --repeats more than 0")
    if args.profile < 0:
        parser.error("--profile must be 0 or more")
    if args.cache_dir is None:
        from mtbench.runner.config import default_cache_dir
        args.cache_dir = default_cache_dir()
    if args.out is None:
        args.out = os.path.join("mtbench-results", time.strftime("gpu-matrix-%Y%m%d-%H%M%S"))
    return args, train_options


def stop_on_sigterm(signum, frame):
    raise KeyboardInterrupt  # subprocess.run kills the running row; run_matrix marks it and writes the files


def main(argv=None):
    started = time.monotonic()
    args, train_options = parse_args(sys.argv[1:] if argv is None else argv)
    if args.probe:
        print(json.dumps(probe_machine()))
        return 0
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        return run(args, train_options, started)
    except KeyboardInterrupt:
        print(f"gpu_matrix: stopped; what had ended is in {os.path.abspath(args.out)}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args, train_options, started):
    probe = run_probe()
    kind = device_kind(probe)
    if args.steps is None and kind != "cpu":
        args.steps = GPU_STEPS
    if args.repeats is None:
        args.repeats = 1 if kind == "cpu" else GPU_REPEATS
    planned = plan_rows(probe, args.preset_list, args.dtype_list, args.ways, args.numbers)
    os.makedirs(args.out, exist_ok=True)

    def publish(records, results, record):
        summary = summarize(records, results, probe, args, train_options, kind, time.monotonic() - started,
                            finished=False)
        write_report(summary, args.out)
        if record is not None:
            print(table_line(record), file=sys.stderr, flush=True)

    records, results = run_matrix(planned, args, train_options, kind, started=started, publish=publish)
    summary = summarize(records, results, probe, args, train_options, kind, time.monotonic() - started,
                        finished=True)
    write_report(summary, args.out)
    print("\n".join(report_lines(summary)))
    print(json.dumps(summary))
    return 1 if any(r["status"] == "failed" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
