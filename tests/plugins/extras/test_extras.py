"""Built-in extras: availability with its reason, the effect each has, and its record in the result JSON."""

import json
import re
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import (COMPARE_STEPS, CPU_ONLY, ONE_BUCKET, TESTS_DIR, TINY_COMPARE, TINY_TRAIN, cpu_machine_only,
                      device_kind, json_answer, run_cli, simulated_devices)
from mtbench.plugins.extras.flash_attention import (JAX_KERNEL_PATTERN, TORCH_KERNEL_PATTERN, FlashAttention,
                                                    kernel_calls, kernel_evidence)
from mtbench.figures import run_warnings

TWO_DEVICES = simulated_devices(2)
SHORT = [*TINY_TRAIN, "--steps", "20"]


def train(tmp_path, name, cache_dir, *args, env=None, flags=SHORT):
    out = str(tmp_path / f"{name}.json")
    proc = run_cli("train", *flags, "--cache-dir", cache_dir, "--out", out, *args, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(out) as f:
        return json.load(f)


def losses(result):
    return np.array([h["loss"] for h in result["history"]])


@pytest.mark.parametrize("args, env, message", [
    pytest.param(["--backend", "jax", "--extra", "flash-attention"], None,
                 "extra 'flash-attention' cannot run here: needs a GPU (or TPU) and float16/bfloat16; this run "
                 "has cpu/float32", marks=cpu_machine_only),
    pytest.param(["--backend", "torch", "--extra", "flash-attention", "--dtype", "mixed_bfloat16"], None,
                 "extra 'flash-attention' cannot run here: needs a GPU (or TPU); this run is on the cpu",
                 marks=cpu_machine_only),
    (["--backend", "jax", "--extra", "pmap"], CPU_ONLY,
     "extra 'pmap' cannot run here: needs at least 2 devices; this run has 1"),
    (["--backend", "jax", "--extra", "data-parallel"], CPU_ONLY,
     "extra 'data-parallel' cannot run here: needs at least 2 devices"),
    (["--backend", "jax", "--extra", "data-parallel", "--batch-size", "33"], TWO_DEVICES,
     "extra 'data-parallel' cannot run here: the batch size 33 does not split evenly over 2 devices"),
    (["--backend", "jax", "--extra", "pmap", "--dtype", "mixed_float16"], TWO_DEVICES,
     "--dtype mixed_float16: XLA on the CPU has no float16 matmul"),
    (["--backend", "jax", "--extra", "tpu"], CPU_ONLY,
     "extra 'tpu' cannot run here: needs TPU devices; this run has 1 cpu device(s)"),
    (["--backend", "jax", "--extra", "pmap", "--extra", "data-parallel"], TWO_DEVICES,
     "extra 'pmap' cannot run together with 'data-parallel'"),
    (["--backend", "jax", "--extra", "torch-compile"], None, "extra 'torch-compile' serves the torch backend(s), not 'jax'"),
])
def test_unavailable_extra_stops_the_run_with_its_reason(tmp_path, cache_dir, args, env, message):
    proc = run_cli("train", *TINY_TRAIN, "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"), *args, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("Error: " + message), proc.stderr
    assert not (tmp_path / "r.json").exists()


@cpu_machine_only  # torch's flash attention is available on a GPU
def test_plugins_command_reports_availability_with_reasons():
    proc = run_cli("plugins", "--json", env=TWO_DEVICES)
    rows = {(r["extra"], r["backend"]): r for r in json.loads(proc.stdout)["extras"]}
    assert rows[("torch-compile", "torch")]["available"]
    assert rows[("pmap", "jax")]["available"] and rows[("data-parallel", "jax")]["available"]
    assert not rows[("tpu", "jax")]["available"] and "TPU devices" in rows[("tpu", "jax")]["reason"]
    assert "cpu/float32" in rows[("flash-attention", "torch")]["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["pmap", "data-parallel"])
def test_data_parallel_loss_equals_single_device_loss(tmp_path, cache_dir, cpu_compared_runs, jax_data_parallel_run,
                                                      extra):
    """The session's one-device JAX run of TINY_COMPARE (one length bucket: one train program a run) beside the
    same on two simulated devices, pmap's and the data-parallel run that test_fsdp.py also reads."""
    single_device = cpu_compared_runs["jax"]["result"]
    if extra == "data-parallel":
        result = jax_data_parallel_run["result"]
    else:
        result = train(tmp_path, extra, cache_dir, "--backend", "jax", "--extra", extra, env=TWO_DEVICES,
                       flags=TINY_COMPARE)
    assert result["extras"] == [extra]
    assert result["extras_record"][extra]["devices"] == 2
    assert result["extras_record"][extra]["per_device_batch"] == 16
    # torch+ddp@2 trains the same way: a comparison holds the two against each other (`same_way_of_training`).
    assert (result["way_of_training"], result["devices_used"]) == ({"parallelism": ["data"], "extras": []}, 2)
    assert single_device["way_of_training"] == {"parallelism": [], "extras": []}
    # mtbench's own step under both: pmap's, and the one-device jit step over the distribution's mesh (not
    # Keras's train_on_batch), with the step's own loss.
    assert result["train_step"] == {"pmap": "jax-pmap", "data-parallel": "jax-jit-stateless"}[extra]
    if extra == "data-parallel":
        assert result["train_step_detail"] == "DataParallel over a mesh of 2 batch, gradients summed as one flat buffer"
    # What each compiled step ran, counted in its program: the data-parallel step's one all-reduce of the flat
    # gradient buffer and one of the batch's token count; pmap's psum of each of the 48 gradients (the tiny
    # Transformer's weights, as test_fsdp_collectives.py counts them), the loss, the correct tokens and the token count.
    assert result["extras_record"][extra]["collectives_per_step"] == \
        {"all-reduce": {"data-parallel": 2, "pmap": 48 + 3}[extra]}
    assert len(losses(result)) == COMPARE_STEPS
    # Each device's norms in the one pass and Keras's update inside the program, as on one device.
    assert result["train_step_numerics"] == single_device["train_step_numerics"]
    np.testing.assert_allclose(losses(result), losses(single_device), rtol=1e-5)
    assert result["metrics"]["val_loss"] == pytest.approx(single_device["metrics"]["val_loss"], rel=1e-5)


@pytest.mark.slow
def test_pmap_drops_each_devices_rows_with_masks_of_its_own_as_data_parallel_does(tmp_path, cache_dir):
    """With dropout, each device of a data-parallel step draws its masks from a stream of its own (the seeds moved
    on by its index; device 0's are the seeds' own), on both of JAX's ways: pmap's devices and the jit step's
    shards draw the same masks for the same rows, so the two train loss for loss. pmap copied the seeds to every
    device alike (every loss parted, by up to 0.15 % in 12 steps)."""
    # --measure-only: the training losses are what is compared; the evaluation after training would add nothing.
    gpt = ["--model", "gpt", "--preset", "tiny", "--block-size", "32", "--batch-size", "8", "--valid-size", "10",
           "--test-size", "10", "--steps", "12", "--dropout", "0.3", "--measure-only"]
    runs = {extra: train(tmp_path, extra, cache_dir, "--backend", "jax", "--extra", extra, env=TWO_DEVICES,
                         flags=gpt) for extra in ("pmap", "data-parallel")}
    assert [runs[extra]["model"]["attention"]["arithmetic"]["probability_dropout"] for extra in runs] == [0.3, 0.3]
    np.testing.assert_allclose(losses(runs["pmap"]), losses(runs["data-parallel"]), rtol=1e-5)
    # The masks were drawn: without dropout the same run trains other losses (0.4 % apart at the first step).
    kept = train(tmp_path, "kept", cache_dir, "--backend", "jax", "--extra", "data-parallel", env=TWO_DEVICES,
                 flags=[*gpt, "--dropout", "0"])
    assert max(abs(np.array(losses(kept)) / np.array(losses(runs["data-parallel"])) - 1)) > 1e-3


@pytest.mark.slow
def test_pmap_holds_one_copy_of_the_state_on_device_zero():
    """Bytes of live arrays on device 0 of two simulated devices (tests/pmap_memory_probe.py): the model and
    optimizer state alone, then with the pmap step trained and finalized. It held the Keras variables and pmap's
    replicated state beside them (2.3x the state after two steps, 3.3x as the step was made)."""
    env = {**os.environ, "KERAS_BACKEND": "jax", **TWO_DEVICES}
    proc = subprocess.run([sys.executable, os.path.join(TESTS_DIR, "pmap_memory_probe.py")], capture_output=True,
                          text=True, env=env, check=False)
    held = json_answer(proc)
    assert held["trained"] <= held["state"] * 1.01 and held["finalized"] <= held["state"] * 1.01
    assert np.isfinite(held["losses"]).all()


@pytest.mark.slow
def test_torch_compile_compiles_mtbench_step_without_graph_breaks_and_trains_like_eager(tmp_path, cache_dir, tiny_runs):
    # The session's eager torch run is the reference: the compiled run trains with its flags, so it takes the same
    # batches from the same weights (a second eager run of its own cost about 25 s; the 40 extra compiled steps
    # about 2 s).
    # --step compiled: the extra joins the run (as --step auto joins it on a CUDA GPU), and is what ran.
    # --measure-only: the extra's record and the losses are written before the evaluation, which it would only
    # lengthen (the same data and weights either way).
    compiled = train(tmp_path, "compiled", cache_dir, "--backend", "torch", "--step", "compiled", "--measure-only",
                     flags=TINY_TRAIN)
    eager = tiny_runs["torch"]["result"]
    record = compiled["extras_record"]["torch-compile"]
    assert compiled["train_step"] == "torch-compiled" and eager["train_step"] == "torch-eager"
    assert (compiled["extras"], compiled["config"]["extras"]) == (["torch-compile"], ["torch-compile"])
    # torch's own way of running its step: a compiled torch run trains as JAX's jit step does, held against it.
    assert compiled["way_of_training"] == eager["way_of_training"] == {"parallelism": [], "extras": []}
    assert compiled["train_step_chosen"] == {"asked": "compiled", "by_extra": "torch-compile"}
    assert eager["train_step_chosen"] == {"asked": "eager", "by_extra": None, "why_not": "asked (--step eager)"}
    assert record["mode"] == "default"
    assert record["compiled"] == ("mtbench torch step: forward + loss (backward via AOTAutograd); fused AdamW "
                                  "update eager")
    assert record["graphs_compiled"] >= 1 and record["frames_compiled"] >= 1
    assert record["graph_breaks"] == 0, record["graph_break_reasons"]  # the forward and loss one graph a shape
    # One compilation per length bucket the run met, and dynamo never gave up on a new one.
    buckets = {tuple(h["shape"]) for h in compiled["history"]}
    assert record["recompilations"] == len(buckets) - 1 and not record["recompile_limit_reached"]
    # counted where each was compiled, at its bucket's warm-up step, as JAX's programs are; none in a steady window
    assert compiled["timing"]["compilations_by_shape"] == {"x".join(map(str, shape)): 1 for shape in buckets}
    assert {h["step"] for h in compiled["history"] if h["compilations"]} == \
        {h["step"] for h in compiled["history"] if h["first_of_shape"]}
    assert not [warning for warning in run_warnings(compiled) if "compiled after the warm-up" in warning]
    # Every shape trained was compiled (the limit is raised above torch's 8 for `base`'s buckets), and the
    # label says how the step ran: no CUDA graphs in the default mode.
    assert record["recompile_limit"] >= 64 and record["shapes_trained"] == len(buckets)
    assert record["shapes_run_eagerly"] == 0 and record["cuda_graphs"] == "not used (mode default)"
    assert compiled["train_step_detail"] == "mode default, CUDA graphs: not used (mode default)"
    assert record["compile_s"] > 0
    # Inductor's caches and torch's cache artifacts persist under --cache-dir for the next run (cold or warm
    # here, depending on what ran before in this session's cache; a cold-then-warm pair is measured by hand).
    cache = compiled["timing"]["compile_cache"]
    assert cache["state"] in ("cold", "warm") and cache["entries_after"] > 0 and record["cache_artifacts"]["saved"]
    # Same initial weights and batches by construction: the compiled step must take the eager step's path.
    np.testing.assert_allclose(losses(compiled)[:5], losses(eager)[:5], rtol=1e-4)
    assert losses(compiled)[-5:].mean() < losses(compiled)[:3].mean()


def test_compiled_torch_step_refuses_models_that_need_layer_call_bookkeeping():
    """The compiled step runs layers' `call` directly; a model relying on what `Layer.__call__` adds is refused
    with the layer and the reason (checked on Keras's layer attributes, the same on every backend)."""
    import keras

    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.plugins.backends.torch_compiled_step import plain_calls_unsupported
    assert plain_calls_unsupported(build_transformer(PRESETS["tiny"])) is None
    masked = keras.layers.Embedding(10, 3, mask_zero=True, name="tokens")
    regularized = keras.layers.Dense(2, activity_regularizer="l2", name="out")
    for layer in (masked, regularized):
        layer.build((None, 4))
    assert plain_calls_unsupported(masked) == "layer 'tokens' uses Keras masks (a `mask` argument or `mask_zero`)"
    assert plain_calls_unsupported(regularized) == "layer 'out' has an activity regularizer"
    unbuilt = keras.layers.Dense(2, name="unbuilt")
    assert plain_calls_unsupported(unbuilt) == "layer 'unbuilt' is not built"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_bfloat16_runs_its_attention_in_bfloat16_and_trains(tmp_path, cache_dir, backend):
    # the plain attention's arithmetic (`--attention auto` takes the fused kernel on a GPU in 16 bits); read off the
    # training's model, so --measure-only leaves out the evaluation (on JAX a dozen decoding programs to compile)
    result = train(tmp_path, backend, cache_dir, "--backend", backend, "--dtype", "mixed_bfloat16", "--steps", "12",
                   "--attention", "unfused", "--measure-only", *ONE_BUCKET)
    assert result["compile_options"]["dtype_policy"] == "mixed_bfloat16"
    # read from what ran: torch's aten ops, JAX's compiled program
    arithmetic = result["model"]["attention"]["arithmetic"]
    assert {key: arithmetic[key] for key in ("matmul_inputs", "accumulation", "scores", "softmax")} == {
        "matmul_inputs": "bfloat16", "accumulation": "float32", "scores": "bfloat16", "softmax": "float32"}
    assert result["compile_options"]["optimizer"] == "AdamW"
    if device_kind(backend) == "cpu":  # a GPU's peak is its datasheet's
        assert re.match(r"measured: (\d+)x\1 bfloat16 matmul on ", result["utilization"]["peak_source"])
    assert losses(result)[-5:].mean() < losses(result)[:3].mean()


@pytest.mark.parametrize("dtype", ["float16", "mixed_float16"])
def test_float16_compiles_with_kerass_loss_scale_optimizer(dtype):
    """Checked in-process at compile time: XLA has no float16 matmul on the CPU (the next test); torch's float16
    runs: tests/runner/test_setup.py, tests/plugins/backends/test_fast_train_steps.py."""
    import keras

    from mtbench.keras_models.transformer import build_transformer
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model
    keras.config.set_dtype_policy(dtype)
    try:
        config = TrainConfig(preset="tiny", dtype=dtype)
        model = build_transformer(config.model)
        options = compile_model(keras, model, config, total_steps=10, compile_options={})
    finally:
        keras.config.set_dtype_policy("float32")
    assert options["optimizer"] == "LossScaleOptimizer" and options["dtype_policy"] == dtype
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_float16_on_jax_cpu_is_refused_with_the_reason(tmp_path, cache_dir):
    proc = run_cli("train", *TINY_TRAIN, "--cache-dir", cache_dir, "--out", str(tmp_path / "r.json"),
                   "--backend", "jax", "--dtype", "mixed_float16", env=CPU_ONLY)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("Error: --dtype mixed_float16: XLA on the CPU has no float16 matmul "
                                   "(mixed_float16); use bfloat16 or mixed_bfloat16 there")


def test_flash_check_fails_when_the_fused_kernel_did_not_run(cache_dir):
    """On this CPU the compiled forward pass has plain XLA attention: verification must refuse."""
    from types import SimpleNamespace

    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.plugins.backends.jax_backend import JaxBackend
    from mtbench.runner.data.batches import make_batch
    from mtbench.runner.data.tokenizer import JOINT_SPECIAL
    model = build_transformer(PRESETS["tiny"])
    split = SimpleNamespace(sources=[[5, 6, 7, 3]] * 2, targets=[[8, 9]] * 2, special=JOINT_SPECIAL)
    run = SimpleNamespace(backend=JaxBackend(), extras_state={"flash-attention": {}})
    reason = FlashAttention().verify(run, model, make_batch(split, [0, 1], 2, 16))
    assert reason.startswith("the fused attention kernel did not run")
    assert run.extras_state["flash-attention"]["kernels"] == []


@pytest.mark.parametrize("program, refused", [
    # one encoder and one decoder block: the encoder's self-attention and the cross-attention take the bias variant
    (["__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaSoftmax"],
     "the fused attention kernel did not run for every encoder self-attention and cross-attention (1 encoder "
     "self-attention layers, 1 cross-attention layers; names in the compiled HLO of the forward pass: "
     "__cudnn$fmhaScaleBiasSoftmax x1, __cudnn$fmhaSoftmax x1); the run would mislabel itself"),
    (["__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaSoftmax"], None),
])
def test_a_kernel_named_in_the_program_must_serve_each_attention_layer(monkeypatch, program, refused):
    """Where Keras on JAX falls back to plain attention for one call, the compiled program still names the kernel
    for the others: the check counts the calls against the model's layers. The program's text stands in for a
    GPU's here."""
    from types import SimpleNamespace

    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer, fused_attention_layers
    from mtbench.plugins.backends.jax_backend import JaxBackend
    from mtbench.plugins.extras.flash_attention import MASKED_KINDS
    from mtbench.runner.data.batches import make_batch
    from mtbench.runner.data.tokenizer import JOINT_SPECIAL
    model = build_transformer(PRESETS["tiny"], flash_attention=True, flash_attention_masked=True)
    assert fused_attention_layers(model) == {"decoder self-attention": 1, "encoder self-attention": 1,
                                             "cross-attention": 1}
    hlo = "\n".join(f'%call.{i} = custom-call(%q, %k, %v), custom_call_target="{name}"'
                     for i, name in enumerate(program))
    monkeypatch.setattr(FlashAttention, "_jax_evidence",
                        staticmethod(lambda model, x: kernel_calls(hlo, JAX_KERNEL_PATTERN)))
    split = SimpleNamespace(sources=[[5, 6, 7, 3]] * 2, targets=[[8, 9]] * 2, special=JOINT_SPECIAL)
    run = SimpleNamespace(backend=JaxBackend(), extras_state={"flash-attention": {
        "applied_to": ["decoder self-attention", *MASKED_KINDS]}})
    assert FlashAttention().verify(run, model, make_batch(split, [0, 1], 2, 16)) == refused
    assert run.extras_state["flash-attention"]["kernels"] == sorted(set(program))


def test_the_fused_attention_layers_of_each_model_are_counted_by_kind():
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.presets import GPT_PRESETS, PRESETS
    from mtbench.keras_models.transformer import build_transformer, fused_attention_layers
    import dataclasses
    two_blocks = dataclasses.replace(PRESETS["tiny"], encoder_layers=2, decoder_layers=3)
    assert fused_attention_layers(build_transformer(two_blocks, flash_attention=True, flash_attention_masked=None)) \
        == {"decoder self-attention": 3, "encoder self-attention": 2, "cross-attention": 3}
    assert fused_attention_layers(build_transformer(two_blocks, flash_attention=True)) == \
        {"decoder self-attention": 3, "encoder self-attention": 0, "cross-attention": 0}
    assert set(fused_attention_layers(build_transformer(two_blocks)).values()) == {0}
    gpt = build_gpt(GPT_PRESETS["tiny"], flash_attention=True)
    assert fused_attention_layers(gpt) == {"decoder self-attention": GPT_PRESETS["tiny"].decoder_layers,
                                           "encoder self-attention": 0, "cross-attention": 0}


def test_kernel_evidence_recognises_only_fused_kernels():
    hlo = 'custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", backend_config={}'
    assert kernel_evidence(hlo, JAX_KERNEL_PATTERN) == ["__cudnn$fmhaSoftmax"]
    assert kernel_evidence("dot(%q, %k) softmax reduce", JAX_KERNEL_PATTERN) == []
    events = ["aten::_scaled_dot_product_flash_attention", "void pytorch_flash::flash_fwd_kernel<Flash_fwd>()"]
    assert len(kernel_evidence(events, TORCH_KERNEL_PATTERN)) == 2
    # The memory-efficient kernel is fused too (it serves the masked attentions); the math kernel's bmm is not.
    assert kernel_evidence(["aten::_scaled_dot_product_efficient_attention", "aten::bmm"], TORCH_KERNEL_PATTERN) == \
        ["aten::_scaled_dot_product_efficient_attention"]
    assert kernel_evidence(["aten::_scaled_dot_product_cudnn_attention", "aten::addmm"], TORCH_KERNEL_PATTERN) == \
        ["aten::_scaled_dot_product_cudnn_attention"]
    assert kernel_evidence(["aten::_scaled_dot_product_attention_math", "aten::bmm", "aten::softmax"],
                           TORCH_KERNEL_PATTERN) == []


@pytest.mark.parametrize("changes, expected", [
    ({"steps": 0}, "extra 'careless' sets steps=0, which the configuration refuses: --steps must be at least 1, "
                   "got 0"),
    ({"batch_size": "eight"}, "extra 'careless' sets batch_size='eight', which the configuration refuses: "),
    (["batch_size", 8], "extra 'careless' gives configuration changes of list, not a dict"),
    # The result said config.backend torch and config.extras none of a run that trained on jax with the extra.
    ({"backend": "torch", "seed": 3, "steps": 3}, "extra 'careless' changes backend, seed, chosen before the "
                                                   "extras change the configuration"),
    ({"backend": "jax", "steps": 3}, None),  # the backend it has: nothing fixed changes
])
def test_an_extra_whose_configuration_changes_are_refused_is_named_not_the_user(changes, expected):
    from mtbench.errors import RunFailure
    from mtbench.plugins.api import Extra, RunContext
    from mtbench.plugins.manager import registry
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import RunPlugins, configuration_changes

    class Careless(Extra):
        name = "careless"

        def config_changes(self, run):
            return changes

    run = RunContext(config=TrainConfig(steps=5), backend=None, device={"count": 1})
    if expected is None:
        assert configuration_changes(run, RunPlugins(None, [Careless()], [], registry()))[1] == {"steps": "careless"}
        return
    with pytest.raises(RunFailure) as refused:
        configuration_changes(run, RunPlugins(None, [Careless()], [], registry()))
    assert str(refused.value).startswith(expected)


def test_tpu_mesh_and_sizes_on_simulated_devices():
    script = """
import json, jax
from types import SimpleNamespace
from mtbench.plugins.extras.jax_tpu import TpuStrategy, tpu_batch_size, tpu_mesh
from mtbench.runner.config import TrainConfig
mesh, distribution = tpu_mesh(jax.devices())
from mtbench.plugins.api import RunContext
from mtbench.plugins.manager import registry
from mtbench.runner.launch import devices_spanned
from mtbench.plugins.backends.jax_backend import JaxBackend
from mtbench.runner.choices import choose_dtype
from mtbench.runner.setup import RunPlugins, check_configuration_changes, configuration_changes
given = TrainConfig(batch_size=60, max_len=45)
# A TPU as JAX describes it: the extra's own checks pass, and --dtype float32 is kept by `choose_dtype`.
run = RunContext(config=given, backend=JaxBackend(), device={"count": 4, "kind": "tpu", "bfloat16": True})
plugins = RunPlugins(None, [TpuStrategy()], [], registry())
choose_dtype(run, plugins)
run.config, changed_by = configuration_changes(run, plugins)
check_configuration_changes(run, plugins, changed_by)
config = run.config
assert (given.batch_size, given.max_len, given.dtype) == (60, 45, "float32")  # a new configuration, not a rewrite
print(json.dumps({"mesh": list(mesh.shape), "axes": list(mesh.axis_names), "batch": config.batch_size,
                  "max_len": config.max_len, "dtype": config.dtype, "b": [tpu_batch_size(8, 1), tpu_batch_size(33, 4)],
                  "record": run.extras_state["tpu"], "spanned": devices_spanned(run.extras_state.values()),
                  "changed_by": changed_by, "dtype_choice": run.dtype_choice}))
"""
    env = {**os.environ, "KERAS_BACKEND": "jax", **simulated_devices(4)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    got = json_answer(proc)
    assert got == {"mesh": [4], "axes": ["batch"], "batch": 64, "max_len": 48, "dtype": "mixed_bfloat16",
                   "b": [8, 64], "record": {"devices": 4, "cores": 4,
                                            "requested": {"batch_size": 60, "max_len": 45, "dtype": "float32"},
                                            "used": {"batch_size": 64, "max_len": 48, "dtype": "mixed_bfloat16"}},
                   "spanned": 4,  # MFU divides the peak by the mesh's 4 devices
                   "changed_by": {"batch_size": "tpu", "max_len": "tpu", "dtype": "tpu"},
                   # The result names the dtype that trained, and who chose it: --dtype had kept float32.
                   "dtype_choice": {"asked": "float32", "dtype": "mixed_bfloat16", "by_extra": "tpu"}}
