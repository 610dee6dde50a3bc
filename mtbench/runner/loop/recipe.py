"""The optimizer recipe a run trains with, stated once: mtbench's (the translation Transformer's), under what the
model family sets (`ModelFamily.optimizer_recipe`: the GPT family trains as GPT recipes do), under what the user
gave. The Keras optimizer is built from it, torch's fused AdamW carries it out, the training log reads its learning
rate from it on the host, the hand-written references in benchmarks/ follow it, and the result records it."""

import math
import struct

import numpy as np

from mtbench.errors import MtbenchError

# AdamW as the translation Transformer has always trained: Vaswani et al.'s betas and epsilon, a light decay on
# every variable, the cosine floor at a tenth of the peak, each gradient clipped on its own (Keras's `clipnorm`).
BASE_RECIPE = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9, "weight_decay": 0.01, "decay": "all",
               "min_lr_ratio": 0.1, "clip": "per-variable", "clip_norm": 1.0}
DECAY_CHOICES = ("all", "matrices")  # matrices: weights of 2 or more dimensions (biases and norms left out)
CLIP_CHOICES = ("per-variable", "global", "none")
# The configuration's options that set a recipe key (None: not given).
OPTIONS = {"adam_beta1": "beta_1", "adam_beta2": "beta_2", "adam_epsilon": "epsilon", "weight_decay": "weight_decay",
           "weight_decay_on": "decay", "clip": "clip", "clip_norm": "clip_norm"}


def check_recipe_options(config):
    """Refuses, by option and value, a recipe option of `config` that AdamW cannot train with: before any data is
    read, where the run's recipe is only put together once the model family is known."""
    given = {key: getattr(config, option) for option, key in OPTIONS.items() if getattr(config, option) is not None}
    check_recipe(given, {key: f"--{option.replace('_', '-')}" for option, key in OPTIONS.items()})
    if config.clip == "none" and config.clip_norm is not None:  # it would clip nothing, and say nothing
        raise MtbenchError(f"--clip-norm {config.clip_norm:g} is the norm gradients are clipped to; --clip none "
                           f"clips none: give one of them")
    if config.lr_decay_steps is not None and config.lr_decay_steps <= config.warmup_steps:
        raise MtbenchError(f"--lr-decay-steps must exceed --warmup-steps {config.warmup_steps}: the decay begins "
                           f"where the warm-up ends, got {config.lr_decay_steps}")
    if config.min_learning_rate is not None and not 0 <= config.min_learning_rate <= config.learning_rate:
        raise MtbenchError(f"--min-learning-rate must lie between 0 and --learning-rate {config.learning_rate:g}, "
                           f"got {config.min_learning_rate}")


def optimizer_recipe(config, total_steps, family=None):
    """AdamW's settings for `config` over `total_steps`: linear warm-up from 0 to the learning rate, cosine decay
    to `min_lr_ratio` of it (`alpha`) by the last step or by --lr-decay-steps, the floor after it, decoupled
    weight decay on the variables `decay` names, clipping by `clip`.
    `family`: the run's ModelFamily (default: the registry's for `config`)."""
    recipe = dict(BASE_RECIPE)
    recipe.update(family_recipe(config, family))
    recipe.update({key: getattr(config, option) for option, key in OPTIONS.items()
                   if getattr(config, option) is not None})
    if config.min_learning_rate is not None:
        recipe["min_lr_ratio"] = config.min_learning_rate / config.learning_rate
    if recipe["clip"] == "none":  # the base's or the family's norm would be recorded as if something were clipped to it
        recipe["clip_norm"] = None
    check_betas_in_weights_dtype(recipe, config.dtype)
    warmup = min(config.warmup_steps, max(total_steps - 1, 0))
    decay_end = total_steps if config.lr_decay_steps is None else config.lr_decay_steps
    return {**recipe, "learning_rate": config.learning_rate, "warmup_steps": warmup,
            "decay_steps": max(decay_end - warmup, 1), "alpha": recipe["min_lr_ratio"]}


