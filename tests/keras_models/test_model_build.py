"""A model's variables are created without running its forward pass: the model is called on symbolic ids. JAX
compiles each operation run eagerly into a program of its own (on a GPU about a tenth of a second each): GPT-2
small's eager call cost about 60 of them, 11 s of each JAX process's start on an H100. The variables hold the
numbers an eager call's would."""

import dataclasses
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import CPU_ONLY, TESTS_DIR, cli_environment, json_answer, keras_on_jax
from mtbench.keras_models.presets import GPT_PRESETS, PRESETS

# Shapes no other test builds (nor each other), so that this process has compiled none of their programs before.
GPT_SHAPE = dataclasses.replace(GPT_PRESETS["tiny"], d_model=24, num_heads=2, ff_dim=40, vocab_size=37, max_len=16)
TRANSLATION_SHAPE = dataclasses.replace(PRESETS["tiny"], d_model=20, num_heads=2, ff_dim=44, vocab_size=41,
                                        max_len=16)
# Programs only a forward pass compiles (an initializer draws, casts and scales; it multiplies no matrices and
# looks nothing up).
FORWARD = ("jit(matmul)", "jit(_einsum)", "jit(_take)", "jit(dot_general)", "jit(take)")


def built(kind, eagerly, caplog):
    """(the model's weights, the programs JAX compiled while it was built), from seed 0."""
    import jax
    keras = keras_on_jax()
    from keras import ops

    from mtbench.keras_models.gpt import GPT
    from mtbench.keras_models.transformer import Transformer, create_variables
    keras.utils.set_random_seed(0)
    if kind == "gpt":
        s = GPT_SHAPE
        model = GPT(vocab_size=s.vocab_size, d_model=s.d_model, num_heads=s.num_heads, layers_count=s.decoder_layers,
                    ff_dim=s.ff_dim, block_size=s.max_len, dropout=0.0)
    else:
        s = TRANSLATION_SHAPE
        model = Transformer(vocab_size=s.vocab_size, d_model=s.d_model, num_heads=s.num_heads,
                            encoder_layers=s.encoder_layers, decoder_layers=s.decoder_layers, ff_dim=s.ff_dim,
                            max_len=s.max_len, dropout=0.0)
    inputs = 1 if kind == "gpt" else 2
    caplog.clear()
    with caplog.at_level(logging.WARNING), jax.log_compiles():
        if eagerly:
            ids = ops.ones((1, 8), dtype="int32")
            model(ids if inputs == 1 else (ids, ids))
        else:
            create_variables(model, inputs=inputs)
    programs = [record.getMessage().split("Finished XLA compilation of ")[1].split(" in ")[0]
                for record in caplog.records if "Finished XLA compilation of" in record.getMessage()]
    return [np.asarray(w.value) for w in model.weights], programs


@pytest.mark.parametrize("kind", ["gpt", "translation"])
def test_variables_are_created_without_running_the_forward_pass(kind, caplog):
    weights, programs = built(kind, eagerly=False, caplog=caplog)
    eager_weights, eager_programs = built(kind, eagerly=True, caplog=caplog)
    assert any(name in eager_programs for name in FORWARD), eager_programs  # the count sees a forward pass
    assert not [name for name in programs if name in FORWARD], programs
    assert len(programs) < len(eager_programs) / 3
    assert len(weights) == len(eager_weights) > 0
    for ours, theirs in zip(weights, eager_weights):
        np.testing.assert_array_equal(ours, theirs)


@pytest.fixture(scope="module")
def flash_model_probe():
    proc = subprocess.run([sys.executable, os.path.join(TESTS_DIR, "model_build_probe.py")], capture_output=True,
                          text=True, env=cli_environment(CPU_ONLY), timeout=300, check=False)
    return json_answer(proc)


@pytest.mark.slow
def test_a_model_asking_for_flash_attention_is_built_without_running_it_on_torch(flash_model_probe):
    """torch's flash check refuses the symbolic (meta) tensors a build traces with; Keras then ran the whole call
    again on the device (on the H100, five warnings a layer and an eager forward pass of each row's model). On the
    CPU, on a GPU machine too: the probe's flash check answers as CUDA's would."""
    ran = flash_model_probe
    assert ran["forward"]["_scaled_dot_product_flash_attention_for_cpu"] == 2  # the count sees the attention
    assert ran["forward"]["mm"] > 0 and ran["forward"]["embedding"] > 0
    assert not {op for op in ran["built"] if op.startswith("_scaled_dot_product") or op in ("mm", "embedding")}


@pytest.mark.slow
def test_the_fused_kernels_evidence_is_taken_with_the_gradients_the_step_needs(flash_model_probe):
    """SDPA's dispatcher refuses some kernels to inputs that need gradients (on Hopper cuDNN's backward takes fewer
    head sizes than its forward): the forward pass that shows which kernel ran must ask as the training step asks,
    or it could name a kernel the step never runs."""
    assert flash_model_probe["evidence_inputs_need_grad"] == [True, True]  # the tiny GPT's two blocks
