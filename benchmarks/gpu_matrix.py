"""One command for the GPU table: every way mtbench trains, on whatever device this machine has, within a time
budget, as a markdown table and one JSON line.

    python benchmarks/gpu_matrix.py [--presets small,base] [--dtypes float32,mixed_bfloat16] [--runs jax,torch,...]
                                    [--steps N] [--budget SECONDS] [--row-timeout SECONDS] [--out DIR]
                                    [-- TRAIN OPTIONS]

The matrix. For each preset and each dtype policy (`float32`, `mixed_bfloat16`), one row per way to train:
`jax` (`--backend jax`), `torch` (eager), `torch+torch-compile` (`--extra torch-compile`, compile mode
`default`), `torch+torch-compile@reduce-overhead` (the same with `--compile-mode reduce-overhead`: CUDA graphs,
CUDA only), and `jax`, `torch` and `torch+torch-compile` again with `--extra flash-attention`. The presets are
`small` and `base` where a backend sees a GPU, `tiny` on a CPU, so that CI and the tests run the same matrix.
`--presets`, `--dtypes` and `--runs` choose a part of it; TRAIN OPTIONS (after `--`) go to every run (`--batch-size
256`, `--max-len 64`, `--dataset ...`).

How the figures are taken. First one short process asks each backend plugin what it runs on and, for every row,
whether its dtype and extras can run there (the checks `mtbench train` makes before it trains, for the row's own
preset and dtype). A row they rule out is listed as "skipped: why", as is a CUDA-graphs row without CUDA and a row
whose backend sees only a CPU in a GPU matrix. Then, per preset, `mtbench init-weights` writes one weights file,
and each remaining row is one `mtbench train` in its own process (keras fixes its backend at import, and a row's
crash or out-of-memory cannot touch the next), loading that file, for `--steps` steps (default 200 on a GPU, the
preset's own on a CPU), in the order of the table. Every figure is mtbench's own, read from the row's result JSON
(see docs/results.md for the clocks):

- `train step that ran`: the step that really ran (`train_step`), the attention implementation the decoder's
  causal and the padded attentions ran (`model.attention`), and what the extras recorded (`extras_record`: the
  compile mode and graph breaks of torch-compile, the fused kernels flash-attention found in the compiled program
  or profiler trace);
- `step ms (median)`: the median steady step, compilation and each batch shape's first step kept apart;
- `tokens/s`: real (non-padding) target tokens of the steady steps over their time;
- `compile s`: the first-of-shape steps' time beyond the steady median, summed over shapes;
- `MFU`: the steady steps' analytic FLOPs over their time, over the device's datasheet peak for the dtype (on a
  CPU, the measured matmul peak);
- `peak device MiB`: the peak device memory the framework reports (n/a on a CPU);
- `parity`: the largest relative loss difference, over the first 50 steps, from the first row of the same preset
  and dtype (mtbench compare's check, within 1 %); rows that train with dropout (`base`) are not checked.

`--budget` bounds the rows' time, counted from the first weights file on: once it is spent no new row (or weights
file) is started, and every row not started is listed as cut by the budget; a row already running finishes
(`--row-timeout` stops a stuck one). Above the table: the device each backend ran on, the versions and the
configuration every row shares, from the results' `env` and `config`. Each row's result JSON and log, and the
whole summary (`gpu-matrix.json`), go to `--out`. The last line printed is the summary as one JSON object. The
exit status is 1 when a row failed.

Why not one `mtbench compare --matrix`: compare gives every run the same train options, so it cannot hold two
torch-compile runs that differ in `--compile-mode`; it stops at the first run that fails; and it has no budget.
The rows here are what compare's runs are (the same weights file, one `mtbench train` each, the same parity check),
launched one at a time so that each can be skipped, cut or fail on its own.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # run as a script: `mtbench` from this checkout

DTYPES = ("float32", "mixed_bfloat16")
PRESETS_ON = {"gpu": ("small", "base"), "cpu": ("tiny",)}
GPU_STEPS = 200  # enough steady steps for a stable median after compilation, short enough for the whole matrix
FLASH = "flash-attention"
COMPILE = "torch-compile"
# Keys of a result's `config` that differ from row to row by design, or name files: not part of the shared
# configuration printed above the table.
PER_ROW_CONFIG = ("backend", "extras", "dtype", "compile_mode", "initial_weights", "initial_weights_sha256", "out",
                  "overwrite", "preset", "model", "parameters", "vocab_size", "max_len", "steps", "dropout")


@dataclass(frozen=True)
class Way:
    """One way to train: a backend, its extras and torch.compile's mode."""
    backend: str
    extras: tuple = ()
    compile_mode: str = None

    @property
    def label(self):
        name = "+".join((self.backend, *self.extras))
        return f"{name}@{self.compile_mode}" if self.compile_mode else name

    def train_arguments(self):
        arguments = ["--backend", self.backend]
        for extra in self.extras:
            arguments += ["--extra", extra]
        return arguments + (["--compile-mode", self.compile_mode] if self.compile_mode else [])


