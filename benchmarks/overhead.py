"""What mtbench's train step costs against the step a user would write by hand: Flax + optax under one
`jax.jit` on JAX, a plain `nn.Module` with `torch.optim.AdamW` on torch; in float32 and mixed bfloat16, on the
`small` preset and real batches of one length bucket from mtbench's own pipeline.

    python benchmarks/overhead.py [--quick] [--model transformer|gpt] [--text FILE] [--backends jax,torch]
                                  [--dtypes float32,mixed_bfloat16] [--batch-size 64] [--length 32] [--rounds 6]
                                  [--steps-per-round 5] [--warmup 3] [--no-keras] [--cpus 0,1] [--cache-dir DIR]
                                  [--baseline native|best]

The model is the translation Transformer (benchmarks/native_torch.py, native_flax.py), or with --model gpt the
decoder-only language model (native_gpt_torch.py, native_gpt_flax.py: nanoGPT's shape) on the language-modelling
task's byte-level batches of --text FILE or the built-in corpus's source side, its block --length tokens (default:
the preset's, 128 for `small`). With --baseline best (--model gpt), mtbench's best step on each backend (torch
compiled, JAX jitted, fused attention where the device has it) against the best-by-hand references
(best_gpt_torch.py compiled on every device, best_gpt_jax.py); each reference's recipe is recorded in
`train_steps`.

How the figures are taken. Each (backend, precision) runs in its own process (keras reads its backend once at
import). In it, the contestants train their own copies of one model from the same initial weights on the same
batches: `mtbench` (the step `mtbench train` uses), `native`, and `keras` (plain `train_on_batch`, the
issue's baseline; --no-keras leaves it out). Each first takes --warmup untimed steps (tracing, compilation,
allocator warm-up), then they alternate in rounds of --steps-per-round steps, A B C A B C ..., so that a change in
the machine's speed during the run hits every contestant alike. The device is synchronised before the clock
starts and before it is read. A figure is the median over every timed step; a ratio is mtbench's median over the
native one. The last line printed is one JSON object for scripts.
"""

import argparse
import functools
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # run as a script: `benchmarks` and `mtbench` from this checkout

DTYPES = ("float32", "mixed_bfloat16")
RATIO_KEYS = {("jax", "float32"): "jax_ratio", ("torch", "float32"): "torch_ratio",
              ("jax", "mixed_bfloat16"): "jax_ratio_bf16", ("torch", "mixed_bfloat16"): "torch_ratio_bf16"}
QUICK = {"batch_size": 16, "rounds": 2, "steps_per_round": 2, "warmup": 1}
MODELS = ("transformer", "gpt")
TRANSLATION_LENGTH = 32  # --length's default for the translation model: a well-filled length bucket
# The hand-written baselines of each model family, by backend.
NATIVE_MODULES = {("transformer", "jax"): "benchmarks.native_flax", ("transformer", "torch"): "benchmarks.native_torch",
                  ("gpt", "jax"): "benchmarks.native_gpt_flax", ("gpt", "torch"): "benchmarks.native_gpt_torch"}
# --baseline best: the language model as each backend's best users write it (fused QKV and attention, torch.compile
# and fused AdamW; one donating jit with cuDNN attention), against mtbench's best way to train on that backend.
BEST_MODULES = {("gpt", "jax"): "benchmarks.best_gpt_jax", ("gpt", "torch"): "benchmarks.best_gpt_torch"}


@dataclass
class Contestant:
    """`step(batch)` trains on one batch; `synchronize()` returns once the device has finished all of it;
    `ran()`: what its step is (a hand-written one's recipe), read once it has run (a compiled step says then what
    it compiled)."""
    name: str
    step: object
    synchronize: object
    ran: object = lambda: None


def interleaved_order(names, rounds):
    """The order contestants take their turns in: every name once per round, in the same order each round."""
    return [name for _ in range(rounds) for name in names]


