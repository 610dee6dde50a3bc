"""What mtbench's JAX train step compiles to, read from its program (StableHLO) on the tiny language model in mixed
bfloat16: the embeddings' gradients are summed in float32 (their scatter-adds write float32 tables), the step has
no conditional (the learning-rate schedule does not branch), whose predicate a GPU reads on the host, and the
program lowered for a GPU (no GPU needed) computes the loss's gradient without a scatter; and where XLA rounds to
bfloat16, as the step's `rounding_16_bit` row says (tests/excess_precision_probe.py)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import CPU_ONLY, TESTS_DIR, device_kind, json_answer, keras_on_jax, tiny_jax_gpt


PROBE = os.path.join(TESTS_DIR, "excess_precision_probe.py")
LOGITS = "4x32x256xf32"  # the tiny model's float32 logits for the 4 x 32 tokens below, over 256 bytes


def step_batch():
    import numpy as np
    ids = np.ones((4, 32), np.int32)
    return (ids,), ids, np.ones((4, 32), np.float32)


@pytest.fixture(scope="module")
def mixed_step():
    """mtbench's JAX step of the tiny language model in mixed bfloat16."""
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    return JitTrainStep(tiny_jax_gpt("mixed_bfloat16"))


@pytest.fixture(scope="module")
def lowered(mixed_step):
    """The step's program lowered for a platform: `lowered(None)` for the device it trains on, `lowered('cpu')`,
    `lowered('cuda')` (on any machine); `lowered('optimised')`, XLA's program for the device it trains on."""
    programs = {platform: mixed_step.lowered_program(*step_batch(), platform) for platform in (None, "cpu", "cuda")}
    programs["optimised"] = mixed_step.lowered_program(*step_batch(), optimised=True)
    return programs.get


@pytest.fixture(scope="module")
def program(lowered):
    return lowered(None)


def scatter_results(text):
    """The result type of every scatter in the program: '256x64xf32'."""
    return re.findall(r'"stablehlo\.scatter".*?\}\) : \([^)]*\) -> tensor<([^>]*)>', text, re.S)


def test_the_embedding_gradients_are_summed_in_float32(program):
    tables = [result for result in scatter_results(program) if result.startswith(("256x64", "32x64"))]
    assert sorted(tables) == ["256x64xf32", "32x64xf32"]  # the token table and the position table
    assert not [result for result in scatter_results(program) if "bf16" in result]


def test_the_step_has_no_conditional(lowered):
    """None in what XLA compiles the step to: the platform's choice of how the label's logit is read
    (`label_logits`) is a case on a constant, which XLA folds away."""
    assert not re.search(r"\bconditional\(", lowered("optimised"))


def test_on_a_gpu_the_losss_gradient_has_no_scatter_into_the_logits(lowered):
    """On the CPU the label's logit is gathered, and its gradient scattered into a zero array of the logits' shape
    (the faster program there); for a GPU it is a masked sum, whose gradient XLA fuses with the softmax's."""
    assert scatter_results(lowered("cpu")).count(LOGITS) == 1
    gpu = lowered("cuda")
    assert LOGITS not in scatter_results(gpu)
    assert sorted(scatter_results(gpu)) == ["256x64xf32", "32x64xf32"]  # the embeddings' gradients alone


def test_the_masked_label_logits_and_their_gradient_are_the_gathered_ones():
    keras_on_jax()
    import jax
    import numpy as np

    from mtbench.plugins.backends.jax_jit_step import gathered_label_logits, masked_label_logits
    draw = np.random.default_rng(0)
    logits = draw.standard_normal((3, 5, 11)).astype(np.float32)
    labels = draw.integers(0, 11, (3, 5)).astype(np.int32)
    cotangent = draw.standard_normal((3, 5)).astype(np.float32)
    for label_logits in (gathered_label_logits, masked_label_logits):
        value, backward = jax.vjp(lambda x: label_logits(labels, x), logits)
        np.testing.assert_array_equal(value, np.take_along_axis(logits, labels[..., None], -1)[..., 0])
        expected = np.zeros_like(logits)
        np.put_along_axis(expected, labels[..., None], cotangent[..., None], -1)
        np.testing.assert_array_equal(backward(cotangent)[0], expected)


