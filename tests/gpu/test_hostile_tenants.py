"""Hostile tenants on the real driver: what tests/redteam shows on the
simulator, checked where NVML is the driver's own.

- A process in a vGPU's container (its blocks bind-mounted, as CDI does)
  that strips the hook and allocates past the limit is charged to the vGPU
  by NVML and killed by the backstop.
- A process that allocated, forked and exited: the driver keeps listing the
  memory under the dead pid while the child holds it; it stays charged.

Needs root (mount namespaces) and the node's Python with vgpud's
dependencies (as tests/gpu/campaign.sh runs the daemon).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.hook import FakeVgpu
from tests.gpu.conftest import GiB

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)

# Allocates through the real driver with no hook, then holds the memory.
ALLOC = """
import ctypes, os, sys, time
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
assert cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(sys.argv[1]))) == 0
if sys.argv[2] == "fork" and os.fork() == 0:
    sys.stdin.close()
    time.sleep(600)  # the child: keeps the driver's descriptors, makes no CUDA call
print("allocated", flush=True)
sys.stdin.readline()  # exits when told to (the fork case: the child lives on)
"""


def gpu_uuid() -> str:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


@pytest.fixture
def vgpu(tmp_path: Path) -> Iterator[FakeVgpu]:
    v = FakeVgpu(tmp_path / "v1", "v1", (GiB,), uuids=(gpu_uuid(),))
    yield v
    v.close()


def in_container(vgpu: FakeVgpu, tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    """ALLOC of 2 GiB in a mount namespace with the vGPU's blocks mounted."""
    target = tmp_path / "control"
    target.touch()
    script = f'mount --bind {vgpu.control.path} {target} && exec "$PY" -c "$ALLOC" {2 * GiB} {mode}'
    env = dict(os.environ, PY=sys.executable, ALLOC=ALLOC)
    env.pop("LD_PRELOAD", None)
    p = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "allocated"
    return p


class Scanner:
    """The daemon's tracking part on the real NVML: scan, then backstop."""

    def __init__(self, vgpu: FakeVgpu, action: str) -> None:
        from vgpud.observe.nvml import open_nvml
        from vgpud.observe.tracker import Tracker
        from vgpud.policy.backstop import BackstopPolicy, BackstopState

        self.vgpu = vgpu
        self.loop = asyncio.new_event_loop()
        self.gw = self.loop.run_until_complete(open_nvml(None))
        self.tracker, self.state = Tracker(), BackstopState()
        self.policy = BackstopPolicy(action, tolerance=64 << 20, confirm_scans=2)

    def scan(self) -> tuple[Any, list[Any]]:
        from vgpud.loops.repairs import check

        snap = self.tracker.scan(
            {"v1": self.vgpu.blocks}, self.loop.run_until_complete(self.gw.sample())
        )
        events, self.state = check(snap, self.policy, self.state)
        return snap, events

    def close(self) -> None:
        self.loop.run_until_complete(self.gw.close())
        self.loop.close()


def test_a_bypass_in_a_vgpu_container_is_charged_and_killed(vgpu: FakeVgpu, tmp_path: Path) -> None:
    bypass = in_container(vgpu, tmp_path, "stay")
    scanner = Scanner(vgpu, "kill")
    try:
        first, events = scanner.scan()
        assert first.processes[bypass.pid].vgpu_id == "v1"
        assert [(e.kind, e.pid) for e in events] == [("over_limit", bypass.pid)]
        _, second = scanner.scan()
        assert [(e.kind, e.pid) for e in second] == [("killed", bypass.pid)]
        assert bypass.wait(timeout=30) == -signal.SIGKILL
    finally:
        scanner.close()
        bypass.kill()
        bypass.wait()


def test_memory_a_fork_child_holds_stays_charged(vgpu: FakeVgpu, tmp_path: Path) -> None:
    parent = in_container(vgpu, tmp_path, "fork")
    scanner = Scanner(vgpu, "report")
    try:
        first, _ = scanner.scan()
        assert first.processes[parent.pid].vgpu_id == "v1"
        assert parent.stdin is not None
        parent.stdin.write("exit\n")
        parent.stdin.flush()
        assert parent.wait(timeout=30) == 0
        time.sleep(1)  # NVML's lists follow within its sample period
        snap, _ = scanner.scan()
        gpu = next(iter(snap.vgpus["v1"].gpus.values()))
        # Driver 580 lists the memory under the dead parent's pid
        # (docs/gpu/driver-facts.md).
        assert snap.processes[parent.pid].kind == "exited"
        assert gpu.nvml_used >= 2 * GiB
    finally:
        scanner.close()
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and _runs_alloc(int(p))]:
            os.kill(pid, signal.SIGKILL)


def _runs_alloc(pid: int) -> bool:
    try:
        return b"cuMemAlloc_v2" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
