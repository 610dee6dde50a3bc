"""mtbench-example: an mtbench plugin package to copy.

The hooks are in `plugin.py` (the module the `mtbench` entry point names); each kind of thing it provides has
its own module. None of them imports keras, jax or torch at module level: mtbench imports plugin modules in
every process before it has chosen a backend, and keras fixes its backend when it is first imported."""

__version__ = "0.1.0"
