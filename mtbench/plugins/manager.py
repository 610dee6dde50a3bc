"""The plugin manager: built-in plugins and those of the `mtbench` entry-point group, registered the same way.

Third-party plugins are the entry points of the `mtbench` group, found per installed package (distribution),
so two packages may use the same entry-point name. `MTBENCH_LOAD_PLUGINS` limits which packages load: a
comma-separated list of package names as pip knows them (`mtbench-example`, `-`/`_`/`.` and case alike; empty:
none). Built-in plugins always load; mtbench cannot run without its backends. Whatever was left out, failed to
load or failed in a hook is kept on the registry, shown by `mtbench plugins`, and named in the error for an
unknown backend, extra, dataset or reporter that it might have provided. A plugin method written in an older
form of the API is called through `Registry.call` with the arguments it takes (`compat.py`) and named once in a
deprecation warning.
"""

import importlib
import importlib.metadata
import inspect
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import pluggy

from mtbench.errors import MtbenchError, RunFailure
from mtbench.plugins import api, hookspecs
from mtbench.plugins.api.versioning import next_major
from mtbench.plugins.compat import (GROWN, deprecated_in, fitting_arguments, form, older_form, older_forms,
                                    positional_parameters, replaced_form)

ENTRY_POINT_GROUP = "mtbench"
LOAD_PLUGINS_ENV = "MTBENCH_LOAD_PLUGINS"
BUILTIN_PLUGINS = (
    "mtbench.plugins.backends.jax_backend",
    "mtbench.plugins.backends.torch_backend",
    "mtbench.plugins.datasets.bible_dataset",
    "mtbench.plugins.models.transformer",
    "mtbench.plugins.models.marian",
    "mtbench.plugins.models.gpt",
    "mtbench.plugins.models.gpt2",
    "mtbench.plugins.reporters.table_reporter",
    "mtbench.plugins.reporters.tensorboard_tracker",
    "mtbench.plugins.reporters.mlflow_tracker",
    "mtbench.plugins.reporters.wandb_tracker",
    "mtbench.plugins.extras.flash_attention",
    "mtbench.plugins.extras.torch_compile",
    "mtbench.plugins.extras.torch_ddp",
    "mtbench.plugins.extras.jax_parallel",
    "mtbench.plugins.extras.jax_tpu",
    "mtbench.plugins.extras.fsdp",
    "mtbench.plugins.extras.tensor_parallel",
    "mtbench.plugins.extras.pipeline_parallel",
    "mtbench.plugins.extras.remat",
)
REGISTER_HOOKS = {
    "backends": "mtbench_register_backends",
    "extras": "mtbench_register_extras",
    "datasets": "mtbench_register_datasets",
    "reporters": "mtbench_register_reporters",
    "models": "mtbench_register_models",
    "tasks": "mtbench_register_tasks",
}
KINDS = tuple(REGISTER_HOOKS)
KIND_BASES = {"backends": api.Backend, "extras": api.Extra, "datasets": api.Dataset, "reporters": api.Reporter,
              "models": api.ModelFamily, "tasks": api.Task}  # what `register` of each kind takes
HOOK_NAMES = [name for name in dir(hookspecs) if name.startswith("mtbench_")]
HOOK_KINDS = {**{hook: kind for kind, hook in REGISTER_HOOKS.items()}, "mtbench_keras_callbacks": "callbacks"}
ANY_KIND = "any"  # what a plugin that failed to load might have provided: we cannot know
# A registered name, as --extra, --matrix ('backend+extra@2:flag=value'), --dataset and --report take it.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
RESERVED_NAMES = {"reporters": {"none"}}  # --report none: no reporter
# Methods the docs mark *required* of every item of a kind, whatever the run (a backend's are asked only of runs
# on it, and a plugin may register one to be named where it cannot run): without one the item could only fail.
REQUIRED_METHODS = {"datasets": ("read_pairs",), "reporters": ("report",)}
# What a run asks of its backend whatever it trains: without one the run could only fail, after keras's import.
REQUIRED_OF_A_RUN = {"backends": ("device_info", "synchronize")}


def singular(kind):
    return kind[:-1]


# What registered items' methods answer, as `PluginRegistry.answer` checks it: (the types, in words).
A_REASON = ((str, type(None)), "a str or None")
A_DICT = (dict, "a dict")


def package_key(name):
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class PluginProblem:
    plugin: str
    kind: str      # the kind of thing the failing hook registers, or ANY_KIND
    message: str
    suspect: bool = True  # whether an unknown name may be the plugin's (not for a name it lost to another)


