"""docs/layout.md's import rule: a module of the daemon imports only from its own
stage and the ones below it (base < vgpus < observe < policy < surface <
loops < daemon)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

ORDER = ["base", "vgpus", "observe", "policy", "surface", "loops", "daemon"]
BASE = {"config", "errors", "log", "libpaths", "systemd", "threadname", "units"}


def stage(module: str) -> str | None:
    """The stage of a dotted vgpud module; None outside the daemon's stages."""
    parts = module.split(".")
    if parts[0] != "vgpud":
        return None
    if len(parts) == 1 or parts[1] in BASE or parts[1] == "__init__":
        return "base"
    if parts[1] == "daemon":
        return "daemon"
    return parts[1] if parts[1] in ORDER else None


def imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


MODULES = sorted((ROOT / "vgpud").rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_imports_no_stage_above_its_own(path: Path) -> None:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    own = stage(name)
    if own is None:
        return
    above = [
        m
        for m in imports(path)
        if (s := stage(m)) is not None and ORDER.index(s) > ORDER.index(own)
    ]
    assert above == [], f"{name} ({own}) imports above its stage"
