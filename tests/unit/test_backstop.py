"""Backstop: NVML's per-process memory against a vGPU's limit; kill safely."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.hook import GPU_UUIDS, FakeVgpu
from vgpud.loops.repairs import check, enforce
from vgpud.observe.cgroups import ContainerRef, Runtime
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.procfs import ProcFS
from vgpud.observe.tracker import (
    GpuUse,
    ProcessKind,
    TrackedProcess,
    Tracker,
    TrackSnapshot,
    VgpuUse,
)
from vgpud.policy.backstop import BackstopPolicy, BackstopState, Kill, decide

GIB = 1 << 30
MIB = 1 << 20
GPU0 = GPU_UUIDS[0]
# docker-cgroupfs-v1: 4100 (ns pid 1) and 4150 (ns pid 7) in one container.
DOCKER_NS = 4026532201


@pytest.fixture
def vgpu(tmp_path: Path, proc: Path) -> Iterator[FakeVgpu]:
    """A vGPU whose blocks the container's first process (4100) maps."""
    v = FakeVgpu(tmp_path / "v1", "v1", (4 * GIB,))
    v.mapped_by(proc, 4100)
    yield v
    v.close()


def nvml(processes: dict[int, int]) -> NvmlSample:
    gpu = GpuSample(GPU0, 0, 0, sum(processes.values()), 80 * GIB, processes, {})
    return NvmlSample(monotonic=0.0, gpus={GPU0: gpu})


def test_within_tolerance_nothing_happens(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: 4 * GIB})
    snap = Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, nvml({4100: 4 * GIB + MIB}))
    kills, events, state = decide(snap, BackstopPolicy("kill", tolerance=64 * MIB), BackstopState())
    assert (kills, events, state.over) == ([], [], {})


def test_bypassing_process_in_the_container_is_reported(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: 3 * GIB})
    snap = Tracker(proc, sees_all_pids=True).scan(
        {"v1": vgpu.blocks}, nvml({4100: 3 * GIB, 4150: 2 * GIB})
    )
    kills, events, _ = decide(snap, BackstopPolicy("report"), BackstopState())
    assert kills == []
    assert [(e.kind, e.vgpu_id, e.uuid, e.pid, e.nvml_used, e.limit) for e in events] == [
        ("over_limit", "v1", GPU0, 4150, 5 * GIB, 4 * GIB)
    ]


def test_kill_policy_kills_the_offender_once_confirmed(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: 3 * GIB})
    tracker = Tracker(proc, sees_all_pids=True)
    policy = BackstopPolicy("kill", confirm_scans=2)
    sample = nvml({4100: 3 * GIB, 4150: 2 * GIB})
    kills, events, state = decide(
        tracker.scan({"v1": vgpu.blocks}, sample), policy, BackstopState()
    )
    assert kills == [] and [e.kind for e in events] == ["over_limit"]
    kills, events, state = decide(tracker.scan({"v1": vgpu.blocks}, sample), policy, state)
    assert [(k.pid, k.start_time, k.vgpu_id, k.uuid) for k in kills] == [(4150, 5150, "v1", GPU0)]
    assert events == []  # reported once per episode
    _, _, state = decide(tracker.scan({"v1": vgpu.blocks}, nvml({4100: 3 * GIB})), policy, state)
    assert state.over == {}


def test_hooked_process_with_unaccounted_memory_is_the_offender(proc: Path, vgpu: FakeVgpu) -> None:
    # Both hold slots; 4150's slot says 1 GiB but NVML sees 3.5 GiB on it.
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: 2 * GIB})
    vgpu.hook.claim(1, pid=7, pidns=DOCKER_NS, start_time=5150, used={0: GIB})
    snap = Tracker(proc, sees_all_pids=True).scan(
        {"v1": vgpu.blocks}, nvml({4100: 2 * GIB + 100 * MIB, 4150: 3 * GIB + 512 * MIB})
    )
    kills, _, _ = decide(snap, BackstopPolicy("kill", confirm_scans=1), BackstopState())
    assert [k.pid for k in kills] == [4150]


