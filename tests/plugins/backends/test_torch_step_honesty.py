"""What the torch steps do that a comparison could hide: how a batch reaches the device (no host wait, on CUDA a
pinned, non-blocking copy) and a compiled step that says when a shape ran eagerly or CUDA graphs did not run."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import CPU_ONLY, json_answer, run_cli

import torch

from mtbench.plugins.backends.rounding_16_bit import EAGER_ROUNDING, NO_16_BIT  # noqa: E402
from mtbench.plugins.backends.torch_compiled_step import (PRECISION_CASTS, PRECISION_CASTS_NOT_IN_CPP,  # noqa: E402
                                                          cpp_kernels_round)
from mtbench.plugins.backends.torch_eager_step import to_device  # noqa: E402


def test_on_the_cpu_a_batch_is_the_arrays_own_memory():
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    tensor = to_device(array, "cpu")
    assert tensor.dtype == torch.int32 and np.shares_memory(tensor.numpy(), array)


class CopiesSeen:
    """Every `aten._to_copy` that ran inside it, as (source, non_blocking, result), and the tensors pinning made.
    Where torch has no accelerator, pinning is stood in for: `aten._pin_memory` returns a copy, remembered as
    pinned memory (torch cannot pin memory without one)."""

    def __init__(self, stand_in_pinning):
        from torch.utils._python_dispatch import TorchDispatchMode
        seen = self
        self.copies, self.pinned = [], []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if stand_in_pinning and func is torch.ops.aten._pin_memory.default:
                    out = args[0].clone()
                else:
                    out = func(*args, **kwargs)
                if func is torch.ops.aten._pin_memory.default:
                    seen.pinned.append(out)
                elif func is torch.ops.aten._to_copy.default:
                    seen.copies.append((args[0], kwargs.get("non_blocking", False), out))
                return out

        self.mode = Mode()

    def was_pinned(self, tensor):
        return any(tensor is pinned for pinned in self.pinned) or tensor.is_pinned()


# Off the CPU every device takes the same path; the meta device stands in for CUDA where there is none.
DEVICES = ["meta", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
def test_off_the_cpu_a_batch_is_copied_once_from_pinned_memory_without_waiting(device):
    array = np.arange(12, dtype=np.int32).reshape(3, 4)
    seen = CopiesSeen(stand_in_pinning=device == "meta")
    with seen.mode:
        tensor = to_device(array, device)
    (source, non_blocking, result), = seen.copies  # one copy to the device, after the pinning
    assert result is tensor and tensor.device.type == device and tensor.dtype == torch.int32
    assert seen.was_pinned(source) and np.array_equal(source.cpu().numpy(), array)
    assert non_blocking


@pytest.mark.parametrize("device", DEVICES)
def test_a_batch_already_a_tensor_is_copied_without_waiting(device):
    host = torch.arange(6.0).reshape(2, 3)  # a wrapping step's tensor
    seen = CopiesSeen(stand_in_pinning=device == "meta")
    with seen.mode:
        tensor = to_device(host, device)
    (source, non_blocking, result), = seen.copies
    assert source is host and result is tensor and tensor.device.type == device and non_blocking


# One process for every probed step (each process spends about 10 s importing torch, Keras and mtbench): the tiny
# GPT's update runs first, eager before compiled (an mtbench process builds one train step, and a compiled step's
# settings, inductor's precision casts and dynamo's marks on Keras's helpers, stay in the process after it); then the
# tiny Transformer held to the fused attention (a process-wide setting, hence after the GPT's runs), one compiled
# step for the flash kernels and then dynamo's recompile limit. Dynamo's graphs and counters are reset before it:
# they count on the step's compiled code, which every step shares.
STEPS_PROBE = textwrap.dedent("""
    import collections, json, os, sys
    os.environ["KERAS_BACKEND"] = "torch"
    import keras, numpy as np, torch
    from torch._dynamo.utils import counters
    from torch.profiler import profile
    from benchmarks.inductor_cost import fused_attention_here
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS, PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
    from mtbench.plugins.backends.torch_eager_step import EagerTorchTrainStep
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model
    torch_default_limit = torch._dynamo.config.recompile_limit

    def update(dtype, kind):  # bfloat16: 16-bit weights; the compiled or the eager step
        keras.config.set_dtype_policy(dtype)
        model = build_gpt(GPT_PRESETS["tiny"])
        compile_model(keras, model, TrainConfig(model_name="gpt", preset="tiny", dtype=dtype), 10, {})
        step = (CompiledTorchTrainStep if kind == "compiled" else EagerTorchTrainStep)(model)
        ids = np.ones((2, 16), np.int32)
        step((ids,), ids, np.ones((2, 16), np.float32))
        with profile() as trace:
            step((ids,), ids, np.ones((2, 16), np.float32))
        names = [event.name for event in trace.events()]
        fused = [name for name in names if "fused_adam" in name]
        return {"compiled": getattr(step, "compiled_part", None), "numerics": step.numerics(),
                "fused_kernels": {name: fused.count(name) for name in fused},
                "layer_norms": names.count("aten::native_layer_norm")}

    def flash_and_limit(model):
        # One compiled step for both reports: the fused attention's program, profiled at its second step, then a
        # second shape past a recompile limit of 1 (mode reduce-overhead, whose CUDA graphs a CPU cannot run: the
        # same program as the default mode's here).
        torch._dynamo.config.recompile_limit = torch_default_limit  # what the step raises, not an earlier step
        step = CompiledTorchTrainStep(model, mode="reduce-overhead")
        limit_after_init = torch._dynamo.config.recompile_limit
        torch._dynamo.config.recompile_limit = 1  # as torch's default of 8 would be for a model of 9 buckets
        try:
            ids = np.ones((4, 16), np.int32)
            step((ids, ids), ids, np.ones((4, 16), np.float32))
            with profile() as trace:
                step((ids, ids), ids, np.ones((4, 16), np.float32))
            ran = collections.Counter(event.name for event in trace.events() if "attention" in event.name)
            flash = {"ran": ran, "graph_breaks": sum(counters["graph_break"].values()),
                     "attentions": len(model.encoder_blocks) + 2 * len(model.decoder_blocks)}
            ids = np.ones((4, 32), np.int32)
            step((ids, ids), ids, np.ones((4, 32), np.float32))
        finally:
            torch._dynamo.config.recompile_limit = limit_after_init
        return flash, {"limit_after_init": limit_after_init, "eager": step.shapes_run_eagerly(),
                       "cuda_graphs": step.cuda_graphs(), "description": step.description()}

    reports = {}
    for run in sys.argv[1:]:
        if run == "flash-and-limit":  # the fused-attention Transformer
            keras.config.set_dtype_policy("float32")
            fused_attention_here()  # as under --extra flash-attention: fused kernels only, Keras's CUDA-only
            # check answered. As the extra builds it on torch: flash for the causal attention, the masked ones
            # left to the fused kernels the backend holds the process to.
            model = build_transformer(PRESETS["tiny"], flash_attention=True, flash_attention_masked=None)
            compile_model(keras, model, TrainConfig(preset="tiny"), 10, {})
            torch._dynamo.reset()  # dynamo's graphs and counters: the GPT's compiled steps' before
            reports["flash"], reports["limit"] = flash_and_limit(model)
        else:
            reports[run] = update(*run.split("-"))
    print(json.dumps(reports))