@dataclass
class PluginEntry:
    """One plugin as `mtbench plugins` lists it, loaded or not."""
    name: str
    builtin: bool
    package: str = None
    version: str = None
    status: str = "loaded"  # loaded (broken where it has problems) | not loaded | failed to load
    reason: str = None      # why it is not loaded or failed


@dataclass
class Registry:
    """Everything the loaded plugins provide, by kind and name, with the plugin that provided it."""
    backends: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)
    datasets: dict = field(default_factory=dict)
    reporters: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)
    tasks: dict = field(default_factory=dict)
    provider: dict = field(default_factory=dict)   # (kind, name) -> plugin name
    warnings: list = field(default_factory=list)   # every problem, in the order it happened
    problems: list = field(default_factory=list)   # PluginProblem of plugins that failed (not fatal)
    entries: dict = field(default_factory=dict)    # plugin name -> PluginEntry, loaded or not
    keras_imported_by: str = None                   # the plugin whose module imported keras as it loaded
    echo_warnings: bool = False                    # print warnings on stderr as they happen (the CLI sets it)
    hook: object = None
    deprecated: set = field(default_factory=set)   # (kind, name, method) of older forms already warned about

    def warn(self, message, plugin=None, kind=ANY_KIND, suspect=True):
        if plugin is not None:
            self.problems.append(PluginProblem(plugin, kind, message, suspect))
        self.warnings.append(message)
        if self.echo_warnings:
            print(f"Warning: {message}", file=sys.stderr)

    def problems_of(self, plugin):
        return [problem.message for problem in self.problems if problem.plugin == plugin]

    def packages_providing(self, used):
        """{plugin name: 'PACKAGE VERSION'} of the installed plugins that provided `used` ([(kind, name)]): what a
        result records beside mtbench's own version, so that a plugin upgraded between two runs shows."""
        found = {}
        for kind, name in used:
            plugin = self.provider.get((kind, name))
            entry = self.entries.get(plugin)
            if entry and not entry.builtin:
                found[plugin] = f"{entry.package} {entry.version}"
        return found

    def lookup(self, kind, name):
        """The registered backend, extra, dataset or reporter `name`; an unknown name is an error that lists
        what is available and names only the plugins that might have provided it: those that failed to load,
        those whose hook for this kind failed, and the packages MTBENCH_LOAD_PLUGINS left out."""
        items = getattr(self, kind)
        if name in items:
            return items[name]
        message = f"unknown {singular(kind)} '{name}'; available: {', '.join(sorted(items)) or 'none installed'}"
        suspects = [problem.message for problem in self.problems if problem.kind in (kind, ANY_KIND) and problem.suspect]
        if suspects:
            message += "; it may come from a plugin that failed: " + "; ".join(suspects)
        left_out = sorted({entry.package for entry in self.entries.values() if entry.status == "not loaded"})
        if left_out:
            message += (f"; {LOAD_PLUGINS_ENV} left out the plugin package(s) {', '.join(left_out)}, which might "
                        f"provide it")
        raise MtbenchError(message)

    @contextmanager
    def plugin_code(self, kind, name):
        """Runs a registered item's own code: a user's error (MtbenchError) keeps its message behind the item's
        name; any other exception is a failure of the plugin, named with it."""
        try:
            yield
        except MtbenchError as error:
            if getattr(error, "names_its_source", False):  # from a registered item that code called (a task's dataset)
                raise
            raise _naming(MtbenchError(f"{singular(kind)} '{name}': {error}", error.exit_code)) from error
        except Exception as error:
            raise self.failure(kind, name, error) from error

    @contextmanager
    def plugin_failures(self, kind, name):
        """Runs a registered item's own code whose refusals (MtbenchError) are phrased for the user as they are (a
        backend's `--grad-accum 2: ...`): any other exception is a failure of the plugin, named with it."""
        try:
            yield
        except MtbenchError:
            raise
        except Exception as error:
            raise self.failure(kind, name, error) from error

    def answer(self, kind, item, method, *args, expect=None):
        """`item.method(*args)` (as `call` calls it) as the item's own code (`plugin_failures`), its answer checked
        to be of `expect`, (types, what they are in words): a crash or an answer of another kind names the item and
        its plugin, where it would have surfaced later as an AttributeError naming nothing."""
        with self.plugin_failures(kind, item.name):
            answer = self.call(kind, item, method, *args)
            if expect is not None and not isinstance(answer, expect[0]):
                raise TypeError(f"{method} returned a {type(answer).__name__}, not {expect[1]}")
        return answer

    def failure(self, kind, name, error):
        """The RunFailure naming a registered item and its plugin for an exception of its code."""
        return _naming(RunFailure(f"{self.item_label(kind, name)} failed: {type(error).__name__}: {error}"))

    def item_label(self, kind, name):
        """A registered item with its plugin, as a failure of its code names it: "extra 'NAME' of plugin 'P'"."""
        return f"{singular(kind)} '{name}' of plugin '{self.provider.get((kind, name), '?')}'"

    def unimplemented_refusal(self, kind, item):
        """Why a run cannot use `item` (a registered backend): the methods every run asks of it that its class
        leaves to the base class's, named with its plugin; None where it implements them all."""
        base = KIND_BASES[kind]
        missing = [method for method in REQUIRED_OF_A_RUN.get(kind, ())
                   if getattr(type(item), method, None) is getattr(base, method)]
        if not missing:
            return None
        return (f"{self.item_label(kind, item.name)} does not implement {' and '.join(missing)}, which every "
                f"{singular(kind)} must (docs/plugins.md, \"{base.__name__}\")")

    def call(self, kind, item, method, *args):
        """`item.method(*args)` for a registered backend, extra, dataset, reporter or model family. A method in an
        older form of the API (it takes fewer of the trailing arguments) is called with those it takes, and named
        once in a deprecation warning with the form mtbench calls now."""
        bound = getattr(item, method)
        fitting = fitting_arguments(bound, args)
        if len(fitting) < len(args):
            if method not in GROWN.get(kind, {}):  # no earlier form of it took fewer: a mistake, not an older API
                with self.plugin_code(kind, item.name):
                    raise TypeError(f"it implements {form(method, positional_parameters(bound) or [])}, and mtbench "
                                    f"calls {method} with {len(args)} argument{'s' * (len(args) != 1)} "
                                    f"(docs/plugins.md)")
            self._warn_deprecated_once(kind, item, method,
                                       lambda: older_form(item, kind, method) or (form(method, ["..."]), method))
        return bound(*fitting)

    def call_replaced(self, kind, item, method, *args):
        """`item.method(*args)`, a method another replaced (`compat.REPLACED`) that `item` still implements: named
        once in a deprecation warning with the form mtbench calls instead."""
        self._warn_deprecated_once(kind, item, method, lambda: replaced_form(item, kind, method))
        return getattr(item, method)(*args)

    def _warn_deprecated_once(self, kind, item, method, forms):
        """Names `item.method` once a process in a deprecation warning; `forms()`: (the form it implements, the
        form mtbench calls)."""
        if (kind, item.name, method) in self.deprecated:
            return
        self.deprecated.add((kind, item.name, method))
        implemented, current = forms()
        self.warn(deprecation_text(self.provider.get((kind, item.name), "?"), kind, item.name, implemented, current,
                                   deprecated_in(kind, method)))

    def keras_callbacks(self, config):
        """(plugin name, callback) of the Keras callbacks plugins add to a run (keras imported). A plugin whose
        hook fails, or returns anything but a list of `keras.callbacks.Callback`, is warned about and left out."""
        import keras
        callbacks = []
        for impl in self.hook.mtbench_keras_callbacks.get_hookimpls():
            try:
                added = impl.function(config=config) or []
                if not (isinstance(added, (list, tuple))
                        and all(isinstance(callback, keras.callbacks.Callback) for callback in added)):
                    raise TypeError(f"it returned {added!r:.80}, not a list of keras.callbacks.Callback")
                callbacks.extend((impl.plugin_name, callback) for callback in added)
            except Exception as error:
                self.warn(f"plugin '{impl.plugin_name}' failed in mtbench_keras_callbacks and was left out: "
                          f"{_short(error)}", impl.plugin_name, "callbacks")
        return callbacks