WAYS = (
    Way("jax"),
    Way("torch"),
    Way("torch", (COMPILE,)),
    Way("torch", (COMPILE,), "reduce-overhead"),
    Way("jax", (FLASH,)),
    Way("torch", (FLASH,)),
    Way("torch", (COMPILE, FLASH)),
)
WAYS_BY_LABEL = {way.label: way for way in WAYS}


@dataclass(frozen=True)
class Row:
    preset: str
    dtype: str
    way: Way

    @property
    def key(self):
        return f"{self.preset} {self.dtype} {self.way.label}"

    @property
    def file_stem(self):
        return f"{self.preset}-{self.dtype}-{self.way.label}"


# ---- what the machine can run (in a child process: a framework that touches the GPU keeps memory) ----------------

def probe_machine():
    """{"backends": {name: {"device": ...} or {"missing": why}}, "refusals": {row key: why not, or None}} for every
    row of every preset: the checks `mtbench train` makes before training (`start_backend`), each for the row's
    own preset and dtype. Imports the frameworks, never keras."""
    from mtbench.errors import MtbenchError
    from mtbench.keras_models.presets import PRESETS
    from mtbench.plugins import manager as plugins
    from mtbench.plugins.api import RunContext
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import resolve_extras
    registry = plugins.registry()
    backends = {}
    for name in dict.fromkeys(way.backend for way in WAYS):
        backend = registry.backends.get(name)
        missing = (f"backend '{name}' is not installed as a plugin" if backend is None
                   else backend.missing_framework())
        backends[name] = {"missing": missing} if missing else {"device": backend.device_info()}
    refusals = {}
    for preset in PRESETS:
        for dtype in DTYPES:
            for way in WAYS:
                if "device" not in backends[way.backend]:
                    continue
                backend = registry.backends[way.backend]
                config = TrainConfig(backend=way.backend, extras=way.extras, preset=preset, dtype=dtype)
                run = RunContext(config=config, backend=backend, device=backends[way.backend]["device"],
                                 model_shape=config.model)
                reason = backend.unsupported_dtype_reason(dtype, run.device)
                if reason:
                    reason = f"--dtype {dtype}: {reason}"
                else:
                    try:
                        extras = resolve_extras(way.extras, backend, registry)
                    except MtbenchError as error:
                        extras, reason = [], str(error)
                    for extra in extras:
                        why = extra.unavailable_reason(run)
                        if why:
                            reason = f"extra '{extra.name}' cannot run here: {why}"
                            break
                refusals[Row(preset, dtype, way).key] = reason
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

def plan_rows(probe, presets=None, dtypes=DTYPES, ways=WAYS):
    """[(Row, why it is skipped or None)] in the order they run: by preset, dtype, then way."""
    kind = device_kind(probe)
    rows = []
    for preset in presets or PRESETS_ON[kind]:
        for dtype in dtypes:
            for way in ways:
                row = Row(preset, dtype, way)
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
    return probe["refusals"].get(row.key)


