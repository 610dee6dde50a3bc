"""Where mtbench's train step spends its time: a profile of the step on one backend, grouped into matrix
multiplications and everything else, with the FLOP rate the multiplications reach against the device's
measured matmul peak. It says what bounds the model FLOPs utilisation (MFU) that `mtbench train` reports.

    python benchmarks/profile_step.py --backend jax|torch [--preset small] [--batch-size 64] [--length 32]
                                      [--dtype float32] [--steps 4]

JAX: `jax.profiler` writes a Perfetto trace of the jitted step; each XLA operation is looked up in the
optimised HLO (dumped with XLA_FLAGS) to tell the multiplications (`dot`, alone or fused) from the rest and to
count their FLOPs from their shapes. torch, on the CPU only (on a GPU an operator's host time is its launch):
`torch.profiler` with FLOP counting; a multiplication is an `aten::mm`/`addmm`/`bmm`, and the step's wall time
minus the operators' own time is Python and dispatch. Times are per step, after warm-up steps; the analytic FLOPs
are those of `mtbench train`'s MFU.
"""

import argparse
import atexit
import collections
import glob
import gzip
import json
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)

MATMUL = "matrix multiplications"
TORCH_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


INSTRUCTION = re.compile(r"^(?:ROOT )?%([\w.\-]+) = \(?\w+\[([\d,]*)\]")


def library_matmul_flops(result_dims, lhs, line):
    """A cuBLAS call's FLOPs: 2 x its result's elements (the first array of its result, a workspace beside it) x
    the contraction its backend config names on the left operand's dimensions `lhs`."""
    contracting = re.search(r'"lhs_contracting_dimensions":\s*\[([^\]]*)\]', line)
    if lhs is None or contracting is None:
        return 0
    contraction = np.prod([lhs[int(d)] for d in re.findall(r"\d+", contracting.group(1))])
    return 2 * int(np.prod(result_dims)) * int(contraction)


def hlo_computations(hlo_text):
    """{name: its lines, stripped} of every computation of an HLO module, the entry's included."""
    found, name = {}, None
    for line in hlo_text.splitlines():
        header = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{$", line)
        if header:
            name = header.group(1)
            found[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            found[name].append(line.strip())
    return found


def hlo_operations(hlo_text):
    """{operation name: (category, FLOPs)} for the operations of an optimised HLO module. A fusion counts as a
    multiplication when the computation it calls holds a `dot`; its FLOPs are 2 x output size x contraction. On a
    GPU most products are cuBLAS calls instead (`custom-call` to `__cublas$gemm`, `__cublas$lt$matmul`), counted
    alike from the dimension numbers of their backend config."""
    computations = {name: [line for line in body if INSTRUCTION.match(line)]
                    for name, body in hlo_computations(hlo_text).items()}
    shapes = {}
    for line in (line for lines in computations.values() for line in lines):
        instruction = INSTRUCTION.match(line)
        shapes[instruction.group(1)] = [int(d) for d in instruction.group(2).split(",") if d]

    def dot_flops(line):
        output = INSTRUCTION.match(line).group(1)
        lhs = re.search(r"dot\(%([\w.\-]+)", line).group(1)
        contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line).group(1)
        contraction = np.prod([shapes[lhs][int(d)] for d in contracting.split(",") if d])
        return 2 * int(np.prod(shapes[output])) * int(contraction)

    operations = {}
    for line in (line for lines in computations.values() for line in lines):
        name = INSTRUCTION.match(line).group(1)
        called = re.search(r"calls=%([\w.\-]+)", line)
        body = computations.get(called.group(1), []) if called else [line]
        dots = [b for b in body if " dot(" in b]
        library = re.search(r"custom-call\(%([\w.\-]+).*__cublas\$", line)
        if dots:
            operations[name] = (MATMUL, sum(dot_flops(d) for d in dots))
        elif library:
            operations[name] = (MATMUL, library_matmul_flops(shapes[name], shapes.get(library.group(1)), line))
        elif "reduce" in name:
            operations[name] = ("reductions (softmax, layer norm, loss)", 0)
        elif "copy" in name or "transpose" in name:
            operations[name] = ("copies and transposes", 0)
        else:
            operations[name] = ("element-wise and other", 0)
    return operations


def scratch_dir(prefix):
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def profile_jax(run_steps, steps, dump_dir):
    import jax
    trace_dir = scratch_dir("mtbench-trace-")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        run_steps(steps)
    trace = json.load(gzip.open(glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                                          recursive=True)[0]))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    seconds = collections.Counter()
    module_time = collections.Counter()
    for event in events:
        args = event.get("args", {})
        if event.get("ph") == "X" and "hlo_op" in args:
            seconds[(args["hlo_module"], args["hlo_op"])] += event["dur"] / 1e6
            module_time[args["hlo_module"]] += event["dur"] / 1e6
    step_module = module_time.most_common(1)[0][0]
    dumps = glob.glob(os.path.join(dump_dir, f"*.{step_module}.cpu_after_optimizations.txt")) or \
        glob.glob(os.path.join(dump_dir, f"*.{step_module}.*after_optimizations.txt"))
    operations = hlo_operations(open(max(dumps, key=os.path.getsize)).read())
    categories, flops, slowest = collections.Counter(), 0, []
    for (module, name), value in seconds.items():
        if module != step_module:
            categories["other programs"] += value
            continue
        category, operation_flops = operations.get(name, ("element-wise and other", 0))
        categories[category] += value
        flops += operation_flops  # once per operation: the module is one step
        slowest.append((value / steps, name, category, operation_flops))
    return {name: value / steps for name, value in categories.items()}, flops, sorted(slowest, reverse=True)


