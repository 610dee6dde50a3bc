"""Pretrained GPT-2 checkpoints (`--model gpt2:DIR`): a model directory as transformers' `save_pretrained` writes
one (OpenAI's gpt2 to gpt2-xl, or a GPT-2 you trained), read from disk and never downloaded, fine-tuned and scored
as mtbench's Keras GPT, which is GPT-2's architecture, with the checkpoint's own BPE tokenizer: nanoGPT's
`init_from='gpt2'` (its `finetune_shakespeare.py`) on either backend."""

import os

from mtbench import ModelFamily, ModelShape, MtbenchError, hookimpl
from mtbench.plugins.models import gpt2_checkpoint as checkpoint
from mtbench.plugins.models.gpt import GPTFamily, token_folder
from mtbench.plugins.models.gpt2_tokenizer import MERGES, VOCAB, GPT2Tokenizer, read_vocabulary

CHARACTERS_FILE = "meta.pkl"  # a character-level folder's: its ids are characters, not GPT-2's tokens


class GPT2Family(ModelFamily):
    name = "gpt2"
    description = ("a pretrained GPT-2 checkpoint: a local transformers model directory (--model gpt2:PATH), "
                   "fine-tuned as a language model with its own BPE tokenizer")
    takes_path = True
    pretrained = True
    attention_kinds = ("causal",)
    attention_dropout = True  # at the run's dropout, as nanoGPT's (and GPT-2's attn_pdrop)
    recomputes_blocks = True
    task = "language-modelling"
    optimizer_recipe = GPTFamily.optimizer_recipe  # GPT-2's and nanoGPT's AdamW
    training_flops = GPTFamily.training_flops  # the same model

    def check(self, path, config):
        if path is None:
            raise MtbenchError("--model gpt2 needs the checkpoint's directory: --model gpt2:PATH")
        model_config = checkpoint.read_config(path)
        checkpoint.files.check_weights_readable(path, checkpoint.KIND)
        read_vocabulary(path)
        checkpoint.files.refuse_size_flags(path, config)
        checkpoint.files.refuse_vocabulary_flag(config, checkpoint.KIND,
                                                f"{checkpoint.setting(model_config, 'vocab_size'):,} tokens")
        if config.tokenizer is not None:
            raise MtbenchError(f"--tokenizer {config.tokenizer}: a GPT-2 checkpoint reads text with its own BPE "
                               f"tokenizer ({VOCAB}, {MERGES}); leave --tokenizer out")
        if token_folder(config) and os.path.isfile(os.path.join(config.data_file, CHARACTERS_FILE)):
            raise MtbenchError(f"{config.data_file} holds {CHARACTERS_FILE}: its token files are a character-level "
                               f"text's ids, not GPT-2's tokens")
        positions = checkpoint.setting(model_config, "n_positions")
        if config.max_len > positions:
            raise MtbenchError(f"--block-size {config.max_len} is longer than the {positions} positions of the "
                               f"pretrained model ({path}); give --block-size {positions} or less")

    def tokenizer(self, path, config):
        return GPT2Tokenizer(path)

    def default_block_size(self, path):
        """The checkpoint's positions (config.json's n_positions: GPT-2's 1,024), the window `evaluate` and
        `generate` read it in unless --block-size says otherwise: GPT-2 is scored in its own context, as nanoGPT's
        `eval_gpt2.py` scores it, not in a preset's block."""
        return checkpoint.setting(checkpoint.read_config(path), "n_positions")

    def shape(self, path, config):
        return self._shape(checkpoint.read_config(path), config)

    def build(self, run, path, tokenizer, max_len):
        from mtbench.keras_models.gpt import build_gpt
        model_config = checkpoint.read_config(path)
        shape = self._shape(model_config, run.config)
        if tokenizer.vocab_size > shape.vocab_size:
            raise MtbenchError(f"a vocabulary of {tokenizer.vocab_size:,} ids does not fit the {shape.vocab_size:,} "
                               f"token embeddings of the pretrained model ({path})")
        tanh = checkpoint.TANH_GELU[checkpoint.setting(model_config, "activation_function")]
        return build_gpt(shape, flash_attention=run.model_options.get("flash_attention", False),
                         tanh_gelu_activation=tanh, remat=run.model_options.get("remat", False)), shape

    @staticmethod
    def _shape(model_config, config):
        """The checkpoint's size, the run's block and dropout (the preset's or --dropout, as nanoGPT's
        `from_pretrained` takes only its dropout from the run: 0 for nanoGPT's fine-tuning)."""
        return ModelShape(d_model=checkpoint.setting(model_config, "n_embd"),
                          num_heads=checkpoint.setting(model_config, "n_head"), encoder_layers=0,
                          decoder_layers=checkpoint.setting(model_config, "n_layer"),
                          ff_dim=checkpoint.feed_forward_units(model_config),
                          vocab_size=checkpoint.setting(model_config, "vocab_size"), max_len=config.max_len,
                          dropout=config.model.dropout)

    def pretrained_weights(self, path, model):
        return checkpoint.pretrained_weights(path, model)

    def save(self, path, model_shape, directory):
        """The checkpoint's config.json, which `build` reads; the tokenizer saves its own files (every run of the
        family, on text or on token files, keeps the checkpoint's BPE)."""
        checkpoint.files.copy_present((checkpoint.CONFIG,), path, directory)
        return {"checkpoint": os.path.abspath(path)}

    def load_saved(self, directory, description):
        return directory, GPT2Tokenizer(directory)


@hookimpl
def mtbench_register_models(register):
    register(GPT2Family())
