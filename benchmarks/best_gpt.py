"""Trains a best-by-hand GPT reference (benchmarks/best_gpt_torch.py, best_gpt_jax.py) on mtbench's batches from
mtbench's weights file, timed as `mtbench train` times a run, and writes a result JSON with the fields the GPU
matrix reads (`train_step`, `timing`, `utilization.mfu`, `memory`, `history`, `env.device`, `config`):

    python benchmarks/best_gpt.py --backend torch|jax [--preset gpt2-small] [--dtype mixed_bfloat16]
        [--batch-size 16] [--block-size N] [--steps 100] [--timing-window 10] [--initial-weights FILE] [--out FILE]
        [--data FILE] [--cache-dir DIR]

The batches are `mtbench train --model gpt`'s (the language-modelling task's byte-level windows of the same text,
in the same seeded order); the weights are the file's, or mtbench's numpy draw from the seed. The first
--warmup steps are timed alone (compilation, autotuning, allocator growth) and their time beyond the steady median
is the compile time; then steady steps run in windows of --timing-window steps with the device synchronised at
each window's edges, where the losses are read. MFU is nanoGPT's FLOP count (the one mtbench's GPT family uses)
over the same datasheet peak as mtbench's."""

import argparse
import importlib
import json
import os
import statistics
import sys
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # run as a script: `benchmarks` and `mtbench` from this checkout

MODULES = {"torch": "benchmarks.best_gpt_torch", "jax": "benchmarks.best_gpt_jax"}
DTYPES = ("float32", "mixed_bfloat16")


def parse_args(argv):
    # No abbreviations: `--init glorot` must not pass for `--initial-weights glorot`.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--backend", choices=sorted(MODULES), required=True)
    parser.add_argument("--model", default="gpt", choices=["gpt"], help="only the language model has references")
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--dtype", default="mixed_bfloat16", choices=DTYPES)
    parser.add_argument("--matmul-precision", default="highest", choices=["highest", "high"],
                        help="float32 matmuls, as mtbench train's option")
    parser.add_argument("--batch-size", type=int, default=None, help="rows per batch (default: mtbench train's)")
    parser.add_argument("--block-size", type=int, default=None, help="tokens per row (default: the preset's)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=3, help="first steps timed alone, as compilation")
    parser.add_argument("--timing-window", type=int, default=10)
    parser.add_argument("--initial-weights", default=None, help="mtbench's .npz weights file (default: the draw)")
    parser.add_argument("--data", default=None, help="the text (default: the built-in corpus's source side)")
    parser.add_argument("--tokenizer", default=None, choices=["byte", "char"],
                        help="as mtbench train's option (default: the preset's, as there: characters for `char`)")
    # The model's size and the recipe's rate, over the preset's, as mtbench train's options of the same names.
    for flag in ("--layers", "--heads", "--d-model", "--ff-dim", "--warmup-steps", "--valid-size"):
        parser.add_argument(flag, type=int, default=None)
    for flag in ("--dropout", "--learning-rate"):
        parser.add_argument(flag, type=float, default=None)
    parser.add_argument("--step", default="reference", choices=["reference", "mtbench"],
                        help="mtbench: time mtbench's own train step (built as `mtbench train` builds it, attention "
                             "auto) in this script's loop in place of the reference's")
    parser.add_argument("--extra", action="append", default=[], help="with --step mtbench: as mtbench train's")
    parser.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead"],
                        help="torch.compile's mode for the torch reference (reduce-overhead: CUDA graphs, on a CUDA "
                             "device), or with --step mtbench and --extra torch-compile, as mtbench train's")
    parser.add_argument("--validate", action="store_true",
                        help="score the validation split at the end, as mtbench train's final evaluation does")
    parser.add_argument("--out", default=None, help="the result JSON (default: print it only)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="trace N steps after the warm-up ones with the backend's profiler, as mtbench train "
                             "--profile does, timed apart (the trace under OUT.run/profile; needs --out)")
    parser.add_argument("--cache-dir", default=None)
    # What the GPU matrix passes every row, meaningless here.
    for flag in ("--overwrite", "--measure-only"):
        parser.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", default=None, help=argparse.SUPPRESS)
    args, ignored = parser.parse_known_args(argv)
    if ignored:  # a matrix's train options go to every row: one the reference cannot apply would part it from them
        parser.error(f"{' '.join(ignored)}: not an option of the reference, which would train otherwise than "
                     f"mtbench's rows given it")
    if args.step == "mtbench" and args.validate:
        parser.error("--validate scores the reference's model; mtbench's step is scored by mtbench train")
    if args.extra and args.step != "mtbench":
        parser.error("--extra: only with --step mtbench (the references are written by hand)")
    if args.compile_mode != "default" and args.backend != "torch":
        parser.error("--compile-mode: torch.compile's mode, for the torch reference only")
    if min(args.steps, args.timing_window) < 1 or args.warmup < 1 or args.steps <= args.warmup + args.profile:
        parser.error("--steps must exceed --warmup (at least 1) and --profile, and --timing-window be at least 1")
    if args.profile < 0 or (args.profile and not args.out):
        parser.error("--profile N: 0 or more steps, with --out (the trace goes beside it)")
    return args


