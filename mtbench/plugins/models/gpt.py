"""mtbench's decoder-only language model (`--model gpt`): GPT-2's shape (pre-LayerNorm, learned positions, tied
embeddings), sized by --preset (tiny, small, char, gpt2-small) and the size flags, started from the seeded numpy
draw of GPT-2's initialisation, trained on the language-modelling task."""

import dataclasses
import os

from mtbench import ModelFamily, MtbenchError, hookimpl

# Size flags of an encoder-decoder, which a decoder-only model does not take (--layers sets its blocks).
ENCODER_DECODER_FLAGS = ("encoder_layers", "decoder_layers")
TOKEN_FILES = ("train.bin", "val.bin")
# nanoGPT's Shakespeare-character model (`train_shakespeare_char.py`) and the tokens it reads a text by.
CHAR_PRESET, CHAR_TOKENIZER = "char", "char"


def token_folder(config):
    """Whether the run trains on nanoGPT's token files (ids its `prepare.py` made: GPT-2's for OpenWebText and
    Shakespeare, characters for shakespeare_char), not on text a tokenizer reads."""
    return bool(config.data_file) and any(os.path.isfile(os.path.join(config.data_file, name))
                                          for name in TOKEN_FILES)


class GPTFamily(ModelFamily):
    name = "gpt"
    description = ("mtbench's GPT-style decoder-only language model (nanoGPT's and GPT-2's shape), trained from "
                   "scratch (size: --preset tiny/small/char/gpt2-small and the size flags)")
    attention_kinds = ("causal",)
    attention_dropout = True  # at the run's dropout, as nanoGPT's (and GPT-2's attn_pdrop)
    recomputes_blocks = True
    task = "language-modelling"

    def check(self, path, config):
        """Refuses an encoder-decoder's size flags. The `char` preset is nanoGPT's character model, so a text it
        reads without --tokenizer is read by its characters, not the task's default bytes; set here, before the
        run's configuration is recorded, so that the result says what ran (token files keep their own ids)."""
        for flag in ENCODER_DECODER_FLAGS:
            if getattr(config, flag) is not None:
                raise MtbenchError(f"--{flag.replace('_', '-')}: a decoder-only model has one stack; give --layers")
        if config.preset == CHAR_PRESET and config.tokenizer is None and not token_folder(config):
            config.tokenizer = CHAR_TOKENIZER

    def optimizer_recipe(self, config):
        """GPT-2's and nanoGPT's AdamW: betas (0.9, 0.95), epsilon 1e-8, weight decay 0.1 on the matrices alone
        (biases and norms left out), the cosine floor at a tenth of the peak, gradients clipped by their joint
        norm to 1. The `char` preset is nanoGPT's Shakespeare-character run, whose beta2 is 0.99."""
        recipe = {"beta_1": 0.9, "beta_2": 0.95, "epsilon": 1e-8, "weight_decay": 0.1, "decay": "matrices",
                  "min_lr_ratio": 0.1, "clip": "global", "clip_norm": 1.0}
        if config.preset == CHAR_PRESET:
            recipe["beta_2"] = 0.99
        return recipe

    def initialization(self, config):
        """GPT-2's and nanoGPT's draw: normal(0, 0.02), the residual branches' last projections scaled down by the
        square root of their count."""
        return "gpt2"

    def shape(self, path, config):
        return config.model

    def build(self, run, path, tokenizer, max_len):
        from mtbench.keras_models.gpt import build_gpt
        shape = dataclasses.replace(run.config.model, vocab_size=tokenizer.vocab_size, max_len=max_len)
        return build_gpt(shape, flash_attention=run.model_options.get("flash_attention", False),
                         remat=run.model_options.get("remat", False)), shape

    def training_flops(self, model_shape, rows, source_length, target_length):
        from mtbench.keras_models.gpt import training_flops
        return training_flops(model_shape, rows, target_length)

    def load_saved(self, directory, description):
        return None, None  # the shape comes from the run's configuration, the tokenizer from the task


@hookimpl
def mtbench_register_models(register):
    register(GPTFamily())
