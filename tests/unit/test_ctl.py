"""vgpuctl's pieces without a daemon: the client's messages, the ELF reader,
the doctor's judgement, argument handling."""

from __future__ import annotations

import errno
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from vgpud.ctl.client import Client, DaemonUnreachable
from vgpud.ctl.doctor import find_driver, risky, unhooked
from vgpud.ctl.elf import ElfError, exported_functions
from vgpud.ctl.main import command_env, limits_body, parser
from vgpud.ctl.table import process_rows, render
from vgpud.terminal import shown

ROOT = Path(__file__).resolve().parents[2]
ATOMICS = ROOT / "build" / "libvgpu-atomics.so"


def refuse_with(monkeypatch: pytest.MonkeyPatch, err: OSError) -> None:
    def connect(self: socket.socket, address: object) -> None:
        raise err

    monkeypatch.setattr("vgpud.ctl.client.socket.socket.connect", connect)


def test_permission_denied_names_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_with(monkeypatch, PermissionError(errno.EACCES, "Permission denied"))
    with pytest.raises(DaemonUnreachable) as err:
        Client("/run/vgpud.sock").get("/v1/health")
    assert (
        str(err.value) == "permission denied on /run/vgpud.sock: you need root or the 'vgpud' group"
    )


@pytest.mark.parametrize("code", [errno.ENOENT, errno.ECONNREFUSED])
def test_daemon_down(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    refuse_with(monkeypatch, OSError(code, "x"))
    with pytest.raises(DaemonUnreachable, match="vgpud is not running: cannot connect to /s"):
        Client("/s").get("/v1/health")


@pytest.mark.skipif(shutil.which("nm") is None or not ATOMICS.exists(), reason="needs nm and make")
def test_elf_reader_agrees_with_nm() -> None:
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(ATOMICS)], capture_output=True, text=True, check=True
    )
    expected = {line.split()[2] for line in nm.stdout.splitlines() if line.split()[1] in ("T", "W")}
    assert exported_functions(ATOMICS) == expected
    assert "vgpu_atomic_cas_u64" in expected


def test_elf_reader_refuses_what_is_not_elf(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"#!/bin/sh\n")
    with pytest.raises(ElfError, match="not an ELF file"):
        exported_functions(tmp_path / "x")


def test_doctor_flags_unhooked_allocation_and_launch_paths() -> None:
    driver = {
        "cuMemAlloc_v2",
        "cuMemCreate",
        "cuLaunchKernel",
        "cuMemGetInfo_v2",
        "cuMemHostAlloc",
        "cuIpcOpenMemHandle_v2",
        "nvmlInit",
    }
    hook = {"cuMemAlloc_v2"}
    gaps = unhooked(driver, hook)
    assert gaps.risky == ["cuLaunchKernel", "cuMemCreate"]
    assert [name for name, _ in gaps.by_design] == ["cuIpcOpenMemHandle_v2"]
    assert gaps.others == ["cuMemGetInfo_v2", "cuMemHostAlloc"]
    assert not risky("cuMemGetAllocationGranularity")


# What driver 580.159.04 on an H200 exports that looks like allocating or
# launching and the hook leaves alone (vgpuctl doctor there, 2026-11-21):
# every one was reviewed (docs/gpu/driver-facts.md), so none is a problem.
DRIVER_580_PASS_THROUGH = [
    "cuGraphAddKernelNode",
    "cuGraphAddKernelNode_v2",
    "cuGraphAddMemcpyNode",
    "cuGraphAddMemsetNode",
    "cuImportExternalMemory",
    "cuImportExternalSemaphore",
    "cuIpcOpenEventHandle",
    "cuIpcOpenMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuMemImportFromShareableHandle",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolImportPointer",
]


def test_doctor_flags_every_road_the_memory_hook_relies_on() -> None:
    """Issue 10: the generic node adders, context limits, VMM and sparse-array
    mappings, pools and instantiation are roads around the limits if the hook
    misses them; the teardown it accounts must be seen too."""
    roads = [
        "cuCtxSetLimit",
        "cuGraphAddNode",
        "cuGraphAddNode_v2",
        "cuGraphInstantiateWithParams_ptsz",
        "cuMemMap",
        "cuMemMapArrayAsync",
        "cuMemPoolCreate",
        "cuMemRetainAllocationHandle",
        "cuMemUnmap",
        "cuMemAddressFree",
        "cuGraphDestroy",
    ]
    assert unhooked(set(roads), set()).risky == sorted(roads)
    assert unhooked(set(roads), set(roads)).risky == []


