"""How often an A/A comparison calls a difference: --count runs of `mtbench compare --aa` on one configuration
(the baseline and its twin, the same run again, interleaved), each twin held against its baseline in tokens/s by
the rule of every verdict (`verdicts.verdict`, no noise floor: the A/A is what measures one). With 95 % intervals
that count the machine's noise, about 1 in 20 calls a difference by chance; many more means the intervals are too
narrow for this machine (too few repeats or windows, or a load that changes between runs).

    python benchmarks/aa_count.py [--count 20] [--out-dir DIR] -- COMPARE OPTIONS
    python benchmarks/aa_count.py --count 20 -- --backends torch --preset tiny --steps 40 --max-len 32 \\
        --timing-window 2 --measure-only

Everything after `--` goes to `mtbench compare` (`--aa` and `--out` are added). Prints one line per comparison and
the count; `--json FILE` also writes them.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from mtbench.runner.results import verdicts as stats


def aa_verdict(combined):
    """The Verdict of a compare JSON's A/A twin against its baseline in tokens/s (paired, as they ran
    interleaved), or None where either lacks steady windows."""
    twins = [entry["result"] for entry in combined.get("aa_runs") or []]
    if not twins:
        raise SystemExit("the compare JSON has no A/A twin: was --aa given?")
    label = combined["aa_runs"][0]["label"].removesuffix(" (A/A twin)")
    baseline = [entry["result"] for entry in combined["runs"] if entry["label"] == label]
    interval = stats.ratio_interval(stats.SPEED_FIGURE, twins, baseline, paired=True)
    return interval and stats.verdict(f"{label} (A/A twin)", label, interval)


def run_compare(compare_args, out):
    command = [sys.executable, "-m", "mtbench", "compare", "--aa", *compare_args, "--out", out, "--overwrite"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"compare failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def parse_args(argv=None):
    """This script's options, and after `--` the compare's own (`compare_args`)."""
    argv = sys.argv[1:] if argv is None else argv
    ours, compare_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20, help="A/A comparisons to run")
    parser.add_argument("--out-dir", help="where the compare JSONs go (default: a temporary directory)")
    parser.add_argument("--json", help="also write every comparison's verdict and the count here")
    args = parser.parse_args(ours)
    args.compare_args = compare_args
    return args


def main(argv=None):
    args = parse_args(argv)
    compare_args = args.compare_args
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="mtbench-aa-")
    os.makedirs(out_dir, exist_ok=True)
    found = []
    for number in range(1, args.count + 1):
        verdict = aa_verdict(run_compare(compare_args, os.path.join(out_dir, f"aa-{number}.json")))
        found.append(verdict)
        print(f"{number}/{args.count}: " + (verdict.text if verdict else "no interval (no steady windows)"),
              flush=True)
    called = sum(1 for verdict in found if verdict and verdict.called)
    print(f"{called} of {args.count} A/A comparisons called a difference in tokens/s "
          f"(mtbench compare --aa {' '.join(compare_args)})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"count": args.count, "called": called, "compare_args": compare_args,
                       "verdicts": [verdict and verdict.to_dict() for verdict in found]}, f, indent=2)
    return called


if __name__ == "__main__":
    main()
