"""Initial weights drawn with numpy, so every backend starts from the same numbers.

Keras initializers draw from each backend's own random generator, so the same seed gives different weights on
JAX and torch; a comparison that starts from different weights measures the draw as much as the framework. Each
variable gets its own generator seeded by (seed, variable path), so the values do not depend on creation order.

What is drawn is a scheme (`--init`), each the way its users start a model, drawn here for every backend alike:
- glorot: mtbench's first draw, the translation Transformer's: Glorot-uniform kernels, token embeddings
  normal(0, d_model ** -0.5), positions normal(0, 0.02);
- gpt2: GPT-2's and nanoGPT's: kernels and embeddings normal(0, 0.02), the projections that end a residual
  branch (each attention's output, each feed-forward's second layer) normal(0, 0.02 / sqrt(branches));
- torch: what `torch.nn` gives a freshly made layer: `Linear` weights and biases uniform(+-1 / sqrt(fan_in)),
  `Embedding` normal(0, 1), which an output layer tied to the embedding inherits (`TIED_OUTPUT_NOTES`);
- flax: what Flax gives one: `Dense` kernels LeCun normal (truncated at two standard deviations), zero biases,
  `Embed` normal(0, 1 / sqrt(features)).
Every scheme starts norms at scale 1 and offset 0, and glorot, gpt2 and flax start biases at 0.
"""

import math
import zlib

import numpy as np

# --init's choices, and what each draws.
INIT_SCHEMES = {
    "glorot": "Glorot-uniform kernels, token embeddings normal(0, d_model^-0.5), positions normal(0, 0.02)",
    "gpt2": "GPT-2's and nanoGPT's: normal(0, 0.02), residual projections 0.02 / sqrt(2 x layers)",
    "torch": "torch.nn's defaults: Linear uniform(+-1/sqrt(fan_in)) weights and biases, Embedding normal(0, 1)",
    "flax": "Flax's defaults: Dense LeCun-normal kernels and zero biases, Embed normal(0, 1/sqrt(features))",
}
DEFAULT_SCHEME = "glorot"
# What a scheme's embedding draw makes of an output layer tied to the embedding, where a model of the scheme's users
# would start its output layer otherwise: torch's tied head is nn.Embedding's draw, where a published torch GPT's is
# an untied nn.Linear. (gpt2 is GPT-2's own tying; flax's Embed normal(0, 1/sqrt(features)), used as the output
# layer, has the variance of its Dense's LeCun normal.)
TIED_OUTPUT_NOTES = {
    "torch": "the output layer, tied to the token embedding, inherits its normal(0, 1), not the "
             "uniform(+-1/sqrt(d_model)) of an untied nn.Linear head (a published torch GPT's): its first logits are "
             "sqrt(3 x d_model) times as large, its first losses far above a uniform guess's",
}
GPT2_STD = 0.02
# The standard deviation of a standard normal truncated to [-2, 2] (JAX's `truncated_normal` variance scaling
# divides by it, so that the truncated draw keeps the variance asked for).
TRUNCATED_NORMAL_STD = 0.87962566103423978


def _generator(path, seed):
    return np.random.default_rng([seed, zlib.crc32(path.encode())])


def _truncated_normal(rng, std, shape):
    """normal(0, std) truncated to two standard deviations, redrawing what falls outside."""
    values = rng.standard_normal(size=shape)
    outside = np.abs(values) > 2.0
    while outside.any():
        values[outside] = rng.standard_normal(size=int(outside.sum()))
        outside = np.abs(values) > 2.0
    return values * std