def _naming(error):
    """`error`, marked as naming the registered item it came from: an enclosing `plugin_code` keeps it as it is."""
    error.names_its_source = True
    return error


def deprecation_text(plugin, kind, name, implemented, current, version):
    return (f"plugin '{plugin}': {singular(kind)} '{name}' implements {implemented}, deprecated in plugin API "
            f"{version}: mtbench calls {current}, and passes the old form only the arguments it takes "
            f"until plugin API {next_major(version)} (docs/plugins.md, \"Compatibility\")")


# Built-in plugin modules that live above the plugins (the runner's tasks), named to the manager by the code that
# owns them (`add_builtin_plugin`), so that the manager imports nothing above it.
_added_builtins = []


def add_builtin_plugin(module_name):
    """Loads `module_name` as a built-in plugin in every registry built from now on (and in the one built)."""
    if module_name in _added_builtins:
        return
    _added_builtins.append(module_name)
    if _loaded is not None:
        pm, registry = _loaded
        _register_builtin(pm, registry, module_name)
        for kind, hook_name in REGISTER_HOOKS.items():
            for impl in getattr(pm.hook, hook_name).get_hookimpls():
                if impl.plugin_name == _builtin_name(module_name):
                    _collect(registry, kind, impl)


def _register_builtin(pm, registry, module_name):
    from mtbench import __version__
    name = _builtin_name(module_name)
    pm.register(importlib.import_module(module_name), name=name)
    registry.entries[name] = PluginEntry(name, builtin=True, package="mtbench", version=__version__)
    _warn_of_unusable_hooks(pm, registry, name)


