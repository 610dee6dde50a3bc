"""Plugins: `hookspecs.py` (the hooks), `manager.py` (loads built-in and third-party plugins alike), `compat.py`
(plugin methods in an older form of the API), `api/`
(the classes and helpers a plugin uses, re-exported by `mtbench`), and the built-in plugins by kind:
`backends/`, `extras/`, `datasets/`, `reporters/`."""
