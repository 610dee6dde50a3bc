"""benchmarks/fused_projections.py end to end on the tiny GPT (--quick): both contestants train with mtbench's best
step, one with the query, key and value in one product and one in three, and the last line is the JSON summary."""

import os
import subprocess
import sys

import pytest

from conftest import CPU_ONLY, REPOSITORY, cli_environment, json_answer

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "fused_projections.py")


@pytest.mark.slow  # the benchmark script's run, for the scripts more than the day's work (README)
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_quick_run_times_one_product_against_three(backend, cache_dir):
    # On the CPU, also on a GPU machine: the count by hand below is of plain attention's products (a GPU's fused
    # attention kernel holds 6 of them a block, and XLA's GPU compiler may merge the three projections into one).
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--backend", backend, "--preset", "tiny",
                           "--cache-dir", cache_dir], capture_output=True, text=True, timeout=600,
                          env=cli_environment(CPU_ONLY))
    summary = json_answer(proc)
    contestants = summary["run"]["contestants"]
    assert [c["arithmetic"]["projections"] for c in contestants.values()] == ["fused", "separate"]
    assert {c["train_step"] for c in contestants.values()} == {"torch-compiled" if backend == "torch" else
                                                                "jax-jit-stateless"}
    assert all(c["steps"] == 4 and c["first_step_s"] > 0 for c in contestants.values())
    # The products each step ran, counted by hand for the tiny GPT's 2 blocks: a block's forward takes one product
    # for the query, key and value, two of attention (scores, and probabilities by values), the output projection
    # and the feed-forward's two, 6; its backward two for each (the input's gradient and the weight's or the other
    # operand's), 12; the output layer 1 forward and 2 backward. Three projections add 2 forward and 4 backward.
    blocks = 2
    assert contestants["fused"]["products_per_step"] == 18 * blocks + 3
    assert contestants["separate"]["products_per_step"] == 18 * blocks + 3 + 6 * blocks
    assert summary["separate_over_fused"] > 0 and "separate / fused: " in proc.stdout


def test_bad_settings_are_refused_with_one_line():
    proc = subprocess.run([sys.executable, SCRIPT, "--backend", "tensorflow"], capture_output=True, text=True)
    assert proc.returncode == 2 and "invalid choice: 'tensorflow'" in proc.stderr.strip().splitlines()[-1]
