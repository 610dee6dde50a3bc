"""Shared fixtures. In-process tests run keras on JAX; anything that needs another backend runs the CLI in a
subprocess, as real users do (keras fixes its backend at import)."""

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap

import pytest

from cpu_costs import pytest_addoption, pytest_runtest_protocol  # noqa: F401 (the session's hooks: --cpu-costs)
from forked_mtbench import shared_forking_mtbench
from mtbench.runner.config import default_cache_dir
from mtbench.runner.measurement.environment import nvidia_gpu

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(TESTS_DIR)
# Test modules import this file a second time (as `tests.conftest`, below): that import takes the first one's
# directory, which the first one's `pytest_unconfigure` removes, instead of making one nobody removes.
_SESSION_DIR = getattr(sys.modules.get("conftest"), "_SESSION_DIR", None) or tempfile.mkdtemp(prefix="mtbench-tests-")
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("KERAS_HOME", os.path.join(_SESSION_DIR, "keras"))
# A machine with an NVIDIA driver, where the frameworks may compute on a GPU: what a test expects of the device (the
# kind a run names, a measured MFU peak) is then checked against what each framework sees (`device_kind`).
GPU_MACHINE = nvidia_gpu()["gpu_present"]
cpu_machine_only = pytest.mark.skipif(GPU_MACHINE, reason="checks what runs on a machine without a GPU")
if GPU_MACHINE:
    # Two workers' processes share the GPU: JAX's default takes 75 % of its memory for the first process.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # In-process tests compare JAX programs with others in float32: JAX's GPU default is TF32. (mtbench's own
    # processes set it themselves; `cli_environment` leaves it out.)
    os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "float32")
