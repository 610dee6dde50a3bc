"""The attention a run may use and the implementation its result names for each kind of attention: torch is held to
its math kernel without the flash extra (as JAX runs plain XLA attention) and to fused kernels with it, and the
flash-attention extra's check that the fused kernels served every kind it was asked for (the GPU itself is not
here)."""

from types import SimpleNamespace

import pytest

from mtbench.plugins.backends.jax_backend import JaxBackend
from mtbench.plugins.backends.torch_backend import TorchBackend
from mtbench.keras_models.presets import PRESETS
from mtbench.plugins.extras.flash_attention import MASKED_KINDS, cudnn_kinds_missing, torch_kinds_missing
from mtbench.plugins.manager import Registry
from mtbench.runner.setup import choose_attention_kernels

import torch
SDPA_KERNELS = ("math", "flash", "mem_efficient", "cudnn")


@pytest.fixture
def sdpa_flags():
    """The process's SDPA kernel switches, restored after the test."""
    saved = {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")() for name in SDPA_KERNELS}
    yield
    for name, on in saved.items():
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)


def sdpa_operators():
    """The SDPA operators that one causal and one masked attention call ran on this CPU, as torch's profiler saw
    them: the kernel the switches left it, not the switches."""
    from torch.profiler import ProfilerActivity, profile
    q = torch.randn(2, 4, 8, 16)
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    ran = {}
    for kind, options in (("causal", {"is_causal": True}), ("masked", {"attn_mask": mask})):
        with profile(activities=[ProfilerActivity.CPU]) as trace:
            assert torch.nn.functional.scaled_dot_product_attention(q, q, q, **options).shape == (2, 4, 8, 16)
        ran[kind] = sorted({event.name for event in trace.events()
                            if event.name.startswith("aten::_scaled_dot_product_") or event.name == "aten::bmm"})
    return ran


def run_on(backend, kind, model_shape=None, config=None, **model_options):
    return SimpleNamespace(backend=backend, device={"kind": kind}, model_options=model_options,
                           model_shape=model_shape, config=config)


def kernels_of(run, registry=None):
    return choose_attention_kernels(run, SimpleNamespace(backend=run.backend, registry=registry or Registry()))


@pytest.mark.parametrize("run, expected", [
    (run_on(JaxBackend(), "gpu"), {"causal": "xla (unfused)", "masked": "xla (unfused)", "decoding": "xla (unfused)"}),
    (run_on(JaxBackend(), "gpu", flash_attention=True, flash_attention_masked=True),
     {"causal": "cudnn (fused)", "masked": "cudnn (fused)", "decoding": "xla (unfused)"}),
    (run_on(JaxBackend(), "tpu", flash_attention=True, flash_attention_masked=True),
     {"causal": "splash (fused)", "masked": "splash (fused)", "decoding": "xla (unfused)"}),
])
def test_the_result_names_what_each_kind_of_attention_ran_on_jax(run, expected):
    assert kernels_of(run) == expected


def test_torch_without_the_flash_extra_is_held_to_the_math_kernel(sdpa_flags):
    torch.backends.cuda.enable_flash_sdp(True)  # as torch starts: its dispatcher may pick any kernel
    kernels = kernels_of(run_on(TorchBackend(), "gpu"))
    assert kernels == {"causal": "aten (unfused)", "masked": "aten (unfused)", "decoding": "aten (unfused)",
                       "sdpa_kernels_enabled": ["math"]}
    assert torch.backends.cuda.math_sdp_enabled()
    assert not any(getattr(torch.backends.cuda, f"{name}_sdp_enabled")() for name in ("flash", "mem_efficient", "cudnn"))
    # What runs, with the others switched off: the math kernel, for the causal and the masked call alike.
    math = ["aten::_scaled_dot_product_attention_math", "aten::bmm"]  # its two products are bmm's
    assert sdpa_operators() == {"causal": math, "masked": math}


def test_torch_with_the_flash_extra_is_held_to_fused_kernels(sdpa_flags, monkeypatch):
    from mtbench.plugins.backends import torch_backend
    # A dispatcher that ranks FlashAttention first, as before Hopper (and on this CPU): on a GPU machine its own
    # choice is checked by the test `on_a_gpu` below.
    monkeypatch.setattr(torch_backend, "preferred_fused_kernels",
                        lambda device, attention=None: {"causal": "flash", "masked": "mem_efficient"})
    # As the extra asks on torch: no kernel from Keras (None), SDPA's dispatcher choosing among the fused ones.
    kernels = kernels_of(run_on(TorchBackend(), "gpu", flash_attention=None, flash_attention_masked=None))
    assert kernels == {"causal": "flash (fused)", "masked": "memory-efficient (fused)",
                       "decoding": "aten (unfused)", "sdpa_kernels_enabled": ["flash", "mem_efficient", "cudnn"]}
    assert not torch.backends.cuda.math_sdp_enabled()  # no quiet fallback to the unfused kernel
    # the switches govern this CPU's dispatch too: its fused kernel (flash) runs, the math kernel and bmm do not
    assert sdpa_operators() == {"causal": ["aten::_scaled_dot_product_flash_attention_for_cpu"],
                                "masked": ["aten::_scaled_dot_product_flash_attention_for_cpu"]}


