"""One version: the package's metadata is vgpud/__init__.py's, and the
changelog has an entry for it."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import vgpud

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"


def test_the_installed_package_carries_the_one_version() -> None:
    assert importlib.metadata.version("vgpud") == vgpud.__version__


def test_the_changelog_has_an_entry_for_the_version() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", CHANGELOG.read_text(), re.MULTILINE)
    assert vgpud.__version__ in headings
