"""Plugins: `hookspecs.py` (the hooks), `manager.py` (loads built-in and third-party plugins alike), `api/`
(the classes and helpers a plugin uses, re-exported by `mtbench`), and the built-in plugins by kind:
`backends/`, `extras/`, `datasets/`, `reporters/`."""