# The machine's CPUs, before a pytest-xdist worker takes its share of them (`pytest_configure`). Read once by the
# controller and handed down in the environment the workers inherit: test modules import this file a second time
# (as `tests.conftest`), after their worker is pinned, and would otherwise see the worker's share as the machine.
if hasattr(os, "sched_getaffinity"):
    os.environ.setdefault("MTBENCH_TESTS_MACHINE_CPUS", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    MACHINE_CPUS = [int(cpu) for cpu in os.environ["MTBENCH_TESTS_MACHINE_CPUS"].split(",")]
else:
    MACHINE_CPUS = None


# Which vector instructions inductor's C++ kernels may use: torch finds out in every process that compiles, by
# building a library for each instruction set the CPU lists and loading it in a fresh Python (15 to 20 s a
# process on this project's 2-GHz machines, where a cold compile of the tiny GPT's step took 60 s).
_VEC_ISA_PROBE = """
import torch._inductor.config as config
from torch._inductor import cpu_vec_isa
built = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]
cpu_vec_isa.valid_vec_isa_list.cache_clear()
config.cpp.vec_isa_ok = True
print("same" if [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()] == built else "differs")
"""


def inductor_vec_isa_settled():
    """Tells inductor, through the environment every test's process inherits, to trust the CPU's list of vector
    instruction sets (TORCHINDUCTOR_VEC_ISA_OK=1), once one probe here found that torch's own check keeps every
    one of them: the kernels are then compiled for the same instruction sets, without the probe in each process.
    Where the check drops one (a compiler too old for the CPU), nothing is set. The answer is kept per torch
    version, CPU and compiler."""
    if "TORCHINDUCTOR_VEC_ISA_OK" in os.environ or importlib.util.find_spec("torch") is None:
        return
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "")
        compiler = os.environ.get("CXX", "g++")
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        key = hashlib.sha256("\n".join([importlib.metadata.version("torch"), flags, compiler, version]).encode())
        kept = os.path.join(default_cache_dir(), "tests", f"vec-isa-{key.hexdigest()[:16]}")
        if not os.path.exists(kept):
            with tempfile.TemporaryDirectory(prefix="mtbench-vec-isa-") as scratch:
                proc = subprocess.run([sys.executable, "-c", _VEC_ISA_PROBE], capture_output=True, text=True,
                                      env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": scratch}, timeout=600)
            os.makedirs(os.path.dirname(kept), exist_ok=True)
            with open(kept, "w") as out:
                out.write(proc.stdout.strip().rpartition("\n")[2] if proc.returncode == 0 else "failed")
        with open(kept) as answer:
            if answer.read() == "same":
                os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"
    except (OSError, subprocess.SubprocessError):  # no answer: every process checks for itself, as torch does
        pass


def bytecode_written():
    """Compiles the modules the session's processes import from this checkout (mtbench's, and the tests',
    benchmarks' and example plugins' beside them) to bytecode once, where Python is told not to write it
    (PYTHONDONTWRITEBYTECODE, as on this project's machines): each of the session's processes would otherwise
    compile from source the hundred or so modules of mtbench it imports, 0.2 to 0.4 s of every run's start.
    Python reads the bytecode whatever the variable says; it checks each file's source times as ever."""
    if not sys.dont_write_bytecode:  # each module's first import writes its own
        return
    import compileall

    import mtbench
    directories = [os.path.dirname(mtbench.__file__), TESTS_DIR,
                   os.path.join(REPOSITORY, "benchmarks"), os.path.join(REPOSITORY, "examples")]
    for directory in directories:
        if os.path.isdir(directory):
            compileall.compile_dir(directory, quiet=2)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Lets pytest keep the test modules it rewrites for its assertions (`__pycache__/*-pytest-*.pyc`) where Python
    is told not to write bytecode (`bytecode_written`): pytest then rewrites and compiles each of them again in every
    worker, 4 to 6 s of each worker's collection here. Only the collection writes; what runs after is told as
    before."""
    told = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = told


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a run without xdist (-p no:xdist) knows none
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker for each core and one more. A tenth of the workers' time went in waiting (for a run
    another worker makes, for the simulated devices of a JAX process to meet, for a signal), with its core idle;
    the extra worker's tests take it."""
    return len(MACHINE_CPUS) + 1 if MACHINE_CPUS else None


def pytest_configure(config):
    """Each pytest-xdist worker, and every process its tests start, runs on its own share of the cores, as each of
    mtbench's local processes does (`share_cores`), or with more workers than cores on one core, the workers taking
    the cores in turn, one thread each. Unpinned, two workers' runs on two cores each start threads for both cores,
    and torch's OpenMP threads spin while they wait for a busy core: two tiny torch runs side by side took 28 s
    unpinned against 12 s pinned on this project's 2-core machine."""
    from mtbench.plugins.api import Launch
    from mtbench.runner.launch import share_cores
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if not worker:  # pytest's own process, before it starts the workers, which inherit its environment
        inductor_vec_isa_settled()
        bytecode_written()
    if worker and MACHINE_CPUS:
        rank, workers = int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
        if workers <= len(MACHINE_CPUS):
            share_cores(Launch(local_rank=rank, local_processes=workers))
        else:
            os.sched_setaffinity(0, [MACHINE_CPUS[rank % len(MACHINE_CPUS)]])
            os.environ["OMP_NUM_THREADS"] = "1"


def pytest_unconfigure(config):
    """Each process of the session (pytest's, each xdist worker) removes its own directory, its KERAS_HOME, which
    no later run reads. (The session's cache, `cache_dir`, is in pytest's base directory, which pytest prunes.)"""
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@pytest.fixture
def jax_precision():
    """JAX, its default float32 matmul precision put back after the test: a setting of the whole process, which the
    worker's next tests would otherwise inherit."""
    import jax
    saved = jax.config.jax_default_matmul_precision
    yield jax
    jax.config.update("jax_default_matmul_precision", saved)


@contextlib.contextmanager
def keras_dtype_policy_restored():
    """keras's global dtype policy as it was before the block, whatever the block trained in-process (as
    `build_for_training` sets the policy for its process)."""
    keras = sys.modules.get("keras")
    before = keras.config.dtype_policy().name if keras else "float32"  # keras's default, before it is imported
    try:
        yield
    finally:
        keras = sys.modules.get("keras")
        if keras and keras.config.dtype_policy().name != before:
            keras.config.set_dtype_policy(before)


@pytest.fixture(autouse=True)
def keras_dtype_policy_kept():
    """Each test leaves keras's global dtype policy as it found it: a test that trains in-process in 16-bit would
    otherwise build the next tests' models in 16-bit on the same worker; a float32 beam search then met near-tied
    tokens and failed, depending on the order. (A module fixture that trains in-process keeps it itself, with
    `keras_dtype_policy_restored`: it runs before the first test's own fixtures.)"""
    with keras_dtype_policy_restored():
        yield


# Becomes the command ARGV[3:] (exec) once its CPUs are set (ARGV[1], comma-separated; none: as inherited) and, with
# ARGV[2] "1", SIGINT's default action: a `preexec_fn`'s work, without forking a worker that JAX's threads run in to
# run Python in the copy (a deadlock, should a thread hold a lock then; Python warns of it at every such fork).
_EXEC_AFTER = """import os, signal, sys
if sys.argv[1]:
    os.sched_setaffinity(0, [int(cpu) for cpu in sys.argv[1].split(",")])
if sys.argv[2] == "1":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execv(sys.argv[3], sys.argv[3:])
"""


def exec_after(command, cpus=None, default_sigint=False):
    """`command` (its program an absolute path) started on `cpus` and with SIGINT's default action where asked,
    by a small Python that sets them and then becomes the command, its process id kept."""
    return [sys.executable, "-I", "-S", "-c", _EXEC_AFTER, ",".join(map(str, cpus or [])),
            "1" if default_sigint else "0", *command]


def on_every_core(command, env=None):
    """(command, env) that start `command` spread over the machine's cores (torchrun's processes share them out among
    themselves) from a worker that holds only its share."""
    if not MACHINE_CPUS:
        return command, env
    return exec_after(command, MACHINE_CPUS), {"OMP_NUM_THREADS": None, **(env or {})}

# The Flax baselines of benchmarks/ (native_flax.py, native_gpt_flax.py) need the bench extra.
needs_flax = pytest.mark.skipif(importlib.util.find_spec("flax") is None or importlib.util.find_spec("optax") is None,
                                reason="the Flax baselines need flax and optax (pip install -e '.[bench]')")

# Small enough for seconds per run, large enough that the tiny model learns something measurable. float32 on every
# machine (`--dtype auto` trains 16-bit on a GPU): the tests' tolerances are float32's.
TINY_TRAIN = ["--preset", "tiny", "--max-pairs", "4000", "--valid-size", "100", "--test-size", "100",
              "--max-len", "48", "--steps", "60", "--batch-size", "32", "--dtype", "float32"]

# For runs whose tests look at neither length buckets nor the model's figures: with --max-len 32 every training
# batch has one shape (TINY_TRAIN's 48 gives two), so a run compiles one train step and fewer evaluation and
# decoding programs, about 10 s less per run. Click keeps the last --max-len.
ONE_BUCKET = ["--max-len", "32"]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One cache for the whole session, every pytest-xdist worker's tests and the shared runs alike: the corpus and
    tokenizer are prepared once, and a program one worker's run compiled (XLA's, inductor's C++ kernels) is loaded
    by the other's. mtbench's caches take several processes at once, as a compare's runs do."""
    path = os.path.join(shared_directory(tmp_path_factory), "cache")
    os.makedirs(path, exist_ok=True)
    return path


def cli_environment(env=None):
    """The environment of an mtbench process a test starts: this one's, with `env` over it."""
    full_env = dict(os.environ)
    full_env.pop("KERAS_BACKEND", None)  # the backend plugin must set it, not the test environment
    full_env.pop("JAX_DEFAULT_MATMUL_PRECISION", None)  # so must the run (--matmul-precision)
    # pytest-xdist's workers inherit a COLUMNS that a test run without them lacks: the width of mtbench's tables off
    # a terminal is the same either way unless the test sets it.
    full_env.pop("COLUMNS", None)
    full_env.setdefault("MTBENCH_LOAD_PLUGINS", "")
    full_env.update(env or {})
    return {k: v for k, v in full_env.items() if v is not None}  # None in `env` unsets a variable


def free_coordinator():
    """host:port of a port of this machine that no program listens on now, for processes to meet at."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{free.getsockname()[1]}"


def run_joined_probes(probe, processes=2, timeout=120):
    """Runs tests/PROBE as `processes` processes that meet at a free port of this machine (`PROBE RANK
    COORDINATOR`, COORDINATOR host:port of process 0), on the CPU (they join over gloo, also on a GPU machine);
    asserts that each exits with 0 and returns each one's last line of output, read as JSON, in process order."""
    coordinator = free_coordinator()
    started = [subprocess.Popen([sys.executable, os.path.join(TESTS_DIR, probe), str(rank), coordinator],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=cli_environment(CPU_ONLY))
               for rank in range(processes)]
    outputs = [process.communicate(timeout=timeout) for process in started]
    assert [process.returncode for process in started] == [0] * processes, \
        "".join(stderr[-2000:] for _, stderr in outputs)
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]


