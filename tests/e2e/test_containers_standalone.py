"""The seed's docker example, env only: a container with LD_PRELOAD and the
seed's limit variables, no vGPU block, only the library mounted. Its limits
hold across all its processes, vgpud adopts and steers it, and the daemon
never follows a path the container controls."""

from __future__ import annotations

import ctypes
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BUILD
from tests.e2e.harness import Vgpud
from tests.e2e.podman import Podman
from tests.integration.daemon_harness import wait_for
from vgpud.vgpus.abi import SteerC, UsageC
from vgpud.vgpus.blocks import UsageBlock

MIB = 2**20
LIBRARY = "/usr/lib/vgpud/libvgpu.so"
BLOCK = "/tmp/vgpud-0.usage"  # the hook's standalone block for uid 0
SEED_ENV = {"LD_PRELOAD": LIBRARY, "CUDA_MEM_LIMIT_0": "512m", "CUDA_CORE_LIMIT": "30"}
HEARTBEAT_OFFSET = UsageC.steer.offset + SteerC.heartbeat_ns.offset


@pytest.fixture
def seed_run(sim_state: dict[str, str], sim_volumes: list[str]) -> dict[str, object]:
    """`podman run` arguments of the seed's example: env, library, sim."""
    return {
        "env": {**SEED_ENV, **sim_state},
        "volumes": [*sim_volumes, f"{BUILD / 'libvgpu.so'}:{LIBRARY}:ro"],
    }


def adopted(vgpud: Vgpud, host_pid: int) -> dict[str, object] | None:
    return next(
        (
            p
            for p in vgpud.get("/v1/processes")
            if p["host_pid"] == host_pid and p["kind"] == "standalone"
        ),
        None,
    )


