"""benchmarks/inductor_cost.py: mtbench's compiled torch step for the GPT does the reference's matrix products,
attention kernels and loss kernels, counted in the programs inductor generates for both (nothing timed)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import CPU_ONLY, REPOSITORY, cli_environment

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "inductor_cost.py")


@pytest.mark.slow  # inductor compiles two GPT steps: about 40 s on 2 cores
def test_mtbench_s_compiled_step_calls_the_references_products_and_kernels():
    proc = subprocess.run([sys.executable, SCRIPT, "--preset", "tiny", "--rows", "4", "--block-size", "32"],
                          capture_output=True, text=True, timeout=600,
                          env=cli_environment({"TORCHINDUCTOR_COMPILE_THREADS": "1", **CPU_ONLY}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    ours, reference = figures["mtbench"], figures["reference"]
    blocks = 2  # the tiny GPT's
    # Each weight matrix three times (forward, the input's gradient, the weight's gradient): a block's query, key
    # and value as one matrix, its output and two feed-forward matrices; the tied output layer's table.
    assert ours["gemms"] == reference["gemms"] == 3 * (4 * blocks + 1)
    # The fused attention kernel forward and backward in each block, nothing unfused.
    assert ours["attention kernels"] == reference["attention kernels"] == 2 * blocks
    # Inductor's own kernels, as many: the query-key-value product's bias added in the GEMM (addmm) as the
    # reference's is; after a 3-D product inductor added it in a kernel of its own, one more a block. (Other
    # biases it may add in the GEMM or in the pointwise kernel after it, for the reference as for mtbench.)
    assert ours["generated kernel launches"] == reference["generated kernel launches"] > 0
    # The loss's gradient over the logits in one kernel, the label's part (a scatter in aten's decomposition) fused
    # with the softmax's, as mtbench's JAX step computes it on a GPU (tests/plugins/backends/test_jax_step_program.py).
    assert ours["kernels of the loss's gradient"] == reference["kernels of the loss's gradient"] == 1
    assert ours["scatters"] == reference["scatters"] == 0