class CheckingPluginManager(pluggy.PluginManager):
    """pluggy's manager, but a hook function it would skip without a word (no @hookimpl) or refuse with the whole
    module, in a message of several lines (arguments the hookspec does not have), is left out of the registration
    and kept in `unusable_hooks` (hook name, problem), for the plugin's name to be put on it."""

    def __init__(self):
        super().__init__(ENTRY_POINT_GROUP)
        self.unusable_hooks = []

    def parse_hookimpl_opts(self, plugin, name):
        options = super().parse_hookimpl_opts(plugin, name)
        hook_name = (options or {}).get("specname") or name
        if hook_name not in HOOK_NAMES:  # no mtbench hook: `_warn_of_unknown_hooks` names those marked
            return options
        function = getattr(plugin, name, None)
        if options is None:
            if callable(function):
                self.unusable_hooks.append((hook_name, f"{name} is not marked @hookimpl, so pluggy ignores it "
                                                       f"(decorate it with mtbench.hookimpl)"))
            return None
        spec = getattr(self.hook, hook_name).spec
        unknown = set(pluggy.HookImpl(plugin, "", function, options).argnames) - {*spec.argnames, *spec.kwargnames}
        if unknown:
            self.unusable_hooks.append((hook_name, f"hook {name}{inspect.signature(function)} takes arguments the "
                                                   f"hook does not have ({', '.join(sorted(unknown))}); its "
                                                   f"arguments are ({', '.join(spec.argnames)}): never called"))
            return None
        return options


def _warn_of_unusable_hooks(pm, registry, name):
    """The hook functions of plugin `name` that its registration left out (`CheckingPluginManager`), each said in
    a warning that marks the plugin broken, rather than its extras going missing without a word."""
    for hook_name, problem in pm.unusable_hooks:
        registry.warn(f"plugin '{name}': {problem}", name, HOOK_KINDS[hook_name])
    pm.unusable_hooks.clear()


def _builtin_name(module_name):
    return module_name.rsplit(".", 1)[-1]


def _installed_entry_points():
    """(its distribution's metadata, entry point) of every `mtbench` entry point, one per (package, name) pair."""
    found, seen = [], set()
    for dist in importlib.metadata.distributions():
        # A distribution's entry points are one small file; its metadata is parsed as an e-mail message (a
        # millisecond or two each, a third of a second over an environment's packages), again at each read of
        # `dist.metadata`: read once, and only where it counts.
        ours = dist.entry_points.select(group=ENTRY_POINT_GROUP)
        if not ours:
            continue
        metadata = dist.metadata
        for entry_point in ours:
            key = (package_key(metadata["Name"] or "?"), entry_point.name)
            if key not in seen:
                seen.add(key)  # a package on sys.path twice (an editable install and a copy) counts once
                found.append((metadata, entry_point))
    return sorted(found, key=lambda pair: (package_key(pair[0]["Name"] or ""), pair[1].name))


def _wanted_packages(registry, installed_packages):
    """The package keys MTBENCH_LOAD_PLUGINS allows (None: every package), warning about names of packages that
    are not installed with mtbench plugins."""
    limit = os.environ.get(LOAD_PLUGINS_ENV)
    if limit is None:
        return None
    wanted = [name.strip() for name in limit.split(",") if name.strip()]
    for name in wanted:
        if package_key(name) not in installed_packages:
            registry.warn(f"{LOAD_PLUGINS_ENV} names '{name}', which is no installed package with mtbench plugins "
                          f"(installed: {', '.join(sorted(installed_packages.values())) or 'none'})")
    return {package_key(name) for name in wanted}


