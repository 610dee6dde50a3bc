"""The compiled torch step's layer-norm row says what inductor generates, not torch's kernel: read here from the
code inductor writes for a float32 layer norm on this CPU (`run_and_get_code`), a row of the tiny presets' width
and one past inductor's two-pass threshold, in a torch process of its own."""

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import cli_environment

PROBE = textwrap.dedent("""
    import json, os
    os.environ["KERAS_BACKEND"] = "torch"
    import torch
    import torch.nn.functional as F
    from torch._inductor.utils import run_and_get_code
    from mtbench.plugins.backends.torch_compiled_step import inductor_norm_form
    report = {}
    for width in (64, 2048):
        x = torch.randn(4, width, requires_grad=True)
        weight = torch.ones(width, requires_grad=True)
        norm = torch.compile(lambda x, weight: F.layer_norm(x, (width,), weight).square().sum(), dynamic=False)
        _, code = run_and_get_code(lambda: norm(x, weight).backward())
        report[width] = {"welford_in_code": "welford" in "\\n".join(code).lower(),
                         "form": inductor_norm_form(width, "cpu")}
        torch._dynamo.reset()
    print(json.dumps(report))
""")


@pytest.mark.slow  # two compilations by inductor: about 20 s on 2 cores
def test_the_compiled_steps_norm_row_names_what_inductor_generated():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=cli_environment(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # Short rows: no Welford reduction in the generated code, and the row says two passes.
    assert report["64"]["welford_in_code"] is False and report["64"]["form"].startswith("two passes in float32")
    # Long rows: Welford's, and the row says so, as for torch's own kernel.
    assert report["2048"] == {"welford_in_code": True, "form": "Welford's one pass, in float32"}
