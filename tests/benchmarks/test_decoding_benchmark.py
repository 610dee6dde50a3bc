"""benchmarks/decoding.py on the tiny Transformer: the cached, compiled loop decodes the tokens that rerunning the
whole model per token does, on both backends; a buffer longer than the model's positions is refused."""

import os
import subprocess
import sys

import pytest

from conftest import REPOSITORY, cli_environment, json_answer

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "decoding.py")


def decoding(*arguments):
    return subprocess.run([sys.executable, SCRIPT, "--preset", "tiny", *arguments], capture_output=True, text=True,
                          timeout=600, env=cli_environment())


@pytest.mark.slow  # the benchmark script's run, for the scripts more than the day's work (README)
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_the_cached_loop_decodes_the_tokens_of_the_full_rerun(backend):
    proc = decoding("--backend", backend, "--sentences", "8", "--repeats", "1", "--beam", "2")
    summary = json_answer(proc)
    assert summary["same_tokens"] is True and summary["beam_s"] > 0
    # float32 matmuls as float32 on both, read back from the framework (JAX's GPU default is TF32)
    setting, value = {"jax": ("jax.config.jax_default_matmul_precision", "float32"),
                      "torch": ("torch.get_float32_matmul_precision()", "highest")}[backend]
    precision = summary["matmul_precision"]
    assert precision["requested"] == "highest" and precision["reported"][setting] == value
    assert "8 sentences x 31 tokens" in proc.stdout  # tiny's 32 positions, the first one given


def test_a_buffer_past_the_models_positions_is_refused():
    proc = decoding("--length", "48")
    assert proc.returncode == 2 and "--length 48: between 2 and tiny's --max-len 32" in proc.stderr
    assert "Traceback" not in proc.stderr