# ---- running the rows -------------------------------------------------------------------------------------------

def run_mtbench(arguments, log_file, timeout):
    """Runs `python -m mtbench ARGUMENTS` in a fresh process, its output kept in `log_file`. Returns None, or why
    it failed in one line."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}  # the backend plugin sets it
    try:
        proc = subprocess.run([sys.executable, "-m", "mtbench", *arguments], capture_output=True, text=True,
                              env=env, cwd=REPOSITORY, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or ""
        if isinstance(output, bytes):  # what a killed child left is not always decoded
            output = output.decode(errors="replace")
        with open(log_file, "w", encoding="utf-8") as f:
            f.write(f"$ mtbench {' '.join(arguments)}\n# timed out after {timeout} s\n--- stdout\n{output}")
        return f"timed out after {timeout:.0f} s (--row-timeout; log: {log_file})"
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
    parts = []
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
            "device": result["env"]["device"]}


def run_matrix(planned, args, train_options, clock=time.monotonic):
    """Runs the planned rows within the budget; returns one record per row, in the plan's order, and the results
    of the rows that ran ({row key: result})."""
    started = clock()
    records, results, weights = [], {}, {}
    runnable = [row for row, reason in planned if reason is None]
    for row, reason in planned:
        record = {"preset": row.preset, "dtype": row.dtype, "run": row.way.label}
        records.append(record)
        if reason:
            record.update(status="skipped", reason=reason)
            continue
        if clock() - started >= args.budget:
            record.update(status="cut", reason=f"the budget of {args.budget:g} s was spent before it started")
            continue
        preset_dir = os.path.join(args.out, row.preset)
        os.makedirs(preset_dir, exist_ok=True)
        if row.preset not in weights:
            path = os.path.join(preset_dir, "initial-weights.npz")
            print(f"{row.preset}: writing the initial weights every row of it loads", file=sys.stderr, flush=True)
            failure = run_mtbench(["init-weights", "--backend", row.way.backend, "--preset", row.preset,
                                   *train_options, "--cache-dir", args.cache_dir, "--out", path, "--overwrite"],
                                  path[:-len(".npz")] + ".log", args.row_timeout)
            weights[row.preset] = (path, failure)
        path, weights_failure = weights[row.preset]
        if weights_failure:
            record.update(status="failed", reason=f"mtbench init-weights failed: {weights_failure}")
            continue
        number = runnable.index(row) + 1
        print(f"[{number}/{len(runnable)}] {row.key} ...", file=sys.stderr, flush=True)
        row_started = clock()
        result_file = os.path.join(preset_dir, f"{row.file_stem}.json")
        steps = ["--steps", str(args.steps)] if args.steps else []
        failure = run_mtbench(["train", *row.way.train_arguments(), "--preset", row.preset, "--dtype", row.dtype,
                               *steps, *train_options, "--cache-dir", args.cache_dir, "--initial-weights", path,
                               "--out", result_file, "--overwrite", "--report", "none", "--no-save-model"],
                              os.path.join(preset_dir, f"{row.file_stem}.log"), args.row_timeout)
        record["wall_s"] = clock() - row_started
        record["result_file"] = os.path.abspath(result_file)
        if failure:
            record.update(status="failed", reason=failure)
            continue
        with open(result_file, encoding="utf-8") as f:
            result = json.load(f)
        results[row.key] = result
        record.update(status="ran", reason=None, **figures(result))
        print(f"[{number}/{len(runnable)}] {row.key}: {record['wall_s']:.1f} s, {result['train_step']}",
              file=sys.stderr, flush=True)
    return records, results


def add_parity(records, results):
    """Each row that ran gets mtbench compare's parity against the first row of its preset and dtype."""
    from mtbench.plugins.api import run_dtype
    from mtbench.runner.results.parity import check_parity, percent
    for preset in dict.fromkeys(record["preset"] for record in records):
        named = [(f"{r['run']} {r['dtype']}", results[f"{r['preset']} {r['dtype']} {r['run']}"])
                 for r in records if r["preset"] == preset and r["status"] == "ran"]
        report = check_parity(named, run_dtype)
        cells = {pair.run: (f"{percent(pair.max_relative_difference)} vs {pair.reference.split(' ')[0]}"
                            + ("" if pair.within_tolerance else f", NOT within {percent(report.tolerance)}"))
                 for pair in report.pairs}
        references = {pair.reference for pair in report.pairs}
        unchecked = dict(report.unchecked)
        for record in records:
            name = f"{record['run']} {record['dtype']}"
            if record["preset"] != preset or record["status"] != "ran":
                continue
            if name in cells:
                record["parity"] = cells[name]
            elif name in references:
                record["parity"] = "reference"
            else:
                record["parity"] = "not checked: " + unchecked.get(name, "no other run to compare with")