def train_config(args):
    from mtbench.runner.config import TrainConfig, default_cache_dir
    fields = {name: getattr(args, name) for name in ("batch_size", "block_size", "layers", "heads", "d_model", "ff_dim",
                                                     "dropout", "learning_rate", "warmup_steps", "valid_size")
              if getattr(args, name) is not None}
    config = TrainConfig(backend=args.backend, model_name="gpt", preset=args.preset, dtype=args.dtype,
                         initial_weights=args.initial_weights, extras=tuple(args.extra),
                         data_file=args.data, tokenizer=args.tokenizer, steps=args.steps,
                         matmul_precision=args.matmul_precision, cache_dir=args.cache_dir or default_cache_dir(),
                         compile_mode=args.compile_mode, **fields)
    # The model family's defaults, as `mtbench train` sets them (the `char` preset reads characters): a GPU
    # matrix's reference rows, which name no tokenizer, then train on the tokens its mtbench rows train on.
    from mtbench.plugins import manager
    from mtbench.runner.setup import resolve_model
    resolve_model(config, manager.registry())
    return config


def starting_weights(args, config, shape):
    """{Keras path: array}: the weights file's, else mtbench's numpy draw for this shape (keras on this backend)."""
    if args.initial_weights:
        from mtbench.runner.data.weights_file import read_weights_file
        return read_weights_file(args.initial_weights)[0]
    import keras  # noqa: F401 (builds the model whose draw mtbench makes)
    from benchmarks.workload import drawn_weights
    from mtbench.keras_models.gpt import build_gpt
    return drawn_weights(build_gpt(shape), config)


def device_and_peak(backend_name, dtype, cache_dir, matmul_precision="highest"):
    """(backend, device, peak FLOP/s, its source): the peak `mtbench train` divides by for these matmuls (a GPU's
    float32 at 'high' is TF32's)."""
    from mtbench.plugins import manager as plugins
    from mtbench.runner.measurement.peaks import device_peak
    registry = plugins.registry()
    backend = registry.backends[backend_name]
    device = backend.device_info()
    peak, source = device_peak(backend, device, dtype, cache_dir, registry.backends.values(), matmul_precision)
    return backend, device, peak, source


def peak_device_bytes(backend_name):
    if backend_name == "torch":
        import torch
        return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None
    import jax
    stats = jax.local_devices()[0].memory_stats()
    return int(stats["peak_bytes_in_use"]) if stats and "peak_bytes_in_use" in stats else None


def train(step, convert, batches, warmup, window, profiling=None):
    """(first steps' seconds, steady windows as (seconds, steps), losses): each warm-up step timed alone, then
    windows of `window` steps with the device synchronised at their edges only. `profiling` (a `StepProfiling`)
    traces the steps after the warm-up ones in a window of their own, untimed, as `mtbench train --profile`."""
    first, windows, losses = [], [], []
    step.block()  # the weights' and optimizer state's copies to the device are not the first step's
    for batch in batches[:warmup]:
        start = time.perf_counter()
        losses.append(float(step(*convert(batch))["loss"]))
        first.append(time.perf_counter() - start)
    steady = batches[warmup:]
    if profiling:
        losses += traced(profiling, step, convert, steady[:profiling.wanted_steps], first_step=warmup + 1)
        steady = steady[profiling.wanted_steps:]
    for begin in range(0, len(steady), window):
        chunk = steady[begin:begin + window]
        step.block()
        start = time.perf_counter()
        pending = [step(*convert(batch))["loss"] for batch in chunk]
        step.block()
        windows.append((time.perf_counter() - start, len(chunk)))
        losses += [float(loss) for loss in pending]
    return first, windows, losses