def test_torch_names_the_kernels_its_dispatcher_prefers(sdpa_flags, monkeypatch):
    """On a GPU whose dispatcher ranks cuDNN's kernel first (an H200's: nanoGPT's SDPA ran it), the result names
    cuDNN's kernel for what it serves, and cuDNN's SDPA is left on for it."""
    from mtbench.plugins.backends import torch_backend
    monkeypatch.setattr(torch_backend, "preferred_fused_kernels",
                        lambda device, attention: {"causal": "cudnn", "masked": "cudnn"})
    kernels = kernels_of(run_on(TorchBackend(), "gpu", flash_attention=None, flash_attention_masked=None))
    assert (kernels["causal"], kernels["masked"]) == ("cudnn (fused)", "cudnn (fused)")
    assert torch.backends.cuda.cudnn_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()


def test_the_dispatcher_is_asked_about_the_attention_the_runs_model_computes(sdpa_flags, monkeypatch):
    """SDPA's dispatcher chooses by the inputs (cuDNN's kernel takes heads of at most 128 before some versions, flash
    refuses float32): it is asked about the run's heads, length and compute dtype, not GPT-2 small's."""
    from mtbench.plugins.backends import torch_backend
    asked = []
    monkeypatch.setattr(torch_backend, "preferred_fused_kernels",
                        lambda device, attention: asked.append(attention) or {"causal": "flash", "masked": "flash"})
    tiny = PRESETS["tiny"]  # 64 wide in 2 heads
    run = run_on(TorchBackend(), "gpu", tiny, SimpleNamespace(dtype="mixed_float16", max_len=40),
                 flash_attention=None, flash_attention_masked=None)
    assert kernels_of(run)["masked"] == "flash (fused)"
    assert asked == [{"heads": 2, "head_dim": 32, "length": 40, "dtype": "float16"}]
    run.config, run.model_shape = SimpleNamespace(dtype="bfloat16", max_len=None), PRESETS["base"]
    kernels_of(run)
    assert asked[-1] == {"heads": 8, "head_dim": 64, "length": 128, "dtype": "bfloat16"}  # the preset's length
    run.model_shape = None  # a family that knows its shape only once built: GPT-2 small's heads, in bfloat16
    kernels_of(run)
    assert asked[-1] == {"heads": 12, "head_dim": 64, "length": 1024, "dtype": "bfloat16"}


def test_a_backend_that_names_its_kernels_without_the_run_is_called_as_it_was_and_named_deprecated(sdpa_flags):
    class Before127(TorchBackend):
        def attention_kernels(self, fused, device):
            return super().attention_kernels(fused, device)

    registry = Registry()
    registry.provider[("backends", "torch")] = "someone"
    run = run_on(Before127(), "cpu", flash_attention=None, flash_attention_masked=None)
    assert kernels_of(run, registry)["causal"] == kernels_of(run, registry)["causal"] == "flash (fused)"
    [warning] = registry.warnings
    assert warning.startswith("plugin 'someone': backend 'torch' implements attention_kernels(fused, device), "
                              "deprecated in plugin API 1.27: mtbench calls attention_kernels(fused, device, run)")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="asks a CUDA GPU's SDPA dispatcher")
