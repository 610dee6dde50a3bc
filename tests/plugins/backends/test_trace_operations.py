"""Reading a profiled window's trace back: own times of nested events, the union of overlapping lanes, and the device's
events chosen over the host's in the two formats a GPU writes (torch's Kineto categories, JAX's device processes and
their streams). The traces here are written by hand in those formats; a CPU run's real traces are read in
tests/runner/loop/test_profiling.py."""

import gzip
import json
import os

import pytest

from mtbench.figures import operation_name, profile_operations_text
from mtbench.plugins.backends.jax_profiler import JaxStepProfiler
from mtbench.plugins.backends.torch_profiler import TorchStepProfiler
from mtbench.plugins.backends.trace_operations import Work, kernel_kind, operations_record
from mtbench.runner.loop.profiling import operations_of


def test_own_times_leave_callees_out_and_busy_time_counts_overlapping_lanes_once():
    # Lane a: an outer call from 0 to 10 us holding two calls (2-5, 6-8); lane b: one call from 9 to 14 us.
    works = [Work("host", "a", "outer", 0, 10), Work("host", "a", "mm", 2, 3), Work("host", "a", "mm", 6, 2),
             Work("host", "b", "add", 9, 5)]
    record = operations_record("host", works)
    assert record["on"] == "host" and record["units"] == 1
    assert record["busy_s"] == pytest.approx(14e-6)     # [0, 10] and [9, 14]
    assert record["total_s"] == pytest.approx(15e-6)    # 5 + 5 + 5: the overlap counted on each lane
    assert [(t["name"], t["calls"]) for t in record["top"]] == [("outer", 1), ("mm", 2), ("add", 1)]
    assert [t["seconds"] for t in record["top"]] == pytest.approx([5e-6, 5e-6, 5e-6])
    assert [t["share"] for t in record["top"]] == pytest.approx([1 / 3] * 3)
    assert operations_record("host", []) is None


def test_the_record_keeps_the_ten_longest():
    works = [Work("host", "a", f"op{i}", i * 100, i + 1) for i in range(12)]
    top = operations_record("host", works)["top"]
    assert [t["name"] for t in top] == [f"op{i}" for i in range(11, 1, -1)]


def test_each_device_is_busy_on_its_own_and_the_record_keeps_their_mean():
    # Device 0 runs from 0 to 10 us on two streams at once, device 1 from 0 to 4 us: 10 and 4 us busy.
    works = [Work(0, 7, "gemm", 0, 10), Work(0, 8, "copy", 2, 5), Work(1, 7, "gemm", 0, 4)]
    record = operations_record("device", works)
    assert record["units"] == 2 and record["busy_s"] == pytest.approx(7e-6) and record["total_s"] == pytest.approx(19e-6)
    line = profile_operations_text({"profile": {"steps": [3], "operations": {**record, "window_s": 20e-6,
                                                                             "busy_share": 7 / 20}}})
    assert line.startswith("2 devices, each busy 0.0 ms a step on average (35 % of the profiled window); longest: "
                           "gemm 74 % (2 calls)")


def complete(name, ts, dur, pid=1, tid=1, **fields):
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, **fields}


def test_torch_reads_a_gpus_kernels_and_copies_not_the_operators_that_launched_them(tmp_path):
    profiler = TorchStepProfiler(str(tmp_path))
    events = [complete("aten::mm", 0, 50, cat="cpu_op"),
              complete("cudaLaunchKernel", 10, 5, cat="cuda_runtime"),
              complete("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>(Params)", 20, 300, pid=0, tid=7,
                       cat="kernel"),
              complete("sm90_xmma_gemm_bf16bf16_bf16f32", 320, 100, pid=0, tid=7, cat="kernel"),
              complete("Memcpy HtoD (Pageable -> Device)", 500, 20, pid=0, tid=8, cat="gpu_memcpy")]
    with open(profiler.path, "w") as f:
        json.dump({"traceEvents": events}, f)
    record = profiler.operations()
    assert record["on"] == "device"
    assert [t["name"] for t in record["top"]] == [events[2]["name"], events[3]["name"], events[4]["name"]]
    assert record["busy_s"] == pytest.approx(420e-6) and record["total_s"] == pytest.approx(420e-6)
    assert [t["kind"] for t in record["top"]] == ["attention", "matmul", "memory"]
    assert [(k["kind"], k["seconds"], k["share"]) for k in record["kinds"]] == [
        ("attention", pytest.approx(300e-6), pytest.approx(300 / 420)),
        ("matmul", pytest.approx(100e-6), pytest.approx(100 / 420)),
        ("memory", pytest.approx(20e-6), pytest.approx(20 / 420))]


