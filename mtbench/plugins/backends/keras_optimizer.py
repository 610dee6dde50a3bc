"""What mtbench's train steps and extras read of the Keras optimizer `compile_model` makes: the AdamW, which
float16's loss scaling wraps (`LossScaleOptimizer`), and the two Adam moment variables it keeps for each weight."""


def inner_optimizer(optimizer):
    """The optimizer that updates the weights: a loss-scaling optimizer's inner one, else `optimizer` itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def scales_losses(optimizer):
    """Whether `optimizer` is Keras's loss-scaling wrapper (float16 policies)."""
    import keras
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def moments_of(optimizer, variable):
    """The Keras AdamW's two moment variables of `variable` (through a loss-scaling wrapper)."""
    optimizer = inner_optimizer(optimizer)
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def all_moments(optimizer):
    """Every moment variable of the Keras AdamW (through a loss-scaling wrapper)."""
    optimizer = inner_optimizer(optimizer)
    return [*optimizer._momentums, *optimizer._velocities]
