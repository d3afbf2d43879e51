"""Reaping: a dead process's bytes go back to its vGPU within one scan.

Public interface
----------------
``plan(snapshot, state, policy) -> (actions, events, state)``
    The pure decision (no block touched). Start with ``ReaperState()``.
    The scan carries the actions out (``vgpud.loops.repairs``: ``apply``,
    and ``reap``, the two in a row).
``ReaperEvent``: frozen; ``kind`` is one of ``slot_reclaimed``,
``usage_reset``, ``usage_drift``, ``slot_stuck``, ``counter_absurd``.

Rules
-----
- A slot that no live process may hold (``SlotState.held`` false: its
  identity is dead, or names a process the host shows outside the vGPU)
  is reclaimed at once when ACTIVE, through
  ``UsageBlock.reclaim_slot`` with the identity the tracker saw: if the slot
  changed hands meanwhile nothing is touched.
- A CLAIMING slot may be a process filling it in right now; it is reclaimed
  only after ``stuck_scans`` scans in a row with the same dead identity. A
  slot stuck in CLAIMING by a live process, or in RECLAIMING (a hook died
  while reclaiming), is reported, never forced.
- A slot of a live process is never touched.
- A vGPU with no live process has its device totals reset to 0 (by CAS:
  a process that starts meanwhile keeps its reservation); this also repairs
  any leak, e.g. bytes of a slot stuck in RECLAIMING.
- A vGPU whose processes live: a process killed inside the hook's
  two-step window (docs/hook.md, "The budget") leaves its call's bytes in
  the total and in no slot. When every slot is ACTIVE with a live holder and
  the totals differ from the sum of the slots, unchanged (totals and every
  slot's words, heartbeat included) for ``stuck_scans`` scans in a row, no
  hook is between its two steps (a step takes instructions, not seconds),
  and each total is set to the sum of its slots, by CAS, after checking
  that the slots are still what the scan saw: ``usage_drift`` (the bytes
  given back per device; negative: added, for a total found below its
  slots, which the protocol never leaves but a process halted inside the
  window and resumed after a repair would). A vGPU with a holder that is
  halted (``halted(host_pid)``: stopped, or in a frozen cgroup) is left
  alone: it may be inside the window however long nothing changes.
- Absurd counters (the hook's total above the vGPU's limit, or above 16 x
  the physical memory) are reported once per episode; the totals are the
  container's word, the reset above is the repair.
- Nothing is judged dead when the tracker cannot see every PID namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vgpud.observe.tracker import SlotState, TrackSnapshot, VgpuUse
from vgpud.vgpus.abi import SLOT_ACTIVE, SLOT_CLAIMING, SLOT_RECLAIMING
from vgpud.vgpus.blocks import SlotView

PHYSICAL_FACTOR = 16  # a total above 16 x the GPU's memory is no real use


@dataclass(frozen=True)
class ReaperPolicy:
    stuck_scans: int = 3
    physical_memory: Mapping[str, int] = field(default_factory=dict)  # GPU uuid -> bytes


@dataclass(frozen=True)
class ReaperEvent:
    kind: str
    vgpu_id: str
    detail: str
    slot: int | None = None
    pid: int | None = None  # as the slot names it (inside its PID namespace)
    freed: tuple[int, ...] = ()  # bytes per device index


@dataclass(frozen=True)
class Reclaim:
    vgpu_id: str
    slot: SlotView


@dataclass(frozen=True)
class Reset:
    vgpu_id: str
    # RECLAIMING slots seen stuck for stuck_scans scans: their reclaimer died,
    # so they no longer stand in the way of a reset. Any other RECLAIMING
    # slot is a hook returning a dead slot's bytes right now; resetting under
    # it would let its late subtraction erase a newcomer's reservation.
    stuck_reclaiming: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Realign:
    """Set each device total to the sum of the slots, if the slots are
    still exactly ``slots`` (all ACTIVE, all held by live processes)."""

    vgpu_id: str
    slots: tuple[SlotView, ...]
    holders: tuple[int, ...]  # their host pids


# What a drifted vGPU looked like: its totals and its slots.
DriftKey = tuple[tuple[int, ...], tuple[SlotView, ...]]


@dataclass(frozen=True)
class ReaperState:
    # (vgpu, slot index, state, pid, pidns, start_time) -> scans seen in a row
    stuck: Mapping[tuple[str, int, int, int, int, int], int] = field(default_factory=dict)
    absurd: frozenset[tuple[str, str]] = frozenset()  # (vgpu, gpu uuid) reported
    drift: Mapping[str, tuple[DriftKey, int]] = field(default_factory=dict)  # -> scans unchanged
    # The vGPUs found level (no drift) at the last scan, with the objects they
    # were judged from (immutable): the same ones again are level again.
    level: Mapping[str, tuple[VgpuUse, tuple[SlotState, ...]]] = field(default_factory=dict)


Action = Reclaim | Reset | Realign


def plan(
    snapshot: TrackSnapshot, state: ReaperState, policy: ReaperPolicy = ReaperPolicy()
) -> tuple[list[Action], list[ReaperEvent], ReaperState]:
    actions: list[Action] = []
    events: list[ReaperEvent] = []
    stuck: dict[tuple[str, int, int, int, int, int], int] = {}
    reclaiming: dict[str, set[int]] = {}  # per vGPU: RECLAIMING slots seen
    settled: dict[str, set[int]] = {}  # of those, the ones stuck long enough
    if snapshot.sees_all_pids:
        for s in snapshot.slots:
            if s.slot.state == SLOT_RECLAIMING:
                reclaiming.setdefault(s.vgpu_id, set()).add(s.slot.index)
            if s.slot.state == SLOT_ACTIVE and not s.held:
                actions.append(Reclaim(s.vgpu_id, s.slot))
            elif s.slot.state in (SLOT_CLAIMING, SLOT_RECLAIMING):
                key = _stuck_key(s)
                stuck[key] = state.stuck.get(key, 0) + 1
                if stuck[key] >= policy.stuck_scans:
                    if s.slot.state == SLOT_RECLAIMING:
                        settled.setdefault(s.vgpu_id, set()).add(s.slot.index)
                    action, event = _unstick(s, stuck[key], policy)
                    actions += [action] if action is not None else []
                    if event is not None and stuck[key] == policy.stuck_scans:
                        events.append(event)
        actions += [
            Reset(vgpu_id, frozenset(settled.get(vgpu_id, ())))
            for vgpu_id, use in snapshot.vgpus.items()
            if use.live_slots == 0
            and any(gpu.hooked_used for gpu in use.gpus.values())
            and reclaiming.get(vgpu_id, set()) <= settled.get(vgpu_id, set())
        ]
    drift, level = _drift(snapshot, state) if snapshot.sees_all_pids else ({}, {})
    actions += [
        Realign(vgpu_id, key[1], _holders(snapshot, vgpu_id))
        for vgpu_id, (key, scans) in drift.items()
        if scans >= policy.stuck_scans
    ]
    absurd = _absurd(snapshot, policy)
    events += [
        ReaperEvent("counter_absurd", vgpu_id, detail)
        for (vgpu_id, uuid), detail in absurd.items()
        if (vgpu_id, uuid) not in state.absurd
    ]
    return (
        actions,
        events,
        ReaperState(stuck=stuck, absurd=frozenset(absurd), drift=drift, level=level),
    )


def _stuck_key(s: SlotState) -> tuple[str, int, int, int, int, int]:
    slot = s.slot
    return (s.vgpu_id, slot.index, slot.state, slot.pid, slot.pidns, slot.start_time)


def _unstick(
    s: SlotState, scans: int, policy: ReaperPolicy
) -> tuple[Action | None, ReaperEvent | None]:
    slot = s.slot
    if slot.state == SLOT_CLAIMING and not s.held:
        return Reclaim(s.vgpu_id, slot), None
    holder = "a live process" if s.held else "no live process"
    detail = f"slot {slot.index} {slot.state_name} for {scans} scans, held by {holder}; left alone"
    return None, ReaperEvent("slot_stuck", s.vgpu_id, detail, slot.index, slot.pid)


def _drift(
    snapshot: TrackSnapshot, state: ReaperState
) -> tuple[dict[str, tuple[DriftKey, int]], dict[str, tuple[VgpuUse, tuple[SlotState, ...]]]]:
    """The vGPUs whose totals differ from their live slots' sum, each with
    how many scans in a row it has looked exactly so; and those that do not
    (or cannot be compared), with what they were judged from."""
    out: dict[str, tuple[DriftKey, int]] = {}
    level: dict[str, tuple[VgpuUse, tuple[SlotState, ...]]] = {}
    for vgpu_id, use in snapshot.vgpus.items():
        mine = snapshot.slots_of.get(vgpu_id, ())
        was = state.level.get(vgpu_id)
        if was is not None and was[0] is use and was[1] is mine:
            level[vgpu_id] = was
            continue
        if not mine or any(
            s.slot.state != SLOT_ACTIVE
            or s.host_pid is None
            # Every device named (a standalone hook may leave one unnamed,
            # and then its total is not in the snapshot to compare).
            or len(s.slot.devices) != len(use.gpus)
            for s in mine
        ):
            level[vgpu_id] = (use, mine)
            continue
        totals = tuple(g.hooked_used for g in use.gpus.values())
        if sum(totals) == sum(s.slot.used for s in mine):
            level[vgpu_id] = (use, mine)
            continue
        key = (totals, tuple(s.slot for s in mine))
        before = state.drift.get(vgpu_id)
        out[vgpu_id] = (key, before[1] + 1 if before is not None and before[0] == key else 1)
    return out, level


def _holders(snapshot: TrackSnapshot, vgpu_id: str) -> tuple[int, ...]:
    return tuple(s.host_pid for s in snapshot.slots_of.get(vgpu_id, ()) if s.host_pid is not None)


def _absurd(snapshot: TrackSnapshot, policy: ReaperPolicy) -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for vgpu_id, use in snapshot.vgpus.items():
        for uuid, gpu in use.gpus.items():
            physical = policy.physical_memory.get(uuid)
            if gpu.limit is not None and gpu.hooked_used > gpu.limit:
                found[(vgpu_id, uuid)] = (
                    f"usage block says {gpu.hooked_used} bytes used on {uuid}, "
                    f"above the limit {gpu.limit}"
                )
            elif physical and gpu.hooked_used > physical * PHYSICAL_FACTOR:
                found[(vgpu_id, uuid)] = (
                    f"usage block says {gpu.hooked_used} bytes used on {uuid}, "
                    f"above {PHYSICAL_FACTOR} x its {physical} bytes"
                )
    return found
