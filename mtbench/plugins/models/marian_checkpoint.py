"""Reading a MarianMT model directory as transformers writes one (`save_pretrained`), from disk only: its
config, its weights (`model.safetensors`, else `pytorch_model.bin`) as numpy arrays under the paths of mtbench's
Keras MarianMT (`mtbench.keras_models.marian`), and the names of its tokenizer files.

Nothing here imports keras, so a run can check a directory before its backend is chosen."""

import re

import numpy as np

from mtbench import MtbenchError
from mtbench.plugins.models import checkpoint_files as files

KIND = "MarianMT"
CONFIG = files.CONFIG
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
VOCAB, TARGET_VOCAB = "vocab.json", "target_vocab.json"

# The defaults of transformers' MarianConfig for the keys read before the model is built (the model applies
# the same defaults, `mtbench.keras_models.marian.MARIAN_DEFAULTS`, to every key).
CONFIG_DEFAULTS = {"max_position_embeddings": 1024, "activation_function": "gelu", "pad_token_id": 58100,
                   "eos_token_id": 0, "decoder_start_token_id": 58100, "attention_dropout": 0.0,
                   "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0}
# The activations the Keras MarianMT implements (the keys of `mtbench.keras_models.marian.ACTIVATIONS`).
SUPPORTED_ACTIVATIONS = ("relu", "swish", "silu", "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")


def setting(config, key):
    return config.get(key, CONFIG_DEFAULTS[key])


def require_directory(directory):
    files.require_directory(directory, KIND)


def require_file(directory, name, why=""):
    """The path of `name` in the model directory, or an error that names both."""
    return files.require_file(directory, name, KIND, why)


def read_config(directory):
    """The parsed config.json of a MarianMT directory."""
    return files.read_config(directory, KIND, "marian")


def read_model_config(directory):
    """config.json with what decoding takes from generation_config.json, where newer transformers versions
    keep `bad_words_ids` (it wins where both files name them)."""
    config = read_config(directory)
    generation = files.read_optional_json(directory, GENERATION_CONFIG)
    if generation.get("bad_words_ids") is not None:
        config = {**config, "bad_words_ids": generation["bad_words_ids"]}
    return config


def read_tokenizer_config(directory):
    """tokenizer_config.json with special_tokens_map.json over it (older directories keep the special tokens
    there), or {} when neither exists: transformers then uses its defaults."""
    return {**files.read_optional_json(directory, TOKENIZER_CONFIG),
            **files.read_optional_json(directory, SPECIAL_TOKENS_MAP)}


def tokenizer_files(directory, separate_vocabs):
    """{name: path} of the tokenizer's files; target_vocab.json only where the two sides have their own."""
    names = [SOURCE_SPM, TARGET_SPM, VOCAB] + ([TARGET_VOCAB] if separate_vocabs else [])
    why = " (separate_vocabs is true in its tokenizer_config.json)" if separate_vocabs else ""
    return {name: require_file(directory, name, why if name == TARGET_VOCAB else "") for name in names}


def weights_file(directory):
    return files.weights_file(directory, KIND)


def check_weights_readable(directory):
    return files.check_weights_readable(directory, KIND)


def read_state_dict(directory):
    return files.read_state_dict(directory, KIND)


_LAYER = re.compile(r"(encoder|decoder)_layer_(\d+)$")
_SUBLAYERS = {"self_attention": "self_attn", "cross_attention": "encoder_attn", "fc1": "fc1", "fc2": "fc2",
              "self_attention_norm": "self_attn_layer_norm", "cross_attention_norm": "encoder_attn_layer_norm",
              "final_norm": "final_layer_norm"}
_PROJECTIONS = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "output": "out_proj"}
_PARAMETERS = {"kernel": "weight", "gamma": "weight", "bias": "bias", "beta": "bias"}
# Token embeddings: the names a checkpoint may hold each under, the first present is used (transformers ties the
# others to it; a safetensors file keeps one copy of tied tensors).
_EMBEDDINGS = {
    "shared_embedding": ("model.shared.weight", "model.encoder.embed_tokens.weight",
                         "model.decoder.embed_tokens.weight"),
    "encoder_embedding": ("model.encoder.embed_tokens.weight",),
    "decoder_embedding": ("model.decoder.embed_tokens.weight",),
}
# Fixed sinusoids that older checkpoints saved; the model computes them.
_POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def checkpoint_names(variable_path):
    """(candidate tensor names, transposed) of the checkpoint tensor behind a Keras variable path. torch's Linear
    keeps its weight as (out, in), a Keras Dense kernel is (in, out)."""
    parts = variable_path.split("/")[1:]  # without the model's own name
    if len(parts) == 2 and parts[0] in _EMBEDDINGS and parts[1] == "embeddings":
        return _EMBEDDINGS[parts[0]], False
    if parts == ["lm_head", "kernel"]:
        return ("lm_head.weight",), True
    if parts == ["final_logits_bias", "bias"]:
        return ("final_logits_bias",), False
    layer = _LAYER.match(parts[0]) if parts else None
    if layer and len(parts) in (3, 4) and parts[1] in _SUBLAYERS and parts[-1] in _PARAMETERS:
        names = ["model", layer.group(1), "layers", layer.group(2), _SUBLAYERS[parts[1]]]
        if len(parts) == 4:
            if parts[2] not in _PROJECTIONS:
                raise ValueError(f"no checkpoint tensor for the variable {variable_path}")
            names.append(_PROJECTIONS[parts[2]])
        return (".".join(names + [_PARAMETERS[parts[-1]]]),), parts[-1] == "kernel"
    raise ValueError(f"no checkpoint tensor for the variable {variable_path}")


