"""Reading a GPT-2 model directory as transformers writes one (`GPT2LMHeadModel.save_pretrained`, OpenAI's
gpt2 to gpt2-xl converted, or nanoGPT's model saved that way): its config and its weights as numpy arrays under the
paths of mtbench's Keras GPT (`mtbench.keras_models.gpt`), the architecture GPT-2 has.

GPT-2 keeps its linear layers as `Conv1D`, whose weight is (in, out) as a Keras Dense kernel is, and its query, key
and value in one (d, 3 d) projection, `c_attn`, which is cut in three for the three Dense layers. Nothing here
imports keras, so a run can check a directory before its backend is chosen."""

import re

import numpy as np

from mtbench import MtbenchError
from mtbench.plugins.models import checkpoint_files as files

KIND = "GPT-2"
CONFIG = files.CONFIG
# transformers' GPT2Config defaults, for the keys a config.json may leave out.
CONFIG_DEFAULTS = {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
                   "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                   "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                   "tie_word_embeddings": True, "add_cross_attention": False}
# transformers' activations -> whether mtbench's GPT computes them by GELU's tanh approximation (GPT-2's
# `gelu_new`; `gelu_pytorch_tanh` and `gelu_fast` are the same function) or exactly (`gelu`).
TANH_GELU = {"gelu_new": True, "gelu_pytorch_tanh": True, "gelu_fast": True, "gelu": False}
# What mtbench's GPT computes of each setting; a checkpoint set otherwise would silently train another model.
FIXED = {"layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
         "tie_word_embeddings": True, "add_cross_attention": False}


def setting(config, key):
    return config.get(key, CONFIG_DEFAULTS[key])


def read_config(directory):
    """The parsed config.json of a GPT-2 directory, refused where mtbench's GPT is not its architecture."""
    config = files.read_config(directory, KIND, "gpt2")
    activation = setting(config, "activation_function")
    if activation not in TANH_GELU:
        raise MtbenchError(f"{directory}: activation_function '{activation}' is not implemented by mtbench's GPT "
                           f"({', '.join(TANH_GELU)})")
    for key, value in FIXED.items():
        if setting(config, key) != value:
            raise MtbenchError(f"{directory}: {key} {setting(config, key)} is not implemented by mtbench's GPT "
                               f"(only {value})")
    if setting(config, "n_embd") % setting(config, "n_head"):
        raise MtbenchError(f"{directory}: n_embd {setting(config, 'n_embd')} is not a multiple of n_head "
                           f"{setting(config, 'n_head')}")
    return config


def feed_forward_units(config):
    return setting(config, "n_inner") or 4 * setting(config, "n_embd")


_BLOCK = re.compile(r"block_(\d+)$")
_NORMS = {"attention_norm": "ln_1", "mlp_norm": "ln_2"}
_DENSE = {("self_attention", "output"): "attn.c_proj", ("mlp", "hidden"): "mlp.c_fc", ("mlp", "out"): "mlp.c_proj"}
_THIRDS = ("query", "key", "value")  # c_attn's columns, in this order
_PARAMETERS = {"kernel": "weight", "gamma": "weight", "bias": "bias", "beta": "bias"}
# Buffers of older checkpoints (the causal mask) and the output layer, which is the token embedding.
_IGNORED = re.compile(r"(h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight)$")


def tensor_source(variable_path):
    """(checkpoint tensor name without `transformer.`, which third of its last axis or None) behind a Keras
    variable path of mtbench's GPT."""
    parts = variable_path.split("/")[1:]  # without the model's own name
    if parts in (["token_embedding", "embeddings"], ["position_embedding", "embeddings"]):
        return ("wte" if parts[0] == "token_embedding" else "wpe") + ".weight", None
    if len(parts) == 2 and parts[0] == "final_norm" and parts[1] in _PARAMETERS:
        return f"ln_f.{_PARAMETERS[parts[1]]}", None
    block = _BLOCK.match(parts[0]) if parts else None
    if block and len(parts) == 3 and parts[1] in _NORMS and parts[2] in _PARAMETERS:
        return f"h.{block.group(1)}.{_NORMS[parts[1]]}.{_PARAMETERS[parts[2]]}", None
    if block and len(parts) == 4 and parts[3] in _PARAMETERS:
        if parts[1] == "self_attention" and parts[2] in _THIRDS:
            return f"h.{block.group(1)}.attn.c_attn.{_PARAMETERS[parts[3]]}", _THIRDS.index(parts[2])
        if (parts[1], parts[2]) in _DENSE:
            return f"h.{block.group(1)}.{_DENSE[parts[1], parts[2]]}.{_PARAMETERS[parts[3]]}", None
    raise ValueError(f"no checkpoint tensor for the variable {variable_path}")


def keras_weights(state_dict, model, source="the checkpoint"):
    """{Keras variable path: float32 numpy array} for every variable of mtbench's Keras GPT `model` from a
    transformers GPT-2 state dict (`GPT2LMHeadModel`'s, names under `transformer.`, or `GPT2Model`'s). The model's
    positions are the checkpoint's first ones (a shorter block, as nanoGPT's `crop_block_size`). Raises
    MtbenchError naming the tensors that are missing, left over or of the wrong shape."""
    tensors = {name.removeprefix("transformer."): value for name, value in state_dict.items()}
    weights, used, missing, wrong_shape = {}, set(), [], []
    for variable in model.weights:
        name, third = tensor_source(variable.path)
        wanted = tuple(variable.shape)
        if name not in tensors:
            missing.append(name)
            continue
        used.add(name)
        value = np.asarray(tensors[name], dtype=np.float32)
        if third is not None and value.shape[-1] % 3 == 0:
            width = value.shape[-1] // 3
            value = value[..., third * width:(third + 1) * width]
        elif name == "wpe.weight" and value.shape[0] >= wanted[0]:
            value = value[:wanted[0]]
        if value.shape != wanted:
            wrong_shape.append(f"{name} {tuple(np.shape(tensors[name]))}")
            continue
        weights[variable.path] = value
    unexpected = sorted(name for name in set(tensors) - used if not _IGNORED.match(name))
    problems = files.problems_text({"missing": missing, "unexpected": unexpected, "of the wrong shape": wrong_shape})
    if problems:
        raise MtbenchError(f"the weights of {source} do not fit its config.json as a GPT-2: {problems}")
    return weights


def pretrained_weights(directory, model):
    """The Keras GPT's variables from the directory's weights file."""
    return keras_weights(files.read_state_dict(directory, KIND), model,
                         source=files.weights_file(directory, KIND))
