"""What fine-tuning a MarianMT costs per step against mtbench's Transformer of the same size, on each backend.

    python benchmarks/marian_step.py [--size tiny|small] [--steps 40] [--batch-size 32] [--max-len 32]
                                     [--backends jax,torch] [--work DIR] [--cache-dir DIR]

No checkpoint can be downloaded here, so the MarianMT is a random one of the chosen size, written by
`transformers` itself (pip install 'mtbench[bench]'), with sentencepiece models trained on the corpus's
training text as OPUS-MT's are. Both families then train the same corpus (the built-in Bible en-fr, the first
--pairs pairs), the same steps, batch size and length buckets, float32, dropout 0, one `mtbench compare` each
(one process per backend, honest timing: compilation apart, medians of synchronised steps). The table sets the
steady step times side by side; the last line is one JSON object for scripts.

The two models differ in what a pretrained MarianMT fixes: post-layer-norm blocks, swish activations, fixed
sinusoidal positions, a final logits bias, and the checkpoint's vocabulary, which the Transformer's run matches
with --vocab-size (its sentencepiece model may support slightly fewer pieces; the table shows both).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {  # MarianConfig fields; "small" is mtbench's small preset
    "tiny": dict(d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128),
    "small": dict(d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024),
}
VOCAB = {"tiny": 1000, "small": 8000}


def corpus_pairs(pairs, cache_dir):
    sys.path.insert(0, REPOSITORY)
    from mtbench.plugins.manager import registry
    from mtbench.runner.config import TrainConfig
    from mtbench.runner.data.corpus import load_corpus
    config = TrainConfig(preset="tiny", max_pairs=pairs, valid_size=200, test_size=200, cache_dir=cache_dir,
                         out=os.path.join(tempfile.gettempdir(), "unused.json"))
    return load_corpus(config, registry(), lambda *_: None).train


def train_sentencepiece(sentences, path, vocab_size):
    import sentencepiece
    with open(path, "wb") as model:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size, model_type="unigram",
            character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)


def random_marian(directory, size, train_pairs):
    """A random MarianMT directory as transformers writes one: OPUS-MT's layout (one vocabulary for both sides,
    </s> 0, <unk> 1, <pad> last, decoder start = pad)."""
    import sentencepiece
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer
    os.makedirs(directory, exist_ok=True)
    spm_files = {"source_spm": os.path.join(directory, "source.spm"), "target_spm": os.path.join(directory, "target.spm")}
    pieces = []
    for side, path in enumerate(spm_files.values()):
        train_sentencepiece([pair[side] for pair in train_pairs], path, VOCAB[size] // 2)
        processor = sentencepiece.SentencePieceProcessor(model_file=path)
        pieces += [processor.id_to_piece(i) for i in range(processor.get_piece_size())
                   if not (processor.is_control(i) or processor.is_unknown(i))]
    vocab = {token: i for i, token in enumerate(dict.fromkeys(["</s>", "<unk>", *pieces, "<pad>"]))}
    vocab_file = os.path.join(directory, "vocab.json")
    with open(vocab_file, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    pad = vocab["<pad>"]
    config = MarianConfig(vocab_size=len(vocab), max_position_embeddings=512, activation_function="swish",
                          scale_embedding=True, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                          pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0,
                          **SIZES[size])
    torch.manual_seed(0)
    MarianMTModel(config).save_pretrained(directory)
    MarianTokenizer(**spm_files, vocab=vocab_file).save_pretrained(directory)
    return len(vocab)


def compare(args, out, model_args):
    command = [sys.executable, "-m", "mtbench", "compare", "--backends", args.backends, *model_args,
               "--data", args.corpus, "--valid-size", "100", "--test-size", "100", "--max-len", str(args.max_len),
               "--steps", str(args.steps), "--batch-size", str(args.batch_size), "--dropout", "0",
               # float32 as the table says: --dtype's default (auto) takes mixed bfloat16 on a GPU that has it.
               "--dtype", "float32",
               "--cache-dir", args.cache_dir, "--out", out, "--overwrite", "--report", "none"]
    subprocess.run(command, check=True, cwd=REPOSITORY, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return {run["result"]["backend"]: run["result"] for run in json.load(f)["runs"]}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SIZES, default="tiny")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-len", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=8000)
    parser.add_argument("--backends", default="jax,torch")
    parser.add_argument("--work", default=None, help="Where the checkpoint, corpus and results go (default: a temp dir).")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "mtbench-bench-cache"))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="marian-step-")
    os.makedirs(work, exist_ok=True)
    pairs = corpus_pairs(args.pairs, args.cache_dir)
    args.corpus = os.path.join(work, "corpus.tsv")
    with open(args.corpus, "w", encoding="utf-8") as f:
        f.writelines(f"{source}\t{target}\n" for source, target in pairs)
    vocab_size = random_marian(os.path.join(work, "marian"), args.size, pairs)

    marian = compare(args, os.path.join(work, "marian.json"), ["--model", f"marian:{os.path.join(work, 'marian')}"])
    transformer = compare(args, os.path.join(work, "transformer.json"),
                          ["--preset", "small" if args.size == "small" else "tiny", "--vocab-size", str(vocab_size)])
    print(f"\n{args.size}: {args.steps} steps x batch {args.batch_size}, --max-len {args.max_len}, float32, dropout 0\n")
    print("| backend | model | parameters | vocabulary | step (ms, median) | tokens/s | compile (s) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ratios = {}
    for backend in args.backends.split(","):
        for name, result in (("MarianMT", marian[backend]), ("Transformer", transformer[backend])):
            timing = result["timing"]
            print(f"| {backend} | {name} | {result['model']['parameters']:,} | {result['model']['vocab_size']:,} | "
                  f"{timing['step_s_median'] * 1000:.1f} | {timing['tokens_per_s']:,.0f} | {timing['compile_s']:.1f} |")
        ratios[backend] = marian[backend]["timing"]["step_s_median"] / transformer[backend]["timing"]["step_s_median"]
    print("\n" + ", ".join(f"{backend}: MarianMT step / Transformer step = {ratio:.2f}" for backend, ratio in ratios.items()))
    backends = args.backends.split(",")
    env = marian[backends[0]]["env"]
    # Each backend's own device (a GPU where it sees one), beside the machine's CPU.
    devices = {backend: marian[backend]["env"]["device"] for backend in backends}
    print("device: " + ", ".join(f"{backend} on {device.get('kind')} ({device.get('name')})"
                                 for backend, device in devices.items())
          + f"; CPU {env['cpu_model']} ({env['cpu_count']} cores); keras {env['keras']}, jax {env['jax']}, "
          f"torch {env['torch']}")
    print(json.dumps({"size": args.size, "steps": args.steps, "batch_size": args.batch_size, "max_len": args.max_len,
                      "marian_over_transformer_step": ratios, "devices": devices,
                      "versions": {name: env[name] for name in ("keras", "jax", "torch")}, "work": work}))


if __name__ == "__main__":
    main()
