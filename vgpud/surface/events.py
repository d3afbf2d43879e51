"""The event log behind GET /v1/events: numbered, bounded, resumable.

Every event gets the next sequence number; the last ``capacity`` are kept so
a client can resume with ?since=<seq>. Followers wait on an asyncio.Event
that each publish sets and replaces (no polling).

A reader is told when events after its ``since`` are gone (``read``): an
``events.lost`` notice, never stored, in the place of the newest lost
event, with how many after ``since`` it will not get. Its place makes it
right with two rings, where one ring may still hold events older than
those the other lost: everything before the notice and after it is all
that is kept, so a client that resumes after the notice's seq misses
nothing kept, and one that drops what it has seen by seq keeps it.

Events of one process or one slot (``CHURN``) are kept in a ring of their
own, of the same capacity: their number is any tenant's to choose, and in
the one ring they pushed out every other event (a neighbour's OOM, a
backstop kill) before a follower resuming with ?since= read it
(docs/security.md). They are ``process.started`` and ``process.exited``
(every process that starts or ends on the GPU: a loop of short-lived
ones), ``slot.reclaimed`` (every slot the reaper takes back: a tenant
writes dead identities into its block's slots, 16 new ones a scan within
the evidence budget, or ends hooked processes in a loop) and
``slot.stuck`` (once per slot and identity left CLAIMING or RECLAIMING for
three scans: up to 256 every three scans, unbudgeted). What stays in the
main ring is bounded by the scan, per vGPU and GPU, whatever the tenant
does: ``oom`` and ``throttled`` (one per scan at most, from counters),
``usage.reset`` (one per scan), ``usage.drift`` (one per three scans),
``counter.absurd`` (once per episode: one every other scan at most),
``block.repaired`` (two per scan: grown, cut short), ``backstop`` (a
report or a kill per GPU and scan); the rest are the operator's or the
node's own.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from vgpud.vgpus.registry import Adoption, Repair

# Event types (the API documents them in openapi.json).
VGPU_CREATED = "vgpu.created"
VGPU_UPDATED = "vgpu.updated"
VGPU_DELETED = "vgpu.deleted"
VGPU_ADOPTED = "vgpu.adopted"
PROCESS_STARTED = "process.started"
PROCESS_EXITED = "process.exited"
OOM = "oom"
THROTTLED = "throttled"
BACKSTOP = "backstop"
SLOT_RECLAIMED = "slot.reclaimed"
SLOT_STUCK = "slot.stuck"
USAGE_RESET = "usage.reset"
USAGE_DRIFT = "usage.drift"
COUNTER_ABSURD = "counter.absurd"
GPU_HEALTH = "gpu.health"
BLOCK_REPAIRED = "block.repaired"
EVENTS_LOST = "events.lost"  # a reader's notice (``read``), never published

# Kept in a ring of their own: as many as the processes any tenant starts,
# or the slots it writes.
CHURN = frozenset({PROCESS_STARTED, PROCESS_EXITED, SLOT_RECLAIMED, SLOT_STUCK})


@dataclass(frozen=True)
class Event:
    seq: int
    time: float
    type: str
    vgpu: str | None = None
    gpu: str | None = None
    pid: int | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time,
            "type": self.type,
            "vgpu": self.vgpu,
            "gpu": self.gpu,
            "pid": self.pid,
            "detail": dict(self.detail),
        }


class EventLog:
    def __init__(self, capacity: int) -> None:
        self._events: deque[Event] = deque(maxlen=capacity)  # all but CHURN
        self._churn: deque[Event] = deque(maxlen=capacity)
        self._seq = 0
        self._lost_through = 0  # the newest seq either ring has let go
        self._wakeup = asyncio.Event()
        self._closed = False

    @property
    def last_seq(self) -> int:
        return self._seq

    def publish(
        self,
        type_: str,
        *,
        vgpu: str | None = None,
        gpu: str | None = None,
        pid: int | None = None,
        **detail: Any,
    ) -> Event:
        self._seq += 1
        event = Event(self._seq, time.time(), type_, vgpu, gpu, pid, detail)
        ring = self._churn if type_ in CHURN else self._events
        if len(ring) == ring.maxlen:  # its oldest goes (the other may have let newer ones go)
            self._lost_through = max(self._lost_through, ring[0].seq)
        ring.append(event)
        self._wake()
        return event

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    def since(self, seq: int) -> list[Event]:
        """The kept events after ``seq``, oldest first: each ring's found
        by bisection, so a follower pays for what is new, not for the
        whole buffer."""
        rings = [_after(ring, seq) for ring in (self._events, self._churn)]
        if not rings[1]:
            return rings[0]
        if not rings[0]:
            return rings[1]
        return list(heapq.merge(*rings, key=lambda e: e.seq))

    def read(self, seq: int) -> list[Event]:
        """What a reader resuming after ``seq`` is sent: the kept events
        after it and, where some after it are gone, the ``events.lost``
        notice among them, with the seq of the newest lost event. Every
        event lost is at most that seq, so all after it are kept; and each
        seq after ``seq`` that is kept in neither ring is one lost.

        A ``seq`` past the last this daemon numbered is an earlier daemon's
        (each numbers from 1): the reader is resuming across a restart, and
        with nothing after it it would wait, unknowing, until this daemon's
        numbers passed it. It is told so (a notice numbered 0, ``lost``
        None: how many the restart took is not known) and sent every event
        kept."""
        if seq > self._seq:
            restarted = Event(0, time.time(), EVENTS_LOST, detail={"lost": None, "after": seq})
            return [restarted, *self.read(0)]
        kept = self.since(seq)
        through = self._lost_through
        if through <= seq:
            return kept
        lost = self._seq - max(seq, 0) - len(kept)
        notice = Event(through, time.time(), EVENTS_LOST, detail={"lost": lost, "after": seq})
        kept.insert(bisect.bisect_left(kept, through, key=lambda e: e.seq), notice)
        return kept

    async def follow(self, seq: int) -> AsyncIterator[Event]:
        """Events after ``seq`` (``read``), then each new one as it comes,
        until close(). A follower too slow for the rings is sent a notice
        of what fell out before it got there."""
        while not self._closed:
            batch = self.read(seq)
            for event in batch:
                yield event
                seq = event.seq
            if not batch:
                await self._wakeup.wait()

    def close(self) -> None:
        """Ends every follow() (at shutdown)."""
        self._closed = True
        self._wake()


def _after(ring: deque[Event], seq: int) -> list[Event]:
    """The events of ``ring`` (in ``seq`` order) after ``seq``."""
    if not ring or ring[-1].seq <= seq:
        return []
    new = len(ring) - bisect.bisect_right(ring, seq, key=lambda e: e.seq)
    return list(islice(reversed(ring), new))[::-1]


def publish_repairs(log: EventLog, repairs: Iterable[Repair]) -> None:
    for r in repairs:
        log.publish(BLOCK_REPAIRED, vgpu=r.vgpu, block=r.block, reason=r.reason)


def publish_adoption(log: EventLog, adoption: Adoption) -> None:
    """What a start found: the blocks it remade, then the vGPUs it serves."""
    publish_repairs(log, adoption.repairs)
    for v in adoption.adopted:
        log.publish(VGPU_ADOPTED, vgpu=v.id, name=v.name)
