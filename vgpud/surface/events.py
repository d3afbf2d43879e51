"""The event log behind GET /v1/events: numbered, bounded, resumable.

Every event gets the next sequence number; the last ``capacity`` are kept so
a client can resume with ?since=<seq>. Followers wait on an asyncio.Event
that each publish sets and replaces (no polling).
"""

from __future__ import annotations

import asyncio
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
        self._events: deque[Event] = deque(maxlen=capacity)
        self._seq = 0
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
        self._events.append(event)
        self._wake()
        return event

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    def since(self, seq: int) -> list[Event]:
        """The kept events after ``seq``, oldest first. Numbers are
        consecutive, so they are the last ``last_seq - seq`` kept: a
        follower pays for what is new, not for the whole buffer."""
        new = min(max(self._seq - seq, 0), len(self._events))
        return list(islice(reversed(self._events), new))[::-1]

    async def follow(self, seq: int) -> AsyncIterator[Event]:
        """Events after ``seq``, then each new one as it comes, until close()."""
        while not self._closed:
            batch = self.since(seq)
            for event in batch:
                yield event
                seq = event.seq
            if not batch:
                await self._wakeup.wait()

    def close(self) -> None:
        """Ends every follow() (at shutdown)."""
        self._closed = True
        self._wake()


def publish_repairs(log: EventLog, repairs: Iterable[Repair]) -> None:
    for r in repairs:
        log.publish(BLOCK_REPAIRED, vgpu=r.vgpu, block=r.block, reason=r.reason)


def publish_adoption(log: EventLog, adoption: Adoption) -> None:
    """What a start found: the blocks it remade, then the vGPUs it serves."""
    publish_repairs(log, adoption.repairs)
    for v in adoption.adopted:
        log.publish(VGPU_ADOPTED, vgpu=v.id, name=v.name)