def json_answer(proc):
    """What a finished probe process answered: its last line of output, read as JSON, once it exited with 0 (else the
    test fails with the end of what it wrote)."""
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@functools.lru_cache(maxsize=None)
def device_kind(backend):
    """"cpu" or "gpu": what `backend`'s framework computes on here, asked in a process of its own (not mtbench)."""
    if not GPU_MACHINE:
        return "cpu"
    probe = {"jax": "import jax; print(jax.default_backend())",
             "torch": "import torch; print('gpu' if torch.cuda.is_available() else 'cpu')"}[backend]
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return proc.stdout.split()[-1]


# The environment of a test's process that checks what happens on a CPU (gloo between processes, the CPU forms of
# kernels): on a GPU machine too. Two processes on one GPU could not each take a device of their own.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}


def simulated_devices(count):
    """The environment of a process whose JAX computes on `count` devices simulated on the CPU: on a GPU machine
    too, where JAX would otherwise take its one GPU and leave the flag unused."""
    return {"XLA_FLAGS": f"--xla_force_host_platform_device_count={count}", "JAX_PLATFORMS": "cpu"}


def install_plugin_distribution(site, package, entry_point, module, version="1.0", name=None):
    """A plugin distribution in directory `site` as an installer leaves one: its metadata (`name`, default
    `package`) and an `mtbench` entry point `entry_point` that loads `module` (whose source the caller writes)."""
    info = site / f"{package}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name or package}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[mtbench]\n{entry_point} = {module}\n")


def install_plugin_module(site, module, entry_point, source, version="1.0"):
    """A plugin of one module, `module`.py of `source` in directory `site`, installed as the distribution `module`
    with the `mtbench` entry point `entry_point` (`install_plugin_distribution`)."""
    (site / f"{module}.py").write_text(source)
    install_plugin_distribution(site, module, entry_point, module, version)


def first_position_kept_or_dropped(attended, values):
    """Asserts of a causal attention's output at its first position (one key, probability 1) through dropout at
    0.5: each head's is that value doubled or zero (the probability kept or dropped whole), about half of each.
    Arrays (rows, heads, head size)."""
    import numpy as np
    kept = np.isclose(attended, 2 * values, rtol=1e-5).all(axis=-1)
    dropped = (attended == 0).all(axis=-1)
    assert (kept ^ dropped).all()
    assert 0.35 < dropped.mean() < 0.65, dropped.mean()


def python_path(*first):
    """A PYTHONPATH that searches `first` before this process's own (which may hold the packages themselves, as
    on a GPU machine set up by .gpukit/env.sh)."""
    return os.pathsep.join([*map(str, first), *filter(None, [os.environ.get("PYTHONPATH")])])


