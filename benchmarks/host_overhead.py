"""The host's share of a training step, measured where there is no GPU: how long each framework's Python and
dispatch take per step, for mtbench's steps against the steps a user would write by hand.

    python benchmarks/host_overhead.py [--quick] [--model transformer|gpt] [--text FILE] [--d-model 16] [--layers 1] [--heads 2] [--ff-dim 32]
                                       [--batch-size 2] [--length 8] [--batches 12] [--rounds 50]
                                       [--steps-per-round 20] [--warmup 5] [--max-other 10] [--retries 5]
                                       [--cpus 0,1] [--cache-dir DIR]

Why it predicts a GPU's floor. A GPU step is host-bound when the framework's work per step on the host (Python,
dispatch, kernel launches, or one compiled program's launch) outlasts the device's work: the device then waits on
the host, and a step cannot run faster than its dispatch however fast the GPU. Here the model is so small (by
default d_model 16, one encoder and one decoder layer, 2 heads, feed-forward 32, batch 2 x 8 tokens, float32)
that the arithmetic is negligible even on a CPU, so a step's time is the host's work: the same Python, dispatch and
operation count as the step on a GPU, with the CPU's microsecond kernels in place of launches. `--layers 3
--heads 4` gives the `small` preset's depth (its operation count) at the same negligible size. --length is also
--max-len, so every pair falls in one length bucket (at most 16 tokens); the built-in corpus has only 3 pairs of
at most 8 tokens a side, so the default batches repeat them, which changes nothing of the host's work.

With --model gpt the model is the decoder-only language model (the `tiny` GPT preset at the same negligible size:
d_model 16, --layers 1 block, 2 heads, feed-forward 32, byte vocabulary 256), on the language-modelling task's
byte-level batches of --text FILE or the built-in corpus's source side, blocks of --length (8) tokens; the native
contestants are benchmarks/native_gpt_torch.py and native_gpt_flax.py.

The contestants, on mtbench's own real batches (one length bucket), from the same initial weights:

- torch (one process, keras on torch): `mtbench eager` (the step `mtbench train --backend torch` runs),
  `mtbench compiled` (the step of `--extra torch-compile`, compile mode default), `native eager` and
  `native compiled` (benchmarks/native_torch.py, an `nn.Module` with `torch.optim.AdamW`, compiled the way a
  PyTorch user compiles it). These are benchmarks/torch_compile.py's four contestants (`make_contestants`).
- jax (one process, keras on JAX): `mtbench jax` (the step `mtbench train --backend jax` runs) and `native flax`
  (benchmarks/native_flax.py, Flax + optax under one `jax.jit`).

How the figures are taken. keras fixes its backend at import, so each framework runs in its own persistent worker
process; the two are started one after the other, each sets up its model, takes --warmup untimed steps per
contestant (tracing, compiling) and reports ready. Then the driver runs --rounds rounds; in each it asks the torch
worker, then the JAX worker, for one burst, so only one process works at a time and a change in the machine's
speed hits both frameworks alike (T J T J ...). A burst is benchmarks/overhead.py's `run_interleaved` for one
round: one untimed step per contestant (what the other process did to the caches and the clock speed is not
billed to whichever contestant comes first), then each contestant in turn takes --steps-per-round steps, every
step timed alone between two synchronisations, its loss read as a training loop reads it. A contestant's figure
is the median of all its timed steps; a ratio is mtbench's median over the native one's in the same worker.

On a shared machine another process's work during a burst slows whichever contestant it meets. Each worker reads,
around every burst, the CPU time other processes took (/proc/stat less its own: mtbench's machine-load figures); a
burst during which they took more than --max-other percent of the CPUs' time (default 10) is thrown away and run
again, up to --retries times (default 5). The last try is kept whatever the load; the report counts the bursts run
again and warns where busy ones were kept.

Goals (from the issue): compiled torch and JAX within 1.2x of their native steps, eager torch within 1.5x of native
eager. The last line printed is one JSON object: `torch_eager_ratio`, `torch_compiled_ratio`, `jax_ratio`, each
goal and whether it is met, the per-step milliseconds of every contestant, the settings, versions and CPU.
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # run as a script: `benchmarks` and `mtbench` from this checkout

from benchmarks.overhead import (device_text, hardware, measurement_parser, parse_measurement_args,  # noqa: E402
                                 pin_to_cpus, ratio, run_interleaved, summarize, versions, workload_config)
from mtbench.runner.measurement.load import other_processes_percent, sample_load  # noqa: E402

QUICK = {"batches": 2, "rounds": 2, "steps_per_round": 2, "warmup": 1}
FRAMEWORKS = ("torch", "jax")  # the order of the bursts in a round
MTBENCH_JAX, NATIVE_FLAX = "mtbench jax", "native flax"
# ratio key: (mtbench contestant, native contestant, goal)
RATIOS = {"torch_eager_ratio": ("mtbench eager", "native eager", 1.5),
          "torch_compiled_ratio": ("mtbench compiled", "native compiled", 1.2),
          "jax_ratio": (MTBENCH_JAX, NATIVE_FLAX, 1.2)}
MESSAGE = "@host-overhead "  # a worker's replies start with it; anything else it prints is not read
REQUIRED = ("torch", "jax", "flax", "optax")


# ---- worker: one framework, in its own process ------------------------------------------------------------------

def train_config(framework, args):
    return workload_config(args, framework, max_len=args.length, d_model=args.d_model, heads=args.heads,
                           layers=args.layers, ff_dim=args.ff_dim)


def jax_contestants(keras, backend, run, workload, total_steps):
    from benchmarks.overhead import keras_contestant, native_contestant
    from benchmarks.workload import OptimizerSettings, build_keras_model
    from mtbench.keras_models.initialization import initial_weights
    model = build_keras_model(keras, workload, total_steps)
    step = backend.make_train_step(run, model)
    native = native_contestant("jax", workload, initial_weights(model, workload.config.seed),
                               OptimizerSettings.of_keras_optimizer(model.optimizer), name=NATIVE_FLAX)
    return ([keras_contestant(MTBENCH_JAX, backend, model, step), native],
            {MTBENCH_JAX: step.name, NATIVE_FLAX: f"{native_module('jax', workload)}.FlaxTrainStep"})


def native_module(framework, workload):
    """The name of the native baselines' module for the workload's model, as the report shows it."""
    from benchmarks.overhead import NATIVE_MODULES
    return NATIVE_MODULES[(workload.config.model_family[0], framework)].rpartition(".")[2]


def torch_contestants(keras, backend, workload, total_steps):
    from benchmarks.torch_compile import COMPILED, EAGER, make_contestants
    from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
    from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
    native = native_module("torch", workload)
    steps = {EAGER["mtbench"]: EagerTorchTrainStep.name, COMPILED["mtbench"]: CompiledTorchTrainStep.name,
             EAGER["native"]: f"{native}.TorchTrainStep", COMPILED["native"]: f"{native}.TorchTrainStep(compile)"}
    return make_contestants(keras, backend, workload, total_steps), steps


def reply(message):
    print(MESSAGE + json.dumps(message), flush=True)


def serve(framework, args):
    """Sets the contestants up, warms them up, says it is ready, then runs one burst per `burst` line read."""
    from benchmarks.workload import prepare_benchmark
    keras, backend, run, workload = prepare_benchmark(train_config(framework, args), args.batches, args.length)
    total_steps = args.warmup + args.rounds * (args.steps_per_round + 1)
    if framework == "torch":
        contestants, steps = torch_contestants(keras, backend, workload, total_steps)
    else:
        contestants, steps = jax_contestants(keras, backend, run, workload, total_steps)
    started = time.perf_counter()
    run_interleaved(contestants, workload.batches, args.warmup, rounds=0, steps_per_round=0)
    info = {"contestants": [c.name for c in contestants], "train_steps": steps,
            "warmup_s": time.perf_counter() - started, "device": run.device,
            "matmul_precision": run.matmul_precision,
            "batch_shape": list(workload.batches[0].shape), "model": workload.model_shape.to_dict()}
    if framework == "torch":
        import torch
        info["torch_threads"] = torch.get_num_threads()
    reply({"ready": info})
    for line in sys.stdin:
        if line.strip() != "burst":
            break
        before = sample_load(nvidia_smi=None)
        seconds = run_interleaved(contestants, workload.batches, 1, 1, args.steps_per_round)
        reply({"seconds": seconds, "other_percent": other_processes_percent(before, sample_load(nvidia_smi=None))})
    return 0


# ---- driver -------------------------------------------------------------------------------------------------------

class WorkerFailed(Exception):
    pass


class Worker:
    """One framework's persistent worker process; its stderr goes to a log file, kept if it fails."""

    def __init__(self, framework, argv, log_dir):
        self.framework = framework
        self.log_path = os.path.join(log_dir, f"{framework}-worker.log")
        self.log = open(self.log_path, "w", encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}  # the backend plugin sets it
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, "--worker", framework],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                        env=env, cwd=REPOSITORY)

    def read(self):
        for line in self.process.stdout:
            if line.startswith(MESSAGE):
                return json.loads(line[len(MESSAGE):])
        self.process.wait()
        self.log.flush()
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
        last = lines[-1] if lines else f"exit code {self.process.returncode}"
        raise WorkerFailed(f"the {self.framework} worker ended early: {last} (log: {self.log_path})")

    def burst(self):
        """{'seconds': {contestant: [timed steps]}, 'other_percent': the CPUs' time other processes took}."""
        try:
            self.process.stdin.write("burst\n")
            self.process.stdin.flush()
        except OSError:  # the worker has ended: read() says why
            pass
        return self.read()

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.log.close()


