"""The scan's hands: what the reaper planned and the backstop decided,
carried out (``vgpud.policy.reaper`` and ``vgpud.policy.backstop`` hold the
pure decisions and their rules).

Public interface
----------------
``apply(actions, views, halted=...) -> events``
    The reaper's actions on the usage blocks: reclaim a dead process's
    slot, reset an idle vGPU's totals, realign totals that drifted; each
    checked again against the block just before (a slot that changed hands
    since the scan is not touched).
``reap(snapshot, vgpus, state, policy=ReaperPolicy(), halted=...) -> (events, state)``
    ``plan`` then ``apply``. Called once per tick after ``Tracker.scan``;
    ``vgpus`` is what the tracker was given (daemon-owned vGPUs); the
    standalone vGPUs the tracker adopted come from the snapshot.
``enforce(kills, proc_root="/proc") -> events``
    The backstop's kills: SIGKILL through a pidfd, after checking that the
    pid still names the process judged (same start time), so PID reuse
    never kills an innocent.
``check(snapshot, policy, state) -> (events, state)``: ``decide`` then
    ``enforce``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping

import structlog

from vgpud.log import tenant_said
from vgpud.observe.procfs import ProcFS
from vgpud.observe.tracker import TrackSnapshot, VgpuView
from vgpud.policy.backstop import BackstopEvent, BackstopPolicy, BackstopState, Kill, decide
from vgpud.policy.reaper import (
    Action,
    Realign,
    ReaperEvent,
    ReaperPolicy,
    ReaperState,
    Reclaim,
    Reset,
    plan,
)
from vgpud.vgpus.abi import SLOT_ACTIVE, SLOT_CLAIMING, SLOT_RECLAIMING
from vgpud.vgpus.blocks import UsageBlock

log = structlog.get_logger(__name__)

DEFAULT_REAPER_POLICY = ReaperPolicy()

# ---- the reaper's actions ----------------------------------------------------


def _never(pid: int) -> bool:
    return False


def apply(
    actions: list[Action],
    views: Mapping[str, VgpuView],
    halted: Callable[[int], bool] = _never,
) -> list[ReaperEvent]:
    """``halted(host_pid)``: is that process stopped or frozen now (a realign
    waits for it)."""
    events: list[ReaperEvent] = []
    for action in actions:
        view = views.get(action.vgpu_id)
        if view is None:
            continue  # deleted since the scan
        if isinstance(action, Reclaim):
            event = _reclaim(action, view.usage)
        elif isinstance(action, Reset):
            event = _reset(action, view.usage)
        elif not any(halted(pid) for pid in action.holders):
            event = _realign(action, view.usage)
        else:
            event = None
        if event is not None:
            # A tenant writes the dead identities into its own slots, as many
            # as it likes before every scan: the line is bounded, the events
            # keep each one.
            tenant_said(
                log,
                "info",
                "reaper repaired a vGPU",
                tenant=event.vgpu_id,
                kind=event.kind,
                action=event.kind,
                vgpu=event.vgpu_id,
                detail=event.detail,
            )
            events.append(event)
    return events


def reap(
    snapshot: TrackSnapshot,
    vgpus: Mapping[str, VgpuView],
    state: ReaperState,
    policy: ReaperPolicy = DEFAULT_REAPER_POLICY,
    halted: Callable[[int], bool] = _never,
) -> tuple[list[ReaperEvent], ReaperState]:
    actions, events, state = plan(snapshot, state, policy)
    views: dict[str, VgpuView] = {**vgpus, **snapshot.standalone}
    return events + apply(actions, views, halted), state


def _reclaim(action: Reclaim, usage: UsageBlock) -> ReaperEvent | None:
    slot = action.slot
    freed = usage.reclaim_slot(slot.index, slot)
    if freed is None:
        return None  # the slot changed hands since the scan: not ours to touch
    return ReaperEvent(
        "slot_reclaimed",
        action.vgpu_id,
        f"reclaimed slot {slot.index} of dead pid {slot.pid} (ns {slot.pidns}): {sum(freed)} bytes",
        slot.index,
        slot.pid,
        freed,
    )


def _reset(action: Reset, usage: UsageBlock) -> ReaperEvent | None:
    # Looked at again just before: a process that claimed a slot since the
    # scan is alive (it cannot be in the scan's dead list), and a hook that
    # began reclaiming a slot since is about to subtract: leave both be.
    for s in usage.slots():
        if s.state in (SLOT_ACTIVE, SLOT_CLAIMING):
            return None
        if s.state == SLOT_RECLAIMING and s.index not in action.stuck_reclaiming:
            return None
    held = [usage.reset_used(d) for d in range(usage.device_count)]
    if not any(held):
        return None
    return ReaperEvent(
        "usage_reset",
        action.vgpu_id,
        f"no live process: budgets reset ({sum(h or 0 for h in held)} bytes were held)",
        freed=tuple(h or 0 for h in held),
    )


def _realign(action: Realign, usage: UsageBlock) -> ReaperEvent | None:
    slots = tuple(usage.slots())
    if slots != action.slots:
        return None  # a slot moved since the scan: a hook is at work, not a leak
    moved = []
    for d, dev in enumerate(usage.devices()):
        held = sum(s.devices[d].used for s in slots)
        swapped = dev.used != held and usage.swap_used(d, dev.used, held)
        moved.append(dev.used - held if swapped else 0)
    if not any(moved):
        return None
    return ReaperEvent(
        "usage_drift",
        action.vgpu_id,
        f"totals did not match the live slots for several scans: set to their sum "
        f"({sum(moved)} bytes given back; a process killed between its two steps)",
        freed=tuple(moved),
    )


# ---- the backstop's kills ----------------------------------------------------


def enforce(kills: list[Kill], proc_root: str = "/proc") -> list[BackstopEvent]:
    procfs = ProcFS(proc_root)
    events = []
    for kill in kills:
        outcome = _kill(kill, procfs)
        kind = "killed" if outcome is None else "kill_skipped"
        detail = f"pid {kill.pid} ({kill.reason})" if outcome is None else outcome
        # A tenant starting a process over its limit at every scan decides
        # how often this comes: bounded, with every kill an event.
        tenant_said(
            log,
            "warning",
            "backstop acted",
            tenant=kill.vgpu_id,
            kind=kind,
            action=kind,
            vgpu=kill.vgpu_id,
            gpu=kill.uuid,
            detail=detail,
        )
        events.append(BackstopEvent(kind, kill.vgpu_id, kill.uuid, detail, kill.pid))
    return events


def check(
    snapshot: TrackSnapshot, policy: BackstopPolicy, state: BackstopState, proc_root: str = "/proc"
) -> tuple[list[BackstopEvent], BackstopState]:
    kills, events, state = decide(snapshot, policy, state)
    return events + enforce(kills, proc_root), state


def _kill(kill: Kill, procfs: ProcFS) -> str | None:
    """SIGKILL the judged process; a reason string when it was not done."""
    if kill.pid <= 1 or kill.pid == os.getpid():
        return f"pid {kill.pid} is never killed by the backstop"
    try:
        pidfd = os.pidfd_open(kill.pid)
    except ProcessLookupError:
        return f"pid {kill.pid} already gone"
    try:
        # The pidfd holds the process that had this pid when it was opened;
        # /proc still showing the judged start time proves it is the one.
        stat = procfs.stat(kill.pid)
        if stat is None or stat.start_time != kill.start_time:
            return f"pid {kill.pid} is another process now"
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return None
    except ProcessLookupError:
        return f"pid {kill.pid} exited first"
    finally:
        os.close(pidfd)
