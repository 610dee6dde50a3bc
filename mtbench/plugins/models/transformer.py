"""mtbench's own encoder-decoder Transformer (`--model transformer`, the default): sized by the preset and the size
flags, started from a seeded numpy draw, with mtbench's joint sentencepiece tokenizer trained on the corpus."""

import dataclasses

from mtbench import ModelFamily, hookimpl
from mtbench.keras_models.flops import training_flops

# What both built-in families' attention layers run through keras.ops.dot_product_attention, with the
# flash_attention options they are given.
ENCODER_DECODER_ATTENTION = ("causal", "masked", "decoding")


class TransformerFamily(ModelFamily):
    name = "transformer"
    description = "mtbench's pre-layer-norm Transformer, trained from scratch (size: --preset and size flags)"
    attention_kinds = ENCODER_DECODER_ATTENTION
    recomputes_blocks = True

    def shape(self, path, config):
        return config.model

    def build(self, run, path, tokenizer, max_len):
        from mtbench.keras_models.transformer import build_transformer
        shape = dataclasses.replace(run.config.model, vocab_size=tokenizer.vocab_size, max_len=max_len)
        return build_transformer(shape, **run.model_options), shape

    def training_flops(self, model_shape, rows, source_length, target_length):
        return training_flops(model_shape, rows, source_length, target_length)

    def load_saved(self, directory, description):
        return None, None  # the shape comes from the run's configuration, the tokenizer is mtbench's own


@hookimpl
def mtbench_register_models(register):
    register(TransformerFamily())