# 160: on Hopper cuDNN's forward takes heads that wide and its backward does not, so a training step runs another
# kernel than an inference call would.
@pytest.mark.parametrize("head_dim", [32, 64, 128, 160, 256])
def test_on_a_gpu_the_kernel_named_for_a_models_heads_is_the_one_sdpa_runs(sdpa_flags, head_dim):
    """As a training step calls SDPA: inputs that need gradients, and the model's additive mask of keys, one row a
    sequence."""
    from torch.profiler import ProfilerActivity, profile

    from mtbench.plugins.backends.torch_backend import preferred_fused_kernels
    TorchBackend().attention_kernels(True, {"kind": "gpu"})  # the fused kernels on, the math kernel off
    named = preferred_fused_kernels({"kind": "gpu"}, {"heads": 4, "head_dim": head_dim, "length": 256})
    operator = {"flash": "flash_attention", "mem_efficient": "efficient_attention", "cudnn": "cudnn_attention"}
    q = torch.randn(2, 4, 256, head_dim, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    mask = torch.zeros(2, 1, 1, 256, dtype=torch.bfloat16, device="cuda")
    for kind, options in (("causal", {"is_causal": True}), ("masked", {"attn_mask": mask})):
        with profile(activities=[ProfilerActivity.CPU]) as trace:
            torch.nn.functional.scaled_dot_product_attention(q, q, q, **options)
        ran = {event.name for event in trace.events() if event.name.startswith("aten::_scaled_dot_product_")}
        assert ran == {f"aten::_scaled_dot_product_{operator[named[kind]]}"}, (kind, head_dim, named)


def test_the_dispatcher_is_asked_on_the_device_the_run_computes_on():
    """On a CPU, SDPA's one fused kernel is flash's; on a GPU, torch's own choice, not a table."""
    from mtbench.plugins.backends.torch_backend import preferred_fused_kernels
    assert preferred_fused_kernels({"kind": "cpu"}) == {"causal": "flash", "masked": "mem_efficient"}
    if torch.cuda.is_available():
        assert preferred_fused_kernels({"kind": "gpu"})["causal"] in ("flash", "cudnn", "mem_efficient")
    else:
        assert preferred_fused_kernels({"kind": "gpu"}) == {"causal": "flash", "masked": "mem_efficient"}


def test_cudnn_must_serve_the_masked_attentions_with_its_bias_variant():
    everything = ["decoder self-attention", *MASKED_KINDS]
    one_each = dict.fromkeys(everything, 1)
    causal_only = ["__cudnn$fmhaSoftmax"]
    assert cudnn_kinds_missing(causal_only, everything, one_each) == MASKED_KINDS
    assert cudnn_kinds_missing(causal_only, ["decoder self-attention"], one_each) == []
    assert cudnn_kinds_missing(["__cudnn$fmhaScaleBiasSoftmax"] * 2, everything, one_each) == ["decoder self-attention"]
    assert cudnn_kinds_missing(["__cudnn$fmhaScaleBiasSoftmax"] * 2 + ["__cudnn$fmhaSoftmax"], everything,
                               one_each) == []


def test_a_fused_kernel_must_serve_every_layer_of_its_kind_not_one():
    """Keras on JAX falls back to plain attention call by call: a kernel named once in the program served one
    layer, and a model of six had five run unfused under a 'fused' label. The calls are counted against the
    layers: 2 encoder and 2 decoder blocks need 4 bias calls (2 encoder self-attentions, 2 cross-attentions) and
    2 without."""
    everything = ["decoder self-attention", *MASKED_KINDS]
    layers = dict.fromkeys(everything, 2)
    bias, plain = "__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaSoftmax"
    assert cudnn_kinds_missing([bias, plain], everything, layers) == everything
    assert cudnn_kinds_missing([bias] * 3 + [plain] * 2, everything, layers) == MASKED_KINDS
    assert cudnn_kinds_missing([bias] * 4 + [plain], everything, layers) == ["decoder self-attention"]
    assert cudnn_kinds_missing([bias] * 4 + [plain] * 2, everything, layers) == []
    flash = "aten::_scaled_dot_product_flash_attention"
    efficient = "aten::_scaled_dot_product_efficient_attention"
    kernel = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>()"  # the CUDA kernel under flash: no call
    assert torch_kinds_missing([flash, kernel, kernel] + [efficient] * 4, everything, layers) == \
        ["decoder self-attention"]
    assert torch_kinds_missing([flash] * 2 + [efficient] * 4, everything, layers) == []


def test_torch_needs_flash_for_the_causal_attention_and_memory_efficient_for_the_masked_ones():
    everything = ["decoder self-attention", *MASKED_KINDS]
    one_each = dict.fromkeys(everything, 1)
    flash = "aten::_scaled_dot_product_flash_attention"
    efficient = "aten::_scaled_dot_product_efficient_attention"
    assert torch_kinds_missing([flash], everything, one_each) == MASKED_KINDS
    assert torch_kinds_missing([efficient] * 2, everything, one_each) == ["decoder self-attention"]
    assert torch_kinds_missing([flash, efficient, efficient], everything, one_each) == []
    assert torch_kinds_missing([flash + "_for_cpu"], ["decoder self-attention"], one_each) == []


def test_torch_kernels_count_against_the_kernel_said_to_serve_each_kind():
    """Where SDPA's dispatcher gives cuDNN's kernel the causal attention (Hopper), flash's calls serve nothing,
    and one kernel serving every kind must be called once a layer of each."""
    everything = ["decoder self-attention", *MASKED_KINDS]
    one_each = dict.fromkeys(everything, 1)
    flash = "aten::_scaled_dot_product_flash_attention"
    efficient = "aten::_scaled_dot_product_efficient_attention"
    cudnn = "aten::_scaled_dot_product_cudnn_attention"
    split = {"causal": "cudnn (fused)", "masked": "memory-efficient (fused)"}
    assert torch_kinds_missing([flash] * 3, ["decoder self-attention"], one_each, split) == ["decoder self-attention"]
    assert torch_kinds_missing([cudnn, efficient, efficient], everything, one_each, split) == []
    both = {"causal": "cudnn (fused)", "masked": "cudnn (fused)"}
    assert torch_kinds_missing([cudnn] * 2, everything, one_each, both) == everything
    assert torch_kinds_missing([cudnn] * 3, everything, one_each, both) == []
    assert torch_kinds_missing([cudnn], ["decoder self-attention"], one_each, both) == []