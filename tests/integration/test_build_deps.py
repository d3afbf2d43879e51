"""The Makefile rebuilds what a change touches: a C test that includes a
hook source is rebuilt when that source changes, and a library when a
header its objects include changes (dependency files, -MMD -MP). Built in a
copy of the tree, so the checkout's build/ is left alone."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copytree(ROOT / "libhook", tmp_path / "libhook")
    return tmp_path


def make(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(tree), *args], capture_output=True, text=True, timeout=300
    )


def touch_after(path: Path, built: Path) -> None:
    """``path`` changed after ``built`` was made (whatever the file system's
    time grain)."""
    later = built.stat().st_mtime + 2
    os.utime(path, (later, later))


@pytest.mark.parametrize(
    ("target", "changed"),
    [
        ("build/tests/test_pacer", "libhook/src/pacer.c"),  # included by the test
        ("build/libvgpu-atomics.so", "libhook/include/vgpu_abi.h"),  # included by its objects
    ],
)
def test_a_change_rebuilds_what_included_it(tree: Path, target: str, changed: str) -> None:
    built = make(tree, target)
    assert built.returncode == 0, built.stderr
    assert make(tree, "-q", target).returncode == 0  # up to date
    touch_after(tree / changed, tree / target)
    assert make(tree, "-q", target).returncode == 1, f"{target} not rebuilt after {changed}"