def quiet_burst(worker, args, bursts):
    """One burst of `worker` that ran while other processes took at most --max-other percent of the CPUs, trying
    again up to --retries times; the last try is kept even if it was not quiet. Counts into `bursts`."""
    for attempt in range(args.retries + 1):
        burst = worker.burst()
        other = burst["other_percent"]
        bursts["other_percent"].append(other)
        if other is None or other <= args.max_other:
            break
        if attempt < args.retries:
            bursts["discarded"] += 1
        else:
            bursts["kept_busy"] += 1
    bursts["kept"] += 1
    return burst["seconds"]


def measure(argv, args, log_dir):
    """Starts the workers one after the other, then runs the rounds; returns what each worker said when ready,
    every contestant's timed seconds, and how many bursts the machine's other load cost."""
    workers, ready, seconds = [], {}, {}
    bursts = {"kept": 0, "discarded": 0, "kept_busy": 0, "other_percent": []}
    try:
        for framework in FRAMEWORKS:
            print(f"starting the {framework} worker (model set-up, {args.warmup} warm-up steps per contestant) ...",
                  file=sys.stderr, flush=True)
            worker = Worker(framework, argv, log_dir)
            workers.append(worker)
            ready[framework] = worker.read()["ready"]
        for number in range(args.rounds):
            for worker in workers:
                for name, values in quiet_burst(worker, args, bursts).items():
                    seconds.setdefault(name, []).extend(values)
            if (number + 1) % 10 == 0:
                print(f"round {number + 1} of {args.rounds} ({bursts['discarded']} bursts run again so far: other "
                      f"processes were busy)", file=sys.stderr, flush=True)
    finally:
        for worker in workers:
            worker.close()
    return ready, seconds, bursts


