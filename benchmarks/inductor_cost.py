"""mtbench's compiled torch step for the GPT against the best-by-hand torch reference (benchmarks/best_gpt_torch.py,
nanoGPT's recipe), as the programs inductor generates for them: both compiled from the same weights for one batch,
and held side by side by what the programs call. Matrix products (inductor's extern GEMM calls), attention kernels
(the aten calls it leaves to SDPA's kernels), the kernels inductor generated (their launches: a kernel of a block
runs once a block), the bytes inductor counts its kernels reading and writing, the buffers the forward program keeps
for the backward, how many of them the backward writes its results over and, on a GPU, the memory a steady step
allocates at its peak. The torch counterpart of benchmarks/program_cost.py; nothing is timed.

    python benchmarks/inductor_cost.py [--preset tiny] [--rows 4] [--block-size 64] [--dtype mixed_bfloat16]

Both attend with the fused kernel a GPU gives them: SDPA's dispatcher's choice where CUDA is (cuDNN's on Hopper,
FlashAttention before); on a CPU the CPU's flash kernel (`_scaled_dot_product_flash_attention_for_cpu`), which Keras
would not ask torch for there, so it is asked for as `--extra flash-attention` asks on a GPU. The last line printed
is one JSON object.
"""

import argparse
import collections
import dataclasses
import json
import os
import re
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # run as a script: `benchmarks` and `mtbench` from this checkout

GEMMS = ("mm", "addmm", "bmm", "baddbmm")
# A kernel inductor generated, launched: a C++ kernel's call on a CPU, a Triton kernel's `.run(` on a GPU.
LAUNCH = re.compile(r"^\s+(cpp_fused_\w+)\(|^\s+(triton_\w+)\.run\(", re.M)
EXTERN = re.compile(r"extern_kernels\.(\w+)\(")
# A call of an attention kernel, forward or backward (not the checks of its outputs' strides that name it).
ATTENTION = re.compile(r"= torch\.ops\.aten\.(_scaled_dot_product_\w+|_flash_attention_\w+|_efficient_attention_\w+)\.\w+\(")
# A buffer the program allocates: its name, shape and dtype.
ALLOCATION = re.compile(r"^\s+(buf\d+) = empty_strided_\w+\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)", re.M)
RETURNED = re.compile(r"^\s+return \((.*)\)\s*$", re.M)
# The program's inputs, unpacked from `args` as its `call` starts.
INPUTS = re.compile(r"^\s+([\w, ]+?),? = args\s*$", re.M)
# A buffer taken over for an output (`# reuse`), whole or as a view.
REUSED = re.compile(r"^\s+buf\d+ = (?:reinterpret_tensor\()?(\w+)\b.*; del \1  # reuse$", re.M)


def bytes_kept_for_the_backward(forward):
    """The bytes of the buffers the forward program allocates and returns, each once (a view of a buffer is the
    buffer): what the step holds from the forward pass to the backward one, beside the loss; the weights and the
    batch it reads are not the program's."""
    import torch
    sizes = {}
    for name, shape, dtype in ALLOCATION.findall(forward):
        elements = 1
        for extent in filter(None, (d.strip() for d in shape.split(","))):
            elements *= int(extent)
        sizes[name] = elements * getattr(torch, dtype).itemsize
    returned = set(re.findall(r"\b(buf\d+)\b", RETURNED.findall(forward)[-1]))
    return sum(sizes.get(name, 0) for name in returned)


def saved_buffers_written_over(backward):
    """How many of the buffers the forward saved the backward program writes its own results into (`# reuse` of
    an input): autograd donates them (a saved tensor is used once), and a program that takes none over holds each
    of its results beside them, the logits' gradient beside the logits."""
    inputs = {name.strip() for name in INPUTS.findall(backward)[-1].split(",")}
    return sum(name in inputs for name in REUSED.findall(backward))


