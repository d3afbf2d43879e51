"""Reaper: dead slots reclaimed within one scan, live ones never touched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.hook import GPU_UUIDS, FakeVgpu
from vgpud.loops.repairs import apply, reap
from vgpud.observe.tracker import Tracker
from vgpud.policy.reaper import ReaperPolicy, ReaperState, Reclaim, Reset, plan
from vgpud.vgpus.abi import SLOT_CLAIMING, SLOT_FREE, SLOT_RECLAIMING

GIB = 1 << 30
DOCKER_NS = 4026532201  # docker-cgroupfs-v1: host 4100 = ns pid 1, start 5100
GPU0 = GPU_UUIDS[0]


@pytest.fixture
def vgpu(tmp_path: Path, proc: Path) -> Iterator[FakeVgpu]:
    """A vGPU whose blocks the container's first process (4100) maps."""
    v = FakeVgpu(tmp_path / "v1", "v1", (4 * GIB, 4 * GIB))
    v.mapped_by(proc, 4100)
    yield v
    v.close()


def used(v: FakeVgpu) -> list[int]:
    return [d.used for d in v.usage.devices()]


def tick(
    tracker: Tracker, v: FakeVgpu, state: ReaperState, policy: ReaperPolicy | None = None
) -> tuple[list[str], ReaperState]:
    snapshot = tracker.scan({"v1": v.blocks}, None)
    events, state = reap(snapshot, {"v1": v.blocks}, state, policy or ReaperPolicy())
    return [e.kind for e in events], state


def test_dead_slot_is_reclaimed_within_one_scan_live_one_untouched(
    proc: Path, vgpu: FakeVgpu
) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB, 1: 2 * GIB})
    vgpu.hook.claim(1, pid=42, pidns=DOCKER_NS, start_time=777, used={0: 3 * GIB})  # dead
    tracker = Tracker(proc, sees_all_pids=True)
    snapshot = tracker.scan({"v1": vgpu.blocks}, None)
    events, _ = reap(snapshot, {"v1": vgpu.blocks}, ReaperState())
    assert [(e.kind, e.slot, e.pid, e.freed) for e in events] == [
        ("slot_reclaimed", 1, 42, (3 * GIB, 0))
    ]
    assert used(vgpu) == [GIB, 2 * GIB]
    assert [s.index for s in vgpu.usage.slots()] == [0]


def test_pid_reuse_reclaims_the_dead_identity_only(proc: Path, vgpu: FakeVgpu) -> None:
    # Same pid in the same namespace, earlier start: a dead predecessor.
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5000, used={0: GIB})
    vgpu.hook.claim(1, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: 2 * GIB})
    kinds, _ = tick(Tracker(proc, sees_all_pids=True), vgpu, ReaperState())
    assert kinds == ["slot_reclaimed"]
    assert [s.index for s in vgpu.usage.slots()] == [1] and used(vgpu)[0] == 2 * GIB


def test_idle_vgpu_totals_reset_repairing_a_leak(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    vgpu.usage.reclaim_slot(0, vgpu.usage.slots()[0])  # as if freed...
    vgpu.hook.block.devices[0].used = 123  # ...leaving a leak a kill left behind
    vgpu.hook.claim(5, pid=42, pidns=DOCKER_NS, start_time=1, used={1: GIB})  # dead
    kinds, _ = tick(Tracker(proc, sees_all_pids=True), vgpu, ReaperState())
    assert kinds == ["slot_reclaimed", "usage_reset"]
    assert used(vgpu) == [0, 0] and vgpu.usage.slots() == []


def test_leak_is_kept_while_a_process_lives(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    vgpu.hook.block.devices[0].used += 5
    kinds, _ = tick(Tracker(proc, sees_all_pids=True), vgpu, ReaperState())
    assert kinds == [] and used(vgpu)[0] == GIB + 5


def test_claiming_slot_of_a_dead_process_waits_stuck_scans(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=42, pidns=DOCKER_NS, start_time=1, used={0: GIB}, state=SLOT_CLAIMING)
    tracker, state = Tracker(proc, sees_all_pids=True), ReaperState()
    policy = ReaperPolicy(stuck_scans=3)
    for _ in range(2):
        kinds, state = tick(tracker, vgpu, state, policy)
        assert kinds == [] and used(vgpu)[0] == GIB
    kinds, state = tick(tracker, vgpu, state, policy)
    assert kinds == ["slot_reclaimed"] and used(vgpu)[0] == 0


def test_claiming_by_a_live_process_is_reported_never_forced(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB}, state=SLOT_CLAIMING)
    tracker, state = Tracker(proc, sees_all_pids=True), ReaperState()
    seen = []
    for _ in range(5):
        kinds, state = tick(tracker, vgpu, state, ReaperPolicy(stuck_scans=2))
        seen += kinds
    assert seen == ["slot_stuck"]
    assert vgpu.usage.slots()[0].state == SLOT_CLAIMING and used(vgpu)[0] == GIB


def test_reclaiming_slot_left_by_a_dead_hook_is_reported_and_budget_reset(
    proc: Path, vgpu: FakeVgpu
) -> None:
    vgpu.hook.claim(0, pid=42, pidns=DOCKER_NS, start_time=1, used={0: GIB}, state=SLOT_RECLAIMING)
    tracker, state = Tracker(proc, sees_all_pids=True), ReaperState()
    kinds, state = tick(tracker, vgpu, state, ReaperPolicy(stuck_scans=1))
    assert sorted(kinds) == ["slot_stuck", "usage_reset"]
    assert used(vgpu)[0] == 0 and vgpu.usage.slots()[0].state == SLOT_RECLAIMING


def test_no_reset_while_a_hook_is_returning_a_dead_slot(proc: Path, vgpu: FakeVgpu) -> None:
    # A hook reclaiming a dead slot subtracts its bytes after the state
    # change; a reset in between would let that subtraction erase bytes a
    # newcomer reserves meanwhile, and the vGPU could pass its limit.
    vgpu.hook.block.devices[0].used = 5  # leaked
    vgpu.hook.claim(0, pid=42, pidns=DOCKER_NS, start_time=1, used={0: GIB}, state=SLOT_RECLAIMING)
    tracker, state = Tracker(proc, sees_all_pids=True), ReaperState()
    kinds, state = tick(tracker, vgpu, state, ReaperPolicy(stuck_scans=3))
    assert kinds == [] and used(vgpu)[0] == GIB + 5
    # Idle and nothing reclaiming at scan time, but a hook starts reclaiming
    # before the reset is applied: the reset stands back.
    vgpu.hook.free(0)
    snapshot = tracker.scan({"v1": vgpu.blocks}, None)
    actions, _, _ = plan(snapshot, ReaperState())
    assert actions == [Reset("v1")]
    vgpu.hook.claim(1, pid=43, pidns=DOCKER_NS, start_time=2, used={0: 1}, state=SLOT_RECLAIMING)
    assert apply(actions, {"v1": vgpu.blocks}) == []
    assert used(vgpu)[0] == GIB + 5 + 1


def test_slot_that_changed_hands_after_the_scan_is_not_touched(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=42, pidns=DOCKER_NS, start_time=1, used={0: GIB})
    snapshot = Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, None)
    actions, _, _ = plan(snapshot, ReaperState())
    assert [type(a) for a in actions] == [Reclaim, Reset]
    # Meanwhile the dead process's hook slot is freed and a new process takes it.
    vgpu.usage.reclaim_slot(0, vgpu.usage.slots()[0])
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: 2 * GIB})
    assert apply(actions, {"v1": vgpu.blocks}) == []
    assert used(vgpu)[0] == 2 * GIB and vgpu.usage.slots()[0].pid == 1


