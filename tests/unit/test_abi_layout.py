"""abi.py must agree with libhook/include/vgpu_abi.h byte for byte.

The C compiler is the judge: a tiny program generated from abi.py's list
of structs and fields prints gcc's offsetof/sizeof for each, and every
constant the daemon relies on; each must equal what ctypes computed.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from vgpud import units
from vgpud.vgpus import abi

ROOT = Path(__file__).resolve().parents[2]
HEADER_DIR = ROOT / "libhook" / "include"

CONSTANTS = {
    "VGPU_CONTROL_MAGIC": abi.CONTROL_MAGIC,
    "VGPU_USAGE_MAGIC": abi.USAGE_MAGIC,
    "VGPU_ABI_VERSION": abi.ABI_VERSION,
    "VGPU_MAX_DEVICES": abi.MAX_DEVICES,
    "VGPU_MAX_PROCS": abi.MAX_PROCS,
    "VGPU_UUID_LEN": abi.UUID_LEN,
    "VGPU_ID_LEN": abi.ID_LEN,
    "VGPU_PPM_FULL": units.PPM_FULL,
    "VGPU_FLAG_OVERSUBSCRIBE": abi.FLAG_OVERSUBSCRIBE,
    "VGPU_DEV_SOFT": abi.DEV_SOFT,
    "VGPU_DEV_CALIBRATED": abi.DEV_CALIBRATED,
    "VGPU_TURN_WANT": abi.TURN_WANT,
    "VGPU_SLOT_FREE": abi.SLOT_FREE,
    "VGPU_SLOT_CLAIMING": abi.SLOT_CLAIMING,
    "VGPU_SLOT_ACTIVE": abi.SLOT_ACTIVE,
    "VGPU_SLOT_RECLAIMING": abi.SLOT_RECLAIMING,
}


def python_layout() -> dict[str, int]:
    """Every sizeof/offsetof/field size that abi.py assumes."""
    out: dict[str, int] = dict(CONSTANTS)
    for struct in abi.ABI_STRUCTS:
        out[f"sizeof {struct.c_name}"] = ctypes.sizeof(struct)
        for name, ctype, *_ in struct._fields_:
            out[f"offsetof {struct.c_name}.{name}"] = getattr(struct, name).offset
            out[f"sizeof {struct.c_name}.{name}"] = ctypes.sizeof(ctype)
    return out


def c_program() -> str:
    lines = [
        "#include <stddef.h>",
        "#include <stdio.h>",
        '#include "vgpu_abi.h"',
        "int main(void) {",
    ]
    for name in CONSTANTS:
        lines.append(f'    printf("%s %llu\\n", "{name}", (unsigned long long)({name}));')
    for struct in abi.ABI_STRUCTS:
        s = f"struct {struct.c_name}"
        lines.append(f'    printf("sizeof {struct.c_name} %zu\\n", sizeof({s}));')
        for name, *_ in struct._fields_:
            key = f"{struct.c_name}.{name}"
            lines.append(f'    printf("offsetof {key} %zu\\n", offsetof({s}, {name}));')
            lines.append(f'    printf("sizeof {key} %zu\\n", sizeof((({s} *)0)->{name}));')
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def c_layout(tmp_path: Path) -> dict[str, int]:
    src = tmp_path / "abi_dump.c"
    exe = tmp_path / "abi_dump"
    src.write_text(c_program())
    subprocess.run(
        ["gcc", "-std=c11", "-Wall", "-Werror", f"-I{HEADER_DIR}", "-o", str(exe), str(src)],
        check=True,
    )
    text = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {key: int(value) for key, value in (line.rsplit(" ", 1) for line in text.splitlines())}


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_every_offset_size_and_constant_matches_the_c_header(tmp_path: Path) -> None:
    expected = c_layout(tmp_path)
    actual = python_layout()
    assert expected.keys() == actual.keys()
    mismatches = {k: (actual[k], expected[k]) for k in expected if actual[k] != expected[k]}
    assert mismatches == {}, "abi.py (python, C) disagree with vgpu_abi.h"


def test_the_header_still_declares_every_struct_blocks_py_mirrors() -> None:
    header = (HEADER_DIR / "vgpu_abi.h").read_text()
    for struct in abi.ABI_STRUCTS:
        assert f"struct {struct.c_name} {{" in header