def write_jax_trace(directory, events, processes, threads):
    folder = os.path.join(directory, "plugins", "profile", "2026_11_29")
    os.makedirs(folder)
    metadata = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}} for pid, name in processes]
    metadata += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}
                 for pid, tid, name in threads]
    path = os.path.join(folder, "perfetto_trace.json.gz")
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": metadata + events}, f)
    return path


def test_jax_reads_a_gpus_streams_once_not_the_xla_op_lines_beside_them(tmp_path):
    profiler = JaxStepProfiler(str(tmp_path))
    op = {"args": {"hlo_op": "fusion.3", "hlo_module": "jit_step"}}
    events = [complete("PjitFunction(step)", 0, 40, pid=701, tid=1),
              complete("fusion.3", 5, 2, pid=701, tid=2, **op),                          # the host's launch
              complete("cutlass_80_tensorop_bf16_s16816gemm", 50, 200, pid=1, tid=13, **op),
              complete("fusion.3", 50, 200, pid=1, tid=100, **op),                         # the same, as an XLA op
              complete("cudnn_generated_fort_native_sdpa", 260, 80, pid=1, tid=13)]
    profiler.files = [write_jax_trace(str(tmp_path), events, [(701, "/host:CPU"), (1, "/device:GPU:0")],
                                      [(1, 13, "Stream #13(Compute)"), (1, 100, "XLA Ops"), (701, 1, "python")])]
    record = profiler.operations()
    assert record["on"] == "device"
    assert [(t["name"], t["calls"]) for t in record["top"]] == [("cutlass_80_tensorop_bf16_s16816gemm", 1),
                                                                ("cudnn_generated_fort_native_sdpa", 1)]
    assert record["busy_s"] == pytest.approx(280e-6)
    assert [(k["kind"], k["share"]) for k in record["kinds"]] == [("matmul", pytest.approx(200 / 280)),
                                                                  ("attention", pytest.approx(80 / 280))]


def test_a_profiler_without_operations_or_with_an_unreadable_trace_is_said_not_raised(tmp_path):
    class Writes:
        def operations(self):
            raise ValueError("not a trace")

    assert operations_of(object(), 0.5) == (None, "this backend's profiler does not read its trace (open it in "
                                                  "ui.perfetto.dev)")
    assert operations_of(Writes(), 0.5) == (None, "its trace could not be read: ValueError: not a trace")
    record, why_not = operations_of(TorchStepProfiler(str(tmp_path)), 0.5)
    assert record is None and why_not.startswith("its trace could not be read: FileNotFoundError")
    assert operations_of(JaxStepProfiler(str(tmp_path)), 0.5) == \
        (None, "its trace could not be read: FileNotFoundError: jax.profiler wrote no perfetto_trace.json.gz")
    result = {"profile": {"steps": [3], "operations_why_not": why_not}}
    assert profile_operations_text(result) == f"not read: {why_not}"


def test_the_line_names_the_busy_share_and_kernels_without_their_template_arguments():
    operations = {"on": "device", "window_s": 0.2, "busy_s": 0.15, "busy_share": 0.75, "total_s": 0.15,
                  "top": [{"name": "void flash_fwd_kernel<Traits<128>>(Params)", "seconds": 0.06, "calls": 24,
                           "share": 0.4},
                          {"name": "aten::mm", "seconds": 0.03, "calls": 48, "share": 0.2}]}
    # Two steps profiled in 200 ms, the device busy 150 ms of it; an unprofiled step takes 80 ms.
    result = {"profile": {"steps": [3, 4], "operations": operations}, "timing": {"step_s_median": 0.08}}
    assert profile_operations_text(result) == \
        "device busy 75.0 ms a step (94 % of a steady step; 75 % of the profiled window); longest: flash_fwd_kernel " \
        "40 % (24 calls), aten::mm 20 % (48 calls)"
    assert operation_name("x" * 60) == "x" * 39 + "…"
    assert profile_operations_text({}) is None and profile_operations_text({"profile": {"steps": []}}) is None


