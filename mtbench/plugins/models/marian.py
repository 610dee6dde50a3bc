"""Pretrained MarianMT checkpoints (`--model marian:PATH`): a model directory as transformers' `save_pretrained`
writes one (Helsinki-NLP's opus-mt models, for example), read from disk and never downloaded, trained and
evaluated as mtbench's Keras MarianMT with the checkpoint's own tokenizer."""

import os
from dataclasses import dataclass

from mtbench import ModelFamily, ModelShape, MtbenchError, hookimpl
from mtbench.plugins.models import marian_checkpoint as checkpoint
from mtbench.plugins.models.marian_tokenizer import MarianTokenizer
from mtbench.plugins.models.transformer import ENCODER_DECODER_ATTENTION, TransformerFamily


@dataclass(frozen=True)
class MarianShape(ModelShape):
    """A MarianMT checkpoint's shape: `ff_dim` is its encoder's feed-forward width, and its decoder's may differ
    (config.json's decoder_ffn_dim), which the FLOPs count at its own."""
    decoder_ff_dim: int = None


class MarianFamily(ModelFamily):
    name = "marian"
    description = "a pretrained MarianMT checkpoint: a local transformers model directory (--model marian:PATH)"
    takes_path = True
    pretrained = True
    attention_kinds = ENCODER_DECODER_ATTENTION
    recomputes_blocks = True
    training_flops = TransformerFamily.training_flops  # the same stacks of matmuls as mtbench's Transformer

    def check(self, path, config):
        if path is None:
            raise MtbenchError("--model marian needs the checkpoint's directory: --model marian:PATH")
        model_config = checkpoint.read_config(path)
        checkpoint.check_weights_readable(path)
        separate_vocabs = bool(checkpoint.read_tokenizer_config(path).get("separate_vocabs", False))
        checkpoint.tokenizer_files(path, separate_vocabs)
        checkpoint.files.refuse_size_flags(path, config)
        checkpoint.files.refuse_vocabulary_flag(config, checkpoint.KIND, "its vocab.json's")
        positions = checkpoint.setting(model_config, "max_position_embeddings")
        if config.max_len > positions:
            raise MtbenchError(f"--max-len {config.max_len} is longer than the {positions} positions of the "
                               f"pretrained model ({path}); give --max-len {positions} or less")
        activation = checkpoint.setting(model_config, "activation_function")
        if activation not in checkpoint.SUPPORTED_ACTIVATIONS:
            raise MtbenchError(f"{path}: activation_function '{activation}' is not implemented by mtbench's "
                               f"MarianMT ({', '.join(checkpoint.SUPPORTED_ACTIVATIONS)})")
        # mtbench's attention has no dropout and its stacks drop no layers; training such a checkpoint would
        # silently differ from transformers'.
        for key in ("attention_dropout", "encoder_layerdrop", "decoder_layerdrop"):
            if checkpoint.setting(model_config, key) > 0:
                raise MtbenchError(f"{path}: {key} {checkpoint.setting(model_config, key)} is not implemented by "
                                   f"mtbench's MarianMT (only 0)")

    def tokenizer(self, path, config):
        return MarianTokenizer(path)

    def shape(self, path, config):
        return self._shape(self._model_config(path, config), config.max_len)

    def build(self, run, path, tokenizer, max_len):
        from mtbench.keras_models.marian import build_marian, marian_settings
        model_config = self._model_config(path, run.config)
        positions = marian_settings(model_config)["max_position_embeddings"]
        if max_len > positions:
            raise MtbenchError(f"sequences of {max_len} tokens do not fit the {positions} positions of the "
                               f"pretrained model ({path})")
        return build_marian(model_config, **run.model_options), self._shape(model_config, max_len)

    @staticmethod
    def _shape(model_config, max_len):
        from mtbench.keras_models.marian import marian_settings, target_vocab_size
        settings = marian_settings(model_config)
        return MarianShape(d_model=settings["d_model"], num_heads=settings["encoder_attention_heads"],
                           encoder_layers=settings["encoder_layers"], decoder_layers=settings["decoder_layers"],
                           ff_dim=settings["encoder_ffn_dim"], vocab_size=target_vocab_size(settings),
                           # whether training draws dropout masks at all (the parity check asks)
                           max_len=max_len, dropout=max(settings["dropout"], settings["activation_dropout"]),
                           decoder_ff_dim=settings["decoder_ffn_dim"])

    @staticmethod
    def _model_config(path, config):
        """config.json, with --dropout over the checkpoint's residual, embedding and activation dropout."""
        model_config = checkpoint.read_model_config(path)
        if getattr(config, "dropout", None) is not None:
            model_config["dropout"] = model_config["activation_dropout"] = config.dropout
        return model_config

    def pretrained_weights(self, path, model):
        return checkpoint.pretrained_weights(path, model)

    def save(self, path, model_shape, directory):
        """The checkpoint's config.json (and generation_config.json, where `bad_words_ids` may be), which
        `build` reads; the tokenizer saves its own files."""
        checkpoint.files.copy_present((checkpoint.CONFIG, checkpoint.GENERATION_CONFIG), path, directory)
        return {"checkpoint": os.path.abspath(path)}

    def load_saved(self, directory, description):
        return directory, MarianTokenizer(directory)


@hookimpl
def mtbench_register_models(register):
    register(MarianFamily())
