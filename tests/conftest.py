"""Shared fixtures. In-process tests run keras on JAX; anything that needs another backend runs the CLI in a
subprocess, as real users do (keras fixes its backend at import)."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

_SESSION_DIR = tempfile.mkdtemp(prefix="mtbench-tests-")
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("KERAS_HOME", os.path.join(_SESSION_DIR, "keras"))

# Small enough for seconds per run, large enough that the tiny model learns something measurable.
TINY_TRAIN = ["--preset", "tiny", "--max-pairs", "4000", "--valid-size", "100", "--test-size", "100",
              "--max-len", "48", "--steps", "60", "--batch-size", "32"]


@pytest.fixture(scope="session")
def cache_dir():
    """One cache for the whole session: the corpus and tokenizer are prepared once."""
    path = os.path.join(_SESSION_DIR, "cache")
    os.makedirs(path, exist_ok=True)
    return path


def run_cli(*args, env=None, cwd=None, timeout=600):
    """Runs `python -m mtbench ARGS` in a fresh process; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.pop("KERAS_BACKEND", None)  # the backend plugin must set it, not the test environment
    full_env.setdefault("MTBENCH_LOAD_PLUGINS", "")
    full_env.update(env or {})
    full_env = {k: v for k, v in full_env.items() if v is not None}  # None in `env` unsets a variable
    return subprocess.run([sys.executable, "-m", "mtbench", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout)


@pytest.fixture(scope="session")
def tiny_runs(cache_dir):
    """One tiny training run per built-in backend, shared by the tests that inspect results."""
    out_dir = os.path.join(_SESSION_DIR, "runs")
    runs = {}
    for backend in ("jax", "torch"):
        out = os.path.join(out_dir, f"{backend}.json")
        proc = run_cli("train", "--backend", backend, *TINY_TRAIN, "--cache-dir", cache_dir, "--out", out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(out) as f:
            runs[backend] = {"result": json.load(f), "stdout": proc.stdout, "stderr": proc.stderr, "path": out}
    return runs


# The tiny configuration with fewer steps: a compare runs both backends, and the parity check still covers
# every step it trains.
COMPARE_STEPS = 30
TINY_COMPARE = [*TINY_TRAIN, "--steps", str(COMPARE_STEPS)]  # click keeps the last --steps


@pytest.fixture(scope="session")
def compared(cache_dir):
    """One `mtbench compare` of jax and torch on the tiny preset, shared by the compare and report tests."""
    out = os.path.join(_SESSION_DIR, "compare", "tiny-compare.json")
    proc = run_cli("compare", "--backends", "jax,torch", *TINY_COMPARE, "--cache-dir", cache_dir, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return {"combined": json.load(f), "stdout": proc.stdout, "stderr": proc.stderr, "path": out}
THIRD_PARTY = textwrap.dedent('''
    from mtbench import Backend, Extra, Reporter, hookimpl
    from mtbench.plugins.api import KerasTrainStep

    class CountingStep(KerasTrainStep):
        def __init__(self, model, state):
            super().__init__(model)
            self.state = state

        def __call__(self, x, y, sample_weight):
            self.state["steps_seen"] += 1
            return super().__call__(x, y, sample_weight)

    class CountSteps(Extra):
        name = "count-steps"
        description = "counts the train steps it wraps"
        backends = ("jax", "torch")

        def make_train_step(self, run, model):
            run.extras_state[self.name] = {"steps_seen": 0}
            return CountingStep(model, run.extras_state[self.name])

        def record(self, run):
            return run.extras_state[self.name]

    class NotInstalledBackend(Backend):
        name = "fakeflow"
        keras_backend = "jax"
        framework_modules = ("fakeflow_is_not_installed",)

    class OneLineReporter(Reporter):
        name = "oneline"
        description = "one line per run"

        def report(self, result, console):
            print(f"ONELINE backend={result['backend']} steps={result['timing']['steps']} "
                  f"bleu={result['metrics']['bleu']:.2f}")

    @hookimpl
    def mtbench_register_backends(register):
        register(NotInstalledBackend())

    @hookimpl
    def mtbench_register_reporters(register):
        register(OneLineReporter())

    @hookimpl
    def mtbench_register_extras(register):
        register(CountSteps())
''')

# Loads, but its callbacks hook fails during the run.
FLAKY = textwrap.dedent('''
    from mtbench import hookimpl

    @hookimpl
    def mtbench_keras_callbacks(config):
        raise RuntimeError("flaky callbacks on purpose")
''')


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory):
    """A directory holding three installed distributions: a working plugin, one that fails to import and one
    whose hook fails during a run."""
    site = tmp_path_factory.mktemp("site")
    (site / "mtbench_thirdparty.py").write_text(THIRD_PARTY)
    (site / "mtbench_broken.py").write_text("raise ImportError('this plugin is broken on purpose')\n")
    (site / "mtbench_flaky.py").write_text(FLAKY)
    for dist, version in (("mtbench_thirdparty", "0.3.0"), ("mtbench_broken", "0.0.1"), ("mtbench_flaky", "0.1.0")):
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[mtbench]\n{dist.split('_', 1)[1]} = {dist}\n")
    return str(site)


def env_with(plugin_path):
    return {"PYTHONPATH": plugin_path + os.pathsep + os.environ.get("PYTHONPATH", "")}
