"""What `torch.compile` does for mtbench's torch step, against what it does for the same model written by hand:
compile time, graph breaks and steady step time, on the `small` preset and real batches of one length bucket.

    python benchmarks/torch_compile.py [--quick] [--preset small] [--batch-size 64] [--length 32]
                                       [--batches 12] [--rounds 6] [--steps-per-round 5] [--warmup 3]
                                       [--cpus 0,1] [--cache-dir DIR]

How the figures are taken. One process, keras on torch, float32. Four contestants train their own copies of one
model from the same initial weights on the same batches: `mtbench eager` (the step `mtbench train` uses),
`mtbench compiled` (the step `--extra torch-compile` uses: forward and loss compiled), `native eager` and
`native compiled` (benchmarks/native_torch.py, its forward and loss compiled the way a PyTorch user would).
Every batch has one length, so each compiled contestant compiles once. Each contestant first takes one step
alone, timed, with dynamo's counters cleared before it: for a compiled contestant that step traces, compiles the
forward and the backward and runs them, and its compile time is that step's wall time minus its steady median;
its graph breaks are the counters after it. Inductor's caches are off, so the compile times are a first run's,
and a trivial function is compiled before either, so that neither pays the process's one-time compiler set-up.
Then come --warmup untimed steps each and interleaved rounds, A B C D A B C D ..., timed as in overhead.py
(whose functions run them). The last line printed is one JSON object for scripts.
"""

import json
import os
import sys
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # run as a script: `benchmarks` and `mtbench` from this checkout

from benchmarks.overhead import (device_text, hardware, keras_contestant, measurement_parser,  # noqa: E402
                                 milliseconds, native_contestant, parse_measurement_args, pin_to_cpus, ratio,
                                 run_interleaved, summarize, versions, workload_config)

QUICK = {"batch_size": 8, "batches": 3, "rounds": 2, "steps_per_round": 2, "warmup": 1}
COMPILED = {"mtbench": "mtbench compiled", "native": "native compiled"}
EAGER = {"mtbench": "mtbench eager", "native": "native eager"}


def warm_up_compiler(device):
    """Compiles a two-operation function and its backward on the contestants' `device`, so that the one-time costs
    of a process's first compilation there (importing and initialising inductor, probing the C++ compiler on a CPU,
    starting Triton and its launcher on a GPU) fall on neither contestant."""
    import torch
    weight = torch.ones(4, requires_grad=True, device=device)
    torch.compile(lambda x: (x * weight).sin().sum())(torch.ones(4, device=device)).backward()


def first_steps(contestants, batch, clock=time.perf_counter):
    """{name: the wall seconds of each contestant's first step, and dynamo's counters of that step alone}."""
    from torch._dynamo.utils import counters

    from mtbench.plugins.backends.torch_compiled_step import dynamo_counters
    found = {}
    for contestant in contestants:
        counters.clear()
        contestant.synchronize()
        start = clock()
        contestant.step(batch)
        contestant.synchronize()
        found[contestant.name] = {"first_step_s": clock() - start, **dynamo_counters()}
    return found


def make_contestants(keras, backend, workload, total_steps):
    from benchmarks.workload import OptimizerSettings, build_keras_model
    from mtbench.keras_models.initialization import initial_weights
    from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
    from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
    eager_model, compiled_model = (build_keras_model(keras, workload, total_steps) for _ in range(2))
    weights = initial_weights(eager_model, workload.config.seed)
    settings = OptimizerSettings.of_keras_optimizer(eager_model.optimizer)
    return [
        keras_contestant(EAGER["mtbench"], backend, eager_model, EagerTorchTrainStep(eager_model)),
        keras_contestant(COMPILED["mtbench"], backend, compiled_model, CompiledTorchTrainStep(compiled_model)),
        native_contestant("torch", workload, weights, settings, name=EAGER["native"]),
        native_contestant("torch", workload, weights, settings, name=COMPILED["native"], compile=True),
    ]


