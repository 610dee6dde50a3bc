"""Persistent compilation caches under --cache-dir: a run records whether it started cold or warm, a second run
with the same cache (of another length and learning rate on JAX) starts warm and is served from it,
--no-compile-cache keeps nothing; and the attention each run used is in its result. Timings are never asserted: they are measured by hand (docs/commands.md)."""

import json
import os

import pytest

from conftest import ONE_BUCKET, TINY_TRAIN, cache_of_its_own, run_cli
from mtbench.plugins.backends import jax_backend, torch_backend
from mtbench.runner.config import TrainConfig

FEW_STEPS = [*TINY_TRAIN, *ONE_BUCKET, "--steps", "4"]
ARITHMETIC_KEYS = ("matmul_inputs", "accumulation", "scores", "softmax")
BFLOAT16_ARITHMETIC = {"matmul_inputs": "bfloat16", "accumulation": "float32", "scores": "bfloat16",
                       "softmax": "float32", "projections": "fused", "probability_dropout": 0.0}


def own_compile_cache(session_cache, path):
    """A cache directory whose compiled programs are its own, its corpora and tokenizers the session's (linked),
    so that a first run there is cold without preparing the corpus again."""
    return cache_of_its_own(session_cache, path, [name for name in os.listdir(session_cache) if name != "compile"])


