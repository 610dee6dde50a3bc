"""The compiled torch step's layer-norm row says what inductor generates, not torch's kernel: read here from the
code inductor writes for a float32 layer norm (`run_and_get_code`) on this CPU, a row of the tiny presets' width and
one past inductor's two-pass threshold, and on a CUDA GPU where there is one (GPT-2 small's 768 and 2,048), in a
torch process of its own."""

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
    widths = {"cpu": (64, 2048), **({"cuda": (768, 2048)} if torch.cuda.is_available() else {})}
    for device, device_widths in widths.items():
        for width in device_widths:
            x = torch.randn(4, width, requires_grad=True, device=device)
            weight = torch.ones(width, requires_grad=True, device=device)
            norm = torch.compile(lambda x, weight: F.layer_norm(x, (width,), weight).square().sum(), dynamic=False)
            _, code = run_and_get_code(lambda: norm(x, weight).backward())
            report[f"{device} {width}"] = {"welford_in_code": "welford" in "\\n".join(code).lower(),
                                           "form": inductor_norm_form(width, device)}
            torch._dynamo.reset()
    print(json.dumps(report))
""")


@pytest.mark.slow  # two compilations by inductor: about 20 s on 2 cores
def test_the_compiled_steps_norm_row_names_what_inductor_generated():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=cli_environment(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # Short rows: no Welford reduction in the generated code, and the row says two passes; on a GPU, GPT-2 small's
    # rows too (one persistent reduction a row).
    short = ["cpu 64", *(["cuda 768"] if "cuda 768" in report else [])]
    for case in short:
        assert report[case]["welford_in_code"] is False and report[case]["form"].startswith("two passes in float32")
    # Long rows: Welford's, and the row says so, as for torch's own kernel.
    long = ["cpu 2048", *(["cuda 2048"] if "cuda 2048" in report else [])]
    for case in long:
        assert report[case] == {"welford_in_code": True, "form": "Welford's one pass, in float32"}, case


def test_on_a_gpu_rows_one_persistent_reduction_holds_are_named_two_passes(monkeypatch):
    """The rule for Triton's code, as torch 2.11 to 2.13 generate it (the probe above reads the code itself on a
    GPU): a row of up to 1,024 is one persistent reduction, two passes over the row held in registers; a longer
    one, or any row where persistent or cooperative reductions change that, is Welford's."""
    from torch._inductor import config

    from mtbench.plugins.backends.torch_compiled_step import inductor_norm_form
    two_passes = "two passes in float32, the mean then the squared deviations, as inductor does rows of at most 1,024"
    assert inductor_norm_form(768, "cuda") == inductor_norm_form(1024, "cuda") == two_passes
    assert inductor_norm_form(1025, "cuda") == "Welford's one pass, in float32"
    monkeypatch.setattr(config.triton, "persistent_reductions", False)
    assert inductor_norm_form(768, "cuda") == "Welford's one pass, in float32"
    monkeypatch.setattr(config.triton, "persistent_reductions", True)
    monkeypatch.setattr(config.triton, "cooperative_reductions", True)
    assert inductor_norm_form(768, "cuda") == "Welford's one pass, in float32"
