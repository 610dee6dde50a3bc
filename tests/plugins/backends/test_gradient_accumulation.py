"""--grad-accum N: each step sums the gradients of N micro-batches and updates once. On both backends a step of two
micro-batches of 4 rows trains as one batch of 8 (loss for loss, float32), counts the whole batch's tokens and
says what it does; on JAX the micro-batches are a loop inside the compiled step. What cannot accumulate is refused
in one line before training."""

import json
import os

import numpy as np
import pytest

from conftest import (CPU_ONLY, REPOSITORY, assert_refused_in_one_line, device_kind, keras_on_jax, run_cli,
                      simulated_devices, tiny_jax_gpt)

# float32 on every machine (`--dtype auto` trains 16-bit on a GPU): the losses are compared at float32's tolerance.
RUN = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--steps", "6", "--timing-window", "1",
       "--measure-only", "--data", os.path.join(REPOSITORY, "README.md"), "--dtype", "float32"]


def train(backend, tmp_path, cache_dir, *arguments, env=None):
    out = tmp_path / f"{backend}-{'-'.join(arguments)}.json"
    proc = run_cli("train", "--backend", backend, *RUN, *arguments, "--cache-dir", cache_dir, "--out", str(out),
                   env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def one_device_batches_of_eight(tmp_path_factory, cache_dir):
    """{backend: the result of one device trained on batches of 8 rows}, made once for the accumulating runs on one
    CPU device and on several."""
    folder = tmp_path_factory.mktemp("whole")
    # On the CPU, as the simulated devices and gloo processes it is set beside (on a GPU machine too).
    return {backend: train(backend, folder, cache_dir, "--batch-size", "8", env=CPU_ONLY)
            for backend in ("jax", "torch")}


@pytest.mark.slow  # two training processes, and the module's two on the CPU
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_two_micro_batches_of_four_rows_train_as_one_batch_of_eight(backend, tmp_path, cache_dir,
                                                                    one_device_batches_of_eight):
    # Where the device is the CPU, the module's run on batches of 8 is this run's; a GPU trains its own.
    whole = (train(backend, tmp_path, cache_dir, "--batch-size", "8") if device_kind(backend) == "gpu"
             else one_device_batches_of_eight[backend])
    accumulated = train(backend, tmp_path, cache_dir, "--batch-size", "4", "--grad-accum", "2")
    np.testing.assert_allclose([h["loss"] for h in accumulated["history"]], [h["loss"] for h in whole["history"]],
                               rtol=1e-5)
    assert [h["tokens"] for h in accumulated["history"]] == [8 * 32] * 6  # the step's tokens, all of them
    assert "gradients of 2 micro-batches summed" in accumulated["train_step_detail"]
    assert accumulated["config"]["grad_accum"] == 2


@pytest.mark.slow  # a training process, or two launched by flags
@pytest.mark.parametrize("backend, extra", [("jax", "data-parallel"), ("torch", "ddp"), ("jax", "fsdp"),
                                            ("torch", "fsdp"), ("jax", "tensor-parallel"), ("torch", "tensor-parallel")])
def test_over_several_devices_and_processes_micro_batches_train_as_one_batch(backend, extra, tmp_path, cache_dir,
                                                                             one_device_batches_of_eight):
    """JAX on 2 simulated devices, torch over 2 gloo processes, each step two micro-batches of 4 global rows: the
    losses of one device trained on batches of 8. DDP averages the gradients once a step (with the last
    micro-batch); JAX's micro-batches are a loop inside its one program over both devices (data-parallel: each
    device sums its own, then one all-reduce, test_jax_flat_gradients.py); fsdp gathers and reduce-scatters for
    each micro-batch; tensor-parallel all-reduces each micro-batch's activations, as Megatron does: 4 a block."""
    from tests.plugins.extras.test_multi_process import launched_by_flags
    out = tmp_path / f"{backend}-{extra}.json"
    arguments = ["train", "--backend", backend, *RUN, "--batch-size", "4", "--grad-accum", "2", "--extra", extra,
                 "--cache-dir", cache_dir, "--out", str(out)]
    if backend == "jax":
        proc = run_cli(*arguments, env=simulated_devices(2))
        assert proc.returncode == 0, proc.stderr[-3000:]
    else:
        # Over gloo, on the CPU (two processes cannot each take a GPU of one). What the micro-batches do over the
        # processes is checked here, not how they were launched: by flags, without torchrun's agent (a third
        # process importing torch; test_multi_process.py launches by torchrun).
        launched_by_flags(*arguments)
    accumulated = json.loads(out.read_text())
    assert 2 in (accumulated["devices_used"], accumulated["processes"]["world_size"])
    assert [h["tokens"] for h in accumulated["history"]] == [8 * 32] * 6
    np.testing.assert_allclose([h["loss"] for h in accumulated["history"]],
                               [h["loss"] for h in one_device_batches_of_eight[backend]["history"]], rtol=1e-5)
    assert "gradients of 2 micro-batches summed" in accumulated["train_step_detail"]
    if extra in ("data-parallel", "ddp"):  # counted in the compiled program, or as torch's profiler saw it dispatched
        # The gradients all-reduced once a step on both, not once a micro-batch (DDP's no_sync: its one bucket;
        # JAX's devices each summing their own first: one flat buffer), beside the step's scalars: one all-reduce
        # on JAX, two on torch (the token count before the micro-batches, their loss and accuracy after them).
        record = accumulated["extras_record"][extra]
        expected = record["gradient_buckets"] + 2 if extra == "ddp" else 1 + 1
        assert record["collectives_per_step"] == {"all-reduce": expected}
    if (backend, extra) == ("jax", "fsdp"):
        # XLA hoists each unit's gathering out of the micro-batch loop (the weights do not change inside it) and
        # reduce-scatters each micro-batch's gradients, as torch's fsdp does (test_torch_accumulation.py): counted in
        # the compiled program, a loop's body as often as it runs (without micro-batches 3 and 3, test_fsdp.py).
        record = accumulated["extras_record"][extra]
        units = len(record["units"])
        assert units == 3 and record["collectives_per_step"]["all-gather"] == units
        assert record["collectives_per_step"]["reduce-scatter"] == 2 * units
        assert "3 units gathered once a step" in accumulated["train_step_detail"]
    if extra == "tensor-parallel":  # counted in the compiled program (its loop's body twice), or over gloo
        blocks, all_reduces_a_block = 2, 4
        assert accumulated["extras_record"][extra]["activation_all_reduces_per_step"] == 2 * blocks * all_reduces_a_block


def test_on_jax_the_micro_batches_are_a_loop_in_the_compiled_step():
    import re

    from mtbench.plugins.backends.jax_jit_step import JitTrainStep, accumulated_gradients
    model = tiny_jax_gpt(total_steps=10)
    ids = np.ones((8, 32), np.int32)
    weight = np.ones((8, 32), np.float32)
    plain = JitTrainStep(model).lowered_program((ids,), ids, weight)
    looped = JitTrainStep(model, gradients_of=accumulated_gradients(2)).lowered_program((ids,), ids, weight)
    assert "stablehlo.while" not in plain
    assert re.search(r"stablehlo\.while", looped)
    # The loop's body runs the model on 4 rows: its embedding lookup reads a (4, 32) block of ids.
    assert "tensor<4x32xi32>" in looped and "tensor<4x32xi32>" not in plain


@pytest.mark.parametrize("arguments, expected", [
    (["--grad-accum", "0"], "--grad-accum must be at least 1"),
    (["--grad-accum", "2", "--backend", "jax", "--extra", "pmap"],
     "runs with torch-compile, flash-attention, ddp, data-parallel, fsdp, tensor-parallel, remat only, not "
     "with --extra pmap (its collectives would run at every micro-batch)"),
    # The pipeline's reason is its own: it gave pmap's.
    (["--grad-accum", "2", "--backend", "jax", "--extra", "pipeline-parallel"],
     "not with --extra pipeline-parallel (the pipeline's micro-batches are its gradient accumulation: give "
     "--pipeline-micro-batches in its place)"),
])
def test_what_cannot_accumulate_is_refused_in_one_line(arguments, expected, tmp_path, cache_dir):
    proc = run_cli("train", *RUN, *arguments, "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"))
    assert_refused_in_one_line(proc, expected)
    assert not os.path.exists(tmp_path / "r.json")


