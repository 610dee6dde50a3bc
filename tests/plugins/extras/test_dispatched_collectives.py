"""torch's profiler, as the torch extras count a step's collectives with it: the step's own output kept, Kineto's
start and stop lines, which every process of a run wrote, left out."""

import subprocess
import sys

SCRIPT = r"""
import os, sys
import torch
from mtbench.plugins.extras.dispatched_collectives import profiled_collectives

def step():
    print("python's own line", file=sys.stderr, flush=True)
    os.write(2, b"a C-level line\n")
    return torch.ones(3) + 1

result, ran = profiled_collectives(step)
print("after", file=sys.stderr)
print(result.tolist(), dict(ran))
"""


def test_the_profiled_step_keeps_its_own_output_and_drops_kinetos_lines():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "[2.0, 2.0, 2.0] {}\n"
    assert proc.stderr == "python's own line\na C-level line\nafter\n"
    # Without it, Kineto writes its lines (the test would pass unseen if it stopped writing them).
    plain = subprocess.run([sys.executable, "-c", "import torch\nfrom torch.profiler import profile\n"
                            "with profile():\n    torch.ones(1) + 1"], capture_output=True, text=True, timeout=120)
    assert "profiler_start" in plain.stderr
