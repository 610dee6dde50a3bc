"""benchmarks/text_tokens.py on a small text with the lines sentencepiece does not give back (runs of spaces,
characters NFKC changes): mtbench's streams and the kept one are the per-token Python's, token for token."""

import os
import subprocess
import sys

from conftest import REPOSITORY, cli_environment, json_answer

SCRIPT = os.path.join(REPOSITORY, "benchmarks", "text_tokens.py")


def test_each_stream_gives_the_tokens_and_bytes_of_the_per_token_python(tmp_path):
    text = tmp_path / "text.txt"
    lines = ["In the beginning God created the heavens and the earth.", "", "  Two  spaces ",
             "pleine\u3000largeur \uff21", "tab\there", "\u00e9t\u00e9 \u2603"]
    text.write_text("\n".join(lines * 40), encoding="utf-8")
    proc = subprocess.run([sys.executable, SCRIPT, "--data", str(text), "--vocab-size", "60", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300, env=cli_environment())
    summary = json_answer(proc)
    assert summary["char"]["same_tokens"] is True and summary["char"]["tokens"] == len("\n".join(lines * 40))
    assert summary["char"]["kept_s_per_mb"] is None  # as fast as reading it: not kept
    assert summary["sentencepiece"]["same_tokens"] is True and summary["sentencepiece"]["kept_s_per_mb"] > 0
