"""Red team: a local user's standalone block on a FUSE filesystem of its own.

The daemon opens a standalone block through /proc/<pid>/map_files and
reads it (docs/security.md, "Bounded reads"). On FUSE every open of the
file and every read of a page not cached waits for the user's own server:
one that never answers held the scan, and with it every vGPU's reaping,
backstop and steering on the node.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BUILD
from tests.fixtures.fuse import HeldFuse
from tests.fixtures.hook import GPU_UUIDS, FakeHook
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.tracker import ProcessKind, Tracker, TrackSnapshot
from vgpud.vgpus.blocks import UsageBlock

GIB = 1 << 30
GPU0 = GPU_UUIDS[0]

MAPPER = """
import mmap, os, sys, time
writable = sys.argv[2] == "rw"
fd = os.open(sys.argv[1], os.O_RDWR if writable else os.O_RDONLY)
prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
kept = mmap.mmap(fd, 0, mmap.MAP_SHARED, prot)
print("mapped", flush=True)
time.sleep(600)
"""


def nvml(processes: dict[int, int]) -> NvmlSample:
    gpu = GpuSample(GPU0, 0, 0, sum(processes.values()), 80 * GIB, processes, {})
    return NvmlSample(monotonic=0.0, gpus={GPU0: gpu})


def _fds_naming(path: Path) -> list[str]:
    """The daemon's (this process's) fds open on ``path``."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                fds.append(fd)
        except OSError:
            pass  # closed meanwhile
    return fds


@pytest.fixture
def fuse_block(tmp_path: Path) -> Iterator[HeldFuse]:
    """A standalone block as the hook makes it, one slot in use, served by FUSE."""
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        pytest.skip("no /dev/fuse to mount with")
    image = tmp_path / "image"
    UsageBlock.create(image, device_count=1).close()
    hook = FakeHook(image)
    hook.standalone([GPU0], [GIB])
    hook.claim(0, pid=1, pidns=1, start_time=1)
    hook.close()
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    fuse = HeldFuse(mountpoint, image.read_bytes())
    yield fuse
    fuse.close()


@pytest.fixture
def overlay(fuse_block: HeldFuse, tmp_path: Path) -> Iterator[Path]:
    """An overlay whose lower layer is the FUSE mount (a rootless
    container's root may be so): opening a lower file for writing copies
    it up, reading it whole from FUSE inside the open."""
    for name in ("upper", "work", "merged"):
        (tmp_path / name).mkdir()
    layers = f"lowerdir={fuse_block.mountpoint},upperdir={tmp_path}/upper,workdir={tmp_path}/work"
    merged = tmp_path / "merged"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", layers, str(merged)], check=True)
    yield merged / fuse_block.path.name
    subprocess.run(["umount", "-l", str(merged)], check=True)


@pytest.mark.root
@pytest.mark.parametrize("held", ["open", "read", "copy-up"])
def test_a_standalone_block_whose_filesystem_never_answers_does_not_hold_the_scan(
    fuse_block: HeldFuse, request: pytest.FixtureRequest, held: str
) -> None:
    """A hooked process maps its standalone block from its own FUSE mount,
    whose server then holds back the daemon's open of it (``open``), its
    reads (``read``), or, under an overlay, the copy-up inside the open
    (``copy-up``). The scan goes on past it; the block is not adopted (its
    pages would be the server's to answer at every later read), the
    process is charged where the host puts it and not tried again, and an
    open that comes back after all leaves no fd behind."""
    path = request.getfixturevalue("overlay") if held == "copy-up" else fuse_block.path
    env = dict(os.environ, LD_PRELOAD=str(BUILD / "libvgpu-atomics.so"), CUDA_MEM_LIMIT="1g")
    p = subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(path), "ro" if held == "copy-up" else "rw"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    tracker = Tracker(sees_all_pids=True)
    tracker.procfs._memory_reads.wait_s = 0.2
    try:
        assert p.stdout is not None and p.stdout.readline() == "mapped\n"
        fuse_block.hold("open" if held == "open" else "read")
        snaps: list[TrackSnapshot] = []
        scan = threading.Thread(
            target=lambda: snaps.append(tracker.scan({}, nvml({p.pid: GIB}))),
            daemon=True,  # were the scan to hang, the test fails rather than pytest
        )
        scan.start()
        scan.join(timeout=10)
        assert not scan.is_alive() and snaps, "the scan waited for the tenant's FUSE server"
        assert not snaps[0].standalone
        assert snaps[0].processes[p.pid].kind is ProcessKind.HOOKED
        if held != "read":
            assert fuse_block.held()  # the daemon did try, and was held
            held_read = tracker.procfs._memory_reads._stuck
            assert held_read is not None
            fuse_block.release()  # the open returns after all
            assert held_read.done.wait(10)
        if held == "open":  # a server that answers late and holds the next open
            fuse_block.hold("open")  # would cost every scan the wait: not tried again
        snap = tracker.scan({}, nvml({p.pid: GIB}))
        assert not snap.standalone and snap.processes[p.pid].kind is ProcessKind.HOOKED
        stuck = tracker.procfs._memory_reads._stuck
        assert stuck is None or stuck.done.is_set()
        fuse_block.release()
        deadline = time.monotonic() + 5  # a late fd is closed by the reading thread
        while _fds_naming(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _fds_naming(path)
    finally:
        fuse_block.close()  # fails whatever is held: a hung scan ends
        tracker.close()
        p.kill()
        p.wait()
