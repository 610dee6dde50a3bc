"""mtbench-classification: a third task from a plugin. A `classification` task on scikit-learn's 8x8 digits and
the `mlp-classifier` model family that trains on it, through mtbench's own train steps on every backend.

The hooks are in `plugin.py`; no module imports keras, jax or torch at module level (mtbench imports plugin
modules before it has chosen a backend), and scikit-learn is imported only when the data is read."""

__version__ = "0.1.0"