def program_figures(codes):
    """What the generated programs (forward and backward, each module's source, in that order) call, counted, and
    the MiB the forward keeps for the backward."""
    text = "\n".join(codes)
    extern = collections.Counter(EXTERN.findall(text))
    launched = [cpu or gpu for cpu, gpu in LAUNCH.findall(text)]
    return {"gemms": sum(extern[name] for name in GEMMS),
            "gemms adding a bias": extern["addmm"] + extern["baddbmm"],
            "attention kernels": len(ATTENTION.findall(text)),
            "generated kernel launches": len(launched),
            # Inductor names a kernel after the operations fused into it: one kernel for the loss's whole gradient
            # over the logits when the label's (a scatter) is fused with the softmax's.
            "kernels of the loss's gradient": sum("nll_loss_backward" in name for name in launched),
            "scatters": sum("scatter" in name for name in launched) + extern["scatter"] + extern["scatter_add"],
            "other extern calls": sum(count for name, count in extern.items() if name not in GEMMS),
            "MiB kept for the backward": round(bytes_kept_for_the_backward(codes[0]) / 2 ** 20, 2),
            "saved buffers written over": saved_buffers_written_over(codes[1])}


def count_kernel_bytes():
    """Has inductor count the bytes each kernel it schedules reads and writes (`torch._inductor.metrics`, kept while
    its metrics log is on) for every graph: its caches off, so that each graph is compiled here, the log on but
    silent, and the count at zero."""
    import torch
    import torch._functorch.config
    import torch._inductor.compile_fx
    import torch._inductor.config
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    torch._logging.set_logs(inductor_metrics=True)
    torch._inductor.compile_fx.inductor_metrics_log.propagate = False
    torch._inductor.metrics.reset()


def kernel_bytes_counted():
    """{'GB the kernels name': ..., 'GB the GEMMs name': ...} of the graphs inductor compiled since the last call
    (`count_kernel_bytes`), by inductor's own count; the count starts again."""
    from torch._inductor import metrics
    gemms = sum(elements * 4 for node, elements in metrics.nodes_num_elem if node.is_extern())  # it kept bytes // 4
    counted = {"GB the kernels name": metrics.num_bytes_accessed / 1e9, "GB the GEMMs name": gemms / 1e9}
    metrics.reset()
    return counted


def step_peak_mib(step, *batch):
    """On a GPU, the MiB one more call of `step` (compiled and run once already) allocates at its peak over what
    was allocated before it: the activations, gradients and temporaries of a steady step, apart from the weights
    and optimizer state both steps hold and the first call's compilation and autotuning, which a run's peak since
    its process started counts. None on a CPU (torch counts no host allocations)."""
    import torch
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step(*batch)
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - before) / 2 ** 20, 1)


def measured_program(step, *batch):
    """(the programs inductor generated for `step`, their figures): compiled and run on `batch`, then run again
    for a steady step's peak. Inductor's byte count is read for the graphs compiled since the last read."""
    from torch._inductor.utils import run_and_get_code
    codes = run_and_get_code(step, *batch)[1]
    figures = {**program_figures(codes), **kernel_bytes_counted()}
    figures["a step's peak MiB"] = step_peak_mib(step, *batch)
    return codes, figures


def fused_attention_here():
    """torch held to its fused attention kernels, the math kernel off, as `--extra flash-attention` holds it; on a
    CPU, the flash kernel's CPU form answered for (Keras asks torch a CUDA-only question)."""
    import torch

    from mtbench.plugins.backends.torch_backend import TorchBackend
    TorchBackend().attention_kernels(True, {"kind": "gpu" if torch.cuda.is_available() else "cpu"})
    if not torch.cuda.is_available():
        torch.backends.cuda.can_use_flash_attention = lambda params, debug=False: True