def run_interleaved(contestants, batches, warmup, rounds, steps_per_round, clock=time.perf_counter):
    """{name: [seconds of each timed step]}. Every contestant walks the same batch sequence (cycling), so its
    k-th step trains on the same batch whatever the interleaving; warm-up steps are taken first and not timed."""
    position = {c.name: 0 for c in contestants}
    by_name = {c.name: c for c in contestants}

    def next_batch(name):
        batch = batches[position[name] % len(batches)]
        position[name] += 1
        return batch

    for contestant in contestants:
        for _ in range(warmup):
            contestant.step(next_batch(contestant.name))
        contestant.synchronize()
    seconds = {c.name: [] for c in contestants}
    for name in interleaved_order([c.name for c in contestants], rounds):
        contestant = by_name[name]
        for _ in range(steps_per_round):
            batch = next_batch(name)
            contestant.synchronize()
            start = clock()
            contestant.step(batch)
            contestant.synchronize()
            seconds[name].append(clock() - start)
    return seconds


def summarize(seconds):
    values = np.asarray(seconds, dtype=float)
    return {"median_s": float(np.median(values)), "p10_s": float(np.percentile(values, 10)),
            "p90_s": float(np.percentile(values, 90)), "steps": int(values.size)}


def ratio(numerator, denominator):
    if numerator is None or denominator is None:
        return None
    return numerator["median_s"] / denominator["median_s"]


def model_flops_utilisation(worker_result):
    """Analytic training FLOPs of mtbench's step over its median time, against the device's peak (a datasheet
    figure, or on a CPU the matmul peak `mtbench env --calibrate` measured and cached)."""
    peak = worker_result.get("peak_flops_per_s")
    if not peak or not worker_result.get("step_flops"):
        return None
    return worker_result["step_flops"] / worker_result["contestants"]["mtbench"]["median_s"] / peak


# ---- worker: one backend and dtype, in its own process ----------------------------------------------------------

def native_contestant(backend_name, workload, weights, settings, name="native", **step_options):
    """The hand-written baseline of the workload's model as a contestant; `step_options` go to its
    `train_step_from_keras_weights` (torch's `compile=True`, or the `device` mtbench's variables are on, say). On
    JAX it trains on jax's default device, as Keras does; on torch on the given device, else on the one
    Keras-torch picks."""
    import importlib
    mixed = workload.config.dtype == "mixed_bfloat16"
    modules = BEST_MODULES if name == "best" else NATIVE_MODULES
    native = importlib.import_module(modules[(workload.config.model_family[0], backend_name)])
    step = native.train_step_from_keras_weights(workload.model_shape, weights, settings, mixed_bfloat16=mixed,
                                                **step_options)
    if backend_name == "jax":
        convert = native.batch_arrays
    else:
        convert = functools.partial(native.batch_tensors, device=step.device)

    def train(batch):
        float(step(*convert(batch))["loss"])  # a training loop reads its loss, as mtbench's does

    return Contestant(name, train, step.block,
                      lambda: getattr(step, "description", None) or getattr(step, "name", None))


def keras_contestant(name, backend, model, train_step):
    def train(batch):
        logs = train_step(batch.inputs, batch.target_output, batch.weight)
        float(logs["loss"])  # a training loop reads its loss, as the native contestants do

    from mtbench.plugins.api import TrainStep, WrappingStep
    # A step that waits for its own state (`block`: JAX's jitted step, whose Keras variables stay stale until
    # `finalize`) is waited for as the native contestants are, by the state it holds: walking every Keras
    # variable's buffers besides, as the backend's `synchronize(model)` does, would time host work the other
    # contestants skip. A step without a `block` of its own (Keras's `train_on_batch`) updates those variables;
    # a wrapper's `block` is its inner step's.
    innermost = train_step
    while isinstance(innermost, WrappingStep):
        innermost = innermost.inner
    waits_for_its_state = type(innermost).block is not TrainStep.block

    def synchronize():
        train_step.block()
        backend.synchronize(None if waits_for_its_state else model)

    return Contestant(name, train, synchronize)


def best_train_step(backend, run, model):
    """mtbench's best way to train `model` on `backend`: torch's compiled step (what `--extra torch-compile`
    trains with), JAX's jitted one; the model built with fused attention where the device has it."""
    if backend.name == "torch":
        from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
        return CompiledTorchTrainStep(model)
    return backend.make_train_step(run, model)


