"""Deprecated since plugin API 1.4: the figures and their formatting live in `mtbench.figures`; this module,
their home before, forwards to it so that a plugin importing it keeps working."""

import warnings

from mtbench.figures import *  # noqa: F401,F403

warnings.warn("mtbench.plugins.api.figures moved to mtbench.figures; the old module is deprecated since plugin API "
              "1.4", DeprecationWarning, stacklevel=2)
