"""The best-by-hand language-model references of benchmarks/ (best_gpt_torch.py, best_gpt_jax.py) train the same
model as mtbench's `--model gpt`: from mtbench's initial weights, on the language-modelling task's byte-level
batches, with the same optimizer, their losses are mtbench's Keras step's losses for 50 steps, in float32; their
weights go back to Keras's paths and shapes. And they are what they say: one fused attention op and one QKV
matmul per block.

In-process (keras on JAX), as tests/benchmarks/test_native_gpt.py; the torch reference runs eagerly here
(`compile=False`): Inductor's compile on 2 cores would cost more than the whole module."""

import numpy as np
import pytest

from conftest import first_position_kept_or_dropped, keras_gpt_run, needs_flax
from optimizer_exercise import float32_matmul_arithmetic, matmul_tolerance

# Keras's step and both references trained for 50 steps on the tiny GPT, twice (two clippings): about 25 s in all on
# 2 cores, in the slow tier with the other benchmarks' references (the quick tier stays under its 5 minutes).
STEPS = 50
# A tenth of the default: clipping hard enough that clipping the query, key and value as one shows in the losses.
CLIP_NORM = 0.1


@pytest.fixture(scope="module")
def keras_run(cache_dir):
    return keras_gpt_run(cache_dir, STEPS)


def torch_step(keras_run):
    from benchmarks import best_gpt_torch
    run = keras_run
    return best_gpt_torch.train_step_from_keras_weights(run["workload"].model_shape, run["weights"], run["settings"],
                                                        compile=False, device="cpu")


def assert_weights_go_back_by_path(step, keras_run):
    weights = step.weights_by_keras_path(list(keras_run["weights"]))
    assert {path: value.shape for path, value in weights.items()} == {
        path: value.shape for path, value in keras_run["weights"].items()}


@pytest.mark.slow
def test_torch_reference_losses_equal_the_keras_steps(keras_run):
    from benchmarks import best_gpt_torch
    step = torch_step(keras_run)
    # Before any step, every Keras variable comes back as it went in: the fused QKV splits where it was joined.
    for path, value in step.weights_by_keras_path(list(keras_run["weights"])).items():
        np.testing.assert_array_equal(value, keras_run["weights"][path], err_msg=path)
    batches = [best_gpt_torch.batch_tensors(b, step.device) for b in keras_run["workload"].batches]
    losses = np.array([float(step(*batch)["loss"]) for batch in batches])
    rtol = matmul_tolerance(1e-4, float32_matmul_arithmetic("jax"), float32_matmul_arithmetic("torch"))
    np.testing.assert_allclose(losses, keras_run["losses"], rtol=rtol)
    assert_weights_go_back_by_path(step, keras_run)


@pytest.mark.slow
@needs_flax
def test_jax_reference_losses_equal_the_keras_steps(keras_run):
    from benchmarks import best_gpt_jax
    run = keras_run
    step = best_gpt_jax.train_step_from_keras_weights(run["workload"].model_shape, run["weights"], run["settings"])
    for path, value in step.weights_by_keras_path(list(run["weights"])).items():
        np.testing.assert_array_equal(value, run["weights"][path], err_msg=path)
    losses = np.array([float(step(*best_gpt_jax.batch_arrays(b))["loss"]) for b in run["workload"].batches])
    np.testing.assert_allclose(losses, run["losses"], rtol=matmul_tolerance(1e-4, float32_matmul_arithmetic("jax")))
    assert_weights_go_back_by_path(step, run)


@pytest.fixture(scope="module")
def keras_run_clipped_per_variable(cache_dir):
    return keras_gpt_run(cache_dir, STEPS, clip="per-variable", clip_norm=CLIP_NORM)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param("jax", marks=needs_flax), "torch"])