def traced(profiling, step, convert, batches, first_step):
    """The batches' losses, their steps traced between two device synchronisations by `profiling` (the
    `StepProfiling` of `mtbench train --profile`, so that the reference's trace and mtbench's are made alike)."""
    step.block()
    profiling.start(first_step)
    start = time.perf_counter()  # after the profiler's start, as mtbench train's profiled window opens
    pending = []
    for number, batch in enumerate(batches, start=first_step):
        with profiling.step(number):
            pending.append(step(*convert(batch))["loss"])
    step.block()
    profiling.stop(time.perf_counter() - start)
    return [float(loss) for loss in pending]


def history(losses, warmup, windows, tokens, profiled=()):
    """Each step's loss; each steady step with its window's mean seconds, the window's size and its tokens, as
    `mtbench train` writes them, so that a verdict's interval reads the windows of both alike; the `profiled`
    steps marked, untimed."""
    timed = iter([{"seconds": seconds / steps, "window_steps": steps, "tokens": tokens}
                  for seconds, steps in windows for _ in range(steps)])
    return [{"step": i + 1, "loss": loss,
             **({"profiled": True} if i + 1 in profiled else next(timed) if i >= warmup else {})}
            for i, loss in enumerate(losses)]


class MtbenchStep:
    """mtbench's own train step for `config`, built by mtbench's runner as `mtbench train` builds it (the backend's
    step and the extras', attention auto, the weights file's or the seed's weights), called as `mtbench train`'s
    loop calls it, on a batch's numpy arrays. Timed by `train` beside the reference, the difference between its
    figure and `mtbench train`'s is the loop around the step; between its figure and the reference's, the step."""

    def __init__(self, config, steps):
        from rich.console import Console
        from mtbench.plugins import manager as plugins_manager
        from mtbench.plugins.api import Launch
        from mtbench.runner.loop.timing import Stopwatch
        from mtbench.runner.setup import choose_plugins, start_backend
        from mtbench.runner.training import build_for_training, prepare_data, read_data, read_initial_weights
        plugins = choose_plugins(config, plugins_manager.registry())
        console, stopwatch = Console(quiet=True), Stopwatch()
        raw = read_data(config, plugins, console, stopwatch)
        keras, run, _ = start_backend(config, plugins, Launch())
        data = prepare_data(run.config, plugins, raw, stopwatch)
        built = build_for_training(keras, run.config, run, plugins, data, read_initial_weights(config)[0], steps,
                                   None, console)
        built.batches.close()  # this script brings the batches (the same ones)
        self.step, self.model, self.backend = built.train_step, built.model, plugins.backend
        self.name = f"mtbench's {self.step.name} step in best_gpt.py's loop"
        kernels = ", ".join(f"{kind}: {name}" for kind, name in (run.attention or {}).items())
        self.description = "; ".join(part for part in (self.step.description(), kernels) if part)

    def __call__(self, inputs, target_output, weight):
        return self.step(inputs, target_output, weight)

    def block(self):
        self.step.block()
        self.backend.synchronize(self.model)


def batch_in_mtbench_s_loop(batch):
    """A batch as mtbench's loop hands it to its step: numpy arrays, the step moving them to the device."""
    return batch.inputs, batch.target_output, batch.weight