def measure(backend_name, dtype, args):
    from benchmarks.workload import OptimizerSettings, build_keras_model, prepare_benchmark
    from mtbench.plugins import manager as plugins
    from mtbench import KerasTrainStep
    config = workload_config(args, backend_name, dtype=dtype, **({"max_len": args.max_len} if args.max_len else {}))
    keras, backend, run, workload = prepare_benchmark(config, args.batches, args.length,
                                                      fused_attention=args.baseline == "best")
    from mtbench.keras_models.initialization import initial_weights
    total_steps = args.warmup + args.rounds * args.steps_per_round

    contestants, step_names = [], {}
    best = args.baseline == "best"
    # Fused where the device has the kernels: the option `prepare_benchmark` set as the flash-attention extra does.
    model = build_keras_model(keras, workload, total_steps,
                              flash_attention=run.model_options.get("flash_attention", False))
    weights, settings = initial_weights(model, config.seed), OptimizerSettings.of_keras_optimizer(model.optimizer)
    mtbench_step = best_train_step(backend, run, model) if best else (
        backend.make_train_step(run, model) or KerasTrainStep(model))
    step_names["mtbench"] = mtbench_step.name
    contestants.append(keras_contestant("mtbench", backend, model, mtbench_step))
    # The baseline trains where mtbench's variables are (Keras-torch puts them on CUDA when it can).
    native_options = {"device": model.weights[0].value.device} if backend_name == "torch" else {}
    if best and backend_name == "torch":
        native_options["compile"] = True  # as mtbench's best step, on every device (the reference's default: CUDA)
    baseline = native_contestant(backend_name, workload, weights, settings, name="best" if best else "native",
                                 **native_options)
    contestants.append(baseline)
    if args.keras:
        keras_model = build_keras_model(keras, workload, total_steps)
        contestants.append(keras_contestant("keras", backend, keras_model, KerasTrainStep(keras_model)))
        step_names["keras"] = "keras-train-on-batch"

    seconds = run_interleaved(contestants, workload.batches, args.warmup, args.rounds, args.steps_per_round)
    step_names[baseline.name] = baseline.ran()
    from mtbench.runner.measurement.peaks import device_peak
    rows, length = workload.batches[0].shape
    family = plugins.registry().lookup("models", config.model_family[0])
    peak, peak_source = device_peak(backend, run.device, dtype, config.cache_dir,
                                       plugins.registry().backends.values())
    threads = None
    if backend_name == "torch":
        import torch
        threads = torch.get_num_threads()
    return {"backend": backend_name, "dtype": dtype, "train_steps": step_names, "baseline": args.baseline,
            "attention": run.attention,
            "contestants": {name: summarize(values) for name, values in seconds.items()},
            "device": run.device, "matmul_precision": run.matmul_precision, "torch_threads": threads,
            "parameters": int(model.count_params()),
            "batch_shape": list(workload.batches[0].shape),
            "step_flops": family.training_flops(workload.model_shape, rows, length, length),
            "peak_flops_per_s": peak, "peak_source": peak_source,
            "target_tokens_per_batch": float(np.mean([b.target_tokens for b in workload.batches]))}


# ---- driver ------------------------------------------------------------------------------------------------------

