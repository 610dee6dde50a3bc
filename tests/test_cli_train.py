"""`mtbench train` on both backends, end to end, on a slice of the built-in corpus."""

import numpy as np
import pytest
from sacrebleu.metrics import BLEU, CHRF

from conftest import cpu_machine_only, device_kind, run_cli
from optimizer_exercise import float32_matmul_arithmetic, matmul_tolerance
from mtbench.runner.results.schema import schema_errors

BACKENDS = ("jax", "torch")


@pytest.mark.parametrize("backend", BACKENDS)
def test_result_matches_schema(tiny_runs, backend):
    result = tiny_runs[backend]["result"]
    assert schema_errors(result) == []
    assert result["backend"] == backend
    assert result["status"] == "completed"
    assert result["config"]["preset"] == "tiny"
    assert result["env"]["device"]["kind"] == device_kind(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_loss_falls(tiny_runs, backend):
    losses = [h["loss"] for h in tiny_runs[backend]["result"]["history"]]
    assert len(losses) == 60
    assert np.mean(losses[-10:]) < np.mean(losses[:5]) - 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_reported_scores_are_sacrebleus_scores_of_the_saved_files(tiny_runs, backend):
    result = tiny_runs[backend]["result"]
    with open(result["hypotheses_file"]) as f:
        hypotheses = f.read().splitlines()
    with open(result["references_file"]) as f:
        references = f.read().splitlines()
    assert len(hypotheses) == len(references) == result["metrics"]["test_sentences_scored"] > 0
    bleu, chrf = BLEU(), CHRF()
    assert result["metrics"]["bleu"] == pytest.approx(bleu.corpus_score(hypotheses, [references]).score)
    assert result["metrics"]["chrf"] == pytest.approx(chrf.corpus_score(hypotheses, [references]).score)
    # 60 steps teach the tiny model little: on a CPU it repeats one piece, on a GPU it may end every sentence at
    # once. Empty output is allowed, but never silently.
    silent = not any(h.strip() for h in hypotheses)
    assert ("quality_warning" in result["metrics"]) == silent
    assert (result["metrics"]["chrf"] > 0) != silent
    assert result["metrics"]["bleu_signature"] == str(bleu.get_signature())
    assert result["metrics"]["bleu_signature"].startswith("nrefs:1|")


@pytest.mark.parametrize("backend", BACKENDS)
def test_timing_separates_compilation_from_steady_steps(tiny_runs, backend):
    timing = tiny_runs[backend]["result"]["timing"]
    history = tiny_runs[backend]["result"]["history"]
    distinct_shapes = {tuple(h["shape"]) for h in history}
    assert timing["shapes_compiled"] == len(distinct_shapes)
    # The host-sync probe's step, counted under the backend's counter, is timed alone and is no steady step.
    probed = [h for h in history if h.get("host_sync_probe")]
    assert len(probed) == 1 and not probed[0]["first_of_shape"] and probed[0]["window_steps"] == 1
    # ... and kept out of the training time: its window is inside the time set aside for it.
    assert 0 < probed[0]["seconds"] <= timing["host_sync_probe_s"]
    assert timing["steady_steps"] == len(history) - len(distinct_shapes) - 1
    assert tiny_runs[backend]["result"]["host_syncs_per_step"] == 0
    assert timing["step_s_median"] <= timing["step_s_p90"]
    assert timing["train_s"] <= timing["total_s"]


def test_backends_start_from_the_same_weights_and_batches(tiny_runs):
    """Numpy-drawn initial weights and a numpy batch order: in float32 the two backends' loss curves must
    coincide step for step, apart from float rounding."""
    jax_losses = np.array([h["loss"] for h in tiny_runs["jax"]["result"]["history"]])
    torch_losses = np.array([h["loss"] for h in tiny_runs["torch"]["result"]["history"]])
    assert [h["shape"] for h in tiny_runs["jax"]["result"]["history"]] == \
        [h["shape"] for h in tiny_runs["torch"]["result"]["history"]]
    assert jax_losses[0] == pytest.approx(torch_losses[0], rel=1e-5)
    # Over 60 steps on a CPU they part by 3e-6: an update that differs (decay, schedule, epsilon) shows at 1e-4.
    rtol = matmul_tolerance(1e-4, float32_matmul_arithmetic("jax"), float32_matmul_arithmetic("torch"))
    np.testing.assert_allclose(torch_losses, jax_losses, rtol=rtol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_phase_of_the_evaluation_after_training_is_announced_as_it_starts(tiny_runs, backend):
    """Off a terminal (a pipe here, a log file under SLURM) a line names each phase of the evaluation after the
    last step's line: on a CPU a large model's evaluation takes minutes that would otherwise pass without one."""
    lines = tiny_runs[backend]["stdout"].splitlines()
    announced = [i for i, line in enumerate(lines) if line.startswith("after training: ")]
    assert [lines[i] for i in announced] == ["after training: evaluate …", "after training: translate …"]
    last_step = max(i for i, line in enumerate(lines) if line.startswith("step "))
    summary = next(i for i, line in enumerate(lines) if line.startswith(f"{backend} completed"))
    assert last_step < announced[0] and announced[-1] < summary
    assert set(tiny_runs[backend]["result"]["timing"]["phases_s"]) >= {"evaluate", "translate"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_run_ends_with_a_short_summary_of_the_figures_read_first(tiny_runs, backend):
    """The default reporter: what ran, speed, quality, memory and warnings in a few lines, the full table left to
    `mtbench report --report table`."""
    stdout = tiny_runs[backend]["stdout"]
    summary = stdout[stdout.index(f"{backend} completed"):stdout.index("result:")].splitlines()
    assert len(summary) <= 10
    for label in ("median", "tokens/s", "MFU", "BLEU / chrF", "loss train / val / test", "warnings",
                  "--report table"):
        assert label in "\n".join(summary)
    assert "steady step median" not in stdout  # the table's, not printed by default


@cpu_machine_only
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cpu_runs_device_memory_is_null_and_says_why(tiny_runs, backend):
    result = tiny_runs[backend]["result"]
    assert result["memory"]["peak_device_bytes"] is None and result["memory"]["training"]["per_device"] is None
    assert result["memory"]["training"]["reason"] == "the CPU's memory is the host's: peak_host_bytes"
    table = run_cli("report", tiny_runs[backend]["path"], "--report", "table")
    assert "n/a (the CPU's memory is the host's: peak_host_bytes)" in table.stdout
