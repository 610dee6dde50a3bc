"""Plugin methods written against an earlier form of the API: which arguments a method takes, and a call that
passes only those. A method that takes fewer of the trailing arguments than mtbench passes is an older form (new
arguments are only ever appended; see `mtbench.plugins.api.versioning`): it is called with what it takes, as
pluggy calls a hook implementation with the arguments it names."""

import functools
import inspect

from mtbench.plugins.api.kinds import Backend, Dataset, Extra, Reporter
from mtbench.plugins.api.models import ModelFamily

BASE_CLASSES = {"backends": Backend, "extras": Extra, "datasets": Dataset, "reporters": Reporter,
                "models": ModelFamily}
# The methods that gained an argument since they were documented, by kind, with the plugin API version that
# deprecated their older form: mtbench calls them through `Registry.call`, which passes an older form the
# arguments it takes. A method that gains an argument joins them, with the version that grew it.
GROWN = {"reporters": {"report": "1.0"}, "extras": {"make_train_step": "1.0"},
         "backends": {"attention_kernels": "1.27"}}
# The methods another one replaced, by kind: (the plugin API version that deprecated them, the form mtbench calls
# instead). mtbench still calls one a plugin implements, and names it as an older form.
REPLACED = {"extras": {"adjust_config": ("1.2", "config_changes(run)")}}


def deprecated_in(kind, method):
    """The plugin API version that deprecated `method`'s older forms (the current one for a method not listed)."""
    from mtbench.plugins.api.versioning import PLUGIN_API_VERSION
    if method in REPLACED.get(kind, {}):
        return REPLACED[kind][method][0]
    return GROWN.get(kind, {}).get(method, PLUGIN_API_VERSION)


def replaced_form(item, kind, method):
    """(the form `item` implements, the form mtbench calls instead) where `item` implements `method`, which another
    replaced (`REPLACED`); None otherwise."""
    if getattr(type(item), method, None) is getattr(BASE_CLASSES[kind], method, None):
        return None
    return form(method, positional_parameters(getattr(item, method)) or ["..."]), REPLACED[kind][method][1]


@functools.lru_cache(maxsize=None)
def _positional(function, drop_first):
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin without a readable signature: assume it takes everything
        return None
    if drop_first and parameters:
        parameters = parameters[1:]
    if any(parameter.kind is inspect.Parameter.VAR_POSITIONAL for parameter in parameters):
        return None
    return tuple(p.name for p in parameters
                 if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))


def positional_parameters(method, unbound=False):
    """The names of the positional parameters `method` takes beyond `self` (a bound method, or a class's function
    with `unbound`), or None when it takes any number (`*args`); read once per function."""
    function = getattr(method, "__func__", method)
    drop_first = unbound or function is not method
    try:
        return _positional(function, drop_first)
    except TypeError:  # an unhashable callable: read every time
        return _positional.__wrapped__(function, drop_first)


def form(name, parameters):
    return f"{name}({', '.join(parameters)})"


def older_form(item, kind, method):
    """(the form `item` implements, the form mtbench calls) when `item.method` takes fewer arguments than the base
    class's form of the API; None when it is the current form (or the base class's own method)."""
    base = BASE_CLASSES[kind]
    current = getattr(base, method, None)
    implemented = getattr(type(item), method, None)
    if current is None or implemented is None or implemented is current:
        return None
    wanted, found = positional_parameters(current, unbound=True), positional_parameters(getattr(item, method))
    if found is None or len(found) >= len(wanted):
        return None
    return form(method, found), form(method, wanted)


def older_forms(item, kind):
    """Every (method, implemented form, current form) of `item` that is an older form of the API."""
    return ([(method, *found) for method in GROWN.get(kind, ()) if (found := older_form(item, kind, method))]
            + [(method, *found) for method in REPLACED.get(kind, ()) if (found := replaced_form(item, kind, method))])


def fitting_arguments(method, args):
    """The leading `args` that `method` takes: all of them, or fewer for an older form."""
    accepted = positional_parameters(method)
    return args if accepted is None or len(args) <= len(accepted) else args[:len(accepted)]
