"""The arithmetic MFU is counted in. The FLOPs of a step come from the model family (`ModelFamily.training_flops`;
the built-in families count them with `mtbench.keras_models.flops`)."""


def compute_dtype(dtype_policy):
    """The dtype the matmuls run in under a Keras dtype policy name."""
    return dtype_policy.replace("mixed_", "")