""")

# The eager steps first (see STEPS_PROBE); the fused-attention steps after the GPT's.
UPDATE_RUNS = ("float32-eager", "bfloat16-eager", "bfloat16-compiled", "float32-compiled")
STEP_RUNS = (*UPDATE_RUNS, "flash-and-limit")


@pytest.fixture(scope="module")
def steps_probed():
    """What the steps probe reports of each of STEP_RUNS, all in one process: for "dtype-kind", one profiled step
    of the tiny GPT (the eager or the compiled torch step in that dtype, a new model and step each); then the tiny
    Transformer held to the fused attention, its compiled step (mode reduce-overhead) with dynamo's recompile limit
    at 1: "flash", its second step profiled; "limit", a second shape trained after."""
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", **CPU_ONLY}  # CPU_ONLY: the CPU's flash kernel
    env.pop("KERAS_BACKEND", None)
    proc = subprocess.run([sys.executable, "-c", STEPS_PROBE, *STEP_RUNS], capture_output=True, text=True,
                          env=env, timeout=600)
    return json_answer(proc)


@pytest.fixture(scope="module")
def updates(steps_probed):
    """The update runs of the steps probe (UPDATE_RUNS): "dtype-kind", the tiny GPT's eager or compiled torch step
    in that dtype."""
    return {run: steps_probed[run] for run in UPDATE_RUNS}


@pytest.mark.slow
def test_a_shape_past_dynamos_limit_is_named_not_hidden(steps_probed):
    report = steps_probed["limit"]
    assert report["limit_after_init"] >= 64  # raised by the step: every bucket of any preset compiles
    assert report["eager"] == 1
    # reduce-overhead asked for CUDA graphs; on this CPU none ran, and the label says so.
    assert report["cuda_graphs"] == "not used: no CUDA device (CUDA graphs need one)"
    assert report["description"] == ("mode reduce-overhead, CUDA graphs: not used: no CUDA device (CUDA graphs "
                                     "need one), 1 of 2 shapes ran eagerly")


@pytest.mark.slow
def test_the_compiled_step_runs_the_fused_attention_in_one_graph(steps_probed):
    """torch-compile with flash-attention: the compiled program runs the flash kernel (its CPU form here) for every
    attention, forward and backward, and Keras's flash check no longer breaks the graph at each attention."""
    report = steps_probed["flash"]
    attentions = report["attentions"]
    assert report["ran"] == {"aten::_scaled_dot_product_flash_attention_for_cpu": attentions,
                             "aten::_scaled_dot_product_flash_attention_for_cpu_backward": attentions}
    assert report["graph_breaks"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("dtype, fused_kernels, compiled", [
    ("bfloat16", {}, "mtbench torch step: forward + loss (backward via AOTAutograd); update eager by Keras's "
                     "optimizer.apply (bfloat16 weights, which Keras's AdamW updates in bfloat16 as on JAX, in its torch "
                     "form: m*beta_1 + g*(1-beta_1) where JAX's is m + (g-m)*(1-beta_1), rounded otherwise)"),
    ("float32", {"aten::_fused_adamw_": 2}, None),  # a call a group: weights that decay, biases and norms that do not
])
def test_the_compiled_steps_record_names_the_update_that_ran(updates, dtype, fused_kernels, compiled):
    """With 16-bit weights torch's fused AdamW is refused and Keras's optimizer.apply updates them: no fused
    kernel runs, and what the torch-compile record says is compiled and what runs eagerly says so (it said
    'fused AdamW update eager' whatever ran). With float32 weights the fused update runs."""
    report = updates[f"{dtype}-compiled"]
    assert report["fused_kernels"] == fused_kernels
    if compiled is None:
        assert "fused AdamW update eager" in report["compiled"], report["compiled"]
    else:
        assert report["compiled"] == compiled


@pytest.mark.slow
def test_the_eager_steps_numerics_name_the_kernels_its_step_ran(updates):
    """The layer-norm and update rows of a torch run count what its step ran (torch's profiler, one step): a
    `layer_norm` kernel call for each norm it names, and one fused AdamW call a parameter group; with 16-bit
    weights no fused call, and the row says Keras's `apply` updated them, and why."""
    report = {dtype: updates[f"{dtype}-eager"] for dtype in ("float32", "bfloat16")}
    for dtype, ran in report.items():
        norms = ran["layer_norms"]
        assert norms >= 3, ran  # a block's two and the final one, at least
        assert ran["numerics"]["layer_norm"] == \
            f"Welford's one pass, in float32 (torch's layer_norm; {norms} of {norms} layer norms)"
    assert report["float32"]["fused_kernels"] == {"aten::_fused_adamw_": 2}
    assert report["float32"]["numerics"]["optimizer_update"] == \
        "Keras's AdamW by torch's fused AdamW kernel, 2 calls a step (one a parameter group)"
    assert report["float32"]["numerics"]["rounding_16_bit"] == NO_16_BIT
    assert report["bfloat16"]["numerics"]["rounding_16_bit"] == EAGER_ROUNDING
    assert report["bfloat16"]["fused_kernels"] == {}
    assert report["bfloat16"]["numerics"]["optimizer_update"] == (
        "Keras's AdamW (`optimizer.apply`), eager: bfloat16 weights, which Keras's AdamW updates in bfloat16 as on "
        "JAX, in its torch form: m*beta_1 + g*(1-beta_1) where JAX's is m + (g-m)*(1-beta_1), rounded otherwise")


def test_the_symbolic_check_finds_a_keras_tensor_wherever_keras_would():
    # Keras's own check flattens every list, tuple, deque and dict; the plain calls' walk must find what it finds.
    import collections

    import keras
    from keras.src.backend.common.keras_tensor import any_symbolic_tensors

    from mtbench.plugins.backends.torch_plain_calls import any_keras_tensor
    symbolic, tensor = keras.KerasTensor((2, 3)), torch.zeros(2, 3)
    cases = [((tensor, 1, None, "float32"), {}), ((tensor, (2, 3)), {"dtype": "float32"}), ((), {}), (None, None),
             ((symbolic,), {}), ((tensor, [1, {"a": (symbolic,)}]), {}), ((), {"x": collections.deque([symbolic])}),
             (((tensor, (tensor,)),), {"training": True})]
    assert [any_keras_tensor(args, kwargs) for args, kwargs in cases] == \
        [False, False, False, False, True, True, True, False]
    assert [any_symbolic_tensors(args, kwargs) for args, kwargs in cases] == \
        [False, False, False, False, True, True, True, False]


@pytest.mark.slow
def test_the_compiled_step_rounds_16_bit_values_where_the_eager_step_does(tmp_path, cache_dir):
    """In mixed_bfloat16 the compiled step's losses are the eager step's, step for step from the same weights: the
    arithmetic is Keras's, not inductor's float32 between fused operations (which left the eager losses by 8e-4 at
    the third step of this run with three products for the query, key and value, and a GPT-2 small's by 0.5 % on
    an H100)."""
    losses, rows = {}, {}
    for way in ("eager", "compiled"):
        out = tmp_path / f"{way}.json"
        proc = run_cli("train", "--backend", "torch", *(["--extra", "torch-compile"] if way == "compiled" else []),
                       "--model", "gpt", "--preset", "tiny", "--steps", "4", "--batch-size", "8", "--dtype",
                       "mixed_bfloat16", "--measure-only", "--cache-dir", cache_dir, "--out", str(out), env=CPU_ONLY)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(out.read_text())
        losses[way] = [h["loss"] for h in result["history"]]
        rows[way] = result["train_step_numerics"]["rounding_16_bit"]
    casts = result["extras_record"]["torch-compile"]["precision_casts"]
    assert casts.startswith("16-bit intermediates rounded")
    # The row beside the figures says what the record says, and the eager step's that it rounds every result.
    assert rows == {"eager": EAGER_ROUNDING, "compiled": casts}
    assert len(losses["compiled"]) == 4
    if cpp_kernels_round():
        assert casts == PRECISION_CASTS
        # The first step's loss is the forward pass of the same weights: rounded where the eager step rounds, it is
        # the eager loss to float32's last digits (without the casts 1.4e-4 apart in this run). Later steps add the
        # backward pass, whose matmuls and reductions sum in another order, which the CPU's vector width decides: on
        # an AVX-512 EPYC 2e-4 apart at the third step and 4e-4 at the fourth with the casts, 1.2e-3 at the third
        # without them.
        assert losses["compiled"][0] == pytest.approx(losses["eager"][0], rel=2e-6)
        assert losses["compiled"] == pytest.approx(losses["eager"], rel=6e-4)
    else:
        # Before torch 2.13 its C++ kernels keep 16-bit values in float32 (torch 2.11: 2.5e-5 apart at the first
        # step, 1.1e-3 at the third), and the record says so.
        assert casts == PRECISION_CASTS_NOT_IN_CPP
        assert losses["compiled"][0] != pytest.approx(losses["eager"][0], rel=2e-6)
