"""nanoGPT's documented CPU configuration (README, "I only have a macbook"): 4 layers, 4 heads, 128 wide, block 64,
batch 12, 2,000 steps, learning rate 1e-3 decayed to 1e-4 over the 2,000, dropout 0, characters, trained three
ways on one text from one weights file on the same batches: `mtbench compare` on JAX and on torch, and the
best-by-hand torch reference of nanoGPT's recipe (benchmarks/best_gpt_torch.py), each scored on the same
validation blocks.

    python benchmarks/nanogpt_cpu.py --data input.txt [--steps 2000] [--log-every 250] [--out DIR]

Prints the validation loss, the training wall time and the steady step time of each, and the last line is one JSON
object. nanoGPT's own run on Shakespeare reaches 1.88 at step 2,000 on the validation split; on another text the
figure is the text's, and the reference beside it is the comparison."""

import argparse
import json
import os
import subprocess
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# nanoGPT's config/train_shakespeare_char.py with its README's CPU overrides, as mtbench's options.
NANOGPT_CPU = ["--model", "gpt", "--preset", "char", "--layers", "4", "--heads", "4", "--d-model", "128",
               "--ff-dim", "512", "--block-size", "64", "--batch-size", "12", "--learning-rate", "1e-3",
               "--dropout", "0", "--tokenizer", "char", "--dtype", "float32"]
REFERENCE_SIZE = ["--layers", "4", "--heads", "4", "--d-model", "128", "--ff-dim", "512", "--block-size", "64",
                  "--batch-size", "12", "--learning-rate", "1e-3", "--dropout", "0", "--tokenizer", "char"]


def mtbench(*arguments):
    proc = subprocess.run([sys.executable, "-m", "mtbench", *arguments], cwd=REPOSITORY, text=True)
    if proc.returncode != 0:
        sys.exit(f"mtbench {arguments[0]} failed (exit {proc.returncode})")


def run_compare(args):
    out = os.path.join(args.out, "compare.json")
    mtbench("compare", "--backends", "jax,torch", *NANOGPT_CPU, "--data", args.data, "--steps", str(args.steps),
            "--out", out, "--overwrite", "--log-every", str(args.log_every))
    with open(out) as f:
        return json.load(f)


def run_reference(args, weights_file):
    out = os.path.join(args.out, "reference-torch.json")
    proc = subprocess.run([sys.executable, os.path.join(REPOSITORY, "benchmarks", "best_gpt.py"), "--backend",
                           "torch", "--preset", "char", "--dtype", "float32", *REFERENCE_SIZE, "--data", args.data,
                           "--steps", str(args.steps), "--initial-weights", weights_file, "--validate",
                           "--out", out], cwd=REPOSITORY, text=True)
    if proc.returncode != 0:
        sys.exit(f"the reference failed (exit {proc.returncode})")
    with open(out) as f:
        return json.load(f)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the text (nanoGPT's: Shakespeare, input.txt)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--log-every", type=int, default=250, help="a line of each run every N steps")
    parser.add_argument("--out", default="mtbench-results/nanogpt-cpu")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    args.data, args.out = os.path.abspath(args.data), os.path.abspath(args.out)  # the runs start in the checkout
    os.makedirs(args.out, exist_ok=True)
    combined = run_compare(args)
    reference = run_reference(args, combined["initial_weights"]["file"])
    rows = {}
    for run in combined["runs"]:
        result = run["result"]
        rows[f"mtbench {run['label']}"] = {
            "val_loss": result["metrics"]["val_loss"], "train_s": result["timing"]["train_s"],
            "step_ms": result["timing"]["step_s_median"] * 1e3, "train_step": result["train_step"],
            "device": result["env"]["device"], "versions": result["env"]["backend_versions"]}
    rows["best-by-hand torch"] = {
        "val_loss": reference["metrics"]["val_loss"], "train_s": reference["timing"]["wall_s"],
        "step_ms": reference["timing"]["step_s_median"] * 1e3, "train_step": reference["description"],
        "device": reference["env"]["device"], "versions": reference["env"]["backend_versions"]}
    print(f"nanoGPT's CPU configuration, {args.steps} steps on {args.data}")
    # Where each ran, and on what: the configuration is the CPU's, but a machine with a GPU runs it there.
    for name, row in rows.items():
        print(f"  {name}: {row['device'].get('kind')} ({row['device'].get('name')}); "
              + ", ".join(f"{package} {version}" for package, version in row["versions"].items()))
    print(f"{'run':<28} {'val loss':>9} {'train s':>8} {'step ms':>8}  step")
    for name, row in rows.items():
        print(f"{name:<28} {row['val_loss']:>9.4f} {row['train_s']:>8.1f} {row['step_ms']:>8.2f}  {row['train_step']}")
    print(json.dumps({"steps": args.steps, "data": args.data, "runs": rows}))


if __name__ == "__main__":
    main()
