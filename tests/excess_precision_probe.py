"""Run by tests/plugins/backends/test_jax_step_program.py, in its own process (XLA reads XLA_FLAGS once, when JAX
starts) and in the test's: how many times XLA:CPU's compiled program of a bfloat16 product, then a float32 mean of it,
rounds to bfloat16, as this process's XLA_FLAGS set XLA (`ran`), with XLA's excess precision allowed (`kept`) and
not (`rounded`), and the row a JAX step computing in bfloat16 records here (`row`). Prints one JSON line.

    XLA_FLAGS=... JAX_PLATFORMS=cpu python tests/excess_precision_probe.py
"""

import json
import os
import re
import sys
import types


def mean_of_a_bfloat16_product(x):
    """The product rounded to bfloat16 as the program says, then read back into float32 for the mean: the rounding
    XLA's excess precision skips on a CPU."""
    import jax.numpy as jnp
    return jnp.mean((x.astype(jnp.bfloat16) * 3).astype(jnp.float32), -1)


def bfloat16_roundings(program):
    """How many values XLA's compiled `program` (HLO text) rounds to bfloat16: its converts to bf16."""
    return len(re.findall(r"= bf16\[[^\]]*\]\S* convert\(", program))


def report():
    import jax
    import jax.numpy as jnp

    from mtbench.plugins.backends.rounding_16_bit import xla_rounding_text
    # On XLA:CPU on any machine (a GPU machine's JAX has a CPU too): its rounding is the one counted here.
    lowered = jax.jit(mean_of_a_bfloat16_product).lower(jax.device_put(jnp.ones((8, 8)), jax.devices("cpu")[0]))
    roundings = {name: bfloat16_roundings(lowered.compile(options).as_text())
                 for name, options in (("ran", None), ("kept", {"xla_allow_excess_precision": True}),
                                       ("rounded", {"xla_allow_excess_precision": False}))}
    bfloat16_model = types.SimpleNamespace(dtype_policy=types.SimpleNamespace(compute_dtype="bfloat16"))
    return {**roundings, "row": xla_rounding_text(bfloat16_model)}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(json.dumps(report()))
