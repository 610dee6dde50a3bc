"""Where a train step rounds its 16-bit intermediates, in words for `TrainStep.numerics` (`rounding_16_bit`): each
backend's compiler may keep an intermediate in float32 where the program rounds it to bfloat16 or float16, which
changes the losses, and the two backends' defaults differ.

torch's eager step rounds every operation's result to its dtype; its compiled step is made to round where the eager
step does (`torch_compiled_step`). XLA, by default (`--xla_allow_excess_precision`, true), may skip the rounding of an
intermediate it computes in float32 where the next operation takes it back to float32 (on this CPU, before
reductions and around slices and pads; its GPU compiler reads the same flag). The tiny GPT's mixed_bfloat16 step,
compiled on this CPU, rounds to bfloat16 169 times with the flag true and 204 times with it false, and its losses
from the same weights and batches part by 2e-5 at the first step and 7e-5 at the fourth. mtbench leaves the flag as
JAX's users leave it (false would be a GPU program nobody has timed, and not the one a JAX user runs) and says which
one ran: a run with `XLA_FLAGS=--xla_allow_excess_precision=false` rounds where torch's steps round, and says so.
"""

import os

ROUNDED_AS_WRITTEN = "16-bit intermediates rounded where the program rounds them"
NO_16_BIT = "none: the step computes in float32"
EAGER_ROUNDING = f"{ROUNDED_AS_WRITTEN} (eager torch: every operation's result)"
XLA_EXCESS_PRECISION = ("16-bit intermediates may be kept in float32 between operations XLA fuses, where the program "
                        "rounds them (xla_allow_excess_precision true, XLA's default)")
XLA_ROUNDED = f"{ROUNDED_AS_WRITTEN} (xla_allow_excess_precision false, from XLA_FLAGS)"
EXCESS_PRECISION_FLAG = "--xla_allow_excess_precision"


def computes_in_16_bits(model):
    """Whether `model`'s dtype policy computes in bfloat16 or float16 (mixed or not)."""
    return model.dtype_policy.compute_dtype in ("bfloat16", "float16")


def excess_precision_allowed(xla_flags):
    """Whether XLA, started with `xla_flags` (the text of XLA_FLAGS, or None), may keep 16-bit intermediates in
    float32: its flag as XLA parses it (`--flag`, `--flag=true|1`, `--flag=false|0`, the last one given counting),
    true where not given."""
    allowed = True
    for token in (xla_flags or "").split():
        name, equals, value = token.partition("=")
        if name == EXCESS_PRECISION_FLAG:
            allowed = not equals or value.lower() in ("true", "1")
    return allowed


def xla_rounding_text(model):
    """The `rounding_16_bit` words of a JAX step training `model`, as this process's XLA_FLAGS set XLA (which reads
    them once, when JAX starts its backends)."""
    if not computes_in_16_bits(model):
        return NO_16_BIT
    return XLA_EXCESS_PRECISION if excess_precision_allowed(os.environ.get("XLA_FLAGS")) else XLA_ROUNDED