def family_recipe(config, family=None):
    from mtbench.plugins import manager
    if family is None:
        family = manager.registry().models.get(config.model_family[0])
    if family is None:
        return {}
    with manager.registry().plugin_failures("models", family.name):  # a crash names the family's plugin
        recipe = family.optimizer_recipe(config)
    if not isinstance(recipe, dict):
        raise MtbenchError(f"model family '{family.name}' gives an optimizer recipe of {type(recipe).__name__}, "
                           f"not a dict")
    unknown = sorted(set(map(str, recipe)) - set(BASE_RECIPE))
    if unknown:
        raise MtbenchError(f"model family '{family.name}' sets unknown optimizer settings: {', '.join(unknown)}")
    try:  # the family's own values, before the user's options go over them: its mistake is not the user's
        check_recipe(recipe)
    except (MtbenchError, TypeError) as error:
        raise MtbenchError(f"model family '{family.name}' sets {recipe}, which mtbench refuses: {error}") from None
    return recipe


def in_sixteen_bits(value, dtype):
    """`value` as a float of `dtype` ('bfloat16': float32's bits rounded to the nearest of its top 16, ties to
    even; 'float16': numpy's)."""
    if dtype == "float16":
        return float(np.float16(value))
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", rounded))[0]


def check_betas_in_weights_dtype(recipe, dtype):
    """Refuses Adam's betas that round to 1 in 16-bit weights' dtype (`--dtype bfloat16` or `float16`, which
    Keras's AdamW computes in on both backends): 1 - beta2^t is then 0, and no weight ever moves."""
    if dtype not in ("bfloat16", "float16"):
        return
    for name in ("beta_1", "beta_2"):
        if in_sixteen_bits(recipe[name], dtype) >= 1:
            raise MtbenchError(f"Adam's {name.replace('_', '')} {recipe[name]:g} is 1.0 in {dtype}, the dtype of "
                               f"the weights and of Keras's AdamW over them: no weight would move (give "
                               f"--dtype mixed_{dtype}, or --adam-{name.replace('_', '')} of at most "
                               f"{in_sixteen_bits_below_one(dtype):g})")


def in_sixteen_bits_below_one(dtype):
    """The largest value below 1 that `dtype` holds."""
    return 1 - 2.0 ** (-8 if dtype == "bfloat16" else -11)


def check_recipe(recipe, names=None):
    """Refuses the first value of `recipe` (any of BASE_RECIPE's keys) that AdamW cannot train with, NaN and infinity
    included; `names`: {key: what to call it} (the user's option names; default the keys)."""
    def name(key):
        return (names or {}).get(key, key)
    for key in ("beta_1", "beta_2"):
        if key in recipe and not 0 <= recipe[key] < 1:
            raise MtbenchError(f"{name(key)} must be in [0, 1), got {recipe[key]}")
    # Written `not 0 < x < inf` so that NaN, which every comparison answers False, is refused too.
    for key in ("epsilon", "clip_norm"):
        if key in recipe and not 0 < recipe[key] < math.inf:
            raise MtbenchError(f"{name(key)} must be a positive finite number, got {recipe[key]}")
    if "weight_decay" in recipe and not 0 <= recipe["weight_decay"] < math.inf:
        raise MtbenchError(f"{name('weight_decay')} must be a finite number, not negative, got "
                           f"{recipe['weight_decay']}")
    if "min_lr_ratio" in recipe and not 0 <= recipe["min_lr_ratio"] <= 1:
        raise MtbenchError(f"{name('min_lr_ratio')} must be from 0 to 1 (a share of the learning rate), got "
                           f"{recipe['min_lr_ratio']}")
    for key, choices in (("decay", DECAY_CHOICES), ("clip", CLIP_CHOICES)):
        if key in recipe and recipe[key] not in choices:
            raise MtbenchError(f"{name(key)} {recipe[key]!r} is not one of {', '.join(choices)}")
