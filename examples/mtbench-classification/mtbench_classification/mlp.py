"""The model family `mlp-classifier`: a multilayer perceptron over an example's features, sized by --preset (tiny,
small, base: their --d-model hidden units and layers) and --d-model, --layers, --dropout; started from mtbench's
seeded numpy draw (its layers' variables are kernels and biases), trained on the classification task."""

from dataclasses import asdict, dataclass

from mtbench import ModelFamily, MtbenchError

# The size flags of attention models, which a perceptron does not take.
REFUSED_FLAGS = ("heads", "encoder_layers", "decoder_layers", "ff_dim")


@dataclass(frozen=True)
class MLPShape:
    """The size of a built classifier (the result's `model` section)."""
    features: int
    hidden: int      # units per hidden layer (--d-model)
    layers: int      # hidden layers (--layers)
    classes: int
    dropout: float = 0.0

    def to_dict(self):
        return asdict(self)

    @property
    def multiply_adds(self):
        """Multiply-adds of one example's forward pass: every kernel's size."""
        return (self.features * self.hidden + (self.layers - 1) * self.hidden * self.hidden
                + self.hidden * self.classes)


class MLPClassifierFamily(ModelFamily):
    name = "mlp-classifier"
    description = ("a multilayer perceptron classifier (ReLU; size: --preset tiny/small/base, --d-model hidden "
                   "units, --layers hidden layers, --dropout), trained from scratch on the classification task")
    task = "classification"
    attention_kinds = ()  # no attention

    def check(self, path, config):
        for flag in REFUSED_FLAGS:
            if getattr(config, flag) is not None:
                raise MtbenchError(f"--{flag.replace('_', '-')}: the mlp-classifier has no attention and one stack; "
                                   f"it takes --d-model (hidden units), --layers (hidden layers) and --dropout")

    def build(self, run, path, tokenizer, max_len):
        from mtbench_classification.keras_mlp import build_mlp
        size = run.config.model  # the preset with the size flags over it
        shape = MLPShape(features=tokenizer.features, hidden=size.d_model, layers=size.decoder_layers,
                         classes=tokenizer.vocab_size, dropout=size.dropout)
        return build_mlp(shape), shape

    def training_flops(self, model_shape, rows, source_length, target_length):
        """6 FLOPs per weight and example (2 forward, 4 backward), the count of Kaplan et al. (2020): a row is an
        example, whatever its length (the features)."""
        return 6 * model_shape.multiply_adds * rows

    def load_saved(self, directory, description):
        return None, None  # the shape comes from the run's configuration, the pixel encoding from the task
