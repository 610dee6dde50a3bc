"""benchmarks/program_cost.py: mtbench's compiled JAX step for the GPT does the work of the best-by-hand reference
and no more, counted in the two programs XLA compiles, nothing run."""

import dataclasses

import pytest

from conftest import keras_on_jax


@pytest.mark.slow  # XLA compiles four GPT steps: about 20 s
@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_mtbench_s_step_does_the_references_arithmetic_and_its_matmuls(dtype, jax_precision):
    keras_on_jax()
    jax = jax_precision

    from benchmarks.program_cost import compiled_programs
    from mtbench.keras_models.presets import GPT_PRESETS
    figures = compiled_programs("tiny", rows=2, block=32, dtype=dtype)
    ours, reference = figures["mtbench"], figures["reference"]
    # both compiled with float32 matmuls in float32, as `mtbench train` sets them (a GPU's XLA would take TF32)
    assert figures["matmul_precision"] == {"requested": "highest",
                                           "reported": {"jax.config.jax_default_matmul_precision": "float32"}}
    assert ours["flops"] == pytest.approx(reference["flops"], rel=0.02)
    # The same exponentials, logs and square roots, up to a few scalars (the schedule's cosine, Adam's corrections).
    assert 0 <= ours["transcendentals"] - reference["transcendentals"] < 32
    assert ours["bytes accessed"] <= reference["bytes accessed"] * 1.05
    # The kernels XLA launches multiply as much, whatever it fused them into.
    assert ours["matmul TFLOP"] == pytest.approx(reference["matmul TFLOP"], rel=0.02) and ours["kernels"] > 0
    # The same matrix multiplications: each weight matrix three times (forward, the input's gradient, the weight's
    # gradient), the query, key and value one matrix in both (the reference's fused QKV, mtbench's fused
    # projections), and attention's two products three times a block, except on a GPU in 16 bits, where both
    # call cuDNN's fused attention for them (a custom call, no product of the program's).
    layers = dataclasses.replace(GPT_PRESETS["tiny"]).decoder_layers
    fused_attention = dtype == "mixed_bfloat16" and jax.default_backend() == "gpu"
    attention_products = 0 if fused_attention else 3 * 2 * layers
    assert ours["matmuls"] == reference["matmuls"] == 3 * (4 * layers + 1) + attention_products
