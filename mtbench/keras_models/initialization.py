"""Initial weights drawn with numpy, so every backend starts from the same numbers.

Keras initializers draw from each backend's own random generator, so the same seed gives different weights on
JAX and torch; a comparison that starts from different weights measures the draw as much as the framework. Each
variable gets its own generator seeded by (seed, variable path), so the values do not depend on creation order.
"""

import zlib

import numpy as np


def initial_value(path, shape, seed):
    rng = np.random.default_rng([seed, zlib.crc32(path.encode())])
    name = path.rsplit("/", 1)[-1]
    if name == "embeddings":
        std = 0.02 if "position" in path else shape[-1] ** -0.5
        return rng.normal(0.0, std, size=shape).astype(np.float32)
    if name == "kernel":
        limit = np.sqrt(6.0 / (shape[0] + shape[-1]))  # Glorot uniform
        return rng.uniform(-limit, limit, size=shape).astype(np.float32)
    if name == "gamma":
        return np.ones(shape, np.float32)
    if name in ("bias", "beta"):
        return np.zeros(shape, np.float32)
    raise ValueError(f"no initialisation rule for variable {path}")


def initial_weights(model, seed):
    """The initial values of every model variable, keyed by variable path."""
    return {v.path: initial_value(v.path, tuple(v.shape), seed) for v in model.weights}


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