def test_doctor_knows_the_reviewed_pass_throughs_of_driver_580() -> None:
    gaps = unhooked(set(DRIVER_580_PASS_THROUGH) | {"cuMemAllocFancy"}, set())
    assert gaps.risky == ["cuMemAllocFancy"]  # an unknown one is still flagged
    assert len(gaps.by_design) == len(DRIVER_580_PASS_THROUGH)


def test_create_arguments_become_the_api_body() -> None:
    args = parser().parse_args(
        [
            "create",
            "--memory",
            "1073741824",
            "--share",
            "30",
            "--gpus",
            "0,GPU-x",
            "--label",
            "a=b",
            "--exclusive",
        ]
    )
    assert limits_body(args, creating=True) == {
        "memory": 1073741824,
        "share": 30,
        "gpus": [0, "GPU-x"],
        "exclusive": True,
        "labels": {"a": "b"},
    }
    update = parser().parse_args(["update", "x", "--memory", "2g"])
    assert limits_body(update, creating=False) == {"memory": "2g"}


@pytest.mark.parametrize(
    ("flag", "user"), [("1000", {"uid": 1000}), ("1000:2000", {"uid": 1000, "gid": 2000})]
)
def test_create_user_becomes_the_api_user(flag: str, user: dict[str, int]) -> None:
    args = parser().parse_args(["create", "--user", flag])
    assert limits_body(args, creating=True)["user"] == user


@pytest.mark.parametrize("flag", ["", "x", "1000:", ":1000", "-1", "1000:g", "\u0661"])
def test_a_malformed_user_is_bad_usage(flag: str) -> None:
    with pytest.raises(SystemExit) as exc:
        parser().parse_args(["create", "--user", flag])
    assert exc.value.code == 2


def test_non_ascii_digits_go_to_the_daemon_as_text() -> None:
    args = parser().parse_args(["create", "--memory", "\u0661\u0662\u0663m", "--gpus", "\u0660"])
    assert limits_body(args, creating=True)["memory"] == "\u0661\u0662\u0663m"
    assert limits_body(args, creating=True)["gpus"] == ["\u0660"]


def test_run_puts_the_recipes_libraries_first_and_keeps_the_callers() -> None:
    env = command_env(
        {"LD_LIBRARY_PATH": "/opt/lib", "LD_PRELOAD": "/x.so", "HOME": "/h"},
        {"LD_LIBRARY_PATH": "/b/sim", "LD_PRELOAD": "/libvgpu.so", "VGPU_ID": "vg-1"},
    )
    assert env == {
        "LD_LIBRARY_PATH": "/b/sim:/opt/lib",
        "LD_PRELOAD": "/libvgpu.so:/x.so",
        "HOME": "/h",
        "VGPU_ID": "vg-1",
    }
    assert command_env({}, {"LD_PRELOAD": "/libvgpu.so"}) == {"LD_PRELOAD": "/libvgpu.so"}


def test_doctor_finds_the_driver_on_the_library_path_first(tmp_path: Path) -> None:
    (tmp_path / "libcuda.so.1").write_bytes(b"")
    found = find_driver(None, False, {"LD_LIBRARY_PATH": f"/nowhere::{tmp_path}"})
    assert found == tmp_path / "libcuda.so.1"


def test_doctor_on_a_simulated_daemon_compares_the_simulator() -> None:
    found = find_driver(None, True, {})
    assert found == ROOT / "build" / "sim" / "libcuda.so.1"
    assert find_driver("/given/libcuda.so.1", True, {}) == Path("/given/libcuda.so.1")


def test_process_rows_prefer_the_hooks_word_and_sum_the_gpus() -> None:
    hooked = {
        "host_pid": 42,
        "container_pid": 7,
        "kind": "vgpu",
        "comm": "python",
        "memory": {"GPU-a": 3 << 30},
        "hooked": {"GPU-a": 1 << 30, "GPU-b": 1 << 30},
        "utilization": {"GPU-a": 12.4},
    }
    unhooked_process = {**hooked, "host_pid": 9, "hooked": {}, "utilization": {}}
    assert process_rows([hooked, unhooked_process]) == [
        [9, 7, "vgpu", "python", "3.0GiB", None],
        [42, 7, "vgpu", "python", "2.0GiB", "12"],
    ]


def test_text_from_the_daemon_is_shown_without_control_characters() -> None:
    row = process_rows(
        [
            {
                "host_pid": 1,
                "container_pid": 1,
                "kind": "vgpu",
                "comm": "a\x1b]0;b\x07\nc\u202e",
                "memory": {},
                "hooked": {},
                "utilization": {},
            }
        ]
    )
    assert render(["COMMAND"], [[row[0][3]]]).splitlines()[1] == "a\\x1b]0;b\\x07\\nc\\u202e"
    assert shown("plain text, ünïcode") == "plain text, ünïcode"
