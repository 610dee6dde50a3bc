"""benchmarks/hlo_kernels.py: the kernels of an optimised XLA program, each charged the bytes it names and the FLOPs
of its products, counted by hand here: on a program XLA compiles for this CPU, and on lines of the program XLA
compiled for an H100 without one (`benchmarks/program_cost.py --target h100`), a cuBLAS call and a cuDNN fused
attention, kept as XLA printed them."""

import pytest

from conftest import keras_on_jax

# From mtbench's and the reference's GPT-2-small steps compiled for an H100 (jax 0.10.2), metadata left out: a
# weight gradient's batched cuBLAS product (its result beside a workspace) and a causal fused attention's forward.
H100_LINES = """HloModule jit_step

ENTRY %main.1 (lhs: bf16[2304,2,8192], rhs: bf16[2,8192,768], q: bf16[16,1024,12,64], k: bf16[16,1024,12,64], v: bf16[16,1024,12,64]) -> f32[2,2304,768] {
  %lhs = bf16[2304,2,8192]{2,1,0} parameter(0)
  %rhs = bf16[2,8192,768]{2,1,0} parameter(1)
  %custom-call.3 = (f32[2,2304,768]{1,2,0}, s8[4194304]{0}) custom-call(%lhs, %rhs), custom_call_target="__cublas$lt$matmul", backend_config={"operation_queue_id":"0","gemm_backend_config":{"selected_algorithm":"0","alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["1"],"rhs_batch_dimensions":["0"]},"epilogue":"DEFAULT"}}
  %q = bf16[16,1024,12,64]{3,2,1,0} parameter(2)
  %k = bf16[16,1024,12,64]{3,2,1,0} parameter(3)
  %v = bf16[16,1024,12,64]{3,2,1,0} parameter(4)
  %dot_product_attention_fwd.60 = (bf16[16,12,1024,64]{3,1,2,0}, f32[16,12,1024]{2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", api_version=API_VERSION_STATUS_RETURNING, backend_config={"operation_queue_id": "0", "cudnn_fmha_backend_config": {"fmha_scale": 0.125, "is_flash_attention": true, "mask_type": "CAUSAL"}}
  %get-tuple-element.1 = f32[2,2304,768]{1,2,0} get-tuple-element(%custom-call.3), index=0
  ROOT %add.1 = f32[2,2304,768]{1,2,0} add(%get-tuple-element.1, %get-tuple-element.1)
}
"""


def test_a_cpu_programs_matmul_is_charged_its_operands_result_and_products():
    keras_on_jax()
    import jax
    import jax.numpy as jnp

    from benchmarks.hlo_kernels import MATMUL, entry_kernels, kernel_figures
    # A CPU's program, also where JAX would compile for a GPU (a cuBLAS call: the next test's)
    cpu = jax.devices("cpu")[0]
    x, w = (jax.device_put(jnp.ones(shape, jnp.float32), cpu) for shape in ((64, 32), (32, 16)))
    text = jax.jit(lambda x, w: x @ w).lower(x, w).compile().as_text()
    kernels = entry_kernels(text)
    (matmul,) = [kernel for kernel in kernels if kernel.kind == MATMUL]
    assert matmul.flops == 2 * 64 * 32 * 16
    assert matmul.bytes == (64 * 32 + 32 * 16 + 64 * 16) * 4
    figures = kernel_figures(text)
    assert figures["matmul TFLOP"] == pytest.approx(2 * 64 * 32 * 16 / 1e12)
    assert "roofline ms" not in figures  # no device peaks given