def summary_json(ready, seconds, bursts, settings):
    contestants = {name: summarize(values) for name, values in seconds.items()}
    out = {}
    for key, (mine, native, goal) in RATIOS.items():
        out[key] = ratio(contestants[mine], contestants[native])
    out["goals"] = {key: {"goal": goal, "met": out[key] <= goal} for key, (_, _, goal) in RATIOS.items()}
    out["step_ms"] = {name: c["median_s"] * 1e3 for name, c in contestants.items()}
    out["contestants"] = contestants
    out["train_steps"] = {**ready["torch"]["train_steps"], **ready["jax"]["train_steps"]}
    out["warmup_s"] = {framework: info["warmup_s"] for framework, info in ready.items()}
    out["torch_threads"] = ready["torch"].get("torch_threads")
    out["devices"] = {framework: info["device"] for framework, info in ready.items()}
    out["matmul_precision"] = {framework: info["matmul_precision"] for framework, info in ready.items()}
    measured = [value for value in bursts["other_percent"] if value is not None]
    out["bursts"] = {"kept": bursts["kept"], "run_again": bursts["discarded"], "kept_busy": bursts["kept_busy"],
                     "other_processes_percent_median": float(np.median(measured)) if measured else None}
    out["settings"] = settings
    return out


def report(summary):
    s = summary["settings"]
    model = s["model"]
    lines = [f"host overhead per training step, {s.get('model_family', 'transformer')} model: d_model {model['d_model']}, {model['encoder_layers']}+"
             f"{model['decoder_layers']} layers, {model['num_heads']} heads, feed-forward {model['ff_dim']}, "
             f"vocabulary {model['vocab_size']}, float32; batch {s['batch_shape'][0]} x {s['batch_shape'][1]} tokens; "
             f"{s['rounds']} rounds of {s['steps_per_round']} timed steps per contestant, the torch and JAX worker "
             f"processes taking turns, after {s['warmup']} warm-up steps",
             "versions: " + ", ".join(f"{k} {v}" for k, v in s["versions"].items() if v),
             f"hardware: {s['hardware']['cpu_model']}, {s['hardware']['cpus_usable']} usable CPUs"
             + (f", pinned to {s['cpus']}" if s["cpus"] else "")
             + f"; torch intra-op threads {summary['torch_threads']}; devices: "
             + ", ".join(f"{framework} {device_text(device)}" for framework, device in summary["devices"].items()),
             "", f"{'contestant':18s} {'median ms':>10s} {'p10 ms':>8s} {'p90 ms':>8s} {'steps':>6s}  train step"]
    for name, c in summary["contestants"].items():
        lines.append(f"{name:18s} {c['median_s'] * 1e3:10.2f} {c['p10_s'] * 1e3:8.2f} {c['p90_s'] * 1e3:8.2f} "
                     f"{c['steps']:6d}  {summary['train_steps'].get(name, '-')}")
    lines += ["", f"{'mtbench / native':36s} {'ratio':>6s} {'goal':>6s}  met"]
    for key, (mine, native, goal) in RATIOS.items():
        met = "yes" if summary["goals"][key]["met"] else "NO"
        lines.append(f"{mine + ' / ' + native:36s} {summary[key]:6.2f} {goal:6.1f}  {met}")
    b = summary["bursts"]
    lines.append(f"\nbursts: {b['kept']} kept, {b['run_again']} run again because other processes took more than "
                 f"{s['max_other_percent']:g} % of the CPUs")
    if b["kept_busy"]:
        lines.append(f"WARNING: {b['kept_busy']} kept bursts ran on a busy machine after {s['retries']} retries "
                     f"(other processes' median share {b['other_processes_percent_median']:.0f} %): the figures "
                     f"are inflated, the ratios less so (each is taken within one worker, its contestants "
                     f"interleaved)")
    return lines


