"""The compiled torch step's layer-norm row says what inductor generates, not torch's kernel: read here from the
code inductor writes for a float32 layer norm (`run_and_get_code`) on this CPU, a row of the tiny presets' width and
one past inductor's two-pass threshold, and on a CUDA GPU where there is one (GPT-2 small's 768 and 2,048), in a
torch process of its own."""

import subprocess
import sys
import textwrap

import pytest

from conftest import cli_environment, json_answer

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
    report = json_answer(proc)
    # Short rows: no Welford reduction in the generated code, and the row says two passes; on a GPU, GPT-2 small's
    # rows too (one persistent reduction a row).
    short = ["cpu 64", *(["cuda 768"] if "cuda 768" in report else [])]
    for case in short:
        assert report[case]["welford_in_code"] is False and report[case]["form"].startswith("two passes in float32")
    # Long rows: Welford's, and the row says so, as for torch's own kernel.
    long = ["cpu 2048", *(["cuda 2048"] if "cuda 2048" in report else [])]
    for case in long:
        assert report[case] == {"welford_in_code": True, "form": "Welford's one pass, in float32"}, case


def test_on_a_gpu_rows_one_persistent_reduction_holds_are_named_two_passes():
    """The rule for Triton's code, as read in torch 2.11 to 2.13's inductor (the probe above reads the code itself
    on a GPU): a row of up to 1,024 is one persistent reduction, two passes over the row held in registers; a
    longer one is Welford's, and so is every row where persistent reductions are off, cooperative ones forced, or
    multi_kernel forces the looped kernel; multi_kernel's timing between the two leaves it open. (Inductor's own
    `config.patch` sets and restores its settings: a monkeypatch's undo deletes them.)"""
    from torch._inductor import config

    from mtbench.plugins.backends.torch_compiled_step import inductor_norm_form
    welford = "Welford's one pass, in float32"
    two_passes = "two passes in float32, the mean then the squared deviations, as inductor does rows of at most"
    assert inductor_norm_form(768, "cuda") == inductor_norm_form(1024, "cuda") == f"{two_passes} 1,024"
    assert inductor_norm_form(1025, "cuda") == welford
    cases = [("cooperative_reductions", True, 768, f"{two_passes} 1,024"),  # never for rows this short, unforced
             ("persistent_reductions", False, 768, welford), ("force_cooperative_reductions", True, 768, welford),
             ("multi_kernel", 3, 768, welford), ("multi_kernel", 2, 4096, f"{two_passes} 16,384"),
             ("multi_kernel", 1, 768, "two passes in float32 or Welford's one pass, whichever of inductor's two "
                                      "kernels for rows of at most 16,384 it timed faster")]
    for setting, value, width, form in cases:
        with config.patch({f"triton.{setting}": value}):
            assert inductor_norm_form(width, "cuda") == form, (setting, value)