def _plugin_names(entry_points):
    """An entry point's plugin name: its own name, or package:name where two packages share it."""
    counts = {}
    for _, entry_point in entry_points:
        counts[entry_point.name] = counts.get(entry_point.name, 0) + 1
    return [entry_point.name if counts[entry_point.name] == 1 else f"{metadata['Name']}:{entry_point.name}"
            for metadata, entry_point in entry_points]


def _keras_modules():
    return {name for name in list(sys.modules) if name == "keras" or name.startswith("keras.")}


def _raised_importing_keras(error):
    """Whether `error` came out of a keras module's own import (keras's default backend, TensorFlow, missing):
    the plugin's fault is then importing keras as it loads, whatever keras raised."""
    traceback = error.__traceback__
    while traceback is not None:
        frame = traceback.tb_frame
        module = frame.f_globals.get("__name__") or ""
        if frame.f_code.co_name == "<module>" and (module == "keras" or module.startswith("keras.")):
            return True
        traceback = traceback.tb_next
    return False


def _keras_imported_on_load(registry, name):
    """Plugin `name`'s module imported keras as it loaded, before any command chose a backend: keras keeps the one
    it found (the environment's, else its default, TensorFlow), so a run on another fails, or the import itself."""
    registry.keras_imported_by = name
    registry.warn(f"plugin '{name}' imports keras as its module loads, before mtbench chooses the backend (keras "
                  f"keeps the first it is given): import keras inside the plugin's methods", name)


def _build():
    pm = CheckingPluginManager()
    pm.add_hookspecs(hookspecs)
    registry = Registry(hook=pm.hook)
    for module_name in (*BUILTIN_PLUGINS, *_added_builtins):
        _register_builtin(pm, registry, module_name)

    entry_points = _installed_entry_points()
    installed = {package_key(metadata["Name"] or "?"): metadata["Name"] for metadata, _ in entry_points}
    wanted = _wanted_packages(registry, installed)
    for (metadata, entry_point), name in zip(entry_points, _plugin_names(entry_points)):
        entry = PluginEntry(name, builtin=False, package=metadata["Name"], version=metadata["Version"])
        registry.entries[name] = entry
        if wanted is not None and package_key(entry.package) not in wanted:
            entry.status, entry.reason = "not loaded", f"{LOAD_PLUGINS_ENV} does not name {entry.package}"
            continue
        module = _load_module(registry, entry, entry_point)
        if module is None:
            continue
        if pm.is_registered(module):  # pluggy's own refusal lists every registered module: kilobytes
            entry.status = "failed to load"
            entry.reason = f"its module {module.__name__} is already loaded as plugin '{pm.get_name(module)}'"
            registry.warn(f"plugin '{name}' was skipped: {entry.reason}", name)
            continue
        try:
            pm.register(module, name=name)
        except Exception as error:  # a broken third-party plugin must not take mtbench down with it
            pm.unusable_hooks.clear()
            _failed_to_load(registry, entry, error)
            continue
        _warn_of_unusable_hooks(pm, registry, name)
        _warn_of_unknown_hooks(pm, registry, name, module)

    for kind, hook_name in REGISTER_HOOKS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            _collect(registry, kind, impl)
    return pm, registry


def _load_module(registry, entry, entry_point):
    """The module of plugin `entry`'s entry point, or None where importing it raised: listed as failed to load, or
    as broken where keras raised as the module imported it (the keras warning says what to do; what keras raised,
    TensorFlow missing where no backend was set, would only mislead)."""
    keras_before = _keras_modules()
    try:
        module, error = entry_point.load(), None
    except Exception as raised:  # a broken third-party plugin must not take mtbench down with it
        module, error = None, raised
    keras_failed = error is not None and _raised_importing_keras(error)
    # Modules of keras this plugin's load added: a failed import of keras by another plugin before it leaves some
    # of its submodules behind, and one that raised in keras's first module leaves none.
    if keras_failed or _keras_modules() - keras_before:
        _keras_imported_on_load(registry, entry.name)
    if error is not None and not keras_failed:
        _failed_to_load(registry, entry, error)
    return module


def _failed_to_load(registry, entry, error):
    entry.status, entry.reason = "failed to load", _short(error)
    registry.warn(f"plugin '{entry.name}' failed to load and was skipped: {entry.reason}", entry.name)


def _short(error):
    """An exception in one line of at most 300 characters: `repr` of some (pluggy's) runs to kilobytes."""
    text = (repr(error).splitlines() or [type(error).__name__])[0]
    return text if len(text) <= 300 else text[:299] + "…"