def parse_args(argv):
    parser = measurement_parser(__doc__.split("\n\n")[0], QUICK, "a smoke run, for tests")
    parser.set_defaults(preset="tiny", batch_size=2, length=8, rounds=50, steps_per_round=20, warmup=5)
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--layers", type=int, default=1, help="encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--ff-dim", type=int, default=32)
    parser.add_argument("--max-other", type=float, default=10.0, metavar="PERCENT",
                        help="a burst during which other processes took more of the CPUs' time is run again "
                             "(default 10)")
    parser.add_argument("--retries", type=int, default=5, help="times a busy burst is run again (default 5)")
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    args = parse_measurement_args(parser, argv, QUICK)
    if args.retries < 0 or args.max_other < 0:
        parser.error("--retries and --max-other must be 0 or more")
    from mtbench.runner.data.batches import BUCKET_STEP
    if args.model != "gpt" and args.length > BUCKET_STEP:
        # --max-len is the length, so every pair falls in one length bucket (a bucket too thin to fill a batch,
        # beside others, would leave the search for its batches endless)
        parser.error(f"--length must be at most {BUCKET_STEP} (one length bucket), not {args.length}")
    from mtbench.errors import MtbenchError
    try:
        train_config("torch", args)  # the model's shape, checked as mtbench train checks it
    except MtbenchError as error:
        parser.error(str(error))
    if not args.worker:
        missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
        if missing:
            parser.error(f"needs {', '.join(REQUIRED)} (pip install -e '.[jax,torch,bench]'); missing: "
                         f"{', '.join(missing)}")
        try:
            pin_to_cpus(args.cpus)  # the workers inherit it
        except (ValueError, OSError) as error:
            parser.error(f"--cpus {args.cpus}: {error}")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.worker:
        return serve(args.worker, args)
    started = time.perf_counter()
    log_dir = tempfile.mkdtemp(prefix="host-overhead-")
    try:
        ready, seconds, bursts = measure(argv, args, log_dir)
    except WorkerFailed as failure:
        print(f"host_overhead: {failure}", file=sys.stderr)
        return 1
    shutil.rmtree(log_dir, ignore_errors=True)  # kept only where a worker failed
    settings = {"model_family": args.model, "model": ready["torch"]["model"], "batch_shape": ready["torch"]["batch_shape"],
                "rounds": args.rounds, "steps_per_round": args.steps_per_round, "warmup": args.warmup,
                "batches": args.batches, "dtype": "float32", "versions": versions(), "hardware": hardware(),
                "cpus": args.cpus, "max_other_percent": args.max_other, "retries": args.retries,
                "seconds": time.perf_counter() - started}
    summary = summary_json(ready, seconds, bursts, settings)
    print("\n".join(report(summary)))
    print(f"({settings['seconds']:.0f} s in all)")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
