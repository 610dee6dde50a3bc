"""mtbench's JAX train step for the GPT against the best-by-hand JAX reference (benchmarks/best_gpt_jax.py), as
programs: both compiled by XLA for this machine's device from the same weights, shape and optimizer recipe, and
held side by side by what XLA's cost analysis counts (FLOPs, bytes accessed, transcendentals) and by what they
hold (matrix multiplications, dtype conversions, fusions). Nothing runs: a difference here is work one of them
does that the other does not, on any machine, before any clock.

    python benchmarks/program_cost.py [--preset gpt2-small] [--rows 2] [--block-size 128] [--dtype mixed_bfloat16]

The last line printed is one JSON object: each program's figures and mtbench's over the reference's."""

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

COSTS = ("flops", "bytes accessed", "transcendentals")


def program_figures(compiled, lowered_text):
    """What XLA's cost analysis counts in `compiled`, and what the program before optimization holds."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    ops = collections.Counter(re.findall(r"(stablehlo\.[a-z_]+)", lowered_text))
    optimized = compiled.as_text()
    return {**{name: float(cost.get(name, 0.0)) for name in COSTS},
            "matmuls": ops["stablehlo.dot_general"], "conversions": ops["stablehlo.convert"],
            "fusions": len(re.findall(r"\bfusion\(", optimized))}


def compiled_programs(preset, rows, block, dtype):
    """{'mtbench': figures, 'reference': figures} of the two steps for one batch of `rows` x `block` tokens."""
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
    from mtbench.runner.setup import compile_model
    steps = 10
    config = TrainConfig(model_name="gpt", preset=preset, dtype=dtype, block_size=block, steps=steps)
    shape = dataclasses.replace(config.model, max_len=block)
    keras.config.set_dtype_policy(dtype)
    model = build_gpt(shape)
    compile_model(keras, model, config, steps, {}, plugins.registry().lookup("models", "gpt"))
    ids, weight = np.ones((rows, block), np.int32), np.ones((rows, block), np.float32)
    ours = JitTrainStep(model)
    state = tuple([v.value for v in variables] for variables in ours._keras_state())
    lowered = ours._step.lower(state, (ids,), ids, weight)
    figures = {"mtbench": program_figures(lowered.compile(), lowered.as_text())}
    reference = best_gpt_jax.train_step_from_keras_weights(
        shape, initial_weights(model, config.seed), OptimizerSettings.of_config(config, steps),
        mixed_bfloat16=dtype == "mixed_bfloat16")
    batch = (jnp.asarray(ids), jnp.asarray(ids), jnp.asarray(weight))
    lowered = reference._step.lower(reference.params, reference.optimizer_state, reference.key, *batch)
    figures["reference"] = program_figures(lowered.compile(), lowered.as_text())
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="gpt2-small")
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--dtype", default="mixed_bfloat16", choices=["float32", "mixed_bfloat16"])
    args = parser.parse_args(argv)
    figures = compiled_programs(args.preset, args.rows, args.block_size, args.dtype)
    ratios = {name: figures["mtbench"][name] / figures["reference"][name]
              for name in figures["mtbench"] if figures["reference"][name]}
    import jax
    print(f"GPT {args.preset}, {args.rows} x {args.block_size} tokens, {args.dtype}, compiled for "
          f"{jax.devices()[0].device_kind}")
    print(f"{'':18} {'mtbench':>12} {'reference':>12} {'ratio':>7}")
    for name in figures["mtbench"]:
        print(f"{name:18} {figures['mtbench'][name]:>12.4g} {figures['reference'][name]:>12.4g} "
              f"{ratios.get(name, float('nan')):>7.3f}")
    print(json.dumps({"preset": args.preset, "rows": args.rows, "block_size": args.block_size, "dtype": args.dtype,
                      "device": jax.devices()[0].device_kind, **figures, "ratios": ratios}))


if __name__ == "__main__":
    main()
