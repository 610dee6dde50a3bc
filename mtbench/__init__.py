"""mtbench: one Keras 3 Transformer for translation, trained and timed on JAX and PyTorch.

The names below are the plugin API (see docs/plugins.md); everything else is mtbench's own and may change."""

from mtbench.plugins.api import *  # noqa: F401,F403 (the public API, listed in its __all__)
from mtbench.plugins.api import __all__ as _api
from mtbench.plugins.api import moved_names_of

__version__ = "0.1.0"
__all__ = [*_api, "__version__"]
__getattr__ = moved_names_of(__name__)  # the old names of mtbench.figures' contents, deprecated since 1.4
