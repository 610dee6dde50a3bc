"""No host waits inside a steady step (issue 29): the counters of tensors made from host data and of device values
read on the host (`torch_host_syncs`, `jax_host_syncs`) see what they should and nothing else, and the steps
mtbench trains with wait for nothing, on both backends, eager and compiled, float32 and mixed bfloat16, and torch's
float16 with its loss scaling (tests/host_syncs_probe.py: torch's in a process of its own, JAX's in this one, keras
on JAX). On a GPU the torch steps run under `torch.cuda.set_sync_debug_mode('error')` too, where any synchronising
call is an error."""

import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import TESTS_DIR, device_kind, json_answer, keras_dtype_policy_restored, keras_on_jax

PROBE = os.path.join(TESTS_DIR, "host_syncs_probe.py")


def torch_probe(dtypes):
    """The probe's report of each of the comma-separated `dtypes` (DTYPE[:OPTION], as the probe takes them) on
    torch, {dtype: report}, all run in one process."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(MTBENCH_LOAD_PLUGINS="", TORCHINDUCTOR_COMPILE_THREADS="1")
    proc = subprocess.run([sys.executable, PROBE, "torch", dtypes], capture_output=True, text=True, env=env,
                          timeout=900)
    return json_answer(proc)


TORCH_EAGER_DTYPES = ("float32", "mixed_float16", "mixed_bfloat16")
TORCH_COMPILED = "mixed_bfloat16:compiled"
# float16 weights: Keras's own update, slow on a CPU (10 s of the process's), run only for the test that reads it.
TORCH_KERAS_UPDATE = "float16"


@pytest.fixture(scope="module")
def torch_reports(request):
    """The torch eager step's report in each of TORCH_EAGER_DTYPES, and the compiled step's in mixed bfloat16
    (TORCH_COMPILED) and the eager step's in TORCH_KERAS_UPDATE where the session runs their tests, a new model and
    step each, in one process: each spares a process of its own, and a session without their tests (the quick
    tier) compiles and waits for nothing."""
    tested = {getattr(item, "function", None) for item in request.session.items}
    wanted = {TORCH_COMPILED: test_torch_compiled_step_waits_for_nothing,
              TORCH_KERAS_UPDATE: test_a_torch_step_that_waits_for_its_loss_scale_says_so}
    return torch_probe(",".join([*TORCH_EAGER_DTYPES, *(dtype for dtype, test in wanted.items() if test in tested)]))


# mixed_float16: loss scaling, kept on the device by the fused update (Keras's own apply reads the device each
# step: test_a_torch_step_that_waits_for_its_loss_scale_says_so).
@pytest.mark.parametrize("dtype", ["float32", "mixed_float16", pytest.param("mixed_bfloat16", marks=pytest.mark.slow)])
def test_torch_eager_step_waits_for_nothing(torch_reports, dtype):
    report = torch_reports[dtype]
    assert report["events"] == {}
    assert report["syncs_per_step"] == 0
    assert report["cuda_sync_debug"] in ("error", "no CUDA device")


@pytest.mark.slow
def test_a_torch_step_that_waits_for_its_loss_scale_says_so(torch_reports):
    """float16 weights leave the update to Keras's `optimizer.apply` (torch's fused AdamW would compute in float32),
    whose loss scaling branches in Python on whether the gradients are finite: a read of the device each step,
    counted at the update's call, which the step's description and update row name. In mixed float16 the fused
    update keeps the loss scale on the device: no wait, and neither says one."""
    import inspect

    from mtbench.plugins.backends.torch_eager_step import LOSS_SCALE_WAITS, EagerTorchTrainStep
    lines, first = inspect.getsourcelines(EagerTorchTrainStep.__call__)
    update_line = first + next(index for index, line in enumerate(lines) if "optimizer.apply(" in line)
    waiting, fused = torch_reports[TORCH_KERAS_UPDATE], torch_reports["mixed_float16"]
    assert waiting["syncs_per_step"] >= 1
    assert {what for what in waiting["events"] if what.startswith("read ")} == \
        {f"read aten._local_scalar_dense.default at torch_eager_step.py:{update_line} (__call__)"}
    assert waiting["description"].endswith(f"; {LOSS_SCALE_WAITS}")
    assert waiting["optimizer_update"].endswith(f"; {LOSS_SCALE_WAITS}")
    assert fused["syncs_per_step"] == 0
    assert LOSS_SCALE_WAITS not in fused["description"] + fused["optimizer_update"]


@pytest.mark.slow
def test_torch_compiled_step_waits_for_nothing(torch_reports):
    report = torch_reports[TORCH_COMPILED]
    assert report["events"] == {}
    assert report["syncs_per_step"] == 0


@pytest.fixture(scope="module")
def jax_reports():
    """The JAX step's report in mixed bfloat16 with mtbench's schedule, and in float32 with Keras's branching
    CosineDecay, a new model and step each, counted in this process (keras on JAX): a process of their own would
    import JAX, keras and mtbench first. Keras's dtype policy is put back afterwards."""
    from host_syncs_probe import reports
    keras_on_jax()
    with keras_dtype_policy_restored():
        return reports("jax", "mixed_bfloat16,float32:keras-schedule")