def _replaced_by_ties(config):
    """Tensors a checkpoint may hold that transformers overwrites with the tensor they are tied to."""
    replaced = set(_POSITIONS)
    if config.get("share_encoder_decoder_embeddings", True):
        replaced.update(_EMBEDDINGS["shared_embedding"])
    if config.get("tie_word_embeddings", True):
        replaced.add("lm_head.weight")
    return replaced


def keras_weights(state_dict, config, model, source="the checkpoint"):
    """{Keras variable path: float32 numpy array} for every variable of the Keras MarianMT `model`, from a
    transformers MarianMTModel state dict. A missing `final_logits_bias` is zero, as transformers makes it.
    Raises MtbenchError naming the tensors that are missing, left over or of the wrong shape."""
    weights, used, missing, wrong_shape = {}, set(), [], []
    for variable in model.weights:
        names, transposed = checkpoint_names(variable.path)
        wanted = tuple(variable.shape)
        name = next((n for n in names if n in state_dict), None)
        if name is None:
            if names == ("final_logits_bias",):
                weights[variable.path] = np.zeros(wanted, np.float32)
            else:
                missing.append(names[0])
            continue
        used.add(name)
        value = np.asarray(state_dict[name], dtype=np.float32)
        if name == "final_logits_bias":
            value = value.reshape(-1) if value.ndim == 2 and value.shape[0] == 1 else value
        elif transposed:
            value = value.T
        if value.shape != wanted:
            expected = wanted[::-1] if transposed else ((1,) + wanted if name == "final_logits_bias" else wanted)
            wrong_shape.append(f"{name} {tuple(np.shape(state_dict[name]))} (config.json implies {expected})")
            continue
        weights[variable.path] = value
    unexpected = sorted(set(state_dict) - used - _replaced_by_ties(config))
    problems = files.problems_text({"missing": missing, "unexpected": unexpected, "of the wrong shape": wrong_shape})
    if problems:
        raise MtbenchError(f"the weights of {source} do not fit its config.json as a MarianMTModel: {problems}")
    return weights


def pretrained_weights(directory, model):
    """The Keras MarianMT's variables from the directory's weights file."""
    config = read_config(directory)
    return keras_weights(read_state_dict(directory), config, model, source=weights_file(directory))