def test_gpu_library_calls_are_counted_from_their_shapes_and_backend_config():
    from benchmarks.hlo_kernels import ATTENTION, MATMUL, entry_kernels, kernel_figures
    kernels = {kernel.name: kernel for kernel in entry_kernels(H100_LINES)}
    assert sorted(kernels) == ["add.1", "custom-call.3", "dot_product_attention_fwd.60"]  # parameters move nothing
    gemm = kernels["custom-call.3"]
    # 2 batches of (2304 x 8192) @ (8192 x 768); the workspace beside the result counts among its bytes.
    assert gemm.kind == MATMUL and gemm.flops == 2 * (2 * 2304 * 768) * 8192
    assert gemm.bytes == (2304 * 2 * 8192 + 2 * 8192 * 768) * 2 + 2 * 2304 * 768 * 4 + 4194304
    attention = kernels["dot_product_attention_fwd.60"]
    # Two products of 16 x 12 heads x 1024 x 1024 x 64, half of them masked away by causality.
    assert attention.kind == ATTENTION and attention.flops == 4 * 16 * 12 * 1024 * 1024 * 64 / 2
    assert attention.bytes == 4 * 16 * 1024 * 12 * 64 * 2 + 16 * 12 * 1024 * 4
    # Its operand twice (each operand is charged) and its result: 3 arrays of 2 x 2304 x 768 float32.
    assert kernels["add.1"].kind == "element-wise" and kernels["add.1"].flops == 0
    assert kernels["add.1"].bytes == 3 * 2 * 2304 * 768 * 4
    peak, bandwidth = 1e15, 3e12
    figures = kernel_figures(H100_LINES, peak, bandwidth)
    # By hand: the product bound by its 58.0 GFLOP at 1 PFLOP/s (its 119 MB would take 0.040 ms), the attention by
    # its 101 MB at 3 TB/s (its 25.8 GFLOP would take 0.026 ms), the addition by its 42.5 MB.
    gemm_ms = 2 * (2 * 2304 * 768) * 8192 / peak * 1e3
    attention_ms = (4 * 16 * 1024 * 12 * 64 * 2 + 16 * 12 * 1024 * 4) / bandwidth * 1e3
    add_ms = 3 * 2 * 2304 * 768 * 4 / bandwidth * 1e3
    assert (gemm_ms, attention_ms, add_ms) == pytest.approx((0.057982, 0.033817, 0.014156), abs=1e-6)
    assert figures["roofline ms"] == pytest.approx(gemm_ms + attention_ms + add_ms)
    assert figures["kernels"] == 3 and figures[f"kernels: {ATTENTION}"] == 1


# From the same H100 program, before the loss read the label's logit as a masked sum: the softmax's gradient, the
# label's subtracted in place by a scatter, and a fusion that reads a reduction's result.
SCATTER_LINES = """HloModule jit_step

ENTRY %main.2 (logits: bf16[16,1024,50304], weight: f32[16,1024], y: s32[16,1024], tokens: f32[]) -> f32[16,1024,50304] {
  %logits = bf16[16,1024,50304]{2,1,0} parameter(0)
  %weight = f32[16,1024]{1,0} parameter(1)
  %y = s32[16,1024]{1,0} parameter(2)
  %tokens = f32[] parameter(3)
  %input_reduce_fusion.2 = f32[16,1024]{1,0} fusion(%logits), kind=kInput, calls=%fused_reduce.2
  %loop_multiply_fusion = f32[16,1024,50304]{2,1,0} fusion(%input_reduce_fusion.2, %logits), kind=kLoop, calls=%fused_multiply
  ROOT %input_scatter_fusion = f32[16,1024,50304]{2,1,0} fusion(%loop_multiply_fusion, %weight, %y, %tokens), kind=kInput, calls=%fused_scatter
}
"""


def test_a_scatter_is_charged_what_it_updates_in_place_and_a_fusion_its_own_kind():
    from benchmarks.hlo_kernels import entry_kernels
    kernels = {kernel.name: kernel for kernel in entry_kernels(SCATTER_LINES)}
    logits, rows = 16 * 1024 * 50304, 16 * 1024
    # The weights, labels and token count read, as many elements written; not the 3.3 GB array it adds into.
    assert kernels["input_scatter_fusion"].bytes == 2 * (rows * 4 + rows * 4 + 4)
    assert kernels["input_scatter_fusion"].kind == "reductions"
    assert kernels["input_reduce_fusion.2"].kind == "reductions"
    # An element-wise fusion that reads a reduction's result is element-wise still.
    assert kernels["loop_multiply_fusion"].kind == "element-wise"
    assert kernels["loop_multiply_fusion"].bytes == rows * 4 + logits * 2 + logits * 4


