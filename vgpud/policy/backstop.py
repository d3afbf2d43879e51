"""The memory backstop: NVML's truth against a vGPU's limit.

The usage block is the container's word. A process that bypassed the hook
(no LD_PRELOAD, a static binary, a raw ioctl) allocates without touching it;
NVML still sees the bytes. When the NVML per-process figures summed over a
vGPU's processes pass its limit by more than a tolerance, the backstop
reports it and, if configured, kills the offender.

Public interface
----------------
``BackstopPolicy(action="report"|"kill", tolerance=bytes, confirm_scans=2)``
    (bad values raise ValueError with the reason).
``decide(snapshot, policy, state) -> (kills, events, state)``
    Pure. Start with ``BackstopState()``. The scan carries the kills out
    (``vgpud.loops.repairs``: ``enforce``, and ``check``, the two in a row).
``BackstopEvent``: frozen; ``kind`` is ``over_limit``, ``killed`` or
``kill_skipped``.

The offender, on each GPU over its limit: a process the host puts in the
vGPU (docs/tracking.md, "Evidence") that holds no slot the host confirms —
no hook, a hook told to look elsewhere, a forged slot — the one with the
most memory; else the process with the most memory the hook does not
account for (NVML's figure minus its slot's bytes). A kill needs the
violation to last ``confirm_scans`` scans in a row (one sample can be
caught between a driver allocation and the hook's overhead charge). Pid 1
and the daemon itself are never killed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from vgpud.observe.tracker import ProcessKind, TrackedProcess, TrackSnapshot

ACTIONS = ("report", "kill")


@dataclass(frozen=True)
class BackstopPolicy:
    action: str = "report"
    tolerance: int = 64 << 20  # bytes NVML may exceed the limit by
    confirm_scans: int = 2

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"backstop action {self.action!r}: expected one of {ACTIONS}")
        if self.tolerance < 0:
            raise ValueError(f"backstop tolerance {self.tolerance}: must be >= 0 bytes")
        if self.confirm_scans < 1:
            raise ValueError(f"backstop confirm_scans {self.confirm_scans}: must be >= 1")


@dataclass(frozen=True)
class Kill:
    pid: int
    start_time: int
    vgpu_id: str
    uuid: str
    reason: str


@dataclass(frozen=True)
class BackstopEvent:
    kind: str
    vgpu_id: str
    uuid: str
    detail: str
    pid: int | None = None
    nvml_used: int | None = None
    limit: int | None = None


@dataclass(frozen=True)
class BackstopState:
    over: Mapping[tuple[str, str], int] = field(default_factory=dict)  # scans in a row


def decide(
    snapshot: TrackSnapshot, policy: BackstopPolicy, state: BackstopState
) -> tuple[list[Kill], list[BackstopEvent], BackstopState]:
    kills: list[Kill] = []
    events: list[BackstopEvent] = []
    over: dict[tuple[str, str], int] = {}
    by_vgpu: dict[str, list[TrackedProcess]] | None = None  # grouped once, if any is over
    for vgpu_id, use in snapshot.vgpus.items():
        for uuid, gpu in use.gpus.items():
            if gpu.limit is None or gpu.nvml_used <= gpu.limit + policy.tolerance:
                continue
            scans = over[(vgpu_id, uuid)] = state.over.get((vgpu_id, uuid), 0) + 1
            may_kill = policy.action == "kill" and scans >= policy.confirm_scans
            if scans > 1 and not may_kill:
                continue  # reported at its first scan over, and not to be killed
            if by_vgpu is None:
                by_vgpu = _by_vgpu(snapshot.processes.values())
            offender = _offender(by_vgpu.get(vgpu_id, []), uuid)
            if scans == 1:
                events.append(
                    BackstopEvent(
                        "over_limit",
                        vgpu_id,
                        uuid,
                        f"NVML sees {gpu.nvml_used} bytes on {uuid}, limit {gpu.limit} "
                        f"(+{policy.tolerance} tolerance), the hook accounts {gpu.hooked_used}; "
                        + _blame(offender),
                        None if offender is None else offender.pid,
                        gpu.nvml_used,
                        gpu.limit,
                    )
                )
            if may_kill and offender is not None:
                kills.append(
                    Kill(
                        offender.pid,
                        offender.start_time,
                        vgpu_id,
                        uuid,
                        f"vGPU {vgpu_id} over its limit on {uuid}: {gpu.nvml_used} > {gpu.limit}",
                    )
                )
    return _unique(kills), events, BackstopState(over=over)


def _unaccounted(p: TrackedProcess, uuid: str) -> int:
    return p.memory.get(uuid, 0) - p.hooked.get(uuid, 0)


def _by_vgpu(processes: Iterable[TrackedProcess]) -> dict[str, list[TrackedProcess]]:
    """Each vGPU's processes, in the snapshot's order (an offender is looked
    for on every GPU over its limit: not a pass over all processes each)."""
    out: dict[str, list[TrackedProcess]] = {}
    for p in processes:
        if p.vgpu_id is not None:
            out.setdefault(p.vgpu_id, []).append(p)
    return out


def _offender(processes: Iterable[TrackedProcess], uuid: str) -> TrackedProcess | None:
    """Among one vGPU's processes, the one to blame on ``uuid`` (see above)."""
    mine = [p for p in processes if p.memory.get(uuid, 0) > 0 and p.kind is not ProcessKind.EXITED]
    # Whoever holds no slot the host confirms bypassed the hook's budget,
    # whatever its environment says (no hook, a stripped one, a forged slot).
    unslotted = [p for p in mine if p.slot is None]
    if unslotted:
        return max(unslotted, key=lambda p: p.memory[uuid])
    worst = max(mine, key=lambda p: _unaccounted(p, uuid), default=None)
    return worst if worst is not None and _unaccounted(worst, uuid) > 0 else None


def _blame(offender: TrackedProcess | None) -> str:
    if offender is None:
        return "no process to blame"
    return (
        f"offender pid {offender.pid} ({offender.comm}, {offender.kind}, {offender.container.key})"
    )


def _unique(kills: list[Kill]) -> list[Kill]:
    seen: set[int] = set()
    out = []
    for kill in kills:
        if kill.pid not in seen:
            seen.add(kill.pid)
            out.append(kill)
    return out
