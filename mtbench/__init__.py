"""mtbench: one Keras 3 Transformer for translation, trained and timed on JAX and PyTorch."""

from mtbench.plugins.api import Backend, Dataset, Extra, Reporter, RunContext
from mtbench.plugins.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["Backend", "Dataset", "Extra", "Reporter", "RunContext", "hookimpl", "__version__"]