def measure(args):
    measure_started = time.perf_counter()
    # mtbench's modules that read the batches and the device may import keras: on this backend, never a default.
    os.environ["KERAS_BACKEND"] = args.backend
    config = train_config(args)
    from mtbench.plugins import manager as plugins
    # mtbench's compile caches under --cache-dir, on both sides (inductor's here, before torch reads the variables;
    # XLA's once JAX starts): a repeat finds its programs there as a repeat of mtbench's row does.
    os.environ.update(plugins.registry().backends[args.backend].prepare_process(config))
    from benchmarks.workload import OptimizerSettings, prepare_workload
    workload = prepare_workload(config, args.steps)
    shape = workload.model_shape
    backend, device, peak, peak_source = device_and_peak(args.backend, args.dtype, config.cache_dir,
                                                         config.matmul_precision)
    backend.open_compile_cache(config)
    # float32 matmuls as `mtbench train` sets them (true float32 unless --matmul-precision high), on both sides.
    matmul_precision = backend.set_matmul_precision(config.matmul_precision)
    settings = OptimizerSettings.of_config(config, args.steps)
    if args.step == "mtbench":
        # Counted on the model mtbench built: a second model for its count would add to the peak device memory.
        step, convert = MtbenchStep(config, args.steps), batch_in_mtbench_s_loop
        parameters = step.model.count_params()
    else:
        weights = starting_weights(args, config, shape)
        parameters = int(sum(value.size for value in weights.values()))
        reference = importlib.import_module(MODULES[args.backend])
        modes = {"compile_mode": args.compile_mode} if args.compile_mode != "default" else {}
        step = reference.train_step_from_keras_weights(shape, weights, settings,
                                                       mixed_bfloat16=args.dtype == "mixed_bfloat16", **modes)
        convert = reference.batch_arrays if args.backend == "jax" else (
            lambda batch: reference.batch_tensors(batch, step.device))
    profiling = None
    if args.profile:
        from mtbench.plugins.api import Launch, ProcessGroup
        from mtbench.runner.loop.checkpoints import RunDirectory, run_dir_for
        from mtbench.runner.loop.profiling import StepProfiling
        profiling = StepProfiling(backend, args.profile, RunDirectory(run_dir_for(args.out), fresh=False),
                                  ProcessGroup(Launch()))
    started = time.perf_counter()
    first, windows, losses = train(step, convert, workload.batches, args.warmup, args.timing_window, profiling)
    wall_s = time.perf_counter() - started
    per_step = [seconds / steps for seconds, steps in windows for _ in range(steps)]
    median = statistics.median(per_step)
    rows, length = workload.batches[0].shape
    from mtbench.keras_models.gpt import training_flops
    flops = training_flops(shape, rows, length)
    peak_bytes = peak_device_bytes(args.backend)
    metrics = {}
    if args.validate:  # the blocks `mtbench train` scores its validation loss on
        from mtbench.runner.data.text import evaluation_batches
        blocks = evaluation_batches(workload.text.splits["valid"], config.batch_size, config.max_len,
                                    config.valid_size * config.max_len)
        metrics["val_loss"] = step.validation_loss([convert(batch) for batch in blocks])
    return {
        "metrics": metrics,
        "kind": "best-by-hand reference" if args.step == "reference" else "mtbench step in the reference's loop",
        "status": "completed", "backend": args.backend,
        "train_step": getattr(step, "name", f"best-by-hand {args.backend}"),
        "description": getattr(step, "description", ""),
        "config": {**config.to_dict(), "steps": args.steps, "timing_window": args.timing_window},
        "model": {"dtype_policy": args.dtype, "dropout": shape.dropout, "vocab_size": shape.vocab_size,
                  "parameters": parameters, "attention": getattr(step, "attention", None)},
        "timing": {"step_s_median": median, "step_s_p90": sorted(per_step)[int(0.9 * (len(per_step) - 1))],
                   "steady_steps": len(per_step), "tokens_per_s": rows * length * len(per_step) / sum(per_step),
                   "compile_s": sum(max(seconds - median, 0.0) for seconds in first),
                   "first_steps_s": first, "wall_s": wall_s, "steady_s": sum(per_step),
                   "compile_cache": backend.compile_cache_hits(),  # this process's lookups, as mtbench's
                   # `mtbench train`'s phases as far as this script has them: all before the loop is "build".
                   "phases_s": {"build": started - measure_started, "train": wall_s},
                   "total_s": time.perf_counter() - measure_started,
                   "clock": "time.perf_counter; device synchronised at each window's edges"},
        # Over the steady steps' time, as `mtbench train` counts them: a slow window lowers both alike.
        "utilization": {"mfu": flops * len(per_step) / sum(per_step) / peak if peak else None,
                        "peak_flops_per_s": peak,
                        "peak_source": peak_source, "step_flops": flops},
        "memory": {"peak_device_bytes": peak_bytes, "peak_since": "process start"},
        "history": history(losses, args.warmup, windows, rows * length, profiling.steps if profiling else ()),
        "profile": profiling.record() if profiling else None,
        "env": {"device": device, "backend_versions": backend.framework_versions(),
                "matmul_precision": {"requested": config.matmul_precision, "reported": matmul_precision}},
    }


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from mtbench.errors import MtbenchError
    try:
        result = measure(args)
    except MtbenchError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2)
    if args.out:
        from mtbench.runner.files import write_text_atomic
        write_text_atomic(args.out, text)
    t = result["timing"]
    print(f"{result['train_step']}: step {t['step_s_median'] * 1e3:.1f} ms (median), {t['tokens_per_s']:,.0f} "
          f"tokens/s, MFU {100 * (result['utilization']['mfu'] or 0):.1f} %, compile {t['compile_s']:.1f} s, "
          f"final loss {result['history'][-1]['loss']:.4f}", file=sys.stderr)
    if not args.out:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
