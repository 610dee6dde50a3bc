"""Both backends run the same attention arithmetic under mixed bfloat16, read from what ran: the aten operations of
a torch forward pass (tests/attention_ops_probe.py, a process of its own) and the lowered program of a JAX one.
The attention's matmuls take bfloat16 and write bfloat16 scores, the softmax runs in float32, and the result's
`model.attention.arithmetic` says so."""

import os
import re
import subprocess
import sys

import jax
import keras
import numpy as np
import pytest
from conftest import TESTS_DIR, cli_environment, json_answer

from mtbench.keras_models.gpt import GPT
from mtbench.keras_models.presets import PRESETS
from mtbench.keras_models.transformer import attention_arithmetic, build_transformer

HLO_DTYPES = {"bf16": "bfloat16", "f32": "float32", "f16": "float16"}
# An element type in a tensor type, e.g. bf16 in tensor<2x8x2x32xbf16>.
ELEMENT_TYPE = re.compile(r"tensor<(?:\d+x)*([a-z]\w*)>")
# The softmax's exponential over the scores: (batch, heads, queries, keys), or more dimensions.
SCORES_EXP = re.compile(r"stablehlo\.exponential .*: tensor<(?:\d+x){4,}([a-z]\w*)>")
BFLOAT16_ATTENTION = {"matmul_inputs": {"bfloat16"}, "scores": {"bfloat16"}, "softmax": {"float32"}}


@pytest.fixture
def mixed_bfloat16():
    before = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    yield
    keras.config.set_dtype_policy(before)


def padded_ids():
    ids = np.full((2, 8), 5, "int32")
    ids[:, -2:] = 0
    return ids


def jax_attention_ops(model):
    """The dtypes of the attention operations in the lowered forward pass of `model` on JAX."""
    def forward(values, inputs):
        with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
            return model(inputs)

    text = jax.jit(forward).lower([v.value for v in model.variables], (padded_ids(), padded_ids())).as_text()
    # The batched dot_generals: attention's two matmuls (the dense layers' dots have no batch dimensions); their
    # operand and result types, and the accumulation type of an explicit dot algorithm where one is given.
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line and "batching_dims" in line]
    types = [[HLO_DTYPES[dtype] for dtype in ELEMENT_TYPE.findall(line.split(" : ")[-1])] for line in dots]
    accumulation = [re.search(r"accumulation_type = (\w+)", line) for line in dots]
    return {"matmul_inputs": {dtype for lhs, rhs, _ in types for dtype in (lhs, rhs)},
            "scores": {out for _, _, out in types},  # the scores, and the attended values (as the scores, here)
            "accumulation": {HLO_DTYPES[found.group(1)] for found in accumulation if found},
            "softmax": {HLO_DTYPES[dtype] for dtype in SCORES_EXP.findall(text)}, "dots": len(dots)}


@pytest.fixture(scope="module")
def torch_attention_ops():
    """The dtypes of the attention operations one torch forward pass ran, by aten operation."""
    proc = subprocess.run([sys.executable, os.path.join(TESTS_DIR, "attention_ops_probe.py"), "mixed_bfloat16"],
                          capture_output=True, text=True, env=cli_environment(), timeout=300, check=False)
    ran = json_answer(proc)
    matmuls = ran.get("bmm", []) + ran.get("baddbmm", [])
    softmaxes = ran.get("_softmax", []) + ran.get("_safe_softmax", [])
    return {"matmul_inputs": {dtype for inputs, _ in matmuls for dtype in inputs},
            "scores": {out for _, out in matmuls}, "softmax": {dtype for inputs, _ in softmaxes for dtype in inputs},
            "dots": len(matmuls), "sdpa": [op for op in ran if op.startswith("_scaled_dot_product")]}


def test_jax_attention_multiplies_bfloat16_and_normalises_in_float32(mixed_bfloat16):
    ops = jax_attention_ops(build_transformer(PRESETS["tiny"]))
    # Two matmuls in each of the tiny model's three attentions (encoder, decoder self- and cross-attention).
    assert ops.pop("dots") == 6
    # No explicit dot algorithm: the scores are written in bfloat16, accumulated as the device's bfloat16
    # matmuls accumulate (float32 on GPUs), as torch's are.
    assert ops == {**BFLOAT16_ATTENTION, "accumulation": set()}


@pytest.mark.slow  # a torch process: about 30 s on this project's 2-core machine
def test_torch_attention_multiplies_bfloat16_and_normalises_in_float32(torch_attention_ops):
    assert torch_attention_ops["dots"] == 6 and torch_attention_ops["sdpa"] == []
    assert {key: torch_attention_ops[key] for key in BFLOAT16_ATTENTION} == BFLOAT16_ATTENTION


@pytest.mark.slow
def test_the_backends_agree_with_each_other_and_the_record(mixed_bfloat16, torch_attention_ops):
    model = build_transformer(PRESETS["tiny"])
    measured = jax_attention_ops(model)
    assert {key: measured[key] for key in BFLOAT16_ATTENTION} == {key: torch_attention_ops[key]
                                                                  for key in BFLOAT16_ATTENTION}
    record = attention_arithmetic(model)
    assert {key: {record[key]} for key in BFLOAT16_ATTENTION} == {key: measured[key] for key in BFLOAT16_ATTENTION}
    # record["accumulation"] is not counted here: neither program names one (the JAX test above), it is the GPU
    # libraries' accumulation of 16-bit matmuls, which a CPU cannot show.


def test_the_record_follows_the_dtype_and_the_kernel(mixed_bfloat16):
    # Built, not called: no fused kernel runs on this CPU.
    fused = GPT(vocab_size=50, d_model=16, num_heads=2, layers_count=1, ff_dim=32, block_size=8, flash_attention=True)
    assert attention_arithmetic(fused) == {"matmul_inputs": "bfloat16", "accumulation": "float32",
                                           "scores": "float32", "softmax": "float32", "projections": "fused",
                                           "probability_dropout": 0.0}
    keras.config.set_dtype_policy("float32")
    assert set(attention_arithmetic(build_transformer(PRESETS["tiny"])).values()) == {"float32", "fused", 0.0}
    dropping = GPT(vocab_size=50, d_model=16, num_heads=2, layers_count=2, ff_dim=32, block_size=8, dropout=0.2)
    assert attention_arithmetic(dropping)["probability_dropout"] == 0.2
    for block in fused.blocks:
        block.attention.fused_projections = False
    assert attention_arithmetic(fused)["projections"] == "separate"
    assert attention_arithmetic(keras.Sequential([keras.layers.Dense(2)])) is None
