"""The scan tick: who runs in each vGPU, and the events that follow from it.

Each scan lists the processes of every vGPU, publishes arrivals and exits,
OOMs (growth of a device's oom_count) and throttling (a vGPU that starts or
stops waiting in the pacer), and refreshes Service.processes for the API.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from vgpud import events as ev
from vgpud.blocks import SLOT_ACTIVE
from vgpud.events import EventLog
from vgpud.registry import Entry
from vgpud.service import ProcessView, Service


@dataclass(frozen=True)
class _Counters:
    oom: tuple[int, ...]
    throttled: tuple[int, ...]


def _own_pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


class Watch:
    def __init__(self, service: Service, events: EventLog) -> None:
        self.service = service
        self.events = events
        self.pidns = _own_pidns()
        self.counters: dict[str, _Counters] = {}
        self.throttled: set[str] = set()
        self.known: dict[tuple[str, int, int], ProcessView] = {}

    async def scan(self) -> None:
        views: list[ProcessView] = []
        for entry in self.service.registry.all():
            views.extend(self._processes(entry))
            self._counter_events(entry)
        self._arrivals_and_exits(views)
        self.service.processes = views
        gone = set(self.counters) - set(self.service.registry.entries)
        for vgpu_id in gone:
            del self.counters[vgpu_id]
            self.throttled.discard(vgpu_id)

    def _processes(self, entry: Entry) -> list[ProcessView]:
        v = entry.vgpu
        out = []
        for slot in entry.usage.slots():
            if slot.state != SLOT_ACTIVE:
                continue
            host_pid = entry.control.slot_host_pid(slot.index) or None
            if host_pid is None and slot.pidns == self.pidns:
                host_pid = slot.pid  # our own PID namespace: the same number
            util: dict[str, float] = {}
            for s in v.slices:
                figures = self.service.figures.get(s.gpu_uuid)
                known = figures.process_util if figures and figures.process_util else {}
                if host_pid in known:
                    util[s.gpu_uuid] = known[host_pid]
            out.append(
                ProcessView(
                    host_pid=host_pid,
                    container_pid=slot.pid,
                    vgpu=v.id,
                    slot=slot.index,
                    memory={
                        s.gpu_uuid: d.used for s, d in zip(v.slices, slot.devices, strict=False)
                    },
                    utilization=util,
                )
            )
        return out

    def _counter_events(self, entry: Entry) -> None:
        v = entry.vgpu
        devices = entry.usage.devices()
        now = _Counters(tuple(d.oom_count for d in devices), tuple(d.throttled_ns for d in devices))
        before = self.counters.get(v.id)
        self.counters[v.id] = now
        if before is None:
            return
        for s, old, new in zip(v.slices, before.oom, now.oom, strict=True):
            if new > old:
                self.events.publish(
                    ev.OOM, vgpu=v.id, gpu=s.gpu_uuid, refused=new - old, limit=s.memory
                )
        waiting = any(n > o for n, o in zip(now.throttled, before.throttled, strict=True))
        if waiting != (v.id in self.throttled):
            self.events.publish(ev.THROTTLED, vgpu=v.id, throttled=waiting)
            if waiting:
                self.throttled.add(v.id)
            else:
                self.throttled.discard(v.id)

    def _arrivals_and_exits(self, views: list[ProcessView]) -> None:
        current = {(p.vgpu, p.slot, p.container_pid): p for p in views}
        for key, p in current.items():
            if key not in self.known:
                self.events.publish(
                    ev.PROCESS_STARTED, vgpu=p.vgpu, pid=p.host_pid, container_pid=p.container_pid
                )
        for key, p in self.known.items():
            if key not in current:
                self.events.publish(
                    ev.PROCESS_EXITED, vgpu=p.vgpu, pid=p.host_pid, container_pid=p.container_pid
                )
        self.known = current
