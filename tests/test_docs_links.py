"""Every link of the README and docs/ to a heading lands on one: anchors as GitHub makes them from headings."""

import os
import re

import pytest

from conftest import REPOSITORY, load_docs_script

DOCUMENTS = ["README.md", *(os.path.join("docs", name) for name in sorted(os.listdir(os.path.join(REPOSITORY, "docs")))
                            if name.endswith(".md"))]
LINK = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


github_anchor = load_docs_script("marked_block.py").github_anchor  # the docs scripts' own, which link by it


def anchors(path):
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    seen, found = {}, set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        anchor = github_anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def test_github_anchors_are_made_as_github_makes_them():
    assert github_anchor("Compilation caches (`--no-compile-cache`)") == "compilation-caches---no-compile-cache"
    assert github_anchor("`run_dir` and `checkpoint`") == "run_dir-and-checkpoint"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_link_to_a_heading_resolves(document):
    path = os.path.join(REPOSITORY, document)
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    broken = []
    for target, anchor in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        linked = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        if not os.path.isfile(linked) or anchor not in anchors(linked):
            broken.append(f"{target}#{anchor}")
    assert broken == []
