"""mtbench's JAX train step for the GPT against the best-by-hand JAX reference (benchmarks/best_gpt_jax.py), as
programs: both compiled by XLA for this machine's device from the same weights, shape and optimizer recipe, and
held side by side by what XLA's cost analysis counts (FLOPs, bytes accessed, transcendentals) and by what they
hold (matrix multiplications, dtype conversions, fusions), and by the kernels each launches
(`benchmarks/hlo_kernels.py`: per kind, the bytes they name and, for a GPU, the roofline time). Nothing runs: a
difference here is work one of them does that the other does not, before any clock.

    python benchmarks/program_cost.py [--preset gpt2-small] [--rows 2] [--block-size 128] [--dtype mixed_bfloat16]
                                      [--target here|h100]

`--target h100` compiles both steps for an NVIDIA H100 without one (XLA's deviceless compilation, from a
description of the device: `H100_TARGET`), on a machine with jax's CUDA plugin installed (`pip install
'jax[cuda13]'`) and no GPU: the programs a GPU would run, read where there is none. XLA cannot autotune there, so
its matrix-multiplication configurations are its defaults. Attention is cuDNN's fused kernel in 16 bits (what
`--attention auto` chooses on a GPU), XLA's own in float32.

The last line printed is one JSON object: each program's figures and mtbench's over the reference's."""

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import re
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPOSITORY not in sys.path:
    sys.path.insert(0, REPOSITORY)  # run as a script: `benchmarks` and `mtbench` from this checkout

COSTS = ("flops", "bytes accessed", "transcendentals")
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_MEMORY_BANDWIDTH = 3.35e12  # bytes/s, the H100 SXM datasheet's HBM3
# The device XLA compiles for under `--target h100`: an H100 SXM as XLA's GPU compiler describes a device (its
# `GpuTargetConfig`), from the datasheet: 132 SMs, 50 MiB of L2, 3.35 TB/s, 1.98 GHz, compute capability 9.0;
# cuDNN 9 and CUDA 13, as on the GPU machine this project is lent.
H100_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024  threads_per_warp: 32  shared_memory_per_block: 49152
  shared_memory_per_core: 233472  threads_per_core_limit: 2048  core_count: 132  fpus_per_core: 128
  block_dim_limit_x: 2147483647  block_dim_limit_y: 65535  block_dim_limit_z: 65535
  memory_bandwidth: 3350000000000  l2_cache_size: 52428800  clock_rate_ghz: 1.98
  device_memory_size: 85520809984  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 minor: 0 }
  registers_per_core_limit: 65536  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 }
runtime_version { major: 13 minor: 0 }
""" + f'device_description_str: "{H100_NAME}"\n'


def program_figures(compiled, lowered_text, peaks=(None, None)):
    """What XLA's cost analysis counts in `compiled` (where it counts: not for a GPU compiled without one), what
    the program before optimization holds, and the kernels of the optimised program (`hlo_kernels`; with the
    device's `peaks`, (FLOP/s, bytes/s), their roofline time)."""
    from benchmarks.hlo_kernels import kernel_figures
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}
    ops = collections.Counter(re.findall(r"(stablehlo\.[a-z_]+)", lowered_text))
    optimized = compiled.as_text()
    return {**{name: float(cost[name]) for name in COSTS if name in cost},
            "matmuls": ops["stablehlo.dot_general"], "conversions": ops["stablehlo.convert"],
            "fusions": len(re.findall(r"\bfusion\(", optimized)), **kernel_figures(optimized, *peaks)}


def prepare_deviceless_gpu():
    """Before jax starts: no GPU is looked for (the CUDA plugin's version checks need one) and the CPU is the
    only device; the H100 is only a compilation target."""
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
    os.environ["JAX_PLATFORMS"] = "cpu"


class Compiler:
    """Compiles a jitted function for this machine's device (`target` 'here') or for an H100 (`h100`)."""

    def __init__(self, target):
        self.target = target
        if target == "here":
            return
        import jax
        from jax.experimental import topologies
        try:
            topology = topologies.get_topology_desc(platform="cuda", target_config=H100_TARGET, topology="1x1x1")
        except NotImplementedError:
            raise SystemExit("program_cost.py: --target h100 needs jax's CUDA plugin (pip install 'jax[cuda13]'), "
                             "not a GPU") from None
        mesh = topologies.make_mesh(topology, (1,), ("device",))
        self.sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    @property
    def gpu(self):
        return self.target != "here"

    def compile(self, jitted, *args):
        """(compiled, lowered StableHLO text) of `jitted` for `args`."""
        if not self.gpu:
            lowered = jitted.lower(*args)
            return lowered.compile(), lowered.as_text()
        import jax
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=self.sharding), args)
        lowered = jitted.trace(*abstract).lower(lowering_platforms=("cuda",))
        return lowered.compile(), lowered.as_text()

    def peaks(self, dtype):
        if not self.gpu:
            return None, None
        from mtbench.runner.measurement.peaks import datasheet_peak
        return datasheet_peak(H100_NAME, dtype)[0], H100_MEMORY_BANDWIDTH


