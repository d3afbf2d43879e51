"""What the API does, apart from HTTP: the daemon's state as answers.

Holds the registry, the GPU gateway and the node's snapshot (snapshot.py):
the loops hand it their sources (a sample, a scan, a tick) and a change
through the API changes the registry, and each folds a new snapshot (a
change, once its answer is written: ``changed``); the read routes and
/metrics render from the snapshot alone. Handlers get a Service and
nothing global.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

from vgpud.config import Config
from vgpud.errors import Conflict, Forbidden, Unprocessable
from vgpud.observe.nvml import NvmlSample
from vgpud.observe.tracker import TrackedProcess, TrackSnapshot
from vgpud.policy import placement
from vgpud.policy.placement import Rules
from vgpud.surface import events as ev
from vgpud.surface.events import EventLog
from vgpud.surface.snapshot import Definition, NodeSnapshot, Sources, fold, managed
from vgpud.units import parse_memory
from vgpud.vgpus.model import (
    BlockUser,
    CreateRequest,
    Credentials,
    GpuLike,
    Limits,
    UpdateRequest,
    Vgpu,
)
from vgpud.vgpus.registry import Entry, Registry

# Rendered answers kept per snapshot (one per route and query string).
RENDERED_MAX = 256
# How stale a figure a control tick may leave the snapshot: NVML's
# per-process samples are 200 ms apart anyway, and reading 100 vGPUs'
# blocks costs most of a millisecond.
RENDER_MAX_AGE = 0.2
# How long after a read the ticks keep the snapshot that fresh, and a scan
# folds it at once. Unread, it is folded by the first read after a scan: a
# fold reads every vGPU's blocks and the scan's processes, ~1.7 ms of a
# core at 100 vGPUs and 1000 processes in the daemon (one a second is
# 0.17 % of a core), five a second would be ~0.4 %.
WATCHED_FOR = 2.0


STANDALONE_READ_ONLY = "standalone vGPU: its limits come from the container's environment"


class GpuInventory(Protocol):
    """The part of nvml.NvmlGateway / NullNvml the API reads."""

    def devices(self) -> Sequence[Any]: ...
    def topology(self, uuid_a: str, uuid_b: str) -> int | None: ...


class Service:
    def __init__(
        self,
        config: Config,
        registry: Registry,
        gpus: GpuInventory,
        events: EventLog,
        *,
        driver_env: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config
        # Added to every vGPU's host environment: the simulated driver's
        # place on a --sim daemon (recipe.sim_driver_env), nothing otherwise.
        self.driver_env = dict(driver_env or {})
        self.registry = registry
        self.gpus = gpus
        self.events = events
        self.started = time.time()
        self._sample: NvmlSample | None = None  # the sampler's latest
        self._track: TrackSnapshot | None = None  # the last scan
        self._quotas: Mapping[tuple[str, str], int] = {}  # the last control tick's
        # Budgets the reaper set back to their slots' sum (usage.drift events).
        self.drift_repairs = 0
        self.drift_bytes = 0
        # Held while the scan's thread reads the blocks: the tracker's own
        # (standalone) blocks and a usage block's repair wait for it.
        self.blocks_lock = asyncio.Lock()
        # Looks at a vGPU's blocks before a delete unmaps them (Watch's last
        # look at its counters: an OOM since the last scan is still news).
        self._before_delete: Callable[[Entry], None] = lambda _entry: None
        # The definitions of the vGPUs whose change was answered since the
        # last fold (``vgpu_body``): the next fold takes them in.
        self._made: dict[str, Definition] = {}
        # The node's state as every read route and /metrics show it
        # (snapshot.py): folded again whenever one of its sources changes,
        # never per request; each route's answer is rendered once per snapshot.
        self._snapshot = self._folded(None, reread=True)
        # A change through the API whose fold waits for its answer to be
        # sent (``changed``): folded then, or by the first read before that.
        self._unfolded = False
        # A scan whose fold waits for the next read: nobody was reading.
        self._unscanned = False
        self._read_at = -WATCHED_FOR  # time.monotonic() of the last read
        self._rendered_of = self._snapshot
        self._rendered: dict[Hashable, bytes] = {}
        # Each process of /v1/processes serialised once while the tracker
        # hands back the same object for it.
        self._processes: dict[int, tuple[TrackedProcess, bytes]] = {}

    def on_delete(self, hook: Callable[[Entry], None]) -> None:
        """``hook(entry)`` runs before each delete, while the blocks are mapped."""
        self._before_delete = hook

    # --- the snapshot the answers are rendered from ------------------------------

    @property
    def snapshot(self) -> NodeSnapshot:
        """The node's snapshot, every change through the API and the last
        scan in it."""
        if self._unscanned:
            self.refresh()
        elif self._unfolded:
            self._fold(reread=False)
        return self._snapshot

    @property
    def sample(self) -> NvmlSample | None:
        return self._sample

    @sample.setter
    def sample(self, value: NvmlSample | None) -> None:
        self._sample = value
        self.ticked()

    @property
    def track(self) -> TrackSnapshot | None:
        return self._track

    @track.setter
    def track(self, value: TrackSnapshot | None) -> None:
        self._track = value
        # Who runs where: shown from the scan that found it; folded now
        # while the snapshot is read, else by the first read.
        if time.monotonic() - self._read_at < WATCHED_FOR:
            self.refresh()
        else:
            self._unscanned = True

    def changed(self) -> None:
        """The registry changed (through the API): a new snapshot, in which
        only the vGPUs whose definition changed are read again, folded in
        the loop's next round (``call_soon``), or by the first read before
        that (``snapshot``). So the change's answer, written in this round,
        does not wait for the fold (~0.3 ms at 100 vGPUs), and no request
        read after it sees the node without the change. The changes of one
        save (``Registry._commit``) share one fold."""
        if not self._unfolded:
            self._unfolded = True
            asyncio.get_running_loop().call_soon(self._fold_changes)

    def _fold_changes(self) -> None:
        if self._unfolded:  # a read or a tick may have folded them already
            self._fold(reread=False)

    def refresh(self) -> None:
        """A scan, or the reaper's repairs: a new snapshot at once, every
        vGPU's blocks read again."""
        self._fold(reread=True)

    def ticked(self, quotas: Mapping[tuple[str, str], int] | None = None) -> None:
        """A tick moved the figures on (NVML's sample; the blocks' counters,
        and ``quotas``, those a control tick gave, by vGPU id and GPU uuid):
        a new snapshot once the current one is RENDER_MAX_AGE old, while
        the snapshot is read (WATCHED_FOR). The two ticks come fifteen
        times a second: folding at each would triple the folds and show
        nothing a reader could tell apart."""
        if quotas is not None:
            self._quotas = quotas
        now = time.monotonic()
        if now - self._snapshot.at >= RENDER_MAX_AGE and now - self._read_at < WATCHED_FOR:
            self.refresh()

    def shown(self) -> NodeSnapshot:
        """The snapshot, for an answer: the ticks keep it fresh while it is read."""
        self._read_at = time.monotonic()
        return self.snapshot

    def _fold(self, *, reread: bool) -> None:
        """A new snapshot; any fold takes in the changes waiting for one,
        one that reads the blocks again a scan waiting for one too."""
        self._unfolded = False
        self._unscanned = self._unscanned and not reread
        self._snapshot = self._folded(self._snapshot, reread=reread)

    def _folded(self, previous: NodeSnapshot | None, *, reread: bool) -> NodeSnapshot:
        sources = Sources(
            entries=self.registry.all(),
            devices=self.devices(),
            sample=self._sample,
            track=self._track,
            quotas=self._quotas,
            nvml=bool(getattr(self.gpus, "available", True)),
            driver_version=getattr(self.gpus, "driver_version", None),
            drift_repairs=self.drift_repairs,
            drift_bytes=self.drift_bytes,
            driver_env=self.driver_env,
            made=self._made,
        )
        self._made = {}  # each is an entry's that this fold takes in, or one deleted since
        version = previous.version + 1 if previous is not None else 0
        return fold(sources, previous, version, time.monotonic(), reread=reread)

    def rendered(self, key: Hashable, build: Callable[[], bytes]) -> bytes:
        """The body of a read route, built at most once per snapshot."""
        if self._rendered_of is not self.shown():
            self._rendered_of, self._rendered = self.snapshot, {}
        body = self._rendered.get(key)
        if body is None:
            body = build()
            if len(self._rendered) >= RENDERED_MAX:  # keys carry query strings: bounded
                self._rendered.clear()
            self._rendered[key] = body
        return body

    # --- rules ------------------------------------------------------------------

    def rules(self) -> Rules:
        c = self.config
        return Rules(
            c.placement_policy, c.allow_oversubscribe, c.memory_scaling, c.max_vgpus_per_gpu
        )

    def limits_for(self, req: CreateRequest) -> Limits:
        c = self.config
        return Limits(
            memory=req.memory or parse_memory(c.default_memory),
            share=req.share if req.share is not None else c.default_share,
            mode=req.mode or c.default_mode,
            weight=req.weight if req.weight is not None else c.default_weight,
        )

    def devices(self) -> list[GpuLike]:
        return list(self.gpus.devices())

    # --- changes ----------------------------------------------------------------

    async def create(self, req: CreateRequest, caller: Credentials) -> Entry:
        if req.exclusive and (req.memory is not None or req.share not in (None, 100)):
            raise Unprocessable("exclusive: the vGPU gets whole GPUs; leave memory and share out")
        where = placement.placer(req, self.devices(), self.rules(), self.gpus.topology)
        entry = await self.registry.create(
            req, self.limits_for(req), where, user=user_for(req.user, caller)
        )
        self.changed()
        v = entry.vgpu
        self.events.publish(ev.VGPU_CREATED, vgpu=v.id, name=v.name, gpus=v.uuids)
        return entry

    async def update(self, key: str, req: UpdateRequest) -> tuple[Entry, list[str]]:
        self.refuse_standalone(key)
        refit = placement.refitter(self.devices(), self.rules())
        try:
            done = await self.registry.update(key, req, refit)
        finally:
            self.changed()
        self.events.publish(ev.VGPU_UPDATED, vgpu=done.entry.vgpu.id, warnings=done.warnings)
        return done.entry, done.warnings

    async def delete(self, key: str, force: bool) -> Vgpu:
        # No wait for a running scan: the registry keeps the blocks mapped
        # until the scan lets go of them (Registry.pin).
        self.refuse_standalone(key)
        entry = self.registry.get(key)
        self._before_delete(entry)
        try:
            done = await self.registry.delete(key, force=force, processes=self.process_count(entry))
        finally:
            self.changed()
        self.events.publish(ev.VGPU_DELETED, vgpu=done.vgpu.id, forced=done.forced)
        return done.vgpu

    # --- answers, rendered from the snapshot -----------------------------------

    def processes_body(self) -> bytes:
        """The last scan's processes as JSON; each process serialised once
        while the tracker hands back the same object for it."""
        known, parts = self._processes, []
        fresh: dict[int, tuple[TrackedProcess, bytes]] = {}
        for pid, p in self.snapshot.processes.items():
            hit = known.get(pid)
            if hit is None or hit[0] is not p:
                hit = (p, json.dumps(process_json(p)).encode())
            fresh[pid] = hit
            parts.append(hit[1])
        self._processes = fresh
        return _json_list(parts)

    def process_count(self, entry: Entry) -> int:
        """Processes holding a slot now (a dead one's slot is reclaimed
        within one scan, so it does not block a delete for long)."""
        return entry.usage.active_slots()

    def refuse_standalone(self, key: str) -> None:
        """A standalone vGPU is read-only: nothing of it is the daemon's to change."""
        if self.registry.entries.get(key) is None and key in self.snapshot.standalone:
            raise Conflict(STANDALONE_READ_ONLY)

    def find_body(self, key: str) -> bytes:
        """One vGPU's answer by id or name, daemon-owned or standalone. A
        daemon-owned vGPU's usage counters are its block's latest (reading
        them is eight words per GPU, and a peak or an OOM written just
        before a process exits must show in the next GET); the rest is the
        snapshot's."""
        snap = self.shown()
        standalone = snap.standalone.get(key) if key not in snap.vgpus else None
        if standalone is not None:
            return standalone.body
        vgpu = snap.find(key)
        entry = self.registry.entries.get(vgpu.vgpu.id)
        counters = entry.usage.devices() if entry is not None else vgpu.counters
        return vgpu.body if counters is vgpu.counters else vgpu.with_counters(counters).body

    def list_body(self, gpu: str | None, label: str | None, owner_pod: str | None) -> bytes:
        snap = self.snapshot
        parts = [v.body for v in snap.vgpus.values() if v.matches(gpu, label, owner_pod)]
        if label is None and owner_pod is None:  # a standalone vGPU has neither
            parts += [u.body for u in snap.standalone.values() if u.on(gpu)]
        return _json_list(parts)

    def vgpu_json(self, entry: Entry) -> dict[str, Any]:
        """A daemon-owned vGPU's answer as an object (create and update add to it)."""
        answer: dict[str, Any] = json.loads(self.vgpu_body(entry))
        return answer

    def vgpu_body(self, entry: Entry) -> bytes:
        """A daemon-owned vGPU's answer to its change (create, update): as
        the snapshot that takes the change in shows it, rendered without
        waiting for that fold (``changed``)."""
        shown = self._snapshot.vgpus.get(entry.vgpu.id)
        if shown is not None and shown.vgpu is entry.vgpu:
            return shown.body
        # Kept for the fold that takes the change in (the next): made once,
        # not again there (~0.15 ms of a paced create's on the development VM).
        definition = self._made[entry.vgpu.id] = Definition.of(entry, self.driver_env)
        return managed(entry, definition, self._snapshot, self._quotas).body

    def devices_json(self) -> list[dict[str, Any]]:
        return [g.to_json() for g in self.snapshot.gpus]

    def health_json(self) -> dict[str, Any]:
        snap = self.snapshot
        return {
            "status": "ok",
            "version": _version(),
            "uptime_s": round(time.time() - self.started, 3),
            "gpus": len(snap.gpus),
            "gpus_unhealthy": sum(1 for g in snap.gpus if not g.healthy),
            "vgpus": len(snap.vgpus),
            "nvml": snap.nvml,
            "driver_version": snap.driver_version,
            "simulated": self.config.sim,
        }


