"""Every relative link in the README, the changelog and docs/ leads to a file
that exists: moving a report into docs/benchmarks/archive/ (or renaming any
file) must take its links along."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
# [text](target) with no space in the target; a target with a scheme
# (https:, mailto:) or only an anchor is not a file of ours.
LINK = re.compile(r"\]\(([^)\s]+)\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:|^#")
# Code (fenced blocks, `spans`) is not Markdown: a regex there is no link.
CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.DOTALL | re.MULTILINE)


def relative_links(doc: Path) -> list[str]:
    text = CODE.sub("", doc.read_text())
    return [t for t in LINK.findall(text) if not EXTERNAL.match(t)]


def test_the_docs_have_links_to_check() -> None:
    assert sum(len(relative_links(doc)) for doc in DOCS) > 50


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_that_exists(doc: Path) -> None:
    broken = [t for t in relative_links(doc) if not (doc.parent / t.split("#")[0]).exists()]
    assert broken == [], f"{doc.relative_to(ROOT)}: links to missing files"
