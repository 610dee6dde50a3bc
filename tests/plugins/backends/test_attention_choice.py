"""The attention implementation a result names for each kind of attention, from what the extras asked for, and
the flash-attention extra's check that cuDNN served every kind it was asked for (the GPU itself is not here)."""

from types import SimpleNamespace

import pytest

from mtbench.plugins.backends.jax_backend import JaxBackend
from mtbench.plugins.backends.torch_backend import TorchBackend
from mtbench.plugins.extras.flash_attention import MASKED_KINDS, cudnn_kinds_missing
from mtbench.runner.results.run_result import attention_implementations


def run_on(backend, kind, **model_options):
    return SimpleNamespace(backend=backend, device={"kind": kind}, model_options=model_options)


@pytest.mark.parametrize("run, expected", [
    (run_on(JaxBackend(), "gpu"), {"causal": "xla", "masked": "xla", "decoding": "xla"}),
    (run_on(JaxBackend(), "gpu", flash_attention=True, flash_attention_masked=True),
     {"causal": "cudnn", "masked": "cudnn", "decoding": "xla"}),
    (run_on(JaxBackend(), "tpu", flash_attention=True, flash_attention_masked=True),
     {"causal": "splash", "masked": "splash", "decoding": "xla"}),
    (run_on(TorchBackend(), "gpu", flash_attention=True, flash_attention_masked=None),
     {"causal": "flash", "masked": "sdpa", "decoding": "sdpa"}),
])
def test_the_result_names_what_each_kind_of_attention_ran(run, expected):
    assert attention_implementations(run) == expected


def test_cudnn_must_serve_the_masked_attentions_with_its_bias_variant():
    everything = ["decoder self-attention", *MASKED_KINDS]
    causal_only = ["__cudnn$fmhaSoftmax"]
    assert cudnn_kinds_missing(causal_only, everything) == MASKED_KINDS
    assert cudnn_kinds_missing(causal_only, ["decoder self-attention"]) == []
    assert cudnn_kinds_missing(["__cudnn$fmhaScaleBiasSoftmax"], everything) == ["decoder self-attention"]
    assert cudnn_kinds_missing(["__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaSoftmax"], everything) == []
