"""The plugin manager: built-in plugins and those of the `mtbench` entry-point group, loaded the same way.

`MTBENCH_LOAD_PLUGINS` limits which third-party plugins load: a comma-separated list of entry-point names
(empty: none). Built-in plugins always load; mtbench cannot run without its backends.
"""

import importlib
import importlib.metadata
import os
import sys
from dataclasses import dataclass, field

import pluggy

from mtbench.errors import MtbenchError
from mtbench.plugins import hookspecs

LOAD_PLUGINS_ENV = "MTBENCH_LOAD_PLUGINS"
BUILTIN_PLUGINS = (
    "mtbench.plugins.jax_backend",
    "mtbench.plugins.torch_backend",
    "mtbench.plugins.bible_dataset",
    "mtbench.plugins.table_reporter",
    "mtbench.plugins.flash_attention",
    "mtbench.plugins.torch_compile",
    "mtbench.plugins.jax_parallel",
    "mtbench.plugins.jax_tpu",
)
REGISTER_HOOKS = {
    "backends": "mtbench_register_backends",
    "extras": "mtbench_register_extras",
    "datasets": "mtbench_register_datasets",
    "reporters": "mtbench_register_reporters",
}


@dataclass
class Registry:
    """Everything the loaded plugins provide, by kind and name, with the plugin that provided it."""
    backends: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)
    datasets: dict = field(default_factory=dict)
    reporters: dict = field(default_factory=dict)
    provider: dict = field(default_factory=dict)  # (kind, name) -> plugin name
    warnings: list = field(default_factory=list)  # broken plugins: they are reported, not fatal
    broken: dict = field(default_factory=dict)    # plugin name -> what went wrong
    echo_warnings: bool = False                   # print warnings on stderr as they happen (the CLI sets it)
    hook: object = None

    def warn(self, plugin, message):
        self.broken.setdefault(plugin, message)
        self.warnings.append(message)
        if self.echo_warnings:
            print(f"Warning: {message}", file=sys.stderr)

    def lookup(self, kind, name):
        """The registered backend, extra, dataset or reporter `name`; an unknown name is an error that lists
        what is available and names the broken plugins that might have provided it."""
        items = getattr(self, kind)
        if name in items:
            return items[name]
        message = f"unknown {kind[:-1]} '{name}'; available: {', '.join(sorted(items)) or 'none installed'}"
        if self.broken:
            message += "; it may come from a plugin that failed: " + "; ".join(self.broken.values())
        raise MtbenchError(message)

    def keras_callbacks(self, config):
        """The Keras callbacks plugins add to a run. A plugin whose hook fails is warned about and left out."""
        callbacks = []
        for impl in self.hook.mtbench_keras_callbacks.get_hookimpls():
            try:
                callbacks.extend(impl.function(config=config) or [])
            except Exception as error:
                self.warn(impl.plugin_name, f"plugin '{impl.plugin_name}' failed in mtbench_keras_callbacks "
                                            f"and was left out: {error!r}")
        return callbacks


def _builtin_name(module_name):
    return module_name.rsplit(".", 1)[-1]


def _wanted_entry_points():
    available = sorted({ep.name for ep in importlib.metadata.entry_points(group="mtbench")})
    limit = os.environ.get(LOAD_PLUGINS_ENV)
    if limit is None:
        return available
    wanted = [name.strip() for name in limit.split(",") if name.strip()]
    return [name for name in wanted if name in available]


def _build():
    pm = pluggy.PluginManager("mtbench")
    pm.add_hookspecs(hookspecs)
    registry = Registry(hook=pm.hook)
    for module_name in BUILTIN_PLUGINS:
        pm.register(importlib.import_module(module_name), name=_builtin_name(module_name))
    for name in _wanted_entry_points():
        try:
            pm.load_setuptools_entrypoints("mtbench", name=name)
        except Exception as error:  # a broken third-party plugin must not take mtbench down with it
            registry.warn(name, f"plugin '{name}' failed to load and was skipped: {error!r}")
    for kind, hook_name in REGISTER_HOOKS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            _collect(registry, kind, impl)
    return pm, registry


def _collect(registry, kind, impl):
    items = getattr(registry, kind)

    def register(item):
        if item.name in items:
            registry.warnings.append(f"plugin '{impl.plugin_name}' registers {kind[:-1]} '{item.name}', "
                                     f"already provided by '{registry.provider[(kind, item.name)]}'; ignored")
            return
        items[item.name] = item
        registry.provider[(kind, item.name)] = impl.plugin_name

    try:
        impl.function(register)
    except Exception as error:
        registry.warn(impl.plugin_name, f"plugin '{impl.plugin_name}' failed in {impl.function.__name__}: {error!r}")


_loaded = None


def plugin_manager():
    global _loaded
    if _loaded is None:
        _loaded = _build()
    return _loaded[0]


def registry():
    plugin_manager()
    return _loaded[1]


def reset():
    """Forget the loaded plugins (tests that install or limit plugins call this)."""
    global _loaded
    _loaded = None


def plugin_descriptions():
    """One dict per loaded plugin: name, version, hooks, and what it provides."""
    pm, reg = plugin_manager(), registry()
    dist_versions = {plugin: dist.version for plugin, dist in pm.list_plugin_distinfo()}
    rows = []
    builtin_names = {_builtin_name(m) for m in BUILTIN_PLUGINS}
    for name, plugin in pm.list_name_plugin():
        builtin = name in builtin_names
        provides = {kind: sorted(item for (k, item), provider in reg.provider.items()
                                 if k == kind and provider == name) for kind in REGISTER_HOOKS}
        rows.append({
            "name": name,
            "builtin": builtin,
            "version": _builtin_version() if builtin else dist_versions.get(plugin),
            "hooks": sorted(h.name for h in pm.get_hookcallers(plugin)),
            "provides": {kind: names for kind, names in provides.items() if names},
        })
    return rows


def _builtin_version():
    from mtbench import __version__
    return __version__
