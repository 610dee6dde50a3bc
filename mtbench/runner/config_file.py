"""`--config FILE`: a TOML file whose keys are a command's own flag names (`batch-size = 64`, `extra =
["torch-compile"]`), read as that command's defaults, so that a flag given on the command line wins over the file.

Every problem is one line naming the file and the key: an unknown key, a value of the wrong kind, a value the
flag refuses.
"""

from dataclasses import dataclass
from typing import Callable

from mtbench.errors import MtbenchError
from mtbench.runner.data.formats import check_readable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI (a dependency there)
    import tomli as tomllib

KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


@dataclass(frozen=True)
class FileOption:
    """How a key of the file sets one option of the command."""
    name: str                     # the option's parameter
    kind: type                    # bool (a flag), int, float or str: what the file must hold
    multiple: bool = False        # repeatable: a list of values (or one value)
    on_value: object = True       # a flag: the parameter's value for `key = true`
    off_value: object = False     # and for `key = false`
    joined_by: str = None         # a text option that also takes a list, joined by this ("jax,torch")
    convert: Callable = None      # checks one value as the option does; raises ValueError with the reason


def read_toml(path):
    """The TOML file as a dict; one line for a missing, unreadable or malformed file."""
    try:
        check_readable(path, "a TOML file")
        with open(path, "rb") as f:
            return tomllib.load(f)
    except MtbenchError as error:
        raise MtbenchError(f"--config {error}") from None
    except OSError as error:
        raise MtbenchError(f"--config {path}: cannot read: {error.strerror}") from None
    except UnicodeDecodeError:
        raise MtbenchError(f"--config {path}: not valid UTF-8") from None
    except tomllib.TOMLDecodeError as error:
        raise MtbenchError(f"--config {path}: not valid TOML ({error})") from None


def _kind_of(value):
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


def _one_value(path, key, option, value):
    kind = option.kind
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # `repeats = 2`: as the command line gives it, text the option reads
    fits = (isinstance(value, bool) if kind is bool else
            isinstance(value, int) and not isinstance(value, bool) if kind is int else
            isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else
            isinstance(value, str))
    if not fits:
        raise MtbenchError(f"--config {path}: {key} must be {KIND_NAMES[kind]}, got {_kind_of(value)} {value!r}")
    if kind is bool:
        return option.on_value if value else option.off_value
    if option.convert is not None:
        try:
            return option.convert(value)
        except ValueError as error:
            raise MtbenchError(f"--config {path}: {key} = {value!r}: {error}") from None
    return value


def read_config_file(path, options):
    """{parameter name: value} of the file's keys. `options`: {key (the flag without its dashes): FileOption}."""
    data = read_toml(path)
    defaults = {}
    for key, value in data.items():
        option = options.get(key)
        if option is None:
            dashed = key.replace("_", "-")
            hint = (f"; did you mean {dashed}?" if dashed in options else
                    f"; the keys are the flags' names without their dashes ({', '.join(sorted(options)[:6])}, ...)")
            raise MtbenchError(f"--config {path}: unknown key '{key}'{hint}")
        if isinstance(value, list) and option.multiple:
            defaults[option.name] = tuple(_one_value(path, key, option, item) for item in value)
        elif option.joined_by:  # names, never a number (`matrix = 5` was read as a run of backend '5')
            items = value if isinstance(value, list) else [value]
            if not all(isinstance(item, str) for item in items):
                raise MtbenchError(f"--config {path}: {key} must be a string or a list of strings, got "
                                   f"{_kind_of(value)} {value!r}")
            defaults[option.name] = _one_value(path, key, option, option.joined_by.join(items))
        elif option.multiple:
            defaults[option.name] = (_one_value(path, key, option, value),)
        else:
            defaults[option.name] = _one_value(path, key, option, value)
    return defaults