# Kernel names in the forms each library and compiler gives them (NVIDIA GPUs; a TPU's XLA ops).
NAMED_KERNELS = {
    "matmul": ["nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT",
               "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
               "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
               "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)",
               "cublasLt::splitKreduce_kernel", "gemm_fusion_dot_123", "triton_gemm_dot_7", "triton_tem_fused_mm_4",
               "triton_tem_fused_addmm_gelu_0", "triton_tem_fused_bmm_12", "dot.38", "convolution.5",
               "gemv2T_kernel_val"],
    "attention": ["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>(Params)",
                  "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
                  "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0",
                  "_efficient_attention_backward"],
    "collective": ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllGather_RING_LL_Sum_int8_t",
                   "all-reduce.3", "all-gather-start.1", "reduce-scatter.2", "collective-permute.4"],
    "memory": ["Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "MemcpyD2D"],
    "other": ["triton_poi_fused_add_mul_0", "triton_red_fused_native_layer_norm_3", "loop_multiply_fusion",
              "input_reduce_fusion_2", "void at::native::vectorized_elementwise_kernel<4, GeluFunctor>(int)",
              "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>(Args)",
              "cunn_SoftMaxForward", "fusion.12", "copy_fusion.3",
              "triton_per_fused__log_softmax_backward_data_nll_loss_backward_5",
              # inductor's pointwise kernels named after the attention and the matmul whose inputs or bias they add
              "triton_poi_fused__scaled_dot_product_flash_attention_0", "triton_poi_fused_addmm_gelu_1"],
}


@pytest.mark.parametrize("kind", NAMED_KERNELS)
def test_a_devices_kernels_are_sorted_by_the_names_their_libraries_and_compilers_give_them(kind):
    assert {name: kernel_kind(name) for name in NAMED_KERNELS[kind]} == dict.fromkeys(NAMED_KERNELS[kind], kind)


def test_a_hosts_operators_are_not_sorted_into_kinds_and_the_line_gives_a_devices_per_step_and_device():
    works = [Work("host", 1, "aten::mm", 0, 5), Work("host", 1, "aten::add", 5, 5)]
    host = operations_record("host", works)
    assert "kinds" not in host and all("kind" not in top for top in host["top"])
    # Two devices over two profiled steps: 120 ms of matmuls, 30 of attention and 10 of other kernels in all.
    device = operations_record("device", [Work(0, 7, "nvjet_tst_64x8", 0, 60e3),
                                          Work(0, 7, "flash_fwd_kernel", 6e4, 3e4),
                                          Work(1, 7, "nvjet_tst_64x8", 0, 60e3),
                                          Work(1, 7, "triton_poi_fused_add_0", 6e4, 1e4)])
    result = {"profile": {"steps": [3, 4], "operations": {**device, "window_s": 0.2, "busy_share": 0.4}}}
    assert profile_operations_text(result).endswith(
        "; kernels a step by kind: matmul 30.0 ms (75 %), attention 7.5 ms (19 %), other 2.5 ms (6 %)")


def test_a_run_of_several_processes_names_the_least_and_the_most_busy():
    operations = {"on": "device", "units": 1, "window_s": 0.1, "busy_s": 0.07, "busy_share": 0.7, "total_s": 0.07,
                  "top": [{"name": "nvjet_tst", "seconds": 0.05, "calls": 4, "share": 0.7}],
                  "processes_busy_s": [0.07, 0.062, None, 0.074]}   # process 2's trace was not read
    line = profile_operations_text({"profile": {"steps": [5, 6], "operations": operations}})
    assert line.startswith("process 0's device busy 35.0 ms a step (70 % of the profiled window; the 3 processes' "
                           "31.0 (process 1) to 37.0 ms (process 3)); longest: nvjet_tst")
    operations["processes_busy_s"] = [0.07, None]
    assert profile_operations_text({"profile": {"steps": [5, 6], "operations": operations}}).startswith(
        "device busy 35.0 ms a step (70 % of the profiled window); longest")
