"""The files of a model directory as transformers' `save_pretrained` writes one, read from disk only (nothing is
downloaded): its JSON files and its weights (`model.safetensors`, else `pytorch_model.bin`) as numpy arrays. `kind`
names the model in errors ('MarianMT', 'GPT-2').

Nothing here imports keras, so a run can check a directory before its backend is chosen."""

import importlib.util
import json
import os
import shutil

from mtbench import MtbenchError

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
TORCH_WEIGHTS = "pytorch_model.bin"
# The size flags a pretrained model cannot take (its size is its config.json's): config field -> flag.
SIZE_FLAGS = {"layers": "--layers", "encoder_layers": "--encoder-layers", "decoder_layers": "--decoder-layers",
              "d_model": "--d-model", "heads": "--heads", "ff_dim": "--ff-dim"}


def require_directory(directory, kind):
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.exists(directory) else "does not exist"
        raise MtbenchError(f"{kind} model directory {directory} {what} (a directory that transformers' "
                           f"save_pretrained wrote, on local disk: nothing is downloaded)")


def require_file(directory, name, kind, why=""):
    """The path of `name` in the model directory, or an error that names both."""
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise MtbenchError(f"{name} is missing from the {kind} model directory {directory}{why}")
    return path


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise MtbenchError(f"cannot read {path}: {error}") from None


def read_optional_json(directory, name):
    path = os.path.join(directory, name)
    return read_json(path) if os.path.isfile(path) else {}


def read_config(directory, kind, model_type):
    """The parsed config.json of a directory whose `model_type` must be `model_type` (absent: taken as it)."""
    require_directory(directory, kind)
    config = read_json(require_file(directory, CONFIG, kind))
    found = config.get("model_type", model_type)
    if found != model_type:
        raise MtbenchError(f"{os.path.join(directory, CONFIG)} describes a '{found}' model, not a {kind} "
                           f"(model_type '{model_type}')")
    return config


def refuse_size_flags(directory, config):
    """A pretrained model's size is its checkpoint's: the size flags given are refused in one line."""
    flags = [flag for field, flag in SIZE_FLAGS.items() if getattr(config, field, None) is not None]
    if flags:
        raise MtbenchError(f"{', '.join(flags)}: a pretrained model's size comes from its config.json "
                           f"({os.path.join(directory, CONFIG)}); leave out the size flags")


def refuse_vocabulary_flag(config, kind, vocabulary):
    """--vocab-size, given (the preset's own size included), refused in one line: a pretrained model's vocabulary
    is its tokenizer's. `vocabulary` says which, or how large."""
    if config.vocab_size_given:
        raise MtbenchError(f"--vocab-size {config.vocab_size}: a {kind} checkpoint's vocabulary is its own "
                           f"({vocabulary}); leave --vocab-size out")


def weights_file(directory, kind):
    """model.safetensors, else pytorch_model.bin; an error naming both when neither is there."""
    for name in (SAFETENSORS, TORCH_WEIGHTS):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise MtbenchError(f"{SAFETENSORS} (or {TORCH_WEIGHTS}) is missing from the {kind} model directory {directory}")


def check_weights_readable(directory, kind):
    """The weights file exists and the package that reads it is installed."""
    path = weights_file(directory, kind)
    package = "safetensors" if path.endswith(SAFETENSORS) else "torch"
    if importlib.util.find_spec(package) is None:
        raise MtbenchError(f"reading {path} needs the package {package}, which is not installed "
                           f"(pip install {package})")
    return path


def read_state_dict(directory, kind):
    """{tensor name: numpy array} of the directory's weights."""
    path = check_weights_readable(directory, kind)
    try:
        if path.endswith(SAFETENSORS):
            from safetensors.numpy import load_file
            return load_file(path)
        import torch
        state = torch.load(path, map_location="cpu", weights_only=True)
        return {name: (tensor.float() if tensor.is_floating_point() else tensor).numpy()
                for name, tensor in state.items()}
    except (OSError, ValueError, RuntimeError, TypeError) as error:
        raise MtbenchError(f"cannot read the weights {path}: {error}") from None


def copy_present(names, source, target):
    """Copies each of `names` that is a file in the directory `source` into `target` (a file already the same one
    left as it is): what a saved model keeps of its checkpoint."""
    for name in names:
        source_file, target_file = os.path.join(source, name), os.path.join(target, name)
        if os.path.isfile(source_file) and not (os.path.exists(target_file) and
                                                os.path.samefile(source_file, target_file)):
            shutil.copyfile(source_file, target_file)


def problems_text(lists):
    """'missing: a, b; unexpected: c' of {label: [names]}, four names a label at most."""
    problems = []
    for label, names in lists.items():
        if names:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            problems.append(f"{label}: {shown}")
    return "; ".join(problems)
