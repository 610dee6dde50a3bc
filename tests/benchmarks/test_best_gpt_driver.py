"""benchmarks/best_gpt.py, the GPU matrix's reference rows: from the weights file `mtbench init-weights` writes, on
the batches `mtbench train --model gpt` trains on, with the optimizer recipe `mtbench train` builds, each
best-by-hand reference's losses are mtbench's (float32, the CPU), and its result carries the figures the matrix
reads."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPOSITORY, cli_environment, device_kind, json_answer, run_cli
from mtbench.runner.results.verdicts import steady_windows
from optimizer_exercise import float32_matmul_arithmetic, matmul_tolerance

pytestmark = pytest.mark.slow  # three processes, two frameworks: about 40 s on 2 cores

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "best_gpt.py")
STEPS = 12
PROFILED = 2
# float32 for mtbench and the references alike, on a GPU too (where `--dtype auto` trains 16-bit).
RUN = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "4", "--steps", str(STEPS),
       "--data", os.path.join(REPOSITORY, "README.md"), "--dtype", "float32"]


@pytest.fixture(scope="module")
def weights_and_mtbench_run(tmp_path_factory, cache_dir):
    """The weights file `mtbench init-weights` writes and `mtbench train`'s result from it on JAX: the losses every
    reference is held to, and the run `--step mtbench` repeats in the reference's loop (its timing window changes
    when losses are read, not what they are)."""
    folder = tmp_path_factory.mktemp("best-gpt")
    weights = str(folder / "weights.npz")
    made = run_cli("init-weights", "--backend", "jax", *RUN, "--cache-dir", cache_dir, "--out", weights)
    assert made.returncode == 0, made.stderr
    out = folder / "mtbench.json"
    trained = run_cli("train", "--backend", "jax", *RUN, "--initial-weights", weights, "--measure-only",
                      "--timing-window", "5", "--cache-dir", cache_dir, "--out", str(out))
    assert trained.returncode == 0, trained.stderr[-3000:]
    return weights, json.loads(out.read_text())


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_reference_trains_mtbenchs_run_loss_for_loss_and_reports_the_matrix_figures(
        backend, weights_and_mtbench_run, tmp_path, cache_dir):
    weights, train = weights_and_mtbench_run
    mtbench_losses = np.array([entry["loss"] for entry in train["history"]])
    out = tmp_path / "reference.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--backend", backend, *RUN, "--profile", str(PROFILED),
                           "--initial-weights", weights, "--cache-dir", cache_dir, "--out", str(out)],
                          capture_output=True, text=True, env=cli_environment(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    losses = np.array([entry["loss"] for entry in result["history"]])
    assert len(losses) == STEPS  # the profiled steps train too
    rtol = matmul_tolerance(1e-4, float32_matmul_arithmetic("jax"), float32_matmul_arithmetic(backend))
    np.testing.assert_allclose(losses, mtbench_losses, rtol=rtol)
    # --profile: the steps after the 3 warm-up ones, traced as mtbench train traces its own, and left untimed
    profile = result["profile"]
    assert profile["steps"] == [4, 5] == [entry["step"] for entry in result["history"] if entry.get("profiled")]
    assert all(os.path.isfile(os.path.join(profile["directory"], name)) for name in profile["files"])
    timed = STEPS - 3 - PROFILED
    timing = result["timing"]
    assert timing["steady_steps"] == timed and timing["step_s_median"] > 0 and timing["tokens_per_s"] > 0
    # its steady window, as a verdict's interval reads mtbench's: the 7 steps after those, 4 x 32 tokens each
    [(seconds, steps, tokens)] = steady_windows(result["history"])
    assert (steps, tokens) == (timed, timed * 4 * 32) and seconds == pytest.approx(timing["steady_s"])
    # tokens/s and MFU over the steady steps' time, as mtbench's (a slow window counts), not from the median step
    utilization = result["utilization"]
    assert timing["tokens_per_s"] == pytest.approx(timed * 4 * 32 / seconds)
    assert utilization["mfu"] == pytest.approx(
        utilization["step_flops"] * timed / seconds / utilization["peak_flops_per_s"])
    # its programs looked up in mtbench's compile cache, as mtbench's rows' are (a repeat's compile time alike);
    # the torch reference compiles on CUDA only
    lookups = timing["compile_cache"]
    compiles = backend == "jax" or device_kind("torch") == "gpu"
    assert (lookups["hits"] + lookups["misses"] > 0) == compiles
    # the matrix splits its wall time: everything before the loop is "build", the loop is "train"
    assert timing["total_s"] >= timing["phases_s"]["build"] + timing["phases_s"]["train"] > timing["steady_s"] > 0
    assert timing["phases_s"]["train"] == timing["wall_s"]
    assert result["train_step"].startswith("best-by-hand") and result["model"]["vocab_size"] == 256
    assert result["utilization"]["step_flops"] > 0 and result["env"]["device"]["kind"] == device_kind(backend)
    # The attention that ran, recorded as mtbench's runs record theirs: in float32 XLA's on JAX, and on torch the
    # kernel SDPA's dispatcher takes (a CPU's flash kernel; on a GPU the memory-efficient one, as 32-bit inputs go).
    expected = {"jax": "xla (unfused)",
                "torch": "flash (fused)" if device_kind("torch") == "cpu" else "memory-efficient (fused)"}[backend]
    assert result["model"]["attention"] == {"causal": expected}


def test_mtbenchs_own_step_in_the_references_loop_trains_mtbench_trains_losses(
        weights_and_mtbench_run, tmp_path, cache_dir):
    """`--step mtbench` (the matrix's row 14, JAX's) times mtbench's step, not the reference: its losses are `mtbench
    train`'s to rounding, where the reference's are only within the matmul tolerance."""
    weights, train = weights_and_mtbench_run  # `mtbench train --backend jax` from these weights
    out = tmp_path / "mtbench-step.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--backend", "jax", *RUN, "--step", "mtbench",
                           "--initial-weights", weights, "--cache-dir", cache_dir, "--out", str(out)],
                          capture_output=True, text=True, env=cli_environment(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    np.testing.assert_allclose([entry["loss"] for entry in result["history"]],
                               [entry["loss"] for entry in train["history"]], rtol=1e-6)
    assert result["train_step"] == f"mtbench's {train['train_step']} step in best_gpt.py's loop"
    assert result["kind"] == "mtbench step in the reference's loop" and result["timing"]["steady_steps"] == STEPS - 3


def test_the_torch_reference_scores_nanogpts_cpu_shape_on_characters_as_mtbench_does(tmp_path, cache_dir):
    """benchmarks/nanogpt_cpu.py's third row: the reference at nanoGPT's CPU shape (4 layers, 4 heads, 128 wide,
    block 64, batch 12, no dropout) on characters, from mtbench's weights, reaches mtbench's validation loss on
    the same validation blocks."""
    from benchmarks.nanogpt_cpu import NANOGPT_CPU, REFERENCE_SIZE
    data = os.path.join(REPOSITORY, "README.md")
    shape = [*NANOGPT_CPU, "--data", data, "--steps", "20", "--valid-size", "20", "--cache-dir", cache_dir]
    weights = str(tmp_path / "weights.npz")
    assert run_cli("init-weights", "--backend", "torch", *shape, "--out", weights).returncode == 0
    trained = run_cli("train", "--backend", "torch", *shape, "--initial-weights", weights,
                      "--out", str(tmp_path / "mtbench.json"))
    assert trained.returncode == 0, trained.stderr[-3000:]
    mtbench = json.loads((tmp_path / "mtbench.json").read_text())
    out = tmp_path / "reference.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--backend", "torch", "--preset", "char", "--dtype", "float32",
                           *REFERENCE_SIZE, "--data", data, "--steps", "20", "--valid-size", "20", "--validate",
                           "--initial-weights", weights, "--cache-dir", cache_dir, "--out", str(out)],
                          capture_output=True, text=True, env=cli_environment(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = json.loads(out.read_text())
    assert reference["model"]["vocab_size"] == mtbench["model"]["vocab_size"] < 256  # characters, not bytes
    assert reference["metrics"]["val_loss"] == pytest.approx(mtbench["metrics"]["val_loss"], rel=1e-4)


def test_overhead_sets_mtbenchs_best_step_beside_the_references(cache_dir):
    """`benchmarks/overhead.py --baseline best`: mtbench's best way on each backend (torch compiled; fused attention
    where the device has it) in turns with the reference, its ratio in the JSON under the backend's name."""
    proc = subprocess.run([sys.executable, os.path.join(REPOSITORY, "benchmarks", "overhead.py"), "--model", "gpt",
                           "--preset", "tiny", "--baseline", "best", "--quick", "--no-keras", "--dtypes", "float32",
                           "--cache-dir", cache_dir],
                          capture_output=True, text=True, env=cli_environment(), timeout=900)
    summary = json_answer(proc)
    assert summary["jax_ratio_best_float32"] > 0 and summary["torch_ratio_best_float32"] > 0
    steps = {run["backend"]: run["train_steps"]["mtbench"] for run in summary["runs"]}
    assert steps == {"jax": "jax-jit-stateless", "torch": "torch-compiled"}
    # The references compile too, on every device (the torch reference alone compiles only on CUDA by default): the
    # torch reference's loss into one graph, as dynamo counted it at the first step.
    references = {run["backend"]: run["train_steps"]["best"] for run in summary["runs"]}
    assert ", torch.compile (1 graph, 0 graph breaks)" in references["torch"], references
    assert "one donating jit" in references["jax"]
    assert all(run["baseline"] == "best" and "best" in run["contestants"] for run in summary["runs"])


@pytest.mark.parametrize("options", [["--seed", "3"], ["--clip", "none"], ["--init", "glorot"]])
def test_an_option_the_reference_cannot_apply_is_refused_rather_than_dropped(options, capsys):
    """A GPU matrix gives its train options to every row: the reference rows refuse one they cannot apply (another
    seed's batches, another clipping), and take no abbreviation (`--init` is not `--initial-weights`)."""
    from benchmarks import best_gpt
    with pytest.raises(SystemExit) as exit:
        best_gpt.parse_args(["--backend", "torch", *options])
    assert exit.value.code == 2
    assert f"error: {' '.join(options)}: not an option of the reference" in capsys.readouterr().err


@pytest.mark.parametrize("preset, tokenizer", [("char", "char"), ("gpt2-small", None)])
def test_the_reference_reads_the_tokens_mtbench_train_reads_for_the_preset(preset, tokenizer):
    """A GPU matrix names no tokenizer: `gpt-char`'s reference rows read bytes (the script's default) where its
    mtbench rows read characters (the `char` preset's), other tokens than the batches they were held to."""
    from benchmarks import best_gpt
    from mtbench.plugins import manager
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import resolve_model
    config = best_gpt.train_config(best_gpt.parse_args(["--backend", "torch", "--preset", preset]))
    trained = TrainConfig(backend="torch", model_name="gpt", preset=preset)  # `mtbench train`'s, resolved as it is
    resolve_model(trained, manager.registry())
    assert config.tokenizer == trained.tokenizer == tokenizer
    assert best_gpt.train_config(best_gpt.parse_args(["--backend", "torch", "--preset", "char", "--tokenizer",
                                                      "byte"])).tokenizer == "byte"