def load_docs_script(filename):
    """A script of docs/ (the generators of its references), imported as a module."""
    path = os.path.join(REPOSITORY, "docs", filename)
    spec = importlib.util.spec_from_file_location(os.path.splitext(filename)[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_the_check_fails_on_an_edit_by_hand(generator, old, new, tmp_path, monkeypatch):
    """A docs generator's `--check` fails on its file with `old` edited to `new` in the generated block, and a
    rewrite restores the file."""
    with open(generator.PATH, encoding="utf-8") as f:
        text = f.read()
    assert old in text
    edited = tmp_path / os.path.basename(generator.PATH)
    edited.write_text(text.replace(old, new, 1), encoding="utf-8")
    monkeypatch.setattr(generator, "PATH", str(edited))
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0 and edited.read_text(encoding="utf-8") == text


def forking_mtbench():
    """This process's ForkingMtbench (`forked_mtbench`), its outputs in the session's directory."""
    return shared_forking_mtbench(os.path.join(_SESSION_DIR, f"forked-{os.getpid()}"), cli_environment())


def run_cli(*args, env=None, cwd=None, timeout=600):
    """Runs `python -m mtbench ARGS` in a process of its own; returns the CompletedProcess. `report`, which never
    imports keras, runs forked from a Python that has imported mtbench (`forked_mtbench`), the rest afresh."""
    if args[:1] == ("report",):
        return forking_mtbench().run(*args, env=cli_environment(env), cwd=cwd, timeout=timeout)
    return subprocess.run([sys.executable, "-m", "mtbench", *args], capture_output=True, text=True,
                          env=cli_environment(env), cwd=cwd, timeout=timeout)


def assert_refused_in_one_line(proc, expected):
    """The command refused its input as mtbench must: exit code 2 and one line on stderr, `Error: ...` holding
    `expected` (so no traceback either)."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and expected in lines[0], proc.stderr


class SharedRuns:
    """Runs made once per test session, whichever pytest-xdist worker first needs one: the others wait for it and
    read its files. A worker builds the runs no other worker is building, then waits for the rest, so two workers
    that both need all the runs build them side by side instead of twice each."""

    def __init__(self, directory, cache_dir, makers):
        self.directory, self.cache_dir, self.makers = directory, cache_dir, makers

    def get(self, *names):
        from filelock import FileLock, Timeout
        records, pending = {}, list(names)
        for wait in (False, True):
            for name in list(pending):
                lock = FileLock(os.path.join(self.directory, f"{name}.lock"))
                try:
                    lock.acquire(timeout=-1 if wait else 0)
                except Timeout:
                    continue  # another worker is building it: build the others first
                try:
                    records[name] = self._read_or_make(name)
                finally:
                    lock.release()
                pending.remove(name)
        return records

    def _read_or_make(self, name):
        record_file = os.path.join(self.directory, f"{name}.record.json")
        if not os.path.exists(record_file):  # a worker whose build failed left none: this one tries again
            record = self.makers[name](os.path.join(self.directory, name), self.cache_dir)
            with open(record_file + ".tmp", "w") as f:
                json.dump(record, f)
            os.replace(record_file + ".tmp", record_file)
        with open(record_file) as f:
            return json.load(f)


def cache_of_its_own(session_cache, path, shared):
    """A --cache-dir at `path` whose folders named in `shared` are the session cache's (linked, made there first):
    a test that needs a cache without some of what a run keeps (tokens, compiled programs, the CPU's peak) does not
    make the rest again."""
    os.makedirs(path)
    for name in shared:
        folder = os.path.join(session_cache, name)
        if not os.path.exists(folder):  # (a file of the session's is linked as it is)
            os.makedirs(folder, exist_ok=True)  # another worker's run may make it meanwhile
        os.symlink(folder, os.path.join(path, name))
    return str(path)


def shared_directory(tmp_path_factory):
    """A directory that every xdist worker of this test session sees: the parent of the workers' own."""
    base = tmp_path_factory.getbasetemp()
    return str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)


def train_tiny(backend, env=None, flags=None):
    def make(out_dir, cache_dir):
        out = os.path.join(out_dir, f"{backend}.json")
        # torch's tiny run is its eager step on every machine (`--step auto` compiles it on a CUDA GPU).
        eager = ["--step", "eager"] if backend == "torch" else []
        proc = run_cli("train", "--backend", backend, *(flags or TINY_TRAIN), *eager, "--cache-dir", cache_dir,
                       "--out", out, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(out) as f:
            return {"result": json.load(f), "stdout": proc.stdout, "stderr": proc.stderr, "path": out}
    return make


def compare_tiny(out_dir, cache_dir):
    out = os.path.join(out_dir, "tiny-compare.json")
    # --matrix: exactly these two runs (--backends adds torch compiled beside eager where torch sees a GPU).
    proc = run_cli("compare", "--matrix", "jax;torch", *TINY_COMPARE, "--cache-dir", cache_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return {"combined": json.load(f), "stdout": proc.stdout, "stderr": proc.stderr, "path": out}


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory, cache_dir):
    # The session's one cache, whichever workers make the runs: the CPU's peak that MFU divides by is measured
    # once for all of them, as for runs a user starts together (each worker's own cache would measure its own).
    return SharedRuns(shared_directory(tmp_path_factory), cache_dir,
                      {"jax": train_tiny("jax"), "torch": train_tiny("torch"), "compare": compare_tiny,
                       "jax-cpu": train_tiny("jax", CPU_ONLY, TINY_COMPARE),
                       "torch-cpu": train_tiny("torch", CPU_ONLY, TINY_COMPARE),
                       "jax-data-parallel": train_tiny("jax", simulated_devices(2),
                                                       [*TINY_COMPARE, "--extra", "data-parallel"]),
                       "torch-float16-gpt": train_tiny("torch", CPU_ONLY, FLOAT16_GPT),
                       "jax-translation": train_tiny("jax", flags=TRANSLATION_TRAINED)})


@pytest.fixture(scope="session")
def tiny_runs(shared_runs):
    """One tiny training run per built-in backend, shared by the tests that inspect results."""
    return shared_runs.get("jax", "torch")


@pytest.fixture(scope="session")
def cpu_compared_runs(shared_runs):
    """TINY_COMPARE's run of each built-in backend in one process on the CPU (torch's eager step): the references
    of runs over gloo, which train on the CPU. Here, where there is no GPU, the shared compare's runs; on a GPU
    machine, whose compare trains on the GPU in other arithmetic, runs of their own."""
    if GPU_MACHINE:
        return {name.removesuffix("-cpu"): run for name, run in shared_runs.get("jax-cpu", "torch-cpu").items()}
    return {run["result"]["backend"]: {"result": run["result"]}
            for run in shared_runs.get("compare")["compare"]["combined"]["runs"]}


@pytest.fixture(scope="session")
def jax_data_parallel_run(shared_runs):
    """TINY_COMPARE's JAX run with --extra data-parallel on two simulated devices: the replicated run beside which
    pmap's and fsdp's are checked."""
    return shared_runs.get("jax-data-parallel")["jax-data-parallel"]


# The tiny configuration with fewer steps and one length bucket: a compare runs both backends, and the parity
# check still covers every step it trains.
COMPARE_STEPS = 30
TINY_COMPARE = [*TINY_TRAIN, *ONE_BUCKET, "--steps", str(COMPARE_STEPS)]  # click keeps the last --steps


# The tiny GPT in float16, a few steps, measured only (float16 matmuls on a CPU are slow): the one-process run beside
# which the split and sharded torch runs scale their losses.
FLOAT16_GPT = ["--dtype", "mixed_float16", "--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size",
               "8", "--steps", "6", "--measure-only"]


@pytest.fixture(scope="session")
def torch_float16_gpt_run(shared_runs):
    """FLOAT16_GPT's torch run in one process on the CPU (gloo's processes train there too, on a GPU machine as
    well)."""
    return shared_runs.get("torch-float16-gpt")["torch-float16-gpt"]["result"]


# Long enough for the tiny model to translate into varied sentences (so equal translations say something) and to emit
# EOS, with a checkpoint halfway: the model test_inference.py opens again and test_beam_search.py decodes in-process.
TRANSLATION_TRAINED = ["--preset", "tiny", "--max-pairs", "4000", "--valid-size", "100", "--test-size", "100",
                       "--max-len", "32", "--steps", "150", "--batch-size", "32", "--learning-rate", "3e-3",
                       "--warmup-steps", "20", "--checkpoint-every", "75", "--report", "none",
                       "--dtype", "float32"]  # float32 on a GPU too


@pytest.fixture(scope="session")
def translation_run(shared_runs):
    """TRANSLATION_TRAINED's JAX run, which kept its model and its checkpoints: {'result', 'stdout', 'stderr',
    'path'}."""
    return shared_runs.get("jax-translation")["jax-translation"]


@pytest.fixture(scope="session")
def compared(shared_runs):
    """One `mtbench compare` of jax and torch on the tiny preset, shared by the compare and report tests."""
    return shared_runs.get("compare")["compare"]


THIRD_PARTY = textwrap.dedent('''
    from mtbench import Backend, Extra, MtbenchError, Reporter, WrappingStep, hookimpl

    class CountingStep(WrappingStep):
        """Wraps the step chosen before it (the backend's fast step) and counts its calls."""
        def __init__(self, inner, state):
            super().__init__(inner)
            self.state = state
            self.name = f"counted {inner.name}"

        def __call__(self, x, y, sample_weight):
            self.state["steps_seen"] += 1
            return self.inner(x, y, sample_weight)

    class CountSteps(Extra):
        name = "count-steps"
        description = "counts the train steps it wraps"
        backends = ("jax", "torch")

        def make_train_step(self, run, model, step):
            run.extras_state[self.name] = {"steps_seen": 0, "wrapped": step.name}
            return CountingStep(step, run.extras_state[self.name])

    class ReadingStep(WrappingStep):
        """Wraps the step chosen before it and reads its loss on the host after every call, as a careless step
        would: a host wait a step, which the run's host-sync count must find."""
        def __init__(self, inner):
            super().__init__(inner)
            self.name = f"reading {inner.name}"

        def __call__(self, x, y, sample_weight):
            logs = self.inner(x, y, sample_weight)
            float(logs["loss"])
            return logs

    class ReadLoss(Extra):
        name = "read-loss"
        description = "reads the loss on the host after every step"
        backends = ("jax", "torch")
        wraps_step = True  # whatever step it is given: after torch-compile where `--step auto` joins it (a GPU)

        def make_train_step(self, run, model, step):
            return ReadingStep(step)

    class CompilingStep(WrappingStep):
        """Wraps the step chosen before it and, at its sixth call, compiles a JAX program of its own, one no cache
        holds (its constant is the clock's): a compilation inside a steady timing window, which the run must
        find."""
        def __init__(self, inner):
            super().__init__(inner)
            self.name = f"compiling {inner.name}"
            self.calls = 0

        def __call__(self, x, y, sample_weight):
            import time

            import jax
            import numpy as np
            self.calls += 1
            if self.calls == 6:  # one program: its argument comes from the host (jnp.zeros would compile another)
                offset = float(time.time_ns() % 1_000_003)
                jax.jit(lambda v: v + offset)(np.zeros(3, np.float32))
            return self.inner(x, y, sample_weight)

    class CompileLate(Extra):
        name = "compile-late"
        description = "compiles a program of its own at the sixth step"
        backends = ("jax",)

        def make_train_step(self, run, model, step):
            return CompilingStep(step)

    class NoJit(Extra):
        name = "no-jit"
        description = "asks model.compile for jit_compile=False"
        backends = ("jax",)

        def compile_options(self, run):
            return {"jit_compile": False}

    class CrashBeforeModel(Extra):
        name = "crash-before-model"
        description = "a bug in an extra's own code"
        backends = ("jax",)

        def before_model(self, run):
            raise KeyError("mesh")

    class BadRecord(Extra):
        name = "bad-record"
        description = "a bug in an extra's record, once the run has trained"
        backends = ("jax",)

        def record(self, run):
            raise KeyError("lost the count")

    class ComputeIn(Extra):
        """Sets the run's dtype, as the TPU strategy turns float32 into bfloat16: after `--dtype` has chosen."""
        backends = ("jax", "torch")

        def __init__(self, dtype):
            self.dtype, self.name = dtype, f"{dtype.rpartition('_')[2]}-compute"
            self.description = f"trains in {dtype} whatever --dtype says"

        def config_changes(self, run):
            return {"dtype": self.dtype}

    class NotInstalledBackend(Backend):
        name = "fakeflow"
        keras_backend = "jax"
        framework_modules = ("fakeflow_is_not_installed",)

    class OneLineReporter(Reporter):
        name = "oneline"
        description = "one line per run"

        def report(self, result, console, complete):
            bleu = result["metrics"]["bleu"]
            console.print(f"ONELINE backend={result['backend']} steps={result['timing']['steps']} "
                          f"complete={complete} bleu={'none' if bleu is None else f'{bleu:.2f}'}",
                          highlight=False, soft_wrap=True)

    class CallsFile(Reporter):
        """A tracker that writes each call it gets to the file MTBENCH_TEST_CALLS_FILE names, a line each."""
        name = "calls-file"
        description = "writes the calls it gets to a file"

        def _write(self, line):
            import os
            with open(os.environ["MTBENCH_TEST_CALLS_FILE"], "a") as calls:
                calls.write(line + "\\n")

        def start(self, run):
            self._write("start")

        def log(self, metrics, step):
            self._write(f"log {step}")

        def report(self, result, console, complete):
            self._write(f"report complete={complete} status={result['status']}")

    class ExplodingReporter(Reporter):
        name = "explode"
        description = "fails on purpose"

        def report(self, result, console, complete):
            raise ValueError("no ink")

    @hookimpl
    def mtbench_register_backends(register):
        register(NotInstalledBackend())

    @hookimpl
    def mtbench_register_reporters(register):
        register(OneLineReporter())
        register(ExplodingReporter())
        register(CallsFile())

    @hookimpl
    def mtbench_keras_callbacks(config):
        """Where MTBENCH_TEST_CALLBACK_FAILS_AT names a step, a callback whose code fails at its end."""
        import os
        at = os.environ.get("MTBENCH_TEST_CALLBACK_FAILS_AT")
        if not at:
            return []
        import keras

        class FailsAt(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == int(at):
                    raise KeyError("lost the mesh")

        return [FailsAt()]

    @hookimpl
    def mtbench_register_extras(register):
        register(CountSteps())
        register(ReadLoss())
        register(CompileLate())
        register(NoJit())
        register(CrashBeforeModel())
        register(BadRecord())
        register(ComputeIn("mixed_bfloat16"))
        register(ComputeIn("mixed_float16"))
''')

# Loads, but its callbacks hook fails during the run.
FLAKY = textwrap.dedent('''
    from mtbench import hookimpl

    @hookimpl
    def mtbench_keras_callbacks(config):
        raise RuntimeError("flaky callbacks on purpose")
''')

# Loads, but fails while registering datasets: it may explain an unknown dataset, never an unknown backend.
DATASET_TROUBLE = textwrap.dedent('''
    from mtbench import Dataset, MtbenchError, hookimpl

    class Crashing(Dataset):
        name = "crashing"
        description = "raises a plain exception while reading"

        def read_pairs(self, progress):
            raise OSError("the tape is stuck")
            yield

    class NeedsKey(Dataset):
        name = "needs-key"
        description = "a user's error, raised as MtbenchError"

        def missing_reason(self):
            return None

        def read_pairs(self, progress):
            raise MtbenchError("set NEEDS_KEY_PATH to the corpus you licensed")
            yield

    @hookimpl
    def mtbench_register_datasets(register):
        register(Crashing())
        register(NeedsKey())
        raise RuntimeError("half of the datasets registered")
''')

# Two packages whose entry points share the name "twin".
TWIN = textwrap.dedent('''
    from mtbench import Reporter, hookimpl

    class Twin(Reporter):
        name = "twin-{letter}"

        def report(self, result, console, complete):
            pass

    @hookimpl
    def mtbench_register_reporters(register):
        register(Twin())
''')

# A backend whose process set-up fails: a compare names the run and quotes its last error line.
BROKEN_BACKEND = textwrap.dedent('''
    from mtbench import Backend, RunFailure, hookimpl

    class BrokenBackend(Backend):
        name = "brokenflow"
        keras_backend = "jax"

        def prepare_process(self, config):
            raise RunFailure("the brokenflow device is on fire")

        def device_info(self):  # every backend must have one, or its runs are refused before they start
            raise RunFailure("the brokenflow device is on fire")

        def synchronize(self, model=None):
            pass

    @hookimpl
    def mtbench_register_backends(register):
        register(BrokenBackend())
''')

# Plugins that fail in ways mtbench must name: a train step that is no TrainStep, one that raises, a reporter that
# fails on a partial result.
MISFITS = textwrap.dedent('''
    from mtbench import Extra, Reporter, WrappingStep, hookimpl

    class NotAStep:
        name = "not a step"
        def __call__(self, x, y, sample_weight):
            raise AssertionError("never called")

    class NotAStepExtra(Extra):
        name, backends = "not-a-step", ("jax", "torch")
        def make_train_step(self, run, model, step):
            return NotAStep()

    class BreakingStep(WrappingStep):
        def __init__(self, inner):
            super().__init__(inner)
            self.calls = 0
        def __call__(self, x, y, sample_weight):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("the step broke")
            return self.inner(x, y, sample_weight)

    class RaisingStepExtra(Extra):
        name, backends = "raising-step", ("jax", "torch")
        def make_train_step(self, run, model, step):
            return BreakingStep(step)

    class StepForModelExtra(Extra):
        """make_train_step written without `model`: mtbench takes a two-argument one for plugin API 1.0's
        (run, model), so the model arrives where the step was meant."""
        name, backends = "step-for-model", ("jax", "torch")
        def make_train_step(self, run, step):
            return WrappingStep(step)

    class PartialFails(Reporter):
        name = "partial-fails"
        def report(self, result, console, complete):
            if not complete:
                raise ValueError("cannot read a partial result")

    @hookimpl
    def mtbench_register_extras(register):
        register(NotAStepExtra())
        register(RaisingStepExtra())
        register(StepForModelExtra())

    @hookimpl
    def mtbench_register_reporters(register):
        register(PartialFails())
''')

def guide_example(heading):
    """The Python block that follows `heading` in docs/plugins.md: the guide's example, as a reader copies it."""
    with open(os.path.join(REPOSITORY, "docs", "plugins.md"), encoding="utf-8") as f:
        guide = f.read()
    after = guide[guide.index(heading):]
    start = after.index("```python\n") + len("```python\n")
    return after[start:after.index("```", start)]


THIRD_PARTY_PACKAGES = {  # package -> (version, entry-point name, module source)
    "mtbench_thirdparty": ("0.3.0", "thirdparty", THIRD_PARTY),
    "mtbench_broken": ("0.0.1", "broken", "raise ImportError('this plugin is broken on purpose')\n"),
    "mtbench_flaky": ("0.1.0", "flaky", FLAKY),
    "mtbench_datasets_trouble": ("0.2.0", "trouble", DATASET_TROUBLE),
    "mtbench_twin_a": ("1.0.0", "twin", TWIN.replace("{letter}", "a")),
    "mtbench_twin_b": ("1.0.0", "twin", TWIN.replace("{letter}", "b")),
    "mtbench_brokenflow": ("1.0", "brokenflow", BROKEN_BACKEND),
    "mtbench_misfits": ("1.0", "misfits", MISFITS),
    "mtbench_oneblock": ("1.0", "oneblock", guide_example("**A decoder-only family**")),
    "mtbench_csvtracker": ("1.0", "csvtracker", guide_example("`TrackedRun` (what `start` receives)")),
    # What the guide forbids: keras imported as the module loads, before mtbench has chosen the backend.
    "mtbench_eager_keras": ("1.0", "eagerkeras", "import keras  # noqa: F401\nfrom mtbench import hookimpl\n"),
}


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory):
    """A directory of installed distributions with entry points: a working plugin, one that fails to import, one
    whose hook fails during a run, one that fails while registering datasets, and two sharing an entry-point
    name."""
    site = tmp_path_factory.mktemp("site")
    for package, (version, entry_point, source) in THIRD_PARTY_PACKAGES.items():
        install_plugin_module(site, package, entry_point, source, version)
    return str(site)


CARELESS = """
from mtbench import Backend, Dataset, Extra, Reporter, hookimpl


class Typo(Extra):
    name = "careless-typo"
    backends = ("jax", "torch")


class NoBackends(Extra):
    name = "careless-nobackends"
    backends = None


class ServesNone(Extra):
    name = "careless-serves-none"  # the base class's empty list: no run could take it


class Colon(Extra):
    name = "careless:fast"
    backends = ("jax",)


class Clash(Extra):
    name = "torch-compile"
    backends = ("torch",)


class Fine(Extra):
    name = "careless-fine"
    backends = ("jax",)


class NoConflicts(Extra):
    name = "careless-noconflicts"
    backends = ("jax",)
    conflicts = None


class NoModules(Backend):
    name = "careless-nomodules"
    keras_backend = "torch"
    framework_modules = None


class Deviceless(Backend):  # device_info, which every backend must give, left out
    name = "careless-backend"
    keras_backend = "torch"


class OnIt(Extra):
    name = "careless-on-it"
    backends = ("careless-backend",)


class Quiet(Reporter):
    name = "none"


class Pairs(Dataset):
    name = "careless-pairs"


@hookimpl
def mtbench_register_extra(register):  # mtbench's hook is mtbench_register_extras
    register(Typo())


@hookimpl
def mtbench_register_extras(register):
    for extra in (Pairs(), NoBackends(), ServesNone(), Colon(), Clash(), Fine(), NoConflicts(), OnIt()):
        register(extra)


@hookimpl
def mtbench_register_backends(register):
    register(NoModules())
    register(Deviceless())


@hookimpl
def mtbench_register_reporters(register):
    register(Quiet())
"""


@pytest.fixture(scope="session")
def careless_plugin_path(tmp_path_factory):
    """A plugin package that makes an author's mistakes (a misspelled hook, the wrong kind registered, an extra
    without backends, names the command line cannot take, a built-in's name), and a second package whose entry
    point loads the same module."""
    site = tmp_path_factory.mktemp("careless-site")
    (site / "mtbench_careless.py").write_text(CARELESS)
    for package, entry_point in (("mtbench_careless", "careless"), ("mtbench_careless_again", "again")):
        install_plugin_distribution(site, package, entry_point, "mtbench_careless")
    return str(site)


def require_installed_example(package, module, directory, install):
    """The distribution of an example plugin package, installed from this checkout's `directory` (CI installs
    it): a test module's fixture fails, never skips, when it is not."""
    import importlib
    import importlib.metadata
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"the example plugin package {package} is not installed; run: {install}", pytrace=False)
    where = os.path.realpath(importlib.import_module(module).__file__)
    if not where.startswith(os.path.realpath(directory) + os.sep):
        pytest.fail(f"{package} is imported from {where}, not from this checkout's "
                    f"{os.path.relpath(directory, REPOSITORY)}; run: {install}", pytrace=False)
    return distribution


def env_with(plugin_path):
    return {"PYTHONPATH": python_path(plugin_path)}


def keras_gpt_run(cache_dir, steps, clip=None, clip_norm=None, initial_losses=False):
    """mtbench's Keras step on the tiny GPT (a 32-token block, 8 rows) for `steps` batches of the README's bytes,
    without warm-up so that every step moves the weights: {'workload', 'weights', 'settings', 'losses'}, what the
    language model's baselines in benchmarks/ are held to. `clip`, `clip_norm`: `--clip`, `--clip-norm` (None: the
    GPT's defaults); `initial_losses`: also each batch's loss at the initial weights ('initial_losses')."""
    import keras
    import numpy as np

    from benchmarks.workload import OptimizerSettings, build_keras_model, drawn_weights, prepare_workload
    from mtbench import KerasTrainStep
    from mtbench.runner.config import TrainConfig
    config = TrainConfig(model_name="gpt", preset="tiny", data_file=os.path.join(REPOSITORY, "README.md"),
                         block_size=32, batch_size=8, warmup_steps=0, cache_dir=cache_dir, clip=clip,
                         clip_norm=clip_norm)
    workload = prepare_workload(config, steps)
    model = build_keras_model(keras, workload, total_steps=steps)
    weights = drawn_weights(model, config)  # what build_keras_model started the model from
    settings = OptimizerSettings.of_keras_optimizer(model.optimizer)
    step = KerasTrainStep(model)
    losses = [float(step(b.inputs, b.target_output, b.weight)["loss"]) for b in workload.batches]
    run = {"workload": workload, "weights": weights, "settings": settings, "losses": np.array(losses)}
    if initial_losses:  # from a second model that never trains: the steps' losses part from these where they moved
        untrained = build_keras_model(keras, workload, total_steps=steps)
        run["initial_losses"] = np.array([float(untrained.test_on_batch(
            b.inputs, b.target_output, sample_weight=b.weight, return_dict=True)["loss"]) for b in workload.batches])
    return run


def keras_on_jax():
    """keras, imported on JAX as this file sets it up (KERAS_BACKEND=jax unless the environment chose another):
    a test that reads a JAX program in-process fails, rather than skips, when keras runs another backend."""
    import keras
    assert keras.backend.backend() == "jax", (f"keras runs {keras.backend.backend()} in this process; these tests "
                                              f"read JAX programs (unset KERAS_BACKEND)")
    return keras


def traced_matmul_flops(model, inputs):
    """The FLOPs of every matmul in the traced JAX program of `model`'s forward pass over `inputs` (2 x output
    elements x contracted size, inside nested programs too): what the model runs, counted without mtbench's
    formula."""
    import jax
    import numpy as np

    def matmul_flops(jaxpr):
        total = 0
        for equation in jaxpr.eqns:
            if equation.primitive.name == "dot_general":
                (contracted, _), _ = equation.params["dimension_numbers"]
                left, out = equation.invars[0].aval.shape, equation.outvars[0].aval.shape
                total += 2 * int(np.prod(out)) * int(np.prod([left[i] for i in contracted]))
            for param in equation.params.values():
                for inner in param if isinstance(param, (list, tuple)) else [param]:
                    inner = getattr(inner, "jaxpr", inner)
                    if hasattr(inner, "eqns"):
                        total += matmul_flops(inner)
        return total

    keras_on_jax()
    trainable = [v.value for v in model.trainable_variables]
    others = [v.value for v in model.non_trainable_variables]
    forward = lambda weights: model.stateless_call(weights, others, inputs)[0]
    return matmul_flops(jax.make_jaxpr(forward)(trainable).jaxpr)


def tiny_jax_gpt(dtype="float32", total_steps=20):
    """The tiny GPT over 256 bytes and 32 positions, built and compiled in `dtype` as `mtbench train` compiles it
    for `total_steps` steps, keras on JAX; keras's global dtype policy is float32 again afterwards."""
    import dataclasses

    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model
    keras = keras_on_jax()
    keras.config.set_dtype_policy(dtype)
    try:
        model = build_gpt(dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32))
        compile_model(keras, model, TrainConfig(model_name="gpt", preset="tiny", dtype=dtype), total_steps, {})
    finally:
        keras.config.set_dtype_policy("float32")
    return model


def with_torch_extra(registry, name, **declared):
    """`registry` (the plugins) with a torch extra `name` that declares `declared` (`conflicts`, `wraps_step`) and
    does nothing else: what the runner's choices read of an extra."""
    import dataclasses

    from mtbench.plugins.api import Extra
    extra = type(name.title(), (Extra,), {"name": name, "backends": ("torch",), **declared})()
    return dataclasses.replace(registry, extras={**registry.extras, name: extra})