@pytest.mark.slow
def test_jax_step_waits_for_nothing(jax_reports):
    report = jax_reports["mixed_bfloat16"]
    assert report["events"] == {}
    assert report["syncs_per_step"] == 0


@pytest.mark.slow
def test_jax_counter_sees_the_conditionals_of_kerass_branching_schedule(jax_reports):
    """Keras's CosineDecay branches with `ops.cond`, and its AdamW reads the schedule once per decayed variable:
    XLA conditionals, each a host wait on a GPU (counted there; named on the CPU, where it is none). mtbench's
    schedule has none (the test above)."""
    report = jax_reports["float32:keras-schedule"]
    conditionals = report["events"].get("conditional in the compiled step (a host wait on a GPU)", 0)
    # One for each variable weight decay reads the rate for, one for the update's rate, in every counted step.
    assert conditionals == report["counted_steps"] * (report["variables"] + 1)
    # The CPU runs a conditional without waiting; a GPU's host reads each predicate.
    assert report["syncs_per_step"] == (0 if device_kind("jax") == "cpu" else report["variables"] + 1)


def test_the_conditionals_counted_are_those_that_branch_as_the_program_runs():
    """A `jax.lax.cond` on a value picks its branch as the program runs (on a GPU, after a wait for the device);
    `jax.lax.platform_dependent` picks its branch from the platform the program is lowered for, a case on a
    constant that XLA folds away."""
    from conftest import keras_on_jax
    keras_on_jax()
    import jax
    import jax.numpy as jnp

    from mtbench.plugins.backends.jax_host_syncs import runtime_conditionals

    def on_a_value(x):
        return jax.lax.cond(jnp.sum(x) > 0, jnp.sin, jnp.cos, x)

    def on_the_platform(x):
        return jax.lax.platform_dependent(x, cpu=jnp.sin, default=jnp.cos)

    def both(x):
        return on_a_value(on_the_platform(x)) + jax.jit(on_a_value)(x)  # the second in a function of its own

    x = jnp.ones(3)
    for function, branching in ((on_a_value, 1), (on_the_platform, 0), (both, 2)):
        for platform in ("cpu", "cuda"):
            program = jax.jit(function).trace(x).lower(lowering_platforms=(platform,)).as_text()
            assert runtime_conditionals(program) == branching, (function.__name__, platform)