def generated_programs(preset, rows, block, dtype, precision_casts=True, save_code=None):
    """{'mtbench': figures, 'reference': figures} of one step of each on `rows` x `block` tokens; without
    `precision_casts`, mtbench's step in torch.compile's own arithmetic instead of the eager step's rounding. With
    `save_code` (a folder), each program's source is written there to be read side by side."""
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import numpy as np
    import torch
    from benchmarks import best_gpt_torch
    from benchmarks.workload import OptimizerSettings
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.initialization import assign_weights, initial_weights
    from mtbench.plugins import manager as plugins
    from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model
    steps = 10
    config = TrainConfig(model_name="gpt", preset=preset, dtype=dtype, block_size=block, steps=steps)
    shape = dataclasses.replace(config.model, max_len=block)
    fused_attention_here()
    keras.config.set_dtype_policy(dtype)
    model = build_gpt(shape, flash_attention=True)
    weights = initial_weights(model, config.seed)
    assign_weights(model, weights)
    compile_model(keras, model, config, steps, {}, plugins.registry().lookup("models", "gpt"))
    ids = np.random.default_rng(config.seed).integers(0, 256, (rows, block + 1)).astype(np.int32)
    tokens, next_tokens, weight = ids[:, :-1], ids[:, 1:], np.ones((rows, block), np.float32)
    ours = CompiledTorchTrainStep(model)
    torch._inductor.config.emulate_precision_casts = precision_casts  # the step turns it on
    count_kernel_bytes()
    codes, figures = {}, {}
    codes["mtbench"], figures["mtbench"] = measured_program(ours, (tokens,), next_tokens, weight)
    torch._inductor.config.emulate_precision_casts = False  # inductor's default, as nanoGPT's process runs it
    reference = best_gpt_torch.train_step_from_keras_weights(
        shape, weights, OptimizerSettings.of_config(config, steps), mixed_bfloat16=dtype == "mixed_bfloat16",
        compile=True, device=model.weights[0].value.device)
    batch = [torch.as_tensor(array).to(reference.device) for array in (tokens, next_tokens, weight)]
    batch[0], batch[1] = batch[0].long(), batch[1].long()
    codes["reference"], figures["reference"] = measured_program(reference, *batch)
    if save_code:
        save_programs(codes, save_code)
    return figures


def save_programs(codes, folder):
    """Each program's source as `{mtbench,reference}-{forward,backward}.py` in `folder`."""
    os.makedirs(folder, exist_ok=True)
    for name, programs in codes.items():
        for part, code in zip(("forward", "backward"), programs):
            with open(os.path.join(folder, f"{name}-{part}.py"), "w") as f:
                f.write(code)


def shown(figure):
    return f"{figure:.4g}" if isinstance(figure, float) else str(figure)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--dtype", default="mixed_bfloat16", choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--no-precision-casts", dest="precision_casts", action="store_false",
                        help="mtbench's step without the eager step's rounding, to see what the rounding costs")
    parser.add_argument("--save-code", metavar="FOLDER", help="write each program's source there")
    args = parser.parse_args(argv)
    from mtbench.keras_models.presets import GPT_PRESETS
    if args.preset not in GPT_PRESETS:
        parser.error(f"--preset: '{args.preset}' is none of the GPT presets {', '.join(GPT_PRESETS)}")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    figures = generated_programs(args.preset, args.rows, args.block_size, args.dtype, args.precision_casts,
                                 args.save_code)
    import torch
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    ours, reference = figures["mtbench"], figures["reference"]
    casts = "" if args.precision_casts else ", mtbench's step without the eager step's rounding"
    print(f"GPT {args.preset}, {args.rows} x {args.block_size} tokens, {args.dtype}, inductor for {device}{casts}")
    print(f"{'':30} {'mtbench':>9} {'reference':>10}")
    for name in ours:
        print(f"{name:30} {shown(ours[name]):>9} {shown(reference[name]):>10}")
    print(json.dumps({"preset": args.preset, "rows": args.rows, "block_size": args.block_size, "dtype": args.dtype,
                      "precision_casts": args.precision_casts, "device": device, "torch": torch.__version__, **figures}))


if __name__ == "__main__":
    main()