def versions():
    found = {"python": platform.python_version()}
    for package in ("keras", "jax", "jaxlib", "flax", "optax", "torch", "numpy", "ml_dtypes"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def device_text(device):
    """'gpu (NVIDIA H100 80GB HBM3)': a device as its backend described it (`device_info()`)."""
    return f"{device['kind']} ({device['name']})"


def hardware():
    from mtbench import cpu_count, cpu_model
    return {"cpu_model": cpu_model(), "cpus_usable": cpu_count(), "platform": platform.platform()}


def run_worker(backend_name, dtype, argv):
    """Runs one (backend, dtype) in a fresh process; returns its result dict."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    command = [sys.executable, os.path.abspath(__file__), "--worker", backend_name, dtype, *argv]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPOSITORY)
    if proc.returncode != 0:
        raise SystemExit(f"{backend_name}/{dtype} failed:\n{proc.stderr[-3000:]}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def milliseconds(summary):
    return "-" if summary is None else f"{summary['median_s'] * 1e3:8.1f}"


def format_ratio(value):
    return "-" if value is None else f"{value:.3f}"


def table(results):
    base = results[0].get("baseline", "native") if results else "native"
    header = (f"{'backend':8s} {'precision':15s} {'mtbench ms':>10s} {base + ' ms':>10s} {'mtbench/' + base:>15s} "
              f"{'keras ms':>10s} {'keras/' + base:>13s} {'steps':>6s}  mtbench step")
    lines = [header, "-" * len(header)]
    for r in results:
        c = r["contestants"]
        lines.append(f"{r['backend']:8s} {r['dtype']:15s} {milliseconds(c['mtbench']):>10s} "
                     f"{milliseconds(c[base]):>10s} {format_ratio(ratio(c['mtbench'], c[base])):>15s} "
                     f"{milliseconds(c.get('keras')):>10s} {format_ratio(ratio(c.get('keras'), c[base])):>13s} "
                     f"{c['mtbench']['steps']:>6d}  {r['train_steps']['mtbench']}")
    return "\n".join(lines)


def summary_json(results, settings):
    out = {key: None for key in RATIO_KEYS.values()}
    out.update(mfu_jax=None, mfu_torch=None)
    for r in results:
        c = r["contestants"]
        if r.get("baseline") == "best":  # jax_ratio_best (mixed bfloat16), jax_ratio_best_float32, ...
            suffix = "" if r["dtype"] == "mixed_bfloat16" else f"_{r['dtype']}"
            out[f"{r['backend']}_ratio_best{suffix}"] = ratio(c["mtbench"], c["best"])
            out[f"mfu_{r['backend']}_best{suffix}"] = model_flops_utilisation(r)
            continue
        out[RATIO_KEYS[(r["backend"], r["dtype"])]] = ratio(c["mtbench"], c["native"])
        if r["dtype"] == "float32":
            out[f"mfu_{r['backend']}"] = model_flops_utilisation(r)
    out["settings"] = settings
    out["runs"] = results
    return out


def measurement_parser(description, quick, quick_help, model="transformer"):
    """An argument parser with the flags every interleaved step benchmark takes: the model and batches, the
    timing rounds, CPU pinning and the cache; `quick` are the settings --quick replaces."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=f"{quick_help} ({quick})")
    parser.add_argument("--model", choices=MODELS, default=model,
                        help=f"the translation Transformer or the GPT language model (default: {model})")
    parser.add_argument("--text", default=None, metavar="FILE",
                        help="--model gpt: the text to train on, as bytes (default: the built-in corpus's source side)")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per batch (mtbench train's default)")
    parser.add_argument("--length", type=int, default=None,
                        help=f"the length bucket the timed batches come from (default {TRANSLATION_LENGTH}); with "
                             f"--model gpt, the block size (default: the preset's)")
    parser.add_argument("--batches", type=int, default=12, help="distinct batches, cycled")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cpus", default=None, help="pin the measuring processes to these CPUs, e.g. 0,1")
    parser.add_argument("--cache-dir", default=None, help="mtbench's cache (default: mtbench train's)")
    return parser


def pin_to_cpus(cpus):
    """Pins this process, and the processes it starts, to `cpus` ('0,1'; None: leaves it where it is)."""
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})