def test_the_loops_counted_are_those_that_end_on_a_value_the_program_computes():
    """A `while_loop` on a value goes round again after XLA reads its condition (on a GPU, on the host, after a wait
    for the device); `fori_loop` and `scan` of a static length count to a constant, a trip count XLA knows when it
    compiles. mtbench's step accumulating gradients over micro-batches loops so."""
    from conftest import keras_on_jax
    keras_on_jax()
    import jax
    import jax.numpy as jnp

    from mtbench.plugins.backends.jax_host_syncs import runtime_loops

    def until_large(x):
        return jax.lax.while_loop(lambda c: jnp.sum(c) < 100, lambda c: c * 2, x)

    def four_times(x):
        return jax.lax.fori_loop(0, 4, lambda i, c: c * 2, x)

    def scanned(x):
        return jax.lax.scan(lambda c, row: (c + row, None), x, jnp.ones((5, 3)))[0]

    def counting_down_to_a_value(x):
        return jax.lax.while_loop(lambda c: c[0] > jnp.sum(x), lambda c: (c[0] - 1, c[1] * 2), (10, x))[1]

    def all_of_them(x):
        return until_large(four_times(scanned(x))) + counting_down_to_a_value(x) + jax.jit(until_large)(x)

    x = jnp.ones(3)
    for function, deciding in ((until_large, 1), (four_times, 0), (scanned, 0), (counting_down_to_a_value, 1),
                               (all_of_them, 3)):
        for platform in ("cpu", "cuda"):
            program = jax.jit(function).trace(x).lower(lowering_platforms=(platform,)).as_text()
            assert program.count("stablehlo.while") >= 1 and runtime_loops(program) == deciding, \
                (function.__name__, platform)
    accumulating = accumulating_step_program()
    assert "stablehlo.while" in accumulating and runtime_loops(accumulating) == 0


def accumulating_step_program(micro_batches=2):
    """The StableHLO of mtbench's JAX step on the tiny Transformer, summing the gradients of `micro_batches`."""
    import keras

    from host_syncs_probe import batch
    from mtbench.keras_models.initialization import assign_weights, initial_weights
    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep, accumulated_gradients
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model
    model = build_transformer(PRESETS["tiny"])
    assign_weights(model, initial_weights(model, 0))
    compile_model(keras, model, TrainConfig(preset="tiny", dtype="float32", grad_accum=micro_batches), 20, {})
    step = JitTrainStep(model, None, gradients_of=accumulated_gradients(micro_batches))
    return step.lowered_program(*batch(0))


def torch_counter():
    from mtbench.plugins.backends.torch_host_syncs import TorchHostSyncCounter
    return TorchHostSyncCounter("cpu")


def test_torch_counter_counts_tensors_from_host_data_and_reads():
    import torch
    counter = torch_counter()
    x = torch.arange(6.0)
    with counter.counting():
        torch.tensor(2.0)                       # from a Python number: a host copy on a GPU
        torch.as_tensor(np.ones(3))             # from a host array that is not the batch's
        float(x.sum())                          # a read
        bool(x[0] > 0)                          # a read
        torch.nonzero(x)                        # a size that depends on the values
        # A tensor's own reads to the host: a copy on a GPU, nothing dispatched on the CPU (counted where called).
        x.tolist()
        y = x * 2
        y.cpu().numpy()                         # one read: the copy (numpy takes the host's copy)
        y.cpu().tolist()                        # y was copied already
    kinds = sorted(event.split()[0] for event in counter.events.elements())
    assert kinds == ["from", "from", *["read"] * 5]
    assert counter.syncs == 7
    assert sorted(event.split(" at ")[0] for event in counter.events if "Tensor." in event) == [
        "read Tensor.cpu", "read Tensor.tolist"]
    assert any("test_host_syncs.py" in event for event in counter.events)  # where it came from
    # Outside the counting the tensor's methods are torch's own again.
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and counter.syncs == 7
    assert all(name not in torch.Tensor.__dict__ for name in ("cpu", "tolist"))


def test_torch_counter_lets_kernels_with_number_arguments_and_the_batch_pass():
    import torch
    counter = torch_counter()
    batch = np.arange(8, dtype=np.int32).reshape(2, 4)

    def step(x, y, sample_weight):
        tensor = torch.from_numpy(x[0])         # the batch's own array: copied once a step, exempt
        ids = tensor * 2.0 + 1                  # numbers as kernel arguments
        mask = ids != 0
        filled = torch.full((), -1e9) + torch.arange(4) + torch.zeros(2, 4)
        return {"loss": (filled * mask).sum()}

    counter.count_step(step, (batch, batch), batch, batch.astype(np.float32))
    counter.count_step(step, (batch, batch), batch, batch.astype(np.float32))
    assert counter.events == {}
    assert (counter.steps, counter.per_step()) == (2, 0)