def test_reset_skipped_when_a_process_claimed_a_slot_after_the_scan(
    proc: Path, vgpu: FakeVgpu
) -> None:
    vgpu.hook.block.devices[0].used = 7  # leaked
    snapshot = Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, None)
    actions, _, _ = plan(snapshot, ReaperState())
    assert actions == [Reset("v1")]
    vgpu.hook.claim(3, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    assert apply(actions, {"v1": vgpu.blocks}) == []
    assert used(vgpu)[0] == GIB + 7


def test_nothing_is_dead_when_not_every_pid_is_visible(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=42, pidns=DOCKER_NS, start_time=1, used={0: GIB})
    kinds, _ = tick(Tracker(proc, sees_all_pids=False), vgpu, ReaperState())
    assert kinds == [] and used(vgpu)[0] == GIB


def test_absurd_totals_are_reported_once(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100)
    vgpu.hook.block.devices[0].used = 5 * GIB  # above the 4 GiB limit
    tracker, state = Tracker(proc, sees_all_pids=True), ReaperState()
    first, state = tick(tracker, vgpu, state)
    second, state = tick(tracker, vgpu, state)
    assert (first, second) == (["counter_absurd"], [])
    vgpu.hook.block.devices[0].used = 0
    _, state = tick(tracker, vgpu, state)
    vgpu.hook.block.devices[0].used = 5 * GIB
    again, state = tick(tracker, vgpu, state)
    assert again == ["counter_absurd"]  # a new episode


def test_absurd_against_physical_memory(proc: Path, tmp_path: Path) -> None:
    v = FakeVgpu(tmp_path / "big", "big", (1 << 49,))
    try:
        v.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100)
        v.hook.block.devices[0].used = 17 * 80 * GIB
        snapshot = Tracker(proc, sees_all_pids=True).scan({"big": v.blocks}, None)
        policy = ReaperPolicy(physical_memory={GPU0: 80 * GIB})
        _, events, _ = plan(snapshot, ReaperState(), policy)
        assert [e.kind for e in events] == ["counter_absurd"]
        assert "16 x" in events[0].detail
    finally:
        v.close()


def test_deleted_vgpu_between_scan_and_apply_is_skipped(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=42, pidns=DOCKER_NS, start_time=1, used={0: GIB})
    snapshot = Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, None)
    actions, _, _ = plan(snapshot, ReaperState())
    assert apply(actions, {}) == []
    assert vgpu.usage.slots()[0].state != SLOT_FREE


def test_a_drift_after_level_scans_is_seen_and_set_back(proc: Path, vgpu: FakeVgpu) -> None:
    """A vGPU found level scan after scan (judged once, then kept while its
    figures are the same objects) still shows a drift of its totals at the
    next scan: held ``stuck_scans`` scans in a row, it is set back."""
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    tracker, state = Tracker(proc, sees_all_pids=True), ReaperState()
    for _ in range(3):
        kinds, state = tick(tracker, vgpu, state)
        assert kinds == []
    vgpu.hook.block.devices[0].used += 5  # bytes no slot holds
    seen = []
    for _ in range(ReaperPolicy().stuck_scans):
        kinds, state = tick(tracker, vgpu, state)
        seen += kinds
    assert seen == ["usage_drift"] and used(vgpu) == [GIB, 0]