# Lines of the same H100 program, after the masked sum: the accuracy's fusion converts the bfloat16 logits and
# gathers each label's logit (`correct_tokens`), and the softmax's fusion reads them all.
GATHER_LINES = """HloModule jit_step

%fused_gather (param_0: bf16[16384,50304], param_1: s32[16384,3]) -> f32[16,1024] {
  %param_0 = bf16[16384,50304]{1,0} parameter(0)
  %convert.1 = f32[16384,50304]{1,0} convert(%param_0)
  %bitcast.1 = f32[16,1024,50304]{2,1,0} bitcast(%convert.1)
  %param_1 = s32[16384,3]{1,0} parameter(1)
  %gather.1 = f32[16384,1,1,1]{3,2,1,0} gather(%bitcast.1, %param_1), offset_dims={1,2,3}, collapsed_slice_dims={}, start_index_map={0,1,2}, index_vector_dim=1, slice_sizes={1,1,1}
  ROOT %bitcast.2 = f32[16,1024]{1,0} bitcast(%gather.1)
}

%fused_exp (param_0.1: bf16[16384,50304]) -> f32[16384,50304] {
  %param_0.1 = bf16[16384,50304]{1,0} parameter(0)
  %convert.2 = f32[16384,50304]{1,0} convert(%param_0.1)
  %slice.1 = f32[16384,1]{1,0} slice(%convert.2), slice={[0:16384], [0:1]}
  ROOT %exponential.1 = f32[16384,50304]{1,0} exponential(%convert.2)
}

ENTRY %main.3 (logits: bf16[16384,50304], indices: s32[16384,3]) -> f32[16,1024] {
  %logits = bf16[16384,50304]{1,0} parameter(0)
  %indices = s32[16384,3]{1,0} parameter(1)
  %loop_gather_fusion = f32[16,1024]{1,0} fusion(%logits, %indices), kind=kLoop, calls=%fused_gather
  %loop_exponential_fusion = f32[16384,50304]{1,0} fusion(%logits), kind=kLoop, calls=%fused_exp
  ROOT %tuple = (f32[16,1024]{1,0}, f32[16384,50304]{1,0}) tuple(%loop_gather_fusion, %loop_exponential_fusion)
}
"""


def test_an_operand_a_fusion_only_gathers_from_is_charged_what_it_takes():
    from benchmarks.hlo_kernels import entry_kernels
    kernels = {kernel.name: kernel for kernel in entry_kernels(GATHER_LINES)}
    rows, logits = 16 * 1024, 16 * 1024 * 50304
    # 16,384 bfloat16 logits read (converted, then gathered), the indices, the float32 result.
    assert kernels["loop_gather_fusion"].bytes == rows * 2 + rows * 3 * 4 + rows * 4
    # Sliced, but also read whole: the whole operand.
    assert kernels["loop_exponential_fusion"].bytes == logits * 2 + logits * 4


# Lines of mtbench's GPT-2-small step compiled for an H100 (jax 0.10.2), metadata left out: a weight cast to bfloat16
# for the forward's product, and the sum of squares of the query's third of a fused QKV weight gradient (XLA's
# product split in two along its rows, then summed) for the global norm the optimizer clips by.
CONVERT_AND_THIRD_LINES = """HloModule jit_step

%wrapped_convert_computation (param_0: f32[768,768]) -> bf16[768,768] {
  %param_0 = f32[768,768]{1,0} parameter(0)
  ROOT %convert.1 = bf16[768,768]{1,0} convert(%param_0)
}

%region_add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b)
}

%fused_reduce (param_0.1: f32[2,768,2304]) -> f32[512] {
  %param_0.1 = f32[2,768,2304]{2,1,0} parameter(0)
  %zero = f32[] constant(0)
  %reduce.1 = f32[768,2304]{1,0} reduce(%param_0.1, %zero), dimensions={0}, to_apply=%region_add
  %square.1 = f32[768,2304]{1,0} multiply(%reduce.1, %reduce.1)
  %split.1 = f32[768,768]{1,0} slice(%square.1), slice={[0:768], [0:768]}
  %bitcast.1 = f32[512,1152]{1,0} bitcast(%split.1)
  ROOT %reduce.2 = f32[512]{0} reduce(%bitcast.1, %zero), dimensions={1}, to_apply=%region_add
}

ENTRY %main.4 (kernel: f32[768,768], partial_products: f32[2,768,2304]) -> (bf16[768,768], f32[512]) {
  %kernel = f32[768,768]{1,0} parameter(0)
  %partial_products = f32[2,768,2304]{2,1,0} parameter(1)
  %wrapped_convert = bf16[768,768]{1,0} fusion(%kernel), kind=kLoop, calls=%wrapped_convert_computation
  %input_reduce_fusion = f32[512]{0} fusion(%partial_products), kind=kInput, calls=%fused_reduce
  ROOT %tuple = (bf16[768,768]{1,0}, f32[512]{0}) tuple(%wrapped_convert, %input_reduce_fusion)
}
"""


def test_a_fusion_is_charged_the_share_of_an_operand_its_result_needs():
    from benchmarks.hlo_kernels import entry_kernels
    kernels = {kernel.name: kernel for kernel in entry_kernels(CONVERT_AND_THIRD_LINES)}
    # Converted whole: the float32 weight read, the bfloat16 copy written (the operand was once charged nothing,
    # as if only taken from).
    assert kernels["wrapped_convert"].bytes == 768 * 768 * (4 + 2)
    # Summed, squared, then sliced: a third of both partial products read, not the whole 14 MB; 512 sums written.
    assert kernels["input_reduce_fusion"].bytes == 2 * 768 * 768 * 4 + 512 * 4
