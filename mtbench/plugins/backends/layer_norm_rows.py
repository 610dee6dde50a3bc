"""A model's layer norms and the words of a train step's layer-norm row (`TrainStep.numerics`), the same for every
backend: which form computes each norm's statistics is the backend's own, and is said beside the figures."""


def layer_norms(model):
    """Every `keras.layers.LayerNormalization` of `model`, subclasses included."""
    import keras
    return [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.LayerNormalization)]


def forms_text(form, taking, own_call, total, untraced=0, kernel=""):
    """The words of a step's layer-norm row: of the model's `total` norms, how many `form` computes (`taking`, by
    `kernel` where one is named), how many their own `call` (Keras's: two passes) and how many no traced call
    reached."""
    if not total:
        return "none in the model"
    parts = [f"{form} ({f'{kernel}; ' if kernel else ''}{taking} of {total} layer norms)"] if taking else []
    if own_call:
        parts.append(f"{own_call} of {total} by their own `call` (Keras's: two passes)")
    if untraced:
        parts.append(f"{untraced} of {total} not called by the traced program")
    return "; ".join(parts)
