"""mtbench's Keras MarianMT on a checkpoint directory, built and loaded through the marian plugin: its logits and
its greedy translation. tests/keras_models/test_marian.py calls `mtbench_outputs` in-process (JAX) and runs this
file in a fresh process with KERAS_BACKEND=torch (keras fixes its backend at import), against the transformers
outputs the test saved; it prints one JSON line: the largest logit difference and the greedy tokens.

    KERAS_BACKEND=torch python tests/marian_probe.py CHECKPOINT_DIR REFERENCE_NPZ
"""

import json
import sys
from types import SimpleNamespace


def build_loaded_model(directory):
    """(Keras model with the checkpoint's weights, the checkpoint's tokenizer), as a run builds them."""
    from mtbench.keras_models.initialization import assign_weights
    from mtbench.plugins.models.marian import MarianFamily
    family = MarianFamily()
    tokenizer = family.tokenizer(directory, None)
    run = SimpleNamespace(config=SimpleNamespace(dropout=None), model_options={})
    model, _ = family.build(run, directory, tokenizer, max_len=32)
    assign_weights(model, family.pretrained_weights(directory, model))
    return model, tokenizer


def greedy_tokens(model, special, source, new_tokens):
    """mtbench's greedy decoding of `source` into a buffer of `new_tokens` after the start token."""
    import numpy as np
    from keras import ops

    from mtbench.runner.evaluation.decoding import greedy_decoder
    buffer = np.full((len(source), new_tokens + 1), special.pad, np.int32)
    buffer[:, 0] = special.start
    return ops.convert_to_numpy(greedy_decoder(model, special)(source, buffer))


def mtbench_outputs(directory, source, decoder_input, new_tokens):
    """(model, tokenizer, logits of `decoder_input` given `source`, greedy tokens of `source`). The logits come
    from `predict_on_batch`, which compiles the model once on JAX rather than op by op."""
    model, tokenizer = build_loaded_model(directory)
    logits = model.predict_on_batch((source, decoder_input))
    return model, tokenizer, logits, greedy_tokens(model, tokenizer.special, source, new_tokens)


def main(directory, reference_path):
    import keras
    import numpy as np
    reference = np.load(reference_path)
    new_tokens = int(reference["new_tokens"])
    _, _, logits, tokens = mtbench_outputs(directory, reference["source"], reference["decoder_input"], new_tokens)
    print(json.dumps({"backend": keras.backend.backend(),
                      "max_abs_diff": float(np.max(np.abs(logits - reference["logits"]))),
                      "tokens": tokens.tolist()}))


if __name__ == "__main__":
    main(*sys.argv[1:])