# ---- output -----------------------------------------------------------------------------------------------------

COLUMNS = ("preset", "dtype", "run", "train step that ran", "step ms (median)", "tokens/s", "compile s", "MFU",
           "peak device MiB", "parity")


def number(value, form):
    return "n/a" if value is None else format(value, form)


def table_row(record):
    head = [record["preset"], record["dtype"], record["run"]]
    if record["status"] != "ran":
        return head + [f"{record['status']}: {record['reason']}"] + [""] * (len(COLUMNS) - 4)
    step = record["train_step"] + (f" ({record['what_ran']})" if record["what_ran"] else "")
    if record["result_status"] != "completed":  # a diverged run's figures stand, but not as a finished run's
        step += f"; {record['result_status']}: {record['result_status_reason']}"
    return head + [step, number(record["step_ms_median"], ".1f"), number(record["tokens_per_s"], ",.0f"),
                   number(record["compile_s"], ".1f"),
                   "n/a" if record["mfu"] is None else f"{record['mfu'] * 100:.1f} %",
                   number(record["peak_device_mib"], ",.0f"), record.get("parity", "")]


def markdown_table(records):
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" if i < 4 else "---:" for i in
                                                               range(len(COLUMNS))) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in table_row(record)) + " |" for record in records]
    return "\n".join(lines)


def shared_config(results):
    """The configuration every row that ran shares (what differs by design left out)."""
    configs = [result["config"] for result in results.values()]
    if not configs:
        return {}
    return {key: value for key, value in configs[0].items()
            if key not in PER_ROW_CONFIG and all(config.get(key) == value for config in configs)}


def environment(results, probe):
    """Versions, host and the device each backend ran on: from the results' `env` where rows ran, else from this
    process and the probe."""
    from mtbench.runner.measurement.environment import host_environment
    env = dict(next(iter(results.values()))["env"]) if results else host_environment()
    env.pop("device", None)
    env.pop("backend_versions", None)
    devices = {}
    for name, info in probe["backends"].items():
        ran = [r for r in results.values() if r["backend"] == name]
        devices[name] = ran[0]["env"]["device"] if ran else info.get("device", {"missing": info.get("missing")})
    return env, devices


def describe_device(device):
    if "missing" in device:
        return f"not available ({device['missing']})"
    return f"{device.get('count', 1)}x {device.get('name')} ({device.get('kind')})"