def test_each_reference_clips_the_thirds_of_its_fused_qkv_as_keras_clips_its_three_variables(
        backend, keras_run_clipped_per_variable):
    """Under Keras's per-variable clipping (the translation model's default) the query, key and value gradients are
    clipped each on its own. A reference that clipped its fused `qkv` as one parts from Keras's losses by 9.6e-4
    (relative) within these 50 steps, at 1.0 by 1.4e-4. Clipped by the global norm (the first tests), the fused
    arrays are updated whole."""
    run = keras_run_clipped_per_variable
    assert run["settings"].clip == "per-variable"
    if backend == "jax":
        from benchmarks import best_gpt_jax
        step = best_gpt_jax.train_step_from_keras_weights(run["workload"].model_shape, run["weights"], run["settings"])
        losses = [float(step(*best_gpt_jax.batch_arrays(b))["loss"]) for b in run["workload"].batches]
        rtol = matmul_tolerance(1e-4, float32_matmul_arithmetic("jax"))
    else:
        from benchmarks import best_gpt_torch
        step = torch_step(run)
        losses = [float(step(*best_gpt_torch.batch_tensors(b, step.device))["loss"]) for b in run["workload"].batches]
        rtol = matmul_tolerance(1e-4, float32_matmul_arithmetic("jax"), float32_matmul_arithmetic("torch"))
    np.testing.assert_allclose(losses, run["losses"], rtol=rtol)


@pytest.mark.slow
def test_torch_reference_attends_with_one_fused_op_and_projects_qkv_with_one_matmul_per_block(keras_run):
    from torch.utils._python_dispatch import TorchDispatchMode

    from benchmarks import best_gpt_torch

    class Ops(TorchDispatchMode):
        """The aten ops a forward pass runs (under autograd, as in training), with their first output's shape."""

        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            first = out[0] if isinstance(out, (tuple, list)) else out
            self.seen.append((func.overloadpacket.__name__, tuple(getattr(first, "shape", ()))))
            return out

    import torch

    from mtbench.plugins.backends.torch_backend import TorchBackend
    step = torch_step(keras_run)
    shape = keras_run["workload"].model_shape
    tokens = best_gpt_torch.batch_tensors(keras_run["workload"].batches[0], step.device)[0]
    # The process holds SDPA to its math kernel, as mtbench's torch backend does for a run of unfused attention
    # (benchmarks/overhead.py times the reference beside such a run): the reference still takes SDPA's own choice.
    before = {name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")()
              for name in ("math", "flash", "mem_efficient", "cudnn")}
    TorchBackend().attention_kernels(False, {"kind": "cpu"})
    try:
        with Ops() as ops:
            step.model(tokens)
    finally:
        for name, on in before.items():
            getattr(torch.backends.cuda, f"enable_{name}_sdp")(on)
    names = [name for name, _ in ops.seen]
    attention = [name for name in names if name.startswith("_scaled_dot_product_")]
    assert len(attention) == shape.decoder_layers, names
    assert not [name for name in names if "softmax" in name], names  # no unfused attention's softmax
    matmuls = [out for name, out in ops.seen if name in ("mm", "addmm", "bmm", "baddbmm", "matmul")]
    # Per block: qkv, the attention's output, the MLP's two layers; then the tied output layer.
    assert len(matmuls) == 4 * shape.decoder_layers + 1, ops.seen
    assert sum(out[-1] == 3 * shape.d_model for out in matmuls) == shape.decoder_layers


@pytest.mark.slow
def test_torch_reference_loss_compiles_to_one_graph(keras_run):
    """What `compile=True` (the default on CUDA) hands torch.compile traces without a graph break: Dynamo's trace
    alone (the eager backend), since Inductor's compile on 2 cores takes about 30 s."""
    import torch

    from benchmarks import best_gpt_torch
    step = torch_step(keras_run)
    batch = best_gpt_torch.batch_tensors(keras_run["workload"].batches[0], step.device)
    traced = torch.compile(step.loss, backend="eager", fullgraph=True)  # fullgraph: a graph break raises
    torch.testing.assert_close(traced(*batch), step.loss(*batch))


@pytest.mark.slow
@needs_flax
def test_jax_reference_projects_qkv_with_one_dot_general_per_block(keras_run):
    import jax

    from benchmarks import best_gpt_jax
    run = keras_run
    shape = run["workload"].model_shape
    step = best_gpt_jax.train_step_from_keras_weights(shape, run["weights"], run["settings"])
    tokens = best_gpt_jax.batch_arrays(run["workload"].batches[0])[0]
    text = jax.jit(step.forward).lower(step.params, tokens).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line]
    qkv = f"tensor<{tokens.shape[0]}x{tokens.shape[1]}x{3 * shape.d_model}xf32>"
    assert sum(line.rstrip().endswith(qkv) for line in dots) == shape.decoder_layers, dots
    # Per block: qkv, the attention's output, the MLP's two layers, and XLA attention's two; then the output layer.
    assert len(dots) == 6 * shape.decoder_layers + 1, dots