def test_a_run_of_another_length_compiles_the_same_program():
    """The learning-rate schedule's numbers (steps, warm-up, learning rate) are the step's arguments, not constants
    of its program: JAX's compilation cache, whose key is the program, serves a run of any length the program a run
    of another length compiled. (Both steps' losses are Keras's own: test_fast_train_steps.py.)"""
    import numpy as np

    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    ids = np.ones((4, 32), np.int32)
    steps = [JitTrainStep(tiny_jax_gpt("float32", total_steps)) for total_steps in (20, 5000)]
    assert steps[0].schedule_numbers != steps[1].schedule_numbers
    programs = [step.lowered_program((ids,), ids, np.ones((4, 32), np.float32)) for step in steps]
    assert programs[0] == programs[1]


def test_every_matrix_product_of_the_mixed_bfloat16_step_multiplies_bfloat16(lowered):
    """The policy's arithmetic, counted in the program: each weight matrix's three products (forward, the input's
    gradient, the weight's) and attention's two batched products three times a block, every one on bfloat16
    inputs, as many as the torch step runs (tests/keras_models/test_attention.py)."""
    from mtbench.keras_models.presets import GPT_PRESETS
    blocks = GPT_PRESETS["tiny"].decoder_layers
    products = [re.search(r": \(tensor<[^>]*x(\w+)>, tensor<[^>]*x(\w+)>\)", line).groups()
                for line in lowered("cuda").splitlines() if "stablehlo.dot_general" in line]
    assert len(products) == 3 * (4 * blocks + 1) + 3 * 2 * blocks
    assert set(products) == {("bf16", "bf16")}


def test_the_rounding_row_says_where_xla_rounded_bfloat16_values():
    """XLA's default (`--xla_allow_excess_precision` true) skips a rounding to bfloat16 that the program asks for and
    torch's steps do, and the JAX step's row says so; XLA held to round (or run with the flag false: the row then
    says so) rounds where the program does. Counted in this process, whatever XLA_FLAGS it was started with."""
    from excess_precision_probe import report

    from mtbench.plugins.backends.rounding_16_bit import XLA_EXCESS_PRECISION, XLA_ROUNDED
    here = report()
    assert here["kept"] < here["rounded"]
    assert here["ran"] == (here["kept"] if here["row"] == XLA_EXCESS_PRECISION else here["rounded"])
    assert here["row"] in (XLA_EXCESS_PRECISION, XLA_ROUNDED)


def test_a_jax_process_told_to_round_rounds_and_its_row_says_so():
    """XLA_FLAGS that end with the flag false (the last word counts, and '0' is false) make XLA round where the
    program rounds, as torch's steps do, and the row says so: a process of its own, as XLA reads its flags once."""
    from mtbench.plugins.backends.rounding_16_bit import XLA_ROUNDED
    env = {**os.environ, **CPU_ONLY, "XLA_FLAGS": "--xla_allow_excess_precision=true --xla_allow_excess_precision=0"}
    report = json_answer(subprocess.run([sys.executable, PROBE], capture_output=True, text=True, env=env, timeout=300))
    assert report["ran"] == report["rounded"] > report["kept"]
    assert report["row"] == XLA_ROUNDED


@pytest.mark.slow
def test_xlas_default_skips_roundings_of_the_mixed_bfloat16_step(mixed_step, lowered):
    """The tiny model's whole step, not a toy: with excess precision allowed XLA leaves out roundings to bfloat16
    the step's program asks for (on this CPU 169 of the 204 it makes with the flag false are left, and the losses of
    the same weights and batches part by 2e-5 at the first step), which the row names."""
    from excess_precision_probe import bfloat16_roundings

    from mtbench.plugins.backends.rounding_16_bit import XLA_EXCESS_PRECISION
    held_to_round = bfloat16_roundings(mixed_step.lowered_program(
        *step_batch(), optimised=True, compiler_options={"xla_allow_excess_precision": False}))
    ran = bfloat16_roundings(lowered("optimised"))
    if mixed_step.numerics()["rounding_16_bit"] == XLA_EXCESS_PRECISION:
        assert ran < held_to_round if device_kind("jax") == "cpu" else ran <= held_to_round
    else:
        assert ran == held_to_round