def parse_args(argv):
    if "--" in argv:
        split = argv.index("--")
        argv, train_options = argv[:split], argv[split + 1:]
    else:
        train_options = []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=None,
                        help="comma-separated (default: small,base on a GPU, tiny on a CPU)")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--runs", default=",".join(WAYS_BY_LABEL),
                        help="comma-separated ways to train, of: " + ", ".join(WAYS_BY_LABEL))
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps of every row (default: {GPU_STEPS} on a GPU, the preset's on a CPU)")
    parser.add_argument("--budget", type=float, default=3600.0,
                        help="seconds after which no new row starts (default 3600)")
    parser.add_argument("--row-timeout", type=float, default=1800.0, help="seconds before a row is stopped")
    parser.add_argument("--out", default=None,
                        help="folder for the rows' results and logs (default mtbench-results/gpu-matrix-<time>)")
    parser.add_argument("--cache-dir", default=None, help="mtbench's cache (default: mtbench train's)")
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
    from mtbench.keras_models.presets import PRESETS
    args.preset_list = [preset for preset in (args.presets or "").split(",") if preset] or None
    wrong = [preset for preset in args.preset_list or () if preset not in PRESETS]
    if wrong:
        parser.error(f"--presets: {', '.join(wrong)} is none of {', '.join(PRESETS)}")
    if args.budget < 0 or args.row_timeout <= 0 or (args.steps is not None and args.steps < 1):
        parser.error("--budget must be 0 or more, --row-timeout and --steps more than 0")
    if args.cache_dir is None:
        from mtbench.runner.config import default_cache_dir
        args.cache_dir = default_cache_dir()
    if args.out is None:
        args.out = os.path.join("mtbench-results", time.strftime("gpu-matrix-%Y%m%d-%H%M%S"))
    return args, train_options


def main(argv=None):
    args, train_options = parse_args(sys.argv[1:] if argv is None else argv)
    if args.probe:
        print(json.dumps(probe_machine()))
        return 0
    started = time.monotonic()
    probe = run_probe()
    kind = device_kind(probe)
    if args.steps is None and kind != "cpu":
        args.steps = GPU_STEPS
    planned = plan_rows(probe, args.preset_list, args.dtype_list, args.ways)
    os.makedirs(args.out, exist_ok=True)
    records, results = run_matrix(planned, args, train_options)
    add_parity(records, results)
    env, devices = environment(results, probe)
    summary = {
        "kind": "gpu-matrix", "device_kind": kind, "presets": list(dict.fromkeys(r["preset"] for r in records)),
        "steps": args.steps, "train_options": train_options, "budget_s": args.budget,
        "elapsed_s": time.monotonic() - started,
        "cut": [f"{r['preset']} {r['dtype']} {r['run']}" for r in records if r["status"] == "cut"],
        "devices": devices, "env": env, "config": shared_config(results),
        "clock": next((r["timing"].get("clock") for r in results.values()), None),
        "out": os.path.abspath(args.out), "rows": records,
    }
    with open(os.path.join(args.out, "gpu-matrix.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)

    steps = "the preset's own number of" if args.steps is None else args.steps
    print(f"mtbench training matrix on the {kind}: presets {', '.join(summary['presets'])}, {steps} steps a row, "
          f"{summary['elapsed_s']:.0f} s of a {args.budget:g} s budget")
    for name, device in devices.items():
        print(f"device ({name}): {describe_device(device)}")
    print("versions: " + ", ".join(f"{key} {env[key]}" for key in
                                    ("python", "mtbench", "keras", "jax", "jaxlib", "torch", "numpy") if env.get(key))
          + (f"; mtbench commit {env['mtbench_git_commit']}" if env.get("mtbench_git_commit") else ""))
    print(f"host: {env.get('cpu_model')}, {env.get('cpu_count')} CPUs, {env.get('platform')}")
    print("config shared by every row: " + (", ".join(f"{k}={v}" for k, v in summary["config"].items()) or "-")
          + (f"; train options: {' '.join(train_options)}" if train_options else ""))
    if summary["clock"]:
        print(f"clock: {summary['clock']}")
    print()
    print(markdown_table(records))
    print()
    if summary["cut"]:
        print(f"cut by the budget ({args.budget:g} s): {', '.join(summary['cut'])}")
    print(f"rows' results and logs: {summary['out']}")
    print(json.dumps(summary))
    return 1 if any(r["status"] == "failed" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