def mapped_block(host_pid: int) -> str:
    """Where the usage block the process maps is reached as the daemon
    reaches it: /proc/<pid>/map_files, never a path in the container."""
    for line in Path(f"/proc/{host_pid}/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and re.search(r"vgpud-\d+\.usage", fields[5]):
            return f"/proc/{host_pid}/map_files/{fields[0]}"
    raise AssertionError(f"pid {host_pid} maps no standalone usage block")


def steer_heartbeat(fd: int) -> int:
    value: int = struct.unpack("<Q", os.pread(fd, 8, HEARTBEAT_OFFSET))[0]
    return value


def test_env_only_limits_hold_across_the_container_and_vgpud_adopts_it(
    vgpud: Vgpud, podman: Podman, seed_run: dict[str, object]
) -> None:
    podman.start("seed", ["vgpu-burn", "--alloc", "300m", "--hold", "--seconds", "120"], **seed_run)
    host_pid = podman.host_pid("seed")

    process = wait_for(lambda: adopted(vgpud, host_pid), what="vgpud to adopt the container")
    assert process["container_pid"] == 1
    assert process["container"]["id"] == podman.container_id("seed")
    vgpu_id = str(process["vgpu"])
    assert vgpu_id.startswith("sa-")

    # A second process in the same container draws on the same 512 MiB.
    second = podman.exec("seed", ["vgpu-burn", "--alloc", "300m", "--seconds", "0"])
    assert second.returncode == 3, second.stdout + second.stderr
    assert "CUDA_ERROR_OUT_OF_MEMORY" in second.stdout + second.stderr
    fits = podman.exec("seed", ["vgpu-burn", "--alloc", "100m", "--seconds", "0"])
    assert fits.returncode == 0, fits.stdout + fits.stderr

    # In the metrics with the environment's limits, and steered: the daemon
    # writes a quota no higher than CUDA_CORE_LIMIT, and its heartbeat.
    def series(name: str) -> float | None:
        found = re.search(
            rf'^{name}\{{gpu="0",[^}}]*vgpu="{vgpu_id}"\}} (\S+)$', vgpud.get("/metrics"), re.M
        )
        return float(found.group(1)) if found else None

    assert series("vgpud_vgpu_memory_limit_bytes") == 512 * MIB
    # In the API too, read-only, with the environment's limits.
    listed = {v["id"]: v for v in vgpud.get("/v1/vgpus")}
    gpu = listed[vgpu_id]["gpus"][0]
    assert (listed[vgpu_id]["kind"], gpu["memory_limit"], gpu["share"]) == (
        "standalone",
        512 * MIB,
        30,
    )
    wait_for(lambda: series("vgpud_vgpu_processes") == 1, what="one process in the metrics")
    quota = wait_for(lambda: series("vgpud_vgpu_quota_ratio"), what="a steer quota")
    assert 0 < quota <= 0.30
    fd = os.open(mapped_block(host_pid), os.O_RDWR)
    try:
        beat = steer_heartbeat(fd)
        wait_for(lambda: steer_heartbeat(fd) > beat, what="the steer heartbeat to advance")
        block = UsageBlock.open_fd(fd, "seed", device_count=None)
        try:
            assert block.read_steer(0).quota_ppm <= 300_000
        finally:
            block.close()
    finally:
        os.close(fd)


class _Inotify:
    """Every open, read or write of one file, seen by the kernel."""

    IN_ACCESS, IN_MODIFY, IN_ATTRIB, IN_OPEN = 0x1, 0x2, 0x4, 0x20

    def __init__(self, path: Path) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        mask = self.IN_ACCESS | self.IN_MODIFY | self.IN_ATTRIB | self.IN_OPEN
        if self.fd < 0 or self.libc.inotify_add_watch(self.fd, bytes(path), mask) < 0:
            raise OSError(ctypes.get_errno(), "inotify")

    def events(self) -> int:
        try:
            return len(os.read(self.fd, 65536))
        except BlockingIOError:
            return 0

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def decoy(tmp_path: Path) -> Iterator[tuple[Path, _Inotify]]:
    """A host file that looks like a standalone block: what a planted
    symlink would point a careless daemon at."""
    path = tmp_path / "decoy.usage"
    UsageBlock.create(path, device_count=1).close()
    watch = _Inotify(path)
    yield path, watch
    watch.close()


def test_the_daemon_never_follows_a_symlink_the_container_plants(
    vgpud: Vgpud,
    podman: Podman,
    seed_run: dict[str, object],
    decoy: tuple[Path, _Inotify],
) -> None:
    path, watch = decoy
    before = path.read_bytes()
    watch.events()  # our own read, just now

    # One container swaps its block for a symlink after mapping it ...
    podman.start("swap", ["vgpu-burn", "--alloc", "64m", "--hold", "--seconds", "120"], **seed_run)
    host_pid = podman.host_pid("swap")
    wait_for(lambda: adopted(vgpud, host_pid), what="vgpud to adopt the container")
    block = mapped_block(host_pid)
    swapped = podman.exec("swap", ["sh", "-c", f"mv {BLOCK} /tmp/moved && ln -s {path} {BLOCK}"])
    assert swapped.returncode == 0, swapped.stderr
    # ... another plants it before its first CUDA call: the hook refuses it.
    planted = podman.run(
        ["sh", "-c", f"ln -s {path} {BLOCK} && vgpu-burn --alloc 64m --seconds 0"], **seed_run
    )
    assert planted.returncode != 0
    assert "CUDA_ERROR_NOT_PERMITTED" in planted.stdout + planted.stderr

    # The daemon keeps steering the block the process really maps ...
    fd = os.open(block, os.O_RDONLY)
    try:
        for _ in range(3):
            beat = steer_heartbeat(fd)
            wait_for(lambda b=beat: steer_heartbeat(fd) > b, what="the steer heartbeat to advance")
    finally:
        os.close(fd)
    assert adopted(vgpud, host_pid) is not None
    # ... and never opened, read or wrote the symlink's target.
    assert watch.events() == 0
    assert path.read_bytes() == before
