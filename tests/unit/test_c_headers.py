"""Every C header under libhook/ follows one convention (docs/hook.md,
"Headers"): an opening comment that starts with its own name, a VGPU_*_H
include guard named after the file around the whole of it, and it compiles
on its own with the project's warnings."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBHOOK = ROOT / "libhook"
HEADERS = sorted(LIBHOOK.rglob("*.h"))
# The Makefile's WARN, its preprocessor flags and every header directory.
CFLAGS = [
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wshadow",
    "-Wformat=2",
    "-Wstrict-prototypes",
    "-Wmissing-prototypes",
    "-D_GNU_SOURCE",
    '-DVGPU_VERSION="0"',
    *sorted({f"-I{h.parent}" for h in HEADERS}),
]


def guard_name(header: Path) -> str:
    name = header.stem.upper().removeprefix("VGPU_")
    name = "" if name == "VGPU" else f"{name}_"
    test = "TEST_" if header.parent.name == "tests" else ""
    return f"VGPU_{test}{name}H"


def rel(header: Path) -> str:
    return str(header.relative_to(ROOT))


def test_there_are_headers_to_check() -> None:
    assert len(HEADERS) >= 10 and LIBHOOK / "include" / "vgpu_abi.h" in HEADERS


@pytest.mark.parametrize("header", HEADERS, ids=rel)
def test_a_header_opens_with_its_own_name_and_what_it_is(header: Path) -> None:
    first, second = header.read_text().splitlines()[:2]
    assert first == "/*"
    assert re.fullmatch(rf" \* {re.escape(header.name)} - \S.*", second), second


@pytest.mark.parametrize("header", HEADERS, ids=rel)
def test_a_header_is_guarded_whole_by_its_own_vgpu_guard(header: Path) -> None:
    lines = [line for line in header.read_text().splitlines() if line.strip()]
    directives = [line for line in lines if line.startswith("#")]
    guard = guard_name(header)
    assert directives[:2] == [f"#ifndef {guard}", f"#define {guard}"], directives[:2]
    assert lines[-1] == "#endif"
    # Only the opening comment comes before the guard.
    before = lines[: lines.index(f"#ifndef {guard}")]
    assert before[0] == "/*" and before[-1] == " */"
    assert "#pragma once" not in header.read_text()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("header", HEADERS, ids=rel)
def test_a_header_compiles_on_its_own(header: Path) -> None:
    done = subprocess.run(
        ["gcc", *CFLAGS, "-fsyntax-only", "-x", "c", str(header)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
