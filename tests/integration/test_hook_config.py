"""Configuration the hook cannot honour never runs unlimited.

A bad value of any seed variable: one line naming it, and CUDA refuses to
start with CUDA_ERROR_INVALID_VALUE. A vGPU block that is missing, corrupt,
foreign, of another layout or size, truncated, or a symlink: one line and
CUDA_ERROR_NOT_PERMITTED. Every later call answers the same.
"""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from tests.helpers.memprobe import MEMPROBE, MiB, hooked, probe
from vgpud.vgpus.blocks import ControlBlock, DeviceSlice, UsageBlock

GPU0 = "GPU-5117a000-0000-4000-8000-000000000000"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CUDA_MEM_LIMIT", "12x"),
        ("CUDA_MEM_LIMIT", "0"),
        ("CUDA_MEM_LIMIT", "1MiB"),
        ("CUDA_MEM_LIMIT_0", "-1"),
        ("CUDA_MEM_LIMIT_99", "1g"),
        ("CUDA_CORE_LIMIT", "101"),
        ("CUDA_CORE_SOFT_LIMIT", "x"),
        ("CUDA_MEMORY_OVERSUBSCRIBE", "maybe"),
        ("GPU_DEVICES_UUID", "GPU-a,,GPU-b"),
        ("LOGGER_LEVEL", "7"),
    ],
)
def test_bad_value_refuses_cuda(sim_env: dict[str, str], name: str, value: str) -> None:
    run = probe(hooked(sim_env, **{name: value}), "meminfo")
    assert run.returncode == 1
    assert run.init["result"] == "CUDA_ERROR_INVALID_VALUE"
    lines = [line for line in run.stderr.splitlines() if "[vgpu" in line]
    assert len(lines) == 1 and name in lines[0] and "CUDA will not start" in lines[0]


def test_every_later_call_fails_too(sim_env: dict[str, str], tmp_path: Path) -> None:
    """The runtime may call on after cuInit failed: nothing gets through."""
    code = """
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
print(cu.cuInit(0), cu.cuDeviceTotalMem_v2(ctypes.byref(ctypes.c_size_t()), 0),
      cu.cuMemAlloc_v2(ctypes.byref(ctypes.c_uint64()), ctypes.c_size_t(1 << 20)))
"""
    env = hooked(sim_env, CUDA_MEM_LIMIT="lots")
    out = subprocess.run(["python3", "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["1", "1", "1"]


def test_no_configuration_is_pass_through(sim_env: dict[str, str]) -> None:
    sim_env["VGPU_SIM_MEMORY"] = "1g"
    run = probe(hooked(sim_env), "alloc:alloc:900m", "meminfo")
    assert run.ops("alloc")[0]["result"] == "CUDA_SUCCESS"
    assert run.ops("meminfo")[0]["total"] == 1 << 30
    assert "[vgpu" not in run.stderr


def make_blocks(tmp_path: Path) -> tuple[Path, Path]:
    control, usage = tmp_path / "control", tmp_path / "usage"
    ControlBlock.create(control, "cfg", [DeviceSlice(GPU0, 64 * MiB)]).close()
    UsageBlock.create(usage).close()
    return control, usage


def patch(path: Path, offset: int, fmt: str, value: int) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    path.write_bytes(bytes(data))


def corrupt(kind: str, control: Path, usage: Path, tmp_path: Path) -> dict[str, str]:
    env = {"VGPU_CONTROL": str(control), "VGPU_USAGE": str(usage)}
    if kind == "bad-magic":
        patch(control, 0, "<Q", 0x1234)
    elif kind == "foreign":
        env["VGPU_CONTROL"] = str(usage)  # a usage block where the control block goes
    elif kind == "version":
        patch(usage, 8, "<I", 99)
    elif kind == "header-size":
        patch(control, 12, "<I", 12345)
    elif kind == "truncated":
        os.truncate(usage, 4096)
    elif kind == "grown":
        with control.open("ab") as f:
            f.write(b"\0" * 64)
    elif kind == "symlink":
        link = tmp_path / "link"
        link.symlink_to(control)
        env["VGPU_CONTROL"] = str(link)
    elif kind == "missing":
        env["VGPU_USAGE"] = str(tmp_path / "nowhere")
    elif kind == "directory":
        env["VGPU_USAGE"] = str(tmp_path)
    elif kind == "control-only":
        del env["VGPU_USAGE"]
    return env


@pytest.mark.parametrize(
    "kind",
    [
        "bad-magic",
        "foreign",
        "version",
        "header-size",
        "truncated",
        "grown",
        "symlink",
        "missing",
        "directory",
        "control-only",
    ],
)
def test_bad_block_refuses_cuda(sim_env: dict[str, str], tmp_path: Path, kind: str) -> None:
    control, usage = make_blocks(tmp_path)
    run = probe(hooked(sim_env, **corrupt(kind, control, usage, tmp_path)), "meminfo")
    assert run.init["result"] == "CUDA_ERROR_NOT_PERMITTED"
    lines = [line for line in run.stderr.splitlines() if "[vgpu" in line]
    assert len(lines) == 1 and "CUDA will not start" in lines[0]


def test_intact_blocks_are_accepted(sim_env: dict[str, str], tmp_path: Path) -> None:
    control, usage = make_blocks(tmp_path)
    env = hooked(sim_env, VGPU_CONTROL=str(control), VGPU_USAGE=str(usage))
    assert probe(env, "meminfo").ops("meminfo")[0]["total"] == 64 * MiB


def test_standalone_block_refuses_a_symlink(sim_env: dict[str, str], tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    (tmp_path / "usage").symlink_to(target)
    run = probe(hooked(sim_env, CUDA_MEM_LIMIT="1g", VGPU_USAGE=str(tmp_path / "usage")))
    assert run.init["result"] == "CUDA_ERROR_NOT_PERMITTED"
    assert "symbolic link" in run.stderr


def test_standalone_block_is_created_once_private(sim_env: dict[str, str], tmp_path: Path) -> None:
    """Eight processes race to create the block: one does, all share it."""
    usage = tmp_path / "usage"
    env = hooked(sim_env, CUDA_MEM_LIMIT="64m", VGPU_USAGE=str(usage), VGPU_SIM_CTX_OVERHEAD="0")
    procs = [
        subprocess.Popen(
            [str(MEMPROBE), "alloc:alloc:8m", "meminfo"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert all('"result":"CUDA_SUCCESS"' in out for out, _ in outs)
    assert usage.stat().st_mode & 0o777 == 0o600
    with UsageBlock.open(usage) as block:
        limits = block.standalone_limits()
        assert limits.mem_limit[0] == 64 * MiB
        assert limits.uuids[0] == GPU0
        assert block.devices()[0].used == 0
