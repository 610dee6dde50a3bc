"""What one product for an attention's query, key and value saves against three, in mtbench's best step on one
backend: the model as mtbench builds it (`Attention.fused_projections`) against the same model with three
products, from the same weights on the same batches, timed side by side.

    python benchmarks/fused_projections.py [--quick] [--backend torch|jax] [--dtype mixed_bfloat16] [--model gpt]
                                           [--preset small] [--batch-size 64] [--length 128] [--rounds 6]
                                           [--steps-per-round 5] [--warmup 3] [--cpus 0,1] [--cache-dir DIR]

How the figures are taken. One process (keras reads its backend once at import), two contestants that train their
own copies of one model: `fused` (one product of the three kernels side by side) and `separate` (one product a
projection), each with mtbench's best step on the backend (torch: the compiled step `--extra torch-compile` trains
with; JAX: the jitted step), fused attention where the device has it, as `--attention auto` chooses. Each first
takes one step alone, timed (on torch and JAX it compiles), then --warmup untimed steps and interleaved rounds, A B
A B ..., the device synchronised before each clock is read (as in overhead.py, whose functions run them). A figure
is the median of the timed steps; the ratio is separate over fused. After the timed steps, the matrix products of
one step of each are counted where they ran (`products_per_step`: torch's profiled aten products, the dots of XLA's
compiled program), so that a compiler that merged the three products back into one shows. The last line printed is
one JSON object.
"""

import json
import os
import re
import sys
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # run as a script: `benchmarks` and `mtbench` from this checkout

from benchmarks.overhead import (best_train_step, device_text, hardware, keras_contestant,  # noqa: E402
                                 measurement_parser, milliseconds, parse_measurement_args, pin_to_cpus, ratio,
                                 run_interleaved, summarize, versions, workload_config)

QUICK = {"batch_size": 8, "batches": 3, "rounds": 2, "steps_per_round": 2, "warmup": 1}
WAYS = ("fused", "separate")
TORCH_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def products_per_step(backend_name, step, batch):
    """The matrix products one step ran, counted where they ran: on torch the aten products a profiled step called
    (the eager step's, or those inductor's program called), on JAX the dots of the program XLA compiled (each
    fused computation's as often as it runs) and on a GPU its cuBLAS calls: XLA may merge the three projections of
    one input back into one. The products inside a fused attention kernel (flash, cuDNN's) are counted on neither
    backend: the two contestants differ in the projections alone."""
    arguments = (batch.inputs, batch.target_output, batch.weight)
    if backend_name == "jax":
        from mtbench.plugins.extras.compiled_collectives import hlo_computations, hlo_runs
        computations = hlo_computations(step.lowered_program(*arguments, optimised=True))
        runs = hlo_runs(computations)
        return sum(runs[name] for name, _, lines in computations for line in lines
                   if re.search(r"= \S+ dot\(|custom_call_target=\"__cublas", line))
    from torch.profiler import profile
    step.block()
    with profile() as trace:
        step(*arguments)
        step.block()
    return sum(1 for event in trace.events() if event.name in TORCH_PRODUCTS)


def projections_contestant(way, keras, backend, run, workload, total_steps, flash_attention):
    """A contestant training mtbench's model with its query, key and value products `way` ('fused', 'separate')."""
    from benchmarks.workload import build_keras_model
    from mtbench.keras_models.transformer import Attention, attention_arithmetic
    model = build_keras_model(keras, workload, total_steps, flash_attention=flash_attention)
    for layer in model._flatten_layers():
        if isinstance(layer, Attention):
            layer.fused_projections = way == "fused"
    step = best_train_step(backend, run, model)
    return keras_contestant(way, backend, model, step), step, {"train_step": step.name,
                                                               "arithmetic": attention_arithmetic(model)}


def measure(args):
    from benchmarks.workload import prepare_benchmark
    config = workload_config(args, args.backend, dtype=args.dtype)
    started = time.perf_counter()
    keras, backend, run, workload = prepare_benchmark(config, args.batches, args.length, fused_attention=True)
    print(f"data and keras ready in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    # Fused where the device has the kernels: the option `prepare_benchmark` set as the flash-attention extra does.
    flash_attention = run.model_options.get("flash_attention", False)
    total_steps = 1 + args.warmup + args.rounds * args.steps_per_round
    contestants, described, steps = [], {}, {}
    for way in WAYS:
        contestant, steps[way], described[way] = projections_contestant(way, keras, backend, run, workload,
                                                                        total_steps, flash_attention)
        contestants.append(contestant)
    first = {}
    for contestant in contestants:  # the first step alone: on both backends it compiles
        contestant.synchronize()
        start = time.perf_counter()
        contestant.step(workload.batches[0])
        contestant.synchronize()
        first[contestant.name] = time.perf_counter() - start
        # On stderr as it happens: a call cut by its time limit still says how far it came.
        print(f"{contestant.name}: first step (compiling) {first[contestant.name]:.1f} s", file=sys.stderr, flush=True)
    seconds = run_interleaved(contestants, workload.batches, args.warmup, args.rounds, args.steps_per_round)
    for way in WAYS:  # after the timed steps: a profiled step is no timed one
        described[way]["products_per_step"] = products_per_step(args.backend, steps[way], workload.batches[0])
    return {"backend": args.backend, "dtype": args.dtype, "device": run.device, "attention": run.attention,
            "matmul_precision": run.matmul_precision,
            "batch_shape": list(workload.batches[0].shape),
            "contestants": {way: {**summarize(seconds[way]), "first_step_s": first[way], **described[way]}
                            for way in WAYS}}


def parse_args(argv=None):
    parser = measurement_parser(__doc__.split("\n\n")[0], QUICK, "a smoke run, for tests", model="gpt")
    parser.add_argument("--backend", choices=("torch", "jax"), default="torch")
    parser.add_argument("--dtype", choices=("float32", "mixed_bfloat16"), default="mixed_bfloat16")
    return parse_measurement_args(parser, sys.argv[1:] if argv is None else argv, QUICK)


def main(argv=None):
    args = parse_args(argv)
    pin_to_cpus(args.cpus)
    started = time.perf_counter()
    result = measure(args)
    contestants = result["contestants"]
    device = result["device"]
    print(f"query, key and value in one product against three: {args.model} model, {args.preset} preset, "
          f"{args.backend} {args.dtype}, batch {' x '.join(map(str, result['batch_shape']))} tokens, "
          f"{args.rounds} rounds x {args.steps_per_round} steps after {args.warmup} warm-up steps")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items() if v))
    print(f"device: {device_text(device)}; hardware: {hardware()['cpu_model']}")
    print(f"{'projections':12s} {'median ms':>10s} {'p10 ms':>8s} {'p90 ms':>8s} {'first step s':>13s} "
          f"{'products':>9s}  step")
    for way, c in contestants.items():
        print(f"{way:12s} {milliseconds(c):>10s} {c['p10_s'] * 1e3:8.1f} {c['p90_s'] * 1e3:8.1f} "
              f"{c['first_step_s']:13.2f} {c['products_per_step']:9d}  {c['train_step']}")
    separate_over_fused = ratio(contestants["separate"], contestants["fused"])
    print(f"separate / fused: {separate_over_fused:.3f} ({time.perf_counter() - started:.0f} s in all)")
    settings = {key: getattr(args, key) for key in ("model", "preset", "batch_size", "length", "rounds",
                                                    "steps_per_round", "warmup", "cpus")}
    print(json.dumps({"separate_over_fused": separate_over_fused, "settings": settings, "versions": versions(),
                      "hardware": hardware(), "run": result}))


if __name__ == "__main__":
    main()