def measure(args):
    from benchmarks.workload import prepare_benchmark
    config = workload_config(args, "torch")
    keras, backend, run, workload = prepare_benchmark(config, args.batches, args.length)
    import torch

    from benchmarks.native_torch import default_device
    torch.compiler.config.force_disable_caches = True  # compile times as a first run sees them
    total_steps = 1 + args.warmup + args.rounds * args.steps_per_round
    contestants = make_contestants(keras, backend, workload, total_steps)
    warm_up_compiler(default_device())
    first = first_steps(contestants, workload.batches[0])
    seconds = run_interleaved(contestants, workload.batches, args.warmup, args.rounds, args.steps_per_round)
    results = {name: {**summarize(values), **first[name]} for name, values in seconds.items()}
    for name in COMPILED.values():
        results[name]["compile_s"] = results[name]["first_step_s"] - results[name]["median_s"]
    return {"contestants": results, "batch_shape": list(workload.batches[0].shape),
            "torch_threads": torch.get_num_threads(), "device": run.device,
            "matmul_precision": run.matmul_precision}


def table(contestants):
    header = (f"{'contestant':18s} {'median ms':>10s} {'p10 ms':>8s} {'p90 ms':>8s} {'first step s':>13s} "
              f"{'compile s':>10s} {'graphs':>7s} {'breaks':>7s}")
    lines = [header, "-" * len(header)]
    for name, c in contestants.items():
        compile_s = f"{c['compile_s']:.1f}" if "compile_s" in c else "-"
        lines.append(f"{name:18s} {milliseconds(c):>10s} {c['p10_s'] * 1e3:8.1f} {c['p90_s'] * 1e3:8.1f} "
                     f"{c['first_step_s']:13.2f} {compile_s:>10s} {c['graphs_compiled']:7d} {c['graph_breaks']:7d}")
    return "\n".join(lines)


def summary_json(result, settings):
    c = result["contestants"]
    out = {}
    for side in ("mtbench", "native"):
        out[f"compile_s_{side}"] = c[COMPILED[side]]["compile_s"]
        out[f"graph_breaks_{side}"] = c[COMPILED[side]]["graph_breaks"]
    out["compiled_over_eager"] = ratio(c[COMPILED["mtbench"]], c[EAGER["mtbench"]])
    out["native_compiled_over_eager"] = ratio(c[COMPILED["native"]], c[EAGER["native"]])
    out["compiled_over_native_compiled"] = ratio(c[COMPILED["mtbench"]], c[COMPILED["native"]])
    out["settings"] = settings
    out["run"] = result
    return out


def parse_args(argv):
    parser = measurement_parser(__doc__.split("\n\n")[0], QUICK, "a smoke run, for tests")
    return parse_measurement_args(parser, argv, QUICK)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    pin_to_cpus(args.cpus)
    started = time.perf_counter()
    result = measure(args)
    settings = {"preset": args.preset, "batch_size": args.batch_size, "length": args.length,
                "rounds": args.rounds, "steps_per_round": args.steps_per_round, "warmup": args.warmup,
                "versions": versions(), "hardware": hardware(), "cpus": args.cpus}
    print(f"torch.compile: {args.preset} preset, float32, batch {result['batch_shape'][0]} x "
          f"{result['batch_shape'][1]} tokens, {args.rounds} rounds x {args.steps_per_round} steps per contestant "
          f"after a first step and {args.warmup} warm-up steps")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in settings["versions"].items() if v))
    print(f"hardware: {settings['hardware']['cpu_model']}, {settings['hardware']['cpus_usable']} usable CPUs"
          + (f", pinned to {args.cpus}" if args.cpus else "") + f"; torch intra-op threads {result['torch_threads']}"
          + f"; device: {device_text(result['device'])}")
    print(table(result["contestants"]))
    summary = summary_json(result, settings)
    print(f"mtbench compiled / eager: {summary['compiled_over_eager']:.3f}; native compiled / eager: "
          f"{summary['native_compiled_over_eager']:.3f}; mtbench compiled / native compiled: "
          f"{summary['compiled_over_native_compiled']:.3f} ({time.perf_counter() - started:.0f} s in all)")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
