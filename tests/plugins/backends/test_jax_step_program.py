"""What mtbench's JAX train step compiles to, read from its program (StableHLO) on the tiny language model in mixed
bfloat16: the embeddings' gradients are summed in float32 (their scatter-adds write float32 tables), and the
step has no conditional (the learning-rate schedule does not branch), whose predicate a GPU reads on the host."""

import re

import pytest

from conftest import keras_on_jax


@pytest.fixture(scope="module")
def program():
    keras = keras_on_jax()
    import dataclasses

    import numpy as np

    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = build_gpt(dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32))
        compile_model(keras, model, TrainConfig(model_name="gpt", preset="tiny", dtype="mixed_bfloat16"), 20, {})
        ids = np.ones((4, 32), np.int32)
        return JitTrainStep(model).lowered_program((ids,), ids, np.ones((4, 32), np.float32))
    finally:
        keras.config.set_dtype_policy("float32")


def scatter_results(text):
    """The result type of every scatter in the program: '256x64xf32'."""
    return re.findall(r'"stablehlo\.scatter".*?\}\) : \([^)]*\) -> tensor<([^>]*)>', text, re.S)


def test_the_embedding_gradients_are_summed_in_float32(program):
    tables = [result for result in scatter_results(program) if result.startswith(("256x64", "32x64"))]
    assert sorted(tables) == ["256x64xf32", "32x64xf32"]  # the token table and the position table
    assert not [result for result in scatter_results(program) if "bf16" in result]


def test_the_step_has_no_conditional(program):
    assert not re.search(r"stablehlo\.(case|if)\b", program)
