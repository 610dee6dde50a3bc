"""The classifier, written once with keras and keras.ops so every backend runs the same model. Imported only once
mtbench has started keras on the run's backend."""

import keras
from keras import layers, ops


class MLPClassifier(keras.Model):
    """Input: features (batch, features) float32, or a one-element tuple of them (how mtbench's train steps pass a
    batch's inputs); output: float32 logits (batch, 1, classes), one "token" per example."""

    def __init__(self, features, hidden, layers_count, classes, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.features = features
        self.hidden = [layers.Dense(hidden, activation="relu", name=f"hidden_{i}") for i in range(layers_count)]
        self.dropout = layers.Dropout(dropout) if dropout > 0 else None
        self.classify = layers.Dense(classes, name="classify")

    def call(self, inputs, training=False):
        x = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
        for layer in self.hidden:
            x = layer(x)
            if self.dropout is not None:
                x = self.dropout(x, training=training)
        return ops.cast(ops.expand_dims(self.classify(x), 1), "float32")


def build_mlp(shape):
    """The model of `shape` (an `MLPShape`) with its variables created, so weights can be set before compiling."""
    model = MLPClassifier(shape.features, shape.hidden, shape.layers, shape.classes, shape.dropout,
                          name="mlp_classifier")
    model(ops.zeros((1, shape.features), dtype="float32"))
    return model