def test_a_step_holds_its_micro_batches_rows_for_every_length_bucket():
    from mtbench.runner.config import TrainConfig
    assert TrainConfig(batch_size=12, grad_accum=40).rows_for(32) == 480  # nanoGPT's GPT-2 run: 12 x 40 rows
    assert TrainConfig(max_tokens=4096, grad_accum=2).rows_for(32) == 256  # two of 128 rows of 32 tokens


def test_a_loss_other_than_the_token_mean_is_refused_not_summed_wrongly():
    import dataclasses

    from mtbench import MtbenchError
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep, accumulated_gradients
    keras = keras_on_jax()
    model = build_gpt(dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32))
    model.compile(optimizer="adamw", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # a batch mean
    with pytest.raises(MtbenchError, match="is not the token-mean cross-entropy"):
        JitTrainStep(model, gradients_of=accumulated_gradients(2))
    JitTrainStep(model)  # one batch a step: any loss


def test_pmap_refuses_a_loss_other_than_the_token_mean_its_step_computes():
    import dataclasses
    import types

    from mtbench import MtbenchError
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS
    from mtbench.plugins.extras.jax_parallel import Pmap
    keras = keras_on_jax()
    model = build_gpt(dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32))
    model.compile(optimizer="adamw", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # a batch mean
    with pytest.raises(MtbenchError, match=r"^--extra pmap: the model's loss \(SparseCategoricalCrossentropy\) is not"):
        Pmap().make_train_step(types.SimpleNamespace(), model, None)