@contextlib.contextmanager
def fused_attention_for_a_gpu(model, compiler, dtype):
    """mtbench's model calls cuDNN's fused attention while the step is traced where `--attention auto` would (a
    GPU, 16 bits), as the reference does. Compiling for a GPU without one, Keras's check of the first local
    device's compute capability (the CPU's) answers for the target (9.0) meanwhile."""
    import jax
    from mtbench.keras_models.transformer import Attention
    if dtype != "mixed_bfloat16" or not (compiler.gpu or jax.default_backend() == "gpu"):
        yield False
        return
    from jax._src.cudnn import fused_attention_stablehlo as cudnn
    layers = [layer for layer in model._flatten_layers() if isinstance(layer, Attention)]
    check = cudnn.check_compute_capability
    if compiler.gpu:
        cudnn.check_compute_capability = lambda capability: float(capability) <= 9.0
    for layer in layers:
        layer.flash_attention = True
    try:
        yield True
    finally:
        cudnn.check_compute_capability = check
        for layer in layers:
            layer.flash_attention = False


def compiled_programs(preset, rows, block, dtype, target="here"):
    """{'mtbench': figures, 'reference': figures} of the two steps for one batch of `rows` x `block` tokens,
    compiled for `target` ('here': this machine's device; 'h100': see `H100_TARGET`)."""
    os.environ["KERAS_BACKEND"] = "jax"
    import jax.numpy as jnp
    import keras
    import numpy as np

    from benchmarks import best_gpt_jax
    from benchmarks.workload import OptimizerSettings
    from mtbench.keras_models.gpt import build_gpt
    from mtbench.keras_models.initialization import initial_weights
    from mtbench.plugins import manager as plugins
    from mtbench.plugins.backends.jax_jit_step import JitTrainStep
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.setup import compile_model, set_matmul_precision
    compiler = Compiler(target)
    peaks = compiler.peaks(dtype)  # a datasheet's float32 peak: IEEE float32's, the programs' matmuls' below
    # float32 matmuls in float32, as `mtbench train` runs them (XLA compiles them as TF32 on a GPU otherwise)
    matmul_precision = set_matmul_precision(plugins.registry().backends["jax"], "highest")
    steps = 10
    config = TrainConfig(model_name="gpt", preset=preset, dtype=dtype, block_size=block, steps=steps)
    shape = dataclasses.replace(config.model, max_len=block)
    keras.config.set_dtype_policy(dtype)
    model = build_gpt(shape)
    compile_model(keras, model, config, steps, {}, plugins.registry().lookup("models", "gpt"))
    ids, weight = np.ones((rows, block), np.int32), np.ones((rows, block), np.float32)
    with fused_attention_for_a_gpu(model, compiler, dtype) as fused:
        ours = JitTrainStep(model)
        state = tuple([v.value for v in variables] for variables in ours._keras_state())
        arguments = (state, (ids,), ids, weight, ours.schedule_arguments())
        figures = {"mtbench": program_figures(*compiler.compile(ours._step, *arguments), peaks)}
    reference = best_gpt_jax.train_step_from_keras_weights(
        shape, initial_weights(model, config.seed), OptimizerSettings.of_config(config, steps),
        mixed_bfloat16=dtype == "mixed_bfloat16", attention="cudnn" if fused else "auto")
    batch = (jnp.asarray(ids), jnp.asarray(ids), jnp.asarray(weight))
    figures["reference"] = program_figures(*compiler.compile(
        reference._step, reference.params, reference.optimizer_state, reference.key, *batch), peaks)
    return {**figures, "matmul_precision": matmul_precision}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--dtype", default="mixed_bfloat16", choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--target", default="here", choices=["here", "h100"],
                        help="compile for this machine's device, or for an H100 without one")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.target != "here":
        prepare_deviceless_gpu()
    figures = compiled_programs(args.preset, args.rows, args.block_size, args.dtype, args.target)
    ours, reference = figures["mtbench"], figures["reference"]
    from benchmarks.overhead import versions
    installed = {name: version for name, version in versions().items() if version}
    names = list(dict.fromkeys([*ours, *reference]))
    for program in (ours, reference):
        for name in names:
            program.setdefault(name, 0)
    ratios = {name: ours[name] / reference[name] for name in names if reference[name]}
    import jax
    device = H100_NAME if args.target == "h100" else jax.devices()[0].device_kind
    print(f"GPT {args.preset}, {args.rows} x {args.block_size} tokens, {args.dtype}, compiled for {device}; float32 "
          f"matmuls {figures['matmul_precision']['reported']}; " + ", ".join(f"{k} {v}" for k, v in installed.items()))
    print(f"{'':40} {'mtbench':>12} {'reference':>12} {'ratio':>7}")
    for name in names:
        print(f"{name:40} {ours[name]:>12.4g} {reference[name]:>12.4g} {ratios.get(name, float('nan')):>7.3f}")
    print(json.dumps({"preset": args.preset, "rows": args.rows, "block_size": args.block_size, "dtype": args.dtype,
                      "target": args.target, "device": device, "versions": installed, **figures, "ratios": ratios}))


if __name__ == "__main__":
    main()
