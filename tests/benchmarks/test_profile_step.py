"""benchmarks/profile_step.py on the tiny preset: the multiplications XLA really runs in the jitted step, counted
from the optimised HLO, must add up to the analytic FLOPs mtbench divides by for MFU; torch's profiler must see
every multiplication outside attention, and, as mtbench holds torch to SDPA's math kernel (the unfused class JAX
runs), some of attention's products too, as plain batched matmuls, but never more than the analytic count."""

import os
import subprocess
import sys

import pytest

from conftest import CPU_ONLY, REPOSITORY, json_answer

# Each test profiles a training run in a fresh process (7-12 s): the full suite's, not the day-to-day tier's.
pytestmark = pytest.mark.slow


def profile(backend, cache_dir):
    # On the CPU, also on a GPU machine: the script reads a CPU's programs and (torch) its operators' host time.
    env = {**{k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")}, **CPU_ONLY}
    proc = subprocess.run([sys.executable, "benchmarks/profile_step.py", "--backend", backend, "--preset", "tiny",
                           "--batch-size", "32", "--length", "16", "--steps", "2", "--cache-dir", cache_dir],
                          capture_output=True, text=True, env=env, cwd=REPOSITORY, timeout=600)
    answer = json_answer(proc)
    assert "matrix multiplications" in proc.stdout
    return answer

def test_jax_profile_counts_the_analytic_flops_in_the_compiled_step(cache_dir):
    summary = profile("jax", cache_dir)
    assert summary["profiled_matmul_flops"] == summary["analytic_flops"]
    assert 0 < summary["matmul_share"] < 1 and sum(summary["categories_ms"].values()) > 0

def test_torch_profile_sees_every_multiplication_and_no_more(cache_dir):
    from mtbench.keras_models.presets import PRESETS
    summary = profile("torch", cache_dir)
    tiny = PRESETS["tiny"]
    rows, length = summary["batch_shape"]
    # Attention's score and value products: 2 matmuls x 2 FLOPs x rows x heads x L x L x head_dim, forward
    # and twice backward, in every encoder self-, decoder self- and cross-attention.
    attention = 3 * 2 * 2 * rows * length * length * tiny.d_model * (tiny.encoder_layers + 2 * tiny.decoder_layers)
    assert summary["analytic_flops"] - attention < summary["profiled_matmul_flops"] <= summary["analytic_flops"]