def test_jax_counter_counts_implicit_transfers_and_reads_but_not_the_batch():
    import jax
    import jax.numpy as jnp

    from mtbench.plugins.backends.jax_host_syncs import JaxHostSyncCounter
    jitted = jax.jit(lambda a, b, w: {"loss": jnp.sum((a + b) * w)})
    batch = np.ones((2, 4), np.int32), np.ones((2, 4), np.int32)
    weight = np.ones((2, 4), np.float32)

    def clean(x, y, w):
        return jitted(x[0], y, w)

    def waiting(x, y, w):
        logs = jitted(x[0], y, w)
        jnp.asarray(np.ones(3, np.float32)) + 1         # a host array sent implicitly
        float(logs["loss"])                             # and a read
        return logs

    counter = JaxHostSyncCounter()
    assert counter.can_count
    clean(batch, batch[1], weight)
    counter.count_step(clean, batch, batch[1], weight)
    assert (counter.events, counter.per_step()) == ({}, 0)
    waiting(batch, batch[1], weight)
    counter.count_step(waiting, batch, batch[1], weight)
    assert counter.syncs >= 2 and any(event.startswith("read") for event in counter.events), counter.events
    assert counter.per_step() == counter.syncs / 2


def test_the_guards_lines_name_an_arrays_aval_as_the_batch_does():
    """Under jax.distributed the guard names each transfer's aval: a 2-D batch array's comma must not cut it (it
    read 'int32[64', matched no batch array, and counted every batch copy as a host wait)."""
    from mtbench.plugins.backends.jax_host_syncs import _aval, guarded_transfers
    text = ("2026 host-to-device transfer: aval=ShapedArray(int32[64,32]), dst_sharding=...\n"
            "host-to-device transfer: aval=ShapedArray(float32[], weak_type=True), dst_sharding=...\n"
            "device-to-host transfer: aval=ShapedArray(float32[64,32,256])\nhost-to-device transfer: \n")
    assert guarded_transfers(text) == [("host-to-device", "int32[64,32]"), ("host-to-device", "float32[]"),
                                       ("device-to-host", "float32[64,32,256]"), ("host-to-device", "")]
    assert _aval(np.zeros((64, 32), np.int32)) == "int32[64,32]"


def test_cosine_decay_in_numpy_is_keras_schedule():
    import keras

    from mtbench.keras_models.schedules import cosine_decay
    schedules = [keras.optimizers.schedules.CosineDecay(0.0, 90, alpha=0.1, warmup_target=3e-3, warmup_steps=10),
                 keras.optimizers.schedules.CosineDecay(1e-3, 50, alpha=0.0)]
    for schedule in schedules:
        steps = list(range(0, 120, 3)) + [9, 10, 11, 99, 100, 101]
        ours = [float(cosine_decay(schedule, step)) for step in steps]
        theirs = [float(keras.ops.convert_to_numpy(schedule(step))) for step in steps]
        # atol: near the end of a decay to 0, 1 + cos cancels, and a GPU's cos may differ from numpy's by an ulp
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7 * 3e-3)


def test_keras_large_negative_filled_on_the_device_is_keras_own_value():
    from keras.src.backend.torch import nn

    from mtbench.plugins.backends.torch_host_syncs import _large_negative_on_device, keras_constants_on_device
    for dtype in ("float32", "bfloat16", "float16"):
        keras_value, ours = nn._get_large_negative(dtype), _large_negative_on_device(dtype)
        assert (ours.dtype, ours.device, ours.item()) == (keras_value.dtype, keras_value.device, keras_value.item())
    keras_function = nn._get_large_negative
    with keras_constants_on_device():
        assert nn._get_large_negative is _large_negative_on_device
    assert nn._get_large_negative is keras_function


def test_own_losses_are_model_losses():
    """The torch step lists the layers and regularized weights once; it finds what `model.losses` walks for."""
    import keras

    from mtbench.plugins.backends.torch_eager_step import OwnLosses

    class Penalised(keras.layers.Layer):
        def call(self, x):
            self.add_loss(0.5 * keras.ops.sum(x))
            return x

    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.1))(Penalised()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(outputs))
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model(np.ones((2, 3), np.float32))
    own = OwnLosses(model)()
    assert len(own) == len(model.losses) == 2
    np.testing.assert_allclose(sorted(float(loss) for loss in own), sorted(float(loss) for loss in model.losses))
    assert OwnLosses(plain)() == plain.losses == []
