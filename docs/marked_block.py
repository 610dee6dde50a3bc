"""What the docs scripts share: a block of a hand-written document, between two marker lines, rewritten from what
the code knows, a `--check` that fails where the block and the code differ, and GitHub's anchors of headings."""

import re
import sys


def github_anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def rewrite(text, begin, end, rendered, path):
    """`text` with the lines between the markers `begin` and `end` replaced by `rendered` (markers included)."""
    if begin not in text or end not in text:
        raise ValueError(f"{path} lacks the markers of its generated block")
    before, rest = text.split(begin, 1)
    return before + rendered + rest.split(end, 1)[1]


def main(argv, path, begin, end, render, command):
    """Rewrites the block of `path` from `render(the file's text)`; with --check, returns 1 (and says to run
    `command`) where the file holds another block, without writing."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    wanted = rewrite(text, begin, end, render(text), path)
    if "--check" in argv:
        if text != wanted:
            print(f"{path}'s generated block is out of date: run {command}", file=sys.stderr)
            return 1
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(wanted)
    return 0
