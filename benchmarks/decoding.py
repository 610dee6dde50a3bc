"""Decoding speed: mtbench's compiled greedy loop with a key/value cache against a per-token Python loop that
reruns the model over the whole target buffer at every step (what a first implementation usually does; the
buffer's fixed length keeps one compiled shape, and does about twice the work of rerunning only the prefix decoded
so far), and what beam search (`mtbench train --beam N`) costs on top of greedy decoding.

    python benchmarks/decoding.py --backend jax [--preset small --sentences 128 --length 48 --repeats 3 --beam 4]

Random initial weights never emit EOS, so every sentence decodes the full buffer in both ways: the figure is the
cost per token, not luck with early stops. Both produce the same tokens (checked here, and in the tests).
"""

import argparse
import json
import os
import sys
import time

import numpy as np


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--backend", choices=["jax", "torch"], default="jax")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--length", type=int, help="tokens a sentence decodes into, the first one given "
                        "(default and most: the preset's --max-len, past which positions have no embedding)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--beam", type=int, default=4, help="beam size to time beside greedy (1: skip)")
    args = parser.parse_args(argv)
    os.environ["KERAS_BACKEND"] = args.backend
    from mtbench.keras_models.presets import PRESETS
    if args.preset not in PRESETS:
        parser.error(f"--preset {args.preset}: a translation preset ({', '.join(PRESETS)})")
    max_len = PRESETS[args.preset].max_len
    args.length = args.length or max_len
    if not 2 <= args.length <= max_len:
        # A position past the embedding's rows has none of its own (JAX reads another silently): the two ways differ.
        parser.error(f"--length {args.length}: between 2 and {args.preset}'s --max-len {max_len}")
    return args


def main(argv=None):
    args = parse_args(argv)

    from keras import ops

    from mtbench.keras_models.initialization import assign_weights, initial_weights
    from mtbench.keras_models.presets import PRESETS
    from mtbench.keras_models.transformer import build_transformer
    from mtbench.plugins.manager import registry
    from mtbench.runner.evaluation.decoding import beam_decoder, greedy_decoder
    from mtbench.runner.data.tokenizer import BOS_ID, EOS_ID, JOINT_SPECIAL
    from mtbench.runner.setup import set_matmul_precision

    backend = registry().backends[args.backend]
    # float32 matmuls in float32 on both (XLA's GPU default is TF32, torch's is not), as `mtbench train` holds them
    matmul_precision = set_matmul_precision(backend, "highest")
    model = build_transformer(PRESETS[args.preset])
    assign_weights(model, initial_weights(model, seed=0))
    rng = np.random.default_rng(0)
    source = rng.integers(4, PRESETS[args.preset].vocab_size, size=(args.sentences, args.length // 2)).astype(np.int32)
    source[:, -1] = EOS_ID
    buffer = np.zeros((args.sentences, args.length), np.int32)
    buffer[:, 0] = BOS_ID

    compiled = backend.compile_inference(greedy_decoder(model, JOINT_SPECIAL), model)
    beam_compiled = backend.compile_inference(beam_decoder(model, JOINT_SPECIAL, args.beam), model) if args.beam > 1 else None
    forward = backend.compile_inference(lambda src, tgt: model((src, tgt)), model)

    def python_loop():
        tokens = buffer.copy()
        for t in range(args.length - 1):
            logits = ops.convert_to_numpy(forward(source, tokens))
            tokens[:, t + 1] = logits[:, t].argmax(-1)
        return tokens

    def timed(fn):
        ops.convert_to_numpy(fn())  # warm-up: compilation, waited for (JAX and CUDA return before they finish)
        seconds = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = ops.convert_to_numpy(fn())
            seconds.append(time.perf_counter() - t0)
        return float(np.median(seconds)), out

    cached_s, cached_tokens = timed(lambda: compiled(source, buffer))
    loop_s, loop_tokens = timed(python_loop)
    beam_s = timed(lambda: beam_compiled(source, buffer))[0] if args.beam > 1 else None
    same = bool((cached_tokens == loop_tokens).all())
    tokens = args.sentences * (args.length - 1)
    print(f"{args.backend} {args.preset}: {args.sentences} sentences x {args.length - 1} tokens, "
          f"median of {args.repeats}")
    print(f"  compiled loop with key/value cache: {cached_s:8.3f} s  ({tokens / cached_s:,.0f} tokens/s)")
    print(f"  per-token Python loop, full rerun:  {loop_s:8.3f} s  ({tokens / loop_s:,.0f} tokens/s)")
    print(f"  speed-up {loop_s / cached_s:.1f}x; same tokens: {same}")
    if beam_s is not None:
        print(f"  compiled beam search, beam {args.beam}:   {beam_s:8.3f} s  ({beam_s / cached_s:.1f}x greedy)")
    print(json.dumps({"backend": args.backend, "preset": args.preset, "cached_s": cached_s, "python_loop_s": loop_s,
                      "speedup": loop_s / cached_s, "same_tokens": same,
                      "beam": args.beam, "beam_s": beam_s, "matmul_precision": matmul_precision}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