def initial_value(path, shape, seed, scheme=DEFAULT_SCHEME, fan_in=None, residual_branches=None):
    """The initial value of the variable at `path` under `scheme`. `fan_in`: the inputs of the layer a bias
    belongs to (torch draws biases by it); `residual_branches`: for a kernel that ends a residual branch, how many
    such branches the model has (gpt2 scales those by it)."""
    rng = _generator(path, seed)
    name = path.rsplit("/", 1)[-1]
    if name == "gamma":
        return np.ones(shape, np.float32)
    if name == "beta" or (name == "bias" and scheme != "torch"):
        return np.zeros(shape, np.float32)
    if name not in ("embeddings", "kernel", "bias"):
        raise ValueError(f"no initialisation rule for variable {path}")
    if scheme == "glorot":
        if name == "embeddings":
            std = 0.02 if "position" in path else shape[-1] ** -0.5
            return rng.normal(0.0, std, size=shape).astype(np.float32)
        limit = np.sqrt(6.0 / (shape[0] + shape[-1]))
        return rng.uniform(-limit, limit, size=shape).astype(np.float32)
    if scheme == "gpt2":
        std = GPT2_STD / math.sqrt(residual_branches) if residual_branches else GPT2_STD
        return rng.normal(0.0, std, size=shape).astype(np.float32)
    if scheme == "torch":
        if name == "embeddings":
            return rng.standard_normal(size=shape).astype(np.float32)
        bound = 1.0 / math.sqrt(fan_in if name == "bias" else math.prod(shape[:-1]))
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)
    if scheme == "flax":
        if name == "embeddings":
            return rng.normal(0.0, shape[-1] ** -0.5, size=shape).astype(np.float32)
        std = 1.0 / math.sqrt(math.prod(shape[:-1])) / TRUNCATED_NORMAL_STD
        return _truncated_normal(rng, std, shape).astype(np.float32)
    raise ValueError(f"no initialisation scheme '{scheme}' (one of {', '.join(INIT_SCHEMES)})")


def residual_projections(model):
    """The kernels that end a residual branch (each attention's output projection, each feed-forward's second
    layer), by variable path: the model's residual branches."""
    from mtbench.keras_models.gpt import MLP
    from mtbench.keras_models.transformer import Attention, FeedForward
    kernels = []
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, Attention):
            kernels.append(layer.output_projection.kernel.path)
        elif isinstance(layer, (MLP, FeedForward)):
            kernels.append(layer.out.kernel.path)
    return kernels


def tied_output_embedding(model):
    """The path of the embedding table that `model`'s output layer is tied to (the logits are the last hidden states
    times that table, transposed), or None: mtbench's GPT and translation Transformer tie theirs to the token
    embedding (`GPT.logits`, `Transformer._logits`); a plugin's model is not known to."""
    from mtbench.keras_models.gpt import GPT
    from mtbench.keras_models.transformer import Transformer
    return model.token_embedding.embeddings.path if isinstance(model, (GPT, Transformer)) else None


def init_note(scheme, model):
    """What drawing `model` by `scheme` gives its tied output layer that the scheme's users' own output layer would
    not have (`TIED_OUTPUT_NOTES`), or None."""
    note = TIED_OUTPUT_NOTES.get(scheme)
    return note if note and tied_output_embedding(model) else None


def describe_init(scheme, model):
    """How `model`'s starting weights were drawn, in words: the scheme's draw, and `init_note`; None where `scheme`
    is none of INIT_SCHEMES (a checkpoint's weights, a weights file that does not say)."""
    if scheme not in INIT_SCHEMES:
        return None
    note = init_note(scheme, model)
    return INIT_SCHEMES[scheme] + (f"; {note}" if note else "")


def layer_fan_ins(model):
    """{bias path: the inputs of its layer}: a Dense bias's kernel's first dimension."""
    fan_ins = {}
    for layer in model._flatten_layers(include_self=False):
        kernel, bias = getattr(layer, "kernel", None), getattr(layer, "bias", None)
        if kernel is not None and bias is not None and hasattr(bias, "path"):
            fan_ins[bias.path] = math.prod(tuple(kernel.shape)[:-1])
    return fan_ins


def initial_weights(model, seed, scheme=DEFAULT_SCHEME):
    """The initial values of every model variable under `scheme`, keyed by variable path."""
    residual = set(residual_projections(model))
    fan_ins = layer_fan_ins(model)
    return {v.path: initial_value(v.path, tuple(v.shape), seed, scheme, fan_in=fan_ins.get(v.path),
                                  residual_branches=len(residual) if v.path in residual else None)
            for v in model.weights}


def assign_weights(model, weights):
    """Sets every model variable from a {path: array} mapping; refuses a mapping that does not fit the model."""
    by_path = {v.path: v for v in model.weights}
    if set(by_path) != set(weights):
        missing, unexpected = sorted(set(by_path) - set(weights)), sorted(set(weights) - set(by_path))
        raise ValueError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for path, variable in by_path.items():
        value = weights[path]
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"weight {path} has shape {value.shape}, the model wants {tuple(variable.shape)}")
        variable.assign(value)