@pytest.mark.slow
def test_the_reference_in_cuda_graphs_is_refused_in_one_line_where_there_are_none(keras_run, capsys):
    from benchmarks import best_gpt, best_gpt_torch
    from mtbench.errors import MtbenchError
    run = keras_run
    with pytest.raises(MtbenchError, match=r"^--compile-mode reduce-overhead: CUDA graphs need a CUDA device; torch "
                                           r"runs on the cpu here$"):
        best_gpt_torch.train_step_from_keras_weights(run["workload"].model_shape, run["weights"], run["settings"],
                                                     device="cpu", compile_mode="reduce-overhead")
    with pytest.raises(SystemExit) as exit_:
        best_gpt.parse_args(["--backend", "jax", "--compile-mode", "reduce-overhead"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        "error: --compile-mode: torch.compile's mode, for the torch reference only")


@pytest.mark.parametrize("backend", [pytest.param("jax", marks=needs_flax), "torch"])
def test_each_reference_drops_attention_probabilities_as_nanogpt_does(backend):
    """nanoGPT's attention dropout, which mtbench's GPT has: torch's reference through SDPA's `dropout_p`, JAX's by
    writing the attention out (jax.nn's takes no dropout); outside training, none."""
    rows, length, heads, size = 200, 3, 2, 4
    values = np.random.default_rng(3).uniform(1, 2, size=(rows, length, heads, size)).astype("float32")
    if backend == "jax":
        import jax

        from benchmarks import best_gpt_jax
        queries = np.zeros_like(values)
        attend = lambda rate: np.asarray(best_gpt_jax.causal_attention(queries, values, values, rate,
                                                                       jax.random.key(0), None))
        trained, plain = attend(0.5), attend(0.0)
    else:
        import torch

        from benchmarks import best_gpt_torch
        layer = best_gpt_torch.CausalSelfAttention(heads * size, heads, 0.5)
        with torch.no_grad():  # the query, key and value are the input; the output projection passes them on
            layer.qkv.weight.copy_(torch.eye(heads * size).repeat(3, 1))
            layer.qkv.bias.zero_()
            layer.output.weight.copy_(torch.eye(heads * size))
            layer.output.bias.zero_()
            x = torch.from_numpy(values.reshape(rows, length, heads * size))
            trained = layer.train()(x).numpy().reshape(values.shape)
            plain = layer.eval()(x).numpy().reshape(values.shape)
    np.testing.assert_allclose(plain[:, 0], values[:, 0], rtol=1e-6)
    first_position_kept_or_dropped(trained[:, 0], values[:, 0])


def test_the_references_mfu_divides_by_the_peak_of_the_arithmetic_its_matmuls_ran_in(monkeypatch, cache_dir):
    """On a GPU, float32 matmuls at `--matmul-precision high` run as TF32: best_gpt.py's MFU divides by TF32's
    datasheet peak then, as `mtbench train`'s does, not by FP32's (7.4 times lower on an H100). A GPU is stood in
    for by the backend's `device_info`."""
    from benchmarks.best_gpt import device_and_peak
    from mtbench.plugins import manager
    backend = manager.registry().backends["torch"]
    h100 = {"kind": "gpu", "name": "NVIDIA H100 80GB HBM3", "count": 1, "bfloat16": True}
    monkeypatch.setattr(type(backend), "device_info", lambda self: h100)
    peaks = {precision: device_and_peak("torch", "float32", cache_dir, precision)[2:]
             for precision in ("highest", "high")}
    assert peaks == {"highest": (67e12, "NVIDIA H100 SXM datasheet, FP32 dense"),
                     "high": (494.7e12, "NVIDIA H100 SXM datasheet, TF32 dense")}


@needs_flax
def test_the_jax_reference_fuses_attention_where_cudnns_kernel_runs(monkeypatch):
    """`attention="auto"` asks for cuDNN's kernel on a CUDA GPU from compute capability 8.0 only (9.0 for heads over
    128 wide), where `jax.nn.dot_product_attention` has it: a T4, a ROCm GPU or a CPU would raise (JAX's devices
    stood in for)."""
    from types import SimpleNamespace

    import jax

    from benchmarks.best_gpt_jax import cudnn_attention_runs_here

    def device(platform, runtime, capability=None):
        return SimpleNamespace(platform=platform, client=SimpleNamespace(platform_version=runtime),
                               **({"compute_capability": capability} if capability else {}))

    runs = {}
    for label, first in (("H100", device("gpu", "cuda 12080", "9.0")), ("B200", device("gpu", "cuda 12080", "10.0")),
                         ("A100", device("gpu", "cuda 12080", "8.0")), ("T4", device("gpu", "cuda 12080", "7.5")),
                         ("MI300X", device("gpu", "rocm 60400")), ("CPU", device("cpu", "<unknown>"))):
        monkeypatch.setattr(jax, "devices", lambda first=first: [first])
        runs[label] = (cudnn_attention_runs_here(64), cudnn_attention_runs_here(192))
    assert runs == {"H100": (True, True), "B200": (True, True), "A100": (True, False), "T4": (False, False),
                    "MI300X": (False, False), "CPU": (False, False)}


def test_in_mixed_bfloat16_the_torch_references_carry_the_residual_stream_in_keras_dtype():
    """Keras's mixed policy computes every layer in bfloat16, the residual stream between blocks too; autocast alone
    would keep the torch references' stream in float32 (twice the bytes of mtbench's model). Each block's output
    dtype, read from one real step of each torch reference (best by hand, native GPT, native translation), is the
    dtype of the tiny Keras GPT's block outputs in mixed_bfloat16, and the logits are float32 on both sides."""
    import dataclasses

    import torch

    from benchmarks import best_gpt_torch, native_gpt_torch, native_torch
    from benchmarks.workload import OptimizerSettings
    from conftest import tiny_jax_gpt
    from mtbench.keras_models.presets import GPT_PRESETS, PRESETS

    keras_model = tiny_jax_gpt("mixed_bfloat16")
    ids = np.zeros((2, 32), "int32")
    x = keras_model.embed(ids)
    keras_dtypes = []
    for block in keras_model.blocks:
        x = block(x)
        keras_dtypes.append(str(x.dtype))
    assert str(keras_model(ids).dtype) == "float32"

    settings = OptimizerSettings(learning_rate=1e-3, warmup_steps=0, decay_steps=10, alpha=0.1, weight_decay=0.0,
                                 beta_1=0.9, beta_2=0.99, epsilon=1e-7, clipnorm=1.0)
    gpt_shape = dataclasses.replace(GPT_PRESETS["tiny"], vocab_size=256, max_len=32)
    tokens = torch.randint(0, 256, (2, 32))
    gpt_batch = (tokens, torch.roll(tokens, -1, 1), torch.ones(2, 32))
    translation_shape = dataclasses.replace(PRESETS["tiny"], vocab_size=256, max_len=32)
    translation_batch = (tokens, tokens, torch.roll(tokens, -1, 1), torch.ones(2, 32))
    gpt_blocks = gpt_shape.decoder_layers
    steps = {"best by hand": (best_gpt_torch.TrainStep(best_gpt_torch.build_model(gpt_shape), settings,
                                                       mixed_bfloat16=True), gpt_batch, gpt_blocks),
             "native gpt": (native_torch.TorchTrainStep(native_gpt_torch.build_model(gpt_shape), settings,
                                                        mixed_bfloat16=True), gpt_batch, gpt_blocks),
             "native translation": (native_torch.TorchTrainStep(native_torch.build_model(translation_shape), settings,
                                                                mixed_bfloat16=True), translation_batch,
                                    translation_shape.encoder_layers + translation_shape.decoder_layers)}
    for name, (step, batch, block_count) in steps.items():
        model = step.model
        blocks = list(getattr(model, "blocks", [])) + list(getattr(model, "encoder_blocks", [])) + list(
            getattr(model, "decoder_blocks", []))
        assert len(blocks) == block_count, name  # every block hooked: none renamed out of sight
        seen, logits = [], []
        for block in blocks:
            block.register_forward_hook(lambda module, args, out: seen.append(str(out.dtype).removeprefix("torch.")))
        model.register_forward_hook(lambda module, args, out: logits.append(out.dtype))
        assert torch.isfinite(step(*batch)["loss"])
        assert seen == [keras_dtypes[0]] * len(blocks) and keras_dtypes[0] == "bfloat16", (name, seen)
        assert logits == [torch.float32], name