def train(cache, out, *args):
    proc = run_cli("train", *FEW_STEPS, "--cache-dir", cache, "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out) as f:
        return json.load(f), proc.stderr


@pytest.fixture(scope="module")
def jax_cache(cache_dir, tmp_path_factory):
    return own_compile_cache(cache_dir, str(tmp_path_factory.mktemp("jax-compile") / "cache"))


@pytest.fixture(scope="module")
def jax_runs(jax_cache, tmp_path_factory):
    """Two bfloat16 runs, one after the other, on one cache, the second longer, with another learning rate and
    warm-up: (result, stderr) of each. Unfused on every device (a GPU's default would fuse). The second trains only
    (--measure-only): the cache's figures are counted as training ends, and the first run's evaluation and decoding
    already show the programs they add and the attention they log."""
    out = tmp_path_factory.mktemp("jax-runs")
    return [train(jax_cache, out / f"{i}.json", "--backend", "jax", "--dtype", "mixed_bfloat16", "--attention",
                  "unfused", *schedule)
            for i, schedule in ((1, []), (2, ["--steps", "6", "--learning-rate", "2e-3", "--warmup-steps", "2",
                                              "--measure-only"]))]


@pytest.mark.slow
def test_a_jax_run_starts_cold_and_the_next_one_warm(jax_runs, jax_cache):
    (first, _), (second, _) = jax_runs
    cold, warm = first["timing"]["compile_cache"], second["timing"]["compile_cache"]
    assert cold["dir"] == warm["dir"] and cold["dir"].startswith(os.path.join(jax_cache, "compile", "jax-"))
    assert (cold["state"], cold["entries_before"], cold["hits"]) == ("cold", 0, 0)
    assert cold["entries_after"] > 0 and cold["misses"] > 0
    # The first run's evaluation and translation add programs after training, when `entries_after` was counted.
    assert warm["state"] == "warm" and warm["entries_before"] >= cold["entries_after"]
    # The schedule's numbers are the train step's arguments: a run of another length and learning rate compiles
    # nothing the first did not.
    assert warm["hits"] > 0 and warm["misses"] == 0, warm
    assert (second["config"]["steps"], second["config"]["learning_rate"]) == (6, 2e-3)


@pytest.mark.slow
def test_a_jax_run_records_plain_attention_and_logs_no_fused_fallback(jax_runs):
    for result, stderr in jax_runs:
        assert result["model"]["attention"] == {"causal": "xla (unfused)", "masked": "xla (unfused)",
                                                "decoding": "xla (unfused)", "arithmetic": BFLOAT16_ARITHMETIC,
                                                "chosen": {"asked": "unfused", "fused": False}}
        assert "Failed to apply" not in stderr


@pytest.mark.slow
def test_no_compile_cache_keeps_nothing(jax_runs, jax_cache, tmp_path):
    entries = jax_runs[1][0]["timing"]["compile_cache"]["entries_after"]
    # Another batch size: train steps the cache does not hold yet, so a cache still written to would grow (the
    # evaluation's programs would add nothing to show it).
    result, _ = train(jax_cache, tmp_path / "off.json", "--backend", "jax", "--dtype", "mixed_bfloat16",
                      "--batch-size", "16", "--no-compile-cache", "--measure-only")
    off = result["timing"]["compile_cache"]
    assert (off["state"], off["dir"], off["reason"], off["hits"]) == ("off", None, "--no-compile-cache", None)
    assert result["config"]["compile_cache"] is False
    directory = jax_runs[1][0]["timing"]["compile_cache"]["dir"]
    assert jax_backend.JaxBackend().compile_cache_entries(directory) == entries


def test_torch_eager_compiles_nothing_to_cache(tiny_runs):
    result = tiny_runs["torch"]["result"]  # the session's eager torch run, with the session's cache
    cache = result["timing"]["compile_cache"]
    assert cache["state"] == "off" and cache["reason"].startswith("eager")
    attention = dict(result["model"]["attention"])
    chosen = attention.pop("chosen")  # a float32 run attends unfused, on a CPU or a GPU: --attention auto says why
    assert chosen["asked"] == "auto" and not chosen["fused"] and "float16/bfloat16" in chosen["why_unfused"]
    assert attention == {"causal": "aten (unfused)", "masked": "aten (unfused)",
                         "decoding": "aten (unfused)", "sdpa_kernels_enabled": ["math"],
                         "arithmetic": {**dict.fromkeys(ARITHMETIC_KEYS, "float32"), "projections": "fused",
                                        "probability_dropout": 0.0}}


def test_jax_cache_directory_names_version_and_device():
    path = jax_backend.compile_cache_dir("/c", "0.10.2", "NVIDIA H100 80GB HBM3")
    assert path == os.path.join("/c", "compile", "jax-0.10.2-NVIDIA-H100-80GB-HBM3")


def test_jax_counts_programs_not_their_access_times(tmp_path):
    for name in ("jit_step-1f2e-cache", "jit_step-1f2e-atime", "jit_add-9a-cache"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "xla_gpu_per_fusion_autotune_cache_dir").mkdir()
    backend = jax_backend.JaxBackend()
    assert backend.compile_cache_entries(str(tmp_path)) == 2
    assert backend.compile_cache_entries(str(tmp_path / "absent")) == 0
    assert backend.compile_cache_state(str(tmp_path))["state"] == "warm"
    assert backend.compile_cache_state(str(tmp_path / "absent"))["state"] == "cold"


def test_torch_points_inductor_at_the_cache_or_at_a_scratch_directory(tmp_path):
    backend = torch_backend.TorchBackend()
    kept = backend.prepare_process(TrainConfig(cache_dir=str(tmp_path)))
    assert kept == {"TORCHINDUCTOR_CACHE_DIR": torch_backend.compile_cache_dir(str(tmp_path)),
                    "TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
    scratch = backend.prepare_process(TrainConfig(cache_dir=str(tmp_path), compile_cache=False))
    assert not scratch["TORCHINDUCTOR_CACHE_DIR"].startswith(str(tmp_path))
    assert os.path.isdir(scratch["TORCHINDUCTOR_CACHE_DIR"])
    assert (scratch["TORCHINDUCTOR_FX_GRAPH_CACHE"], scratch["TORCHINDUCTOR_AUTOGRAD_CACHE"]) == ("0", "0")


@pytest.mark.slow
def test_a_cache_directory_that_cannot_be_made_is_off_and_says_why(cache_dir, tmp_path):
    # `compile` a file under --cache-dir: JAX's cache could write nothing and every run read "cold", silently.
    cache = own_compile_cache(cache_dir, str(tmp_path / "cache"))
    with open(os.path.join(cache, "compile"), "w") as f:
        f.write("not a directory")
    proc = run_cli("train", *FEW_STEPS, "--measure-only", "--cache-dir", cache, "--out", str(tmp_path / "jax.json"),
                   "--backend", "jax")  # its programs all cold: training's alone, not evaluation's and decoding's
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "jax.json") as f:
        off = json.load(f)["timing"]["compile_cache"]
    assert (off["state"], off["dir"], off["hits"]) == ("off", None, None)
    assert off["unusable_dir"].startswith(os.path.join(cache, "compile", "jax-"))
    assert off["reason"] == f"{off['unusable_dir']} cannot be made (Not a directory)"
    assert f"compile cache off: {off['reason']}" in proc.stdout + proc.stderr
    # torch's inductor is pointed at a scratch directory of the process, its caches off, and the run says why.
    config = TrainConfig(backend="torch", extras=("torch-compile",), cache_dir=cache)
    torch = torch_backend.TorchBackend()
    environment = torch.prepare_process(config)
    assert not environment["TORCHINDUCTOR_CACHE_DIR"].startswith(cache)
    assert (environment["TORCHINDUCTOR_FX_GRAPH_CACHE"], environment["TORCHINDUCTOR_AUTOGRAD_CACHE"]) == ("0", "0")
    state = torch.open_compile_cache(config)
    assert state["state"] == "off" and state["reason"].endswith("cannot be made (Not a directory)")
    with open(os.path.join(cache, "compile")) as f:
        assert f.read() == "not a directory"
