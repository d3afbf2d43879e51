"""The scan tick: who runs in each vGPU, and the events that follow from it.

Each scan runs the tracker (off the event loop: it reads /proc), hands its
snapshot to the service (for the controller, and folded into the node's
snapshot for the answers), publishes arrivals and exits, OOMs (growth of a
device's oom_count) and throttling (a vGPU that starts or stops waiting in
the pacer), then runs the reaper and the backstop hook.
The counters' news is also read once more just before a vGPU is deleted.

The tracker's thread reads the blocks, and the loop reads them again after
it (events, reaper): the registry is pinned for the whole scan and for the
thread's life (even if the scan is cancelled), so a vGPU deleted meanwhile
keeps its blocks mapped until both let go (``Registry.pin``).
``Service.blocks_lock`` is held while the thread runs: the tracker's own
(standalone) blocks and a usage block's repair wait for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from vgpud.log import flush_tenant_lines
from vgpud.loops import repairs
from vgpud.observe.nvml import NvmlSample
from vgpud.observe.procfs import ProcFS
from vgpud.observe.tracker import Tracker, TrackSnapshot, VgpuBlocks
from vgpud.policy import backstop, reaper
from vgpud.surface import events as ev
from vgpud.surface.events import EventLog
from vgpud.surface.service import Service
from vgpud.threadname import name_this_thread
from vgpud.vgpus.blocks import UsageDevice
from vgpud.vgpus.registry import Entry

T = TypeVar("T")

REAPER_EVENTS = {
    "slot_reclaimed": ev.SLOT_RECLAIMED,
    "usage_reset": ev.USAGE_RESET,
    "usage_drift": ev.USAGE_DRIFT,
    "slot_stuck": ev.SLOT_STUCK,
    "counter_absurd": ev.COUNTER_ABSURD,
}


@dataclass(frozen=True)
class _Counters:
    devices: tuple[UsageDevice, ...]  # as read: the same tuple while no counter moves
    oom: tuple[int, ...]
    throttled: tuple[int, ...]


class Watch:
    def __init__(self, service: Service, events: EventLog, tracker: Tracker) -> None:
        self.service = service
        self.events = events
        self.tracker = tracker
        self.counters: dict[str, _Counters] = {}
        self.throttled: set[str] = set()
        self.reaper_state = reaper.ReaperState()
        self.backstop_state = backstop.BackstopState()
        self.procfs = ProcFS(service.config.proc_root)
        # A vGPU deleted between two scans (`vgpuctl run` deletes its vGPU
        # as soon as the command ends) would take its news with it.
        service.on_delete(self._counter_events)

    async def scan(self) -> TrackSnapshot:
        # Every block this scan reads stays mapped until it ends, whatever
        # is deleted meanwhile (a delete does not wait for a scan).
        with self.service.registry.pinned():
            return await self._scan()

    async def _scan(self) -> TrackSnapshot:
        entries = self.service.registry.all()
        views = {e.vgpu.id: VgpuBlocks(e.usage, e.control) for e in entries}
        snapshot = await self.in_thread(self._track, views, self.service.sample)
        self.service.track = snapshot
        # The fold just made while the snapshot is read (~1.5 ms of the
        # loop at 100 vGPUs and 1000 processes; unread, the first read
        # folds it) and the rest of the scan's loop work (~1 ms) are two
        # turns of the loop, not one: a request that came meanwhile is
        # answered between them.
        await asyncio.sleep(0)
        for p in snapshot.arrivals:
            self.events.publish(
                ev.PROCESS_STARTED,
                vgpu=p.vgpu_id,
                pid=p.pid,
                container_pid=p.ns_pid,
                kind=str(p.kind),
            )
        for p in snapshot.exits:
            self.events.publish(
                ev.PROCESS_EXITED, vgpu=p.vgpu_id, pid=p.pid, container_pid=p.ns_pid
            )
        for entry in entries:
            self._counter_events(entry)
        for gone in set(self.counters) - set(self.service.registry.entries):
            del self.counters[gone]
            self.throttled.discard(gone)
        drifted = self._reap(snapshot, views)
        self._backstop(snapshot)
        async with self.service.blocks_lock:  # no scan thread reads what we unmap
            repairs_done = self.service.registry.repair_usage()
        ev.publish_repairs(self.events, repairs_done)
        if drifted or repairs_done:  # the drift counters moved, or a vGPU has a new usage block
            self.service.refresh()
        flush_tenant_lines()  # the counts of tenants' lines held back, once their interval is up
        return snapshot

    def _track(self, views: dict[str, VgpuBlocks], sample: NvmlSample | None) -> TrackSnapshot:
        name_this_thread("vgpud-scan")  # a pool's thread, named for what it does now
        return self.tracker.scan(views, sample)

    def _reap(self, snapshot: TrackSnapshot, views: dict[str, VgpuBlocks]) -> bool:
        """Dead processes' bytes back to their vGPUs (within this scan);
        whether a budget was realigned (usage.drift)."""
        memory = {g.uuid: g.memory_total for g in self.service.devices()}
        found, self.reaper_state = repairs.reap(
            snapshot,
            views,
            self.reaper_state,
            reaper.ReaperPolicy(physical_memory=memory),
            halted=lambda pid: self._halted(snapshot, pid),
        )
        for e in found:
            if e.kind == "usage_drift":
                self.service.drift_repairs += 1
                self.service.drift_bytes += sum(abs(b) for b in e.freed)
            self.events.publish(
                REAPER_EVENTS.get(e.kind, e.kind),
                vgpu=e.vgpu_id,
                slot=e.slot,
                container_pid=e.pid,
                freed=list(e.freed),
                message=e.detail,
            )
        return any(e.kind == "usage_drift" for e in found)

    def _backstop(self, snapshot: TrackSnapshot) -> None:
        """NVML's figures against the limits; report or kill as configured."""
        config = self.service.config
        policy = backstop.BackstopPolicy(config.backstop, config.backstop_tolerance_bytes)
        found, self.backstop_state = repairs.check(
            snapshot, policy, self.backstop_state, config.proc_root
        )
        for e in found:
            self.events.publish(
                ev.BACKSTOP,
                vgpu=e.vgpu_id,
                gpu=e.uuid,
                pid=e.pid,
                action=e.kind,
                nvml_used=e.nvml_used,
                limit=e.limit,
                message=e.detail,
            )

    def _halted(self, snapshot: TrackSnapshot, pid: int) -> bool:
        """Stopped (SIGSTOP, a debugger) or frozen (a paused container's
        cgroup v2 freezer): such a process may sit between the hook's two
        steps for any time. Asked only of the holders of a vGPU whose
        budget is about to be realigned; what cannot be read counts as
        halted (the repair waits)."""
        try:
            stat = self.procfs.stat(pid)
        except OSError:
            return True
        if stat is None or stat.state in ("T", "t"):
            return True
        process = snapshot.processes.get(pid)
        if process is None:
            return True
        config = self.service.config
        cgroup = process.container.cgroup_path.lstrip("/")
        try:
            events = (Path(config.cgroup_root) / cgroup / "cgroup.events").read_text()
        except OSError:
            return False  # no cgroup v2 freezer here
        return "frozen 1" in events.splitlines()

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on a worker thread while holding the blocks lock and a
        registry pin until the thread is done, whatever happens to the
        awaiting task."""
        lock = self.service.blocks_lock
        registry = self.service.registry
        await lock.acquire()
        registry.pin()  # the thread's own: a cancelled scan lets go of its pin early

        def done(_: object) -> None:
            registry.unpin()
            lock.release()

        try:
            future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        except BaseException:
            done(None)
            raise
        future.add_done_callback(done)
        return await asyncio.shield(future)

    def _counter_events(self, entry: Entry) -> None:
        v = entry.vgpu
        devices = entry.usage.devices()
        before = self.counters.get(v.id)
        if before is not None and before.devices is devices:  # no counter moved
            if v.id in self.throttled:
                self.events.publish(ev.THROTTLED, vgpu=v.id, throttled=False)
                self.throttled.discard(v.id)
            return
        now = _Counters(
            devices, tuple(d.oom_count for d in devices), tuple(d.throttled_ns for d in devices)
        )
        self.counters[v.id] = now
        if before is None:
            if v.created_at < self.service.started:
                return  # adopted: what happened before this daemon is not news
            zeros = (0,) * len(devices)
            before = _Counters((), zeros, zeros)  # created since we started: all of it is news
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