def test_no_blame_without_unaccounted_memory(proc: Path, vgpu: FakeVgpu) -> None:
    # The block lies low (hook says 0) but the only process is accounted
    # above what NVML sees: no process to blame, still reported.
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: 6 * GIB})
    snap = Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, nvml({4100: 5 * GIB}))
    kills, events, _ = decide(snap, BackstopPolicy("kill", confirm_scans=1), BackstopState())
    assert kills == [] and events[0].pid is None and "no process to blame" in events[0].detail


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action": "shoot"}, "expected one of"),
        ({"tolerance": -1}, "must be >= 0"),
        ({"confirm_scans": 0}, "must be >= 1"),
    ],
)
def test_bad_policy(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BackstopPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(["sleep", "60"])
    yield child
    child.kill()
    child.wait()


def start_time(pid: int) -> int:
    stat = ProcFS().stat(pid)
    assert stat is not None
    return stat.start_time


def test_enforce_kills_the_judged_process(victim: subprocess.Popen[bytes]) -> None:
    kill = Kill(victim.pid, start_time(victim.pid), "v1", GPU0, "test")
    events = enforce([kill])
    assert [e.kind for e in events] == ["killed"]
    assert victim.wait(timeout=10) == -9


def test_enforce_spares_a_reused_pid(victim: subprocess.Popen[bytes]) -> None:
    kill = Kill(victim.pid, start_time(victim.pid) - 1, "v1", GPU0, "test")
    events = enforce([kill])
    assert [e.kind for e in events] == ["kill_skipped"] and "another process" in events[0].detail
    assert victim.poll() is None


def test_enforce_never_kills_init_or_itself() -> None:
    events = enforce([Kill(1, 0, "v", GPU0, "t"), Kill(os.getpid(), 0, "v", GPU0, "t")])
    assert [e.kind for e in events] == ["kill_skipped", "kill_skipped"]


def test_check_reports_and_kills_in_one_call(
    proc: Path, vgpu: FakeVgpu, victim: subprocess.Popen[bytes]
) -> None:
    # A fixture tree decides; the effect runs against the real /proc, so
    # point the offender at the real victim by giving it the victim's pid.
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    shutil.copytree(proc / "4150", proc / str(victim.pid), symlinks=True)
    stat = (proc / str(victim.pid) / "stat").read_text().split(" ", 1)[1]
    fields = stat.rsplit(")", 1)
    rest = fields[1].split()
    rest[19] = str(start_time(victim.pid))
    (proc / str(victim.pid) / "stat").write_text(f"{victim.pid} {fields[0]}) {' '.join(rest)}\n")
    status = proc / str(victim.pid) / "status"
    text = status.read_text().replace("NSpid:\t4150 7", f"NSpid:\t{victim.pid} 9")
    status.write_text(text.replace("Tgid:\t4150\n", f"Tgid:\t{victim.pid}\n"))
    snap = Tracker(proc, sees_all_pids=True).scan(
        {"v1": vgpu.blocks}, nvml({4100: GIB, victim.pid: 4 * GIB})
    )
    events, _ = check(snap, BackstopPolicy("kill", confirm_scans=1), BackstopState())
    assert [e.kind for e in events] == ["over_limit", "killed"]
    assert victim.wait(timeout=10) == -9


def test_each_vgpu_over_its_limit_blames_its_own_process() -> None:
    """Several vGPUs over their limits in one scan: each offender is found
    among that vGPU's processes only, whatever the order they come in."""
    container = ContainerRef(Runtime.DOCKER, "/docker/c1", container_id="c1")

    def process(pid: int, vgpu_id: str, slot: int | None, nvml: int, hooked: int) -> TrackedProcess:
        kind = ProcessKind.VGPU if slot is not None else ProcessKind.UNMANAGED
        return TrackedProcess(
            pid, pid, DOCKER_NS, 5000 + pid, "burn", 0, container, kind, vgpu_id, slot,
            memory={GPU0: nvml}, hooked={GPU0: hooked} if slot is not None else {},
        )  # fmt: skip

    processes = [
        process(10, "a", 0, 3 * GIB, GIB),  # 2 GiB the hook does not account for
        process(20, "b", 0, GIB, GIB),
        process(11, "a", 1, GIB, GIB),
        process(21, "b", None, 2 * GIB, 0),  # no slot: bypassed the hook
        process(12, "c", 0, 3 * GIB, 3 * GIB),  # "c" is within its limit
    ]

    def use(vgpu_id: str) -> VgpuUse:
        mine = [p for p in processes if p.vgpu_id == vgpu_id]
        nvml_used = sum(p.memory[GPU0] for p in mine)
        gpu = GpuUse(GPU0, 2 * GIB if vgpu_id != "c" else 4 * GIB, 0, nvml_used, None, len(mine))
        return VgpuUse(vgpu_id, False, {GPU0: gpu}, tuple(p.pid for p in mine), len(mine))

    snap = TrackSnapshot(
        0.0, {p.pid: p for p in processes}, {v: use(v) for v in "abc"}, (), {}, (), (), True
    )
    _, events, _ = decide(snap, BackstopPolicy("report", tolerance=0), BackstopState())
    assert [(e.vgpu_id, e.pid) for e in events] == [("a", 10), ("b", 21)]