def _warn_of_unknown_hooks(pm, registry, name, module):
    """A hook implementation whose name is no mtbench hook (`mtbench_register_extra`) is never called: said, and
    the plugin marked broken, rather than its extras going missing without a word."""
    import difflib
    for caller in pm.get_hookcallers(module) or ():
        if caller.spec is None:
            close = difflib.get_close_matches(caller.name, HOOK_NAMES, 1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            registry.warn(f"plugin '{name}' implements {caller.name}, which is no mtbench hook{hint}: never called",
                          name)


def registration_refusal(kind, item):
    """Why `item` cannot be registered as a thing of `kind`, in words, or None."""
    base = KIND_BASES[kind]
    if not isinstance(item, base):
        return f"a {type(item).__name__}, which is no {base.__name__} (mtbench.plugins.api.{base.__name__})"
    name = getattr(item, "name", None)
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        return (f"the name {name!r} (a name is letters, digits, '.', '_' and '-', from a letter or digit on, as the "
                f"command line takes it)")
    if name in RESERVED_NAMES.get(kind, ()):
        return f"the name '{name}', which the command line takes for no {singular(kind)}"
    # Names every run reads, whichever plugins it chose: one that is no list of names would break them all.
    for attribute, kind_of, meaning in (("backends", "extras", "backend names"), ("conflicts", "extras", "extra names"),
                                        ("framework_modules", "backends", "module names")):
        value = getattr(item, attribute, None) if kind == kind_of else ()
        if not (isinstance(value, (list, tuple)) and all(isinstance(entry, str) for entry in value)):
            return f"{singular(kind)} '{name}' with {attribute} {value!r} (a list of {meaning})"
    if kind == "extras" and not item.backends:  # it would serve no run, and say so as 'serves the  backend(s)'
        return f"extra '{name}' with no backends (a list of the backend names it serves)"
    missing = [method for method in REQUIRED_METHODS.get(kind, ())
               if getattr(type(item), method, None) is getattr(base, method)]
    if missing:
        return f"{singular(kind)} '{name}' without {', '.join(missing)} (required of every {singular(kind)})"
    return None


def _collect(registry, kind, impl):
    items = getattr(registry, kind)

    def register(item):
        refusal = registration_refusal(kind, item)
        if refusal:
            registry.warn(f"plugin '{impl.plugin_name}' registers {refusal} as {singular(kind)}; ignored",
                          impl.plugin_name, kind)
            return
        if item.name in items:
            registry.warn(f"plugin '{impl.plugin_name}' registers {singular(kind)} '{item.name}', already "
                          f"provided by '{registry.provider[(kind, item.name)]}'; ignored", impl.plugin_name, kind,
                          suspect=False)
            return
        items[item.name] = item
        registry.provider[(kind, item.name)] = impl.plugin_name

    try:
        impl.function(register)
    except Exception as error:
        registry.warn(f"plugin '{impl.plugin_name}' failed in {impl.function.__name__}: {_short(error)}",
                      impl.plugin_name, kind)


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
    """One dict per plugin, loaded or not: name, package, version, status (loaded, not loaded, failed to load,
    broken: it loaded, or imported keras as it loaded, but something of it mtbench cannot use), the problems,
    hooks, what it provides, and the methods it implements in a deprecated form."""
    pm, reg = plugin_manager(), registry()
    rows = []
    for name, entry in reg.entries.items():
        plugin = pm.get_plugin(name)
        problems = reg.problems_of(name)
        status = "broken" if entry.status == "loaded" and problems else entry.status
        provides = {kind: sorted(item for (k, item), provider in reg.provider.items()
                                 if k == kind and provider == name) for kind in KINDS}
        deprecated = [deprecation_text(name, kind, item, implemented, current, deprecated_in(kind, method))
                      for kind in KINDS for item in provides[kind]
                      for method, implemented, current in older_forms(getattr(reg, kind)[item], kind)]
        rows.append({
            "name": name,
            "builtin": entry.builtin,
            "package": entry.package,
            "version": entry.version,
            "status": status,
            "problems": problems or ([entry.reason] if entry.reason else []),
            "hooks": sorted(h.name for h in pm.get_hookcallers(plugin)) if plugin is not None else [],
            "provides": {kind: names for kind, names in provides.items() if names},
            "deprecated": deprecated,  # methods in an older form of the API, still called (see `Registry.call`)
        })
    return rows
