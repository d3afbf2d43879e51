"""The tracker, reaper and backstop on real processes: real PID namespaces
(unshare), real PID reuse (ns_last_pid), real cgroups, a real standalone
block reached through /proc/<pid>/map_files. Needs root; skips otherwise."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BUILD, ROOT
from tests.fixtures.cgroup import Cgroup
from tests.fixtures.hook import GPU_UUIDS, FakeHook, FakeVgpu
from vgpud.loops.repairs import check, reap
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.procfs import ProcFS
from vgpud.observe.tracker import USAGE_MAPPING_SIZE, ProcessKind, Tracker
from vgpud.policy.backstop import BackstopPolicy, BackstopState
from vgpud.policy.reaper import ReaperState
from vgpud.vgpus.blocks import UsageBlock

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (namespaces, cgroups, map_files)"),
]

GIB = 1 << 30
GPU0 = GPU_UUIDS[0]
HOST_PIDNS = os.stat("/proc/self/ns/pid").st_ino

# Claims a slot for itself in a usage block, as the hook would, says so, and
# holds it until its stdin closes (or it is killed).
HOLDER = """
import sys
from tests.fixtures.hook import FakeHook
hook = FakeHook(sys.argv[1])
hook.claim_self(int(sys.argv[2]), {0: int(sys.argv[3])})
print("claimed", flush=True)
sys.stdin.read()
"""

# PID 1 of a fresh namespace: runs a holder, kills it, rewinds the namespace's
# pid counter so that the next holder gets the same pid, and reports both.
REUSE_DRIVER = """
import subprocess, sys
usage, code = sys.argv[1], sys.argv[2]
def holder(slot):
    p = subprocess.Popen([sys.executable, "-c", code, usage, str(slot), str(1 << 30)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"claimed"
    return p
first = holder(0)
first.kill()
first.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(first.pid - 1))
second = holder(1)
print(first.pid, second.pid, flush=True)
sys.stdin.read()
"""


def python(*args: str, unshare: bool = False) -> list[str]:
    cmd = [sys.executable, *args]
    return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *cmd] if unshare else cmd


def spawn(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    base = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env or base
    )


def stop(p: subprocess.Popen[str]) -> None:
    p.kill()
    p.wait(timeout=30)


def child_of(pid: int) -> int:
    """The host pid of the one child of ``pid`` (the namespace's pid 1)."""
    fs = ProcFS()
    children = [c for c in fs.pids() if (s := fs.stat(c)) is not None and s.ppid == pid]
    assert len(children) == 1, children
    return children[0]


@pytest.fixture
def vgpu(tmp_path: Path) -> Iterator[FakeVgpu]:
    v = FakeVgpu(tmp_path / "v1", "v1", (2 * GIB,))
    os.chmod(tmp_path, 0o755)
    yield v
    v.close()


def nvml(processes: dict[int, int]) -> NvmlSample:
    gpu = GpuSample(GPU0, 0, 0, sum(processes.values()), 80 * GIB, processes, {})
    return NvmlSample(monotonic=0.0, gpus={GPU0: gpu})


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare not installed")
def test_same_inner_pid_in_two_namespaces_maps_to_two_host_processes(vgpu: FakeVgpu) -> None:
    usage = str(vgpu.usage.path)
    holders = [
        spawn(python("-c", HOLDER, usage, str(i), str(GIB // 2), unshare=True)) for i in (0, 1)
    ]
    try:
        for h in holders:
            assert h.stdout is not None and h.stdout.readline().strip() == "claimed"
        tracker = Tracker()
        snap = tracker.scan({"v1": vgpu.blocks}, None)
        host = {s.slot.index: s.host_pid for s in snap.slots}
        assert host == {0: child_of(holders[0].pid), 1: child_of(holders[1].pid)}
        for index, pid in host.items():
            assert pid is not None and vgpu.control.slot_host_pid(index) == pid
            p = snap.processes[pid]
            assert (p.ns_pid, p.kind, p.vgpu_id, p.slot) == (1, ProcessKind.VGPU, "v1", index)
            assert p.pidns != HOST_PIDNS
        assert snap.processes[host[0] or 0].pidns != snap.processes[host[1] or 0].pidns

        # SIGKILL one namespace's process: its bytes come back in one scan.
        os.kill(host[0] or 0, signal.SIGKILL)
        holders[0].wait(timeout=30)
        snap = tracker.scan({"v1": vgpu.blocks}, None)
        events, _ = reap(snap, {"v1": vgpu.blocks}, ReaperState())
        assert [(e.kind, e.slot, e.freed) for e in events] == [("slot_reclaimed", 0, (GIB // 2,))]
        assert vgpu.usage.devices()[0].used == GIB // 2
        assert vgpu.control.slot_host_pid(0) == 0
        assert [s.index for s in vgpu.usage.slots()] == [1]
    finally:
        for h in holders:
            stop(h)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare not installed")
def test_real_pid_reuse_is_told_apart_by_start_time(vgpu: FakeVgpu) -> None:
    driver = spawn(python("-c", REUSE_DRIVER, str(vgpu.usage.path), HOLDER, unshare=True))
    try:
        assert driver.stdout is not None
        first, second = (int(x) for x in driver.stdout.readline().split())
        assert first == second, "the namespace did not hand the same pid out again"
        slots = {s.index: s for s in vgpu.usage.slots()}
        assert slots[0].pid == slots[1].pid == second
        assert slots[0].start_time < slots[1].start_time
        tracker = Tracker()
        snap = tracker.scan({"v1": vgpu.blocks}, None)
        by_slot = {s.slot.index: s.host_pid for s in snap.slots}
        assert by_slot[0] is None and by_slot[1] is not None
        assert snap.processes[by_slot[1]].ns_pid == second
        events, _ = reap(snap, {"v1": vgpu.blocks}, ReaperState())
        assert [(e.kind, e.slot) for e in events] == [("slot_reclaimed", 0)]
        assert [s.index for s in vgpu.usage.slots()] == [1]
        assert vgpu.usage.devices()[0].used == GIB
    finally:
        stop(driver)


def test_unmanaged_process_in_the_vgpus_cgroup_is_caught_and_killed(
    vgpu: FakeVgpu, cgroup: Cgroup
) -> None:
    holder = spawn(python("-c", HOLDER, str(vgpu.usage.path), "0", str(GIB)))
    bypass = subprocess.Popen(["sleep", "300"])  # allocates "without the hook"
    outsider = subprocess.Popen(["sleep", "300"])  # on the GPU, elsewhere
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        cgroup.add(holder.pid)
        cgroup.add(bypass.pid)
        sample = nvml({holder.pid: GIB, bypass.pid: 2 * GIB, outsider.pid: 3 * GIB})
        tracker = Tracker()
        snap = tracker.scan({"v1": vgpu.blocks}, sample)
        p = snap.processes[bypass.pid]
        assert (p.kind, p.vgpu_id) == (ProcessKind.UNMANAGED, "v1")
        assert p.container.cgroup_path == cgroup.path
        assert snap.processes[holder.pid].container.cgroup_path == cgroup.path
        assert snap.processes[outsider.pid].vgpu_id is None
        assert snap.vgpus["v1"].gpus[GPU0].nvml_used == 3 * GIB  # over its 2 GiB

        policy, state = BackstopPolicy("report"), BackstopState()
        events, state = check(snap, policy, state)
        assert [(e.kind, e.pid) for e in events] == [("over_limit", bypass.pid)]
        assert bypass.poll() is None  # report only

        events, state = check(
            tracker.scan({"v1": vgpu.blocks}, sample), BackstopPolicy("kill"), state
        )
        assert [(e.kind, e.pid) for e in events] == [("killed", bypass.pid)]
        assert bypass.wait(timeout=30) == -signal.SIGKILL
        assert holder.poll() is None and outsider.poll() is None
    finally:
        for p in (bypass, outsider):
            p.kill()
            p.wait()
        stop(holder)


STANDALONE = """
import mmap, os, sys
from tests.fixtures.hook import FakeHook
hook = FakeHook(sys.argv[1])
hook.claim_self(0, {0: int(sys.argv[2])})
print("claimed", flush=True)
sys.stdin.read()
"""


def test_standalone_process_is_adopted_through_map_files(tmp_path: Path) -> None:
    block = tmp_path / "standalone.usage"
    UsageBlock.create(block, device_count=1).close()
    block.chmod(0o600)  # as the hook makes it: its user's alone
    recorder = FakeHook(block)
    recorder.standalone([GPU0], [GIB])  # what the hook's env parsing records
    recorder.close()
    # The hook's name in LD_PRELOAD marks it hooked; the preloaded library is
    # harmless here (the atomics library: it defines no CUDA symbol).
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        LD_PRELOAD=str(BUILD / "libvgpu-atomics.so"),
        CUDA_MEM_LIMIT="1g",
    )
    env.pop("VGPU_CONTROL", None)
    child = spawn(python("-c", STANDALONE, str(block), str(GIB // 4)), env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "claimed"
        tracker = Tracker()
        first = tracker.scan({}, nvml({child.pid: GIB // 4}))
        p = first.processes[child.pid]
        assert p.kind is ProcessKind.STANDALONE and p.vgpu_id is not None
        st = block.stat()
        assert p.vgpu_id == f"sa-{st.st_dev:x}-{st.st_ino}" and p.slot == 0
        use = first.vgpus[p.vgpu_id]
        assert use.standalone and use.gpus[GPU0].limit == GIB
        assert use.gpus[GPU0].hooked_used == GIB // 4
        # What the API shows of it (read by the scan, which owns the block).
        counters = use.gpus[GPU0].counters
        assert counters is not None and counters.used == GIB // 4
        assert use.gpus[GPU0].steered_ppm == 0  # never steered yet
        second = tracker.scan({}, nvml({child.pid: GIB // 4}))
        assert second.processes[child.pid].kind is ProcessKind.STANDALONE
        assert [s.host_pid for s in second.slots] == [child.pid]

        stop(child)
        third = tracker.scan({}, None)
        events, _ = reap(third, {}, ReaperState())
        assert [e.kind for e in events] == ["slot_reclaimed"]
        assert tracker.scan({}, None).standalone == {}  # released once empty
    finally:
        stop(child)
        tracker.close()


def test_block_of_the_right_size_but_foreign_is_not_adopted(tmp_path: Path) -> None:
    fake_block = tmp_path / "not-a-block"
    fake_block.write_bytes(b"\0" * USAGE_MAPPING_SIZE)
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        LD_PRELOAD=str(BUILD / "libvgpu-atomics.so"),
        CUDA_MEM_LIMIT="1g",
    )
    code = (
        "import mmap, sys\n"
        "f = open(sys.argv[1], 'r+b')\n"
        "m = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED)\n"
        "print('mapped', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = spawn(python("-c", code, str(fake_block)), env=env)
    tracker = Tracker()
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "mapped"
        snap = tracker.scan({}, nvml({child.pid: GIB}))
        assert (snap.processes[child.pid].kind, snap.standalone) == (ProcessKind.HOOKED, {})
    finally:
        stop(child)
        tracker.close()