def user_for(asked: BlockUser | None, caller: Credentials) -> BlockUser:
    """Who may write a new vGPU's usage block: the caller itself unless it
    asks otherwise. Only root may name another uid or group: a member of the
    socket group who could would hand a block to anyone (docs/api.md)."""
    if asked is None:
        return BlockUser(caller.uid)
    if caller.uid != 0 and (asked.uid != caller.uid or asked.gid not in (None, caller.gid)):
        raise Forbidden(
            f"user: only root may make a vGPU for another user or group "
            f"(you are uid {caller.uid}, gid {caller.gid})"
        )
    return asked


def process_json(p: TrackedProcess) -> dict[str, Any]:
    """A GPU process as /v1/processes lists it."""
    ref = p.container
    return {
        "host_pid": p.pid,
        "container_pid": p.ns_pid,  # the pid it sees for itself
        "vgpu": p.vgpu_id,
        "slot": p.slot,
        "kind": str(p.kind),
        "comm": p.comm,
        "memory": dict(p.memory),  # GPU uuid -> bytes (NVML)
        "hooked": dict(p.hooked),  # GPU uuid -> bytes its slot holds (the hook's word)
        "utilization": dict(p.sm_util),  # GPU uuid -> % (NVML)
        # The id is only what a cgroup's name says: anyone with a delegated
        # subtree names one after any container. The daemon's container is
        # the runtime and the cgroup so named (ContainerRef.key), shown so
        # that an operator does not take a spoofer's process for the victim's.
        "container": {
            "runtime": str(ref.runtime),
            "id": ref.container_id,
            "container_cgroup": ref.container_cgroup,
            "pod_uid": ref.pod_uid,
            "cgroup": ref.cgroup_path,
        },
    }


def _json_list(parts: Sequence[bytes]) -> bytes:
    """A JSON array of serialised items, as json.dumps writes one."""
    return b"[" + b", ".join(parts) + b"]"


def _version() -> str:
    from vgpud import __version__

    return __version__