def parse_measurement_args(parser, argv, quick):
    """`parser`'s arguments with --quick applied, counts checked and the cache defaulted to mtbench train's."""
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in quick.items():
            setattr(args, name, value)
    if args.text is not None and args.model != "gpt":
        parser.error("--text is the language model's text; the translation model trains on --dataset pairs")
    if args.length is None:
        from mtbench.keras_models.presets import presets_for
        presets = presets_for(args.model)
        if args.preset not in presets:
            parser.error(f"unknown preset '{args.preset}' for --model {args.model}; choose one of {', '.join(presets)}")
        args.length = presets[args.preset].max_len if args.model == "gpt" else TRANSLATION_LENGTH
    for name in ("batch_size", "length", "batches", "rounds", "steps_per_round"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more, not {args.warmup}")
    if args.cache_dir is None:
        from mtbench.runner.config import default_cache_dir
        args.cache_dir = default_cache_dir()
    return args


def workload_config(args, backend_name, **fields):
    """The `TrainConfig` of the run a benchmark times, from its measurement flags and `fields`: the translation
    model on the built-in corpus, or (--model gpt) the language model on --text or the built-in corpus, its block
    --length tokens."""
    from mtbench.runner.config import TrainConfig
    if args.model == "gpt":
        fields.update(model_name="gpt", data_file=args.text, tokenizer="byte", max_len=args.length)
    return TrainConfig(backend=backend_name, preset=args.preset, batch_size=args.batch_size, cache_dir=args.cache_dir,
                       **fields)


def parse_args(argv):
    parser = measurement_parser(__doc__.split("\n\n")[0], QUICK, "a smoke run of about a minute")
    parser.add_argument("--backends", default="jax,torch")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--max-len", type=int, default=None)
    parser.add_argument("--no-keras", dest="keras", action="store_false", help="leave plain train_on_batch out")
    parser.add_argument("--baseline", choices=("native", "best"), default="native",
                        help="native: hand-written steps that copy mtbench's arithmetic (its overhead); best (--model "
                             "gpt): the best-by-hand references against mtbench's best way on each backend (fused "
                             "attention where the device has it, torch compiled)")
    parser.add_argument("--worker", nargs=2, metavar=("BACKEND", "DTYPE"), help=argparse.SUPPRESS)
    args = parse_measurement_args(parser, argv, QUICK)
    if args.model == "gpt" and args.max_len is not None:
        parser.error("--max-len is the translation model's; a language model's block is --length")
    if args.baseline == "best" and args.model != "gpt":
        parser.error("--baseline best: the best-by-hand references are the language model's (--model gpt)")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    pin_to_cpus(args.cpus)  # inherited by the workers
    if args.worker:
        print(json.dumps(measure(*args.worker, args)))
        return
    worker_argv = [a for a in argv if a != "--quick"]
    if args.quick:
        worker_argv += [f"--{name.replace('_', '-')}={value}" for name, value in QUICK.items()]
    settings = {"model": args.model, "baseline": args.baseline, "preset": args.preset, "batch_size": args.batch_size, "length": args.length,
                "rounds": args.rounds, "steps_per_round": args.steps_per_round, "warmup": args.warmup,
                "versions": versions(), "hardware": hardware(), "cpus": args.cpus}
    results = []
    started = time.perf_counter()
    for backend_name in args.backends.split(","):
        for dtype in args.dtypes.split(","):
            print(f"measuring {backend_name} {dtype} ...", file=sys.stderr, flush=True)
            results.append(run_worker(backend_name, dtype, worker_argv))
    print(f"mtbench step overhead: {args.model} model, {args.preset} preset, batch {args.batch_size} x {args.length} tokens, "
          f"{args.rounds} rounds x {args.steps_per_round} steps per contestant after {args.warmup} warm-up steps")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in settings["versions"].items() if v))
    torch_threads = next((r["torch_threads"] for r in results if r["torch_threads"]), None)
    print(f"hardware: {settings['hardware']['cpu_model']}, {settings['hardware']['cpus_usable']} usable CPUs"
          + (f", pinned to {args.cpus}" if args.cpus else "")
          + (f"; torch intra-op threads {torch_threads}" if torch_threads else ""))
    devices = sorted({f"{r['backend']} on {device_text(r['device'])}" for r in results})
    print("device: " + ("; ".join(devices) or "-"))
    print(f"model: {results[0]['parameters']:,} parameters" if results else "model: -")
    print(table(results))
    print(f"(median step times; {time.perf_counter() - started:.0f} s in all)")
    print(json.dumps(summary_json(results, settings)))


if __name__ == "__main__":
    main()
