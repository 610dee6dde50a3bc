"""Recognising the loss `compile_model` sets, so a backend's train step may compute it its own, faster way.

Keras's sparse cross-entropy is written once for every backend, and on each it is slower than the framework's
own formulation of the same numbers (on JAX a one-hot product whose backward materialises a second
vocabulary-sized array; on torch a move of the vocabulary axis that copies the logits). A step that recognises
the loss computes it natively; any other loss is called through Keras."""


def is_token_mean_cross_entropy(loss):
    """True when `loss` is sparse categorical cross-entropy from logits over the last axis, summed over tokens
    with their weights and divided by the sum of the weights."""
    import keras
    if not isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
        return False
    config = loss.get_config()
    return (config["from_logits"] and config["reduction"] == "mean_with_sample_weight"
            and config.get("ignore_class") is None and config.get("axis", -1) == -1)


def refuse_accumulating_other_losses(micro_batches, native_loss, loss):
    """Gradient accumulation weighs each micro-batch's token mean by its share of the step's tokens, which sums to
    the step's token mean only for that loss: any other compiled loss is refused rather than summed wrongly."""
    if micro_batches > 1 and not native_loss:
        from mtbench import MtbenchError
        raise MtbenchError(f"--grad-accum {micro_batches}: the model's loss ({type(loss).__name__}) is not the "
                           f"token-mean cross-entropy whose micro-batches a step can sum")