def profile_torch(run_steps, steps):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as profiler:
        start = time.perf_counter()
        run_steps(steps)
        wall = time.perf_counter() - start
    categories, flops = collections.Counter(), 0
    slowest = sorted(((event.self_cpu_time_total / 1e6 / steps, event.key, "", event.flops / steps)
                      for event in profiler.key_averages()), reverse=True)
    for event in profiler.key_averages():
        seconds = event.self_cpu_time_total / 1e6
        if event.key in TORCH_MATMULS:
            categories[MATMUL] += seconds
            flops += event.flops
        elif any(part in event.key for part in ("softmax", "layer_norm", "nll", "sum", "amax")):
            categories["reductions (softmax, layer norm, loss)"] += seconds
        elif "copy" in event.key or "clone" in event.key or "contiguous" in event.key:
            categories["copies and transposes"] += seconds
        elif "adam" in event.key.lower() or "_foreach" in event.key:
            categories["optimizer"] += seconds
        else:
            categories["element-wise and other operators"] += seconds
    categories["Python and dispatch (wall minus operators)"] = max(0.0, wall - sum(categories.values()))
    return {name: value / steps for name, value in categories.items()}, flops / steps, slowest


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("jax", "torch"), required=True)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--length", type=int, default=32, help="the length bucket of the profiled batches")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=4, help="profiled steps (after as many warm-up steps)")
    parser.add_argument("--top", type=int, default=12, help="list this many of the slowest operations")
    parser.add_argument("--cache-dir", default=None)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    # XLA's dumps and the profiler's trace are this process's scratch (tens of MB a run): removed at exit.
    dump_dir = scratch_dir("mtbench-hlo-")
    if args.backend == "jax":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump_dir}").strip()

    from benchmarks.overhead import versions
    from benchmarks.workload import build_keras_model, prepare_benchmark
    from mtbench.plugins import manager as plugins
    from mtbench import KerasTrainStep
    from mtbench.runner.config import TrainConfig
    from mtbench.keras_models.flops import training_flops
    from mtbench.runner.measurement.peaks import device_peak
    config = TrainConfig(backend=args.backend, preset=args.preset, batch_size=args.batch_size, dtype=args.dtype,
                         **({"cache_dir": args.cache_dir} if args.cache_dir else {}))
    keras, backend, run, workload = prepare_benchmark(config, args.steps, args.length)
    if args.backend == "torch" and run.device.get("kind") != "cpu":
        # An operator's own CPU time is its launch there, not its kernels': a device's needs its trace.
        raise SystemExit(f"profile_step.py times torch's operators on the host, which on a {run.device.get('kind')} "
                         f"only launch its kernels; `mtbench train --profile N` reads the device's own trace")
    model = build_keras_model(keras, workload, 2 * args.steps + 10)
    step = backend.make_train_step(run, model) or KerasTrainStep(model)

    def run_steps(count):
        for k in range(count):
            batch = workload.batches[k % len(workload.batches)]
            step((batch.source, batch.target_input), batch.target_output, batch.weight)
        step.block()
        backend.synchronize(model)

    run_steps(args.steps)  # warm-up: compilation, allocator
    timed = []
    for _ in range(args.steps):
        start = time.perf_counter()
        run_steps(1)
        timed.append(time.perf_counter() - start)
    step_s = float(np.median(timed))
    if args.backend == "jax":
        categories, measured_flops, slowest = profile_jax(run_steps, args.steps, dump_dir)
    else:
        categories, measured_flops, slowest = profile_torch(run_steps, args.steps)

    rows, length = workload.batches[0].shape
    analytic = training_flops(workload.model_shape, rows, length, length)
    peak, peak_source = device_peak(backend, run.device, args.dtype, config.cache_dir,
                                    plugins.registry().backends.values(), config.matmul_precision)
    profiled = sum(categories.values())
    print(f"{args.backend} {args.preset} {args.dtype}, step {step.name}, batch {rows} x {length}; "
          f"{run.device.get('name')}; peak {peak / 1e9:.0f} GFLOP/s ({peak_source})")
    print(f"step median {step_s * 1e3:.1f} ms (unprofiled); profiled operations {profiled * 1e3:.1f} ms per step")
    for name, seconds in sorted(categories.items(), key=lambda kv: -kv[1]):
        print(f"  {name:45s} {seconds * 1e3:8.1f} ms  {100 * seconds / profiled:5.1f} %")
    print(f"slowest {args.top} operations (ms per step, GFLOP/s where they multiply matrices):")
    for seconds, name, _, operation_flops in slowest[:args.top]:
        rate = f"{operation_flops / seconds / 1e9:6.0f} GFLOP/s" if operation_flops else ""
        print(f"  {name[:45]:45s} {seconds * 1e3:8.1f} ms  {rate}")
    matmul_s = categories.get(MATMUL, 0.0)
    matmul_rate = measured_flops / matmul_s if matmul_s else None
    summary = {
        "backend": args.backend, "preset": args.preset, "dtype": args.dtype, "train_step": step.name,
        "batch_shape": [rows, length], "step_s": step_s, "analytic_flops": analytic, "profiled_matmul_flops":
        measured_flops, "peak_flops_per_s": peak, "peak_source": peak_source,
        "mfu": analytic / step_s / peak, "matmul_share": matmul_s / profiled if profiled else None,
        "matmul_flops_per_s": matmul_rate, "matmul_fraction_of_peak": matmul_rate / peak if matmul_rate else None,
        "categories_ms": {name: seconds * 1e3 for name, seconds in categories.items()},
        "device": run.device, "matmul_precision": run.matmul_precision, "versions": versions(),
    }
    print(f"MFU {summary['mfu']:.1%}: {summary['matmul_share']:.0%} of the profiled time is matrix multiplication, "
          f"which runs at {matmul_rate / 1e9:.0f} GFLOP/s ({summary['matmul_fraction_of_peak']:.0%} of the peak)"
          if matmul_rate else f"MFU {summary['mfu']:.1%}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
