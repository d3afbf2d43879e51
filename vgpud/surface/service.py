"""What the API does, apart from HTTP: the daemon's state as answers.

Holds the registry, the GPU gateway and the latest measurements; the daemon
loops refresh the measurements, the API reads them. Handlers get a Service
and nothing global.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from vgpud.config import Config
from vgpud.errors import Conflict, Forbidden, Unprocessable
from vgpud.observe.nvml import NvmlSample
from vgpud.observe.tracker import TrackedProcess, TrackSnapshot, VgpuUse
from vgpud.policy import placement
from vgpud.policy.placement import Rules
from vgpud.surface import events as ev
from vgpud.surface.events import EventLog
from vgpud.units import parse_memory, percent_to_ppm, ppm_to_percent
from vgpud.vgpus import recipe
from vgpud.vgpus.blocks import UsageDevice
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

T = TypeVar("T")

RENDERED_MAX = 256  # rendered answers kept per view (one per route and query string)
# How stale a figure an answer may show: NVML's per-process samples are
# 200 ms apart anyway, and reading 100 vGPUs' blocks costs a millisecond.
RENDER_MAX_AGE = 0.2


class SliceFigures(NamedTuple):
    """One GPU of a daemon-owned vGPU as its blocks and NVML show it (a
    tuple: made for 100 vGPUs at every view, and compared as fast)."""

    uuid: str
    gpu_index: int
    memory_limit: int
    memory_used: int
    memory_peak: int
    oom_count: int
    gpu_time_ns: int
    throttled_ns: int
    quota_ppm: int
    share_ppm: int
    utilization: float | None  # NVML, summed over its processes
    processes: int  # its processes NVML listed on this GPU at the last scan

    def to_json(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.gpu_index,
            "memory_limit": self.memory_limit,
            "memory_used": self.memory_used,
            "memory_peak": self.memory_peak,
            "oom_count": self.oom_count,
            "gpu_time_ns": self.gpu_time_ns,
            "throttled_ns": self.throttled_ns,
            "quota_ppm": self.quota_ppm,
            "utilization": self.utilization,
            "processes": self.processes,
        }


@dataclass(frozen=True)
class VgpuFigures:
    """What changes of a daemon-owned vGPU between two changes of its
    definition: the API's answer and /metrics are both rendered from it."""

    processes: int  # slots ACTIVE now
    gpus: tuple[SliceFigures, ...]


class View:
    """The daemon's state as the read routes show it: one immutable view
    per state, shared by every route and /metrics.

    A change (through the API, or a new scan) ends a view at once; a loop's
    tick (new NVML figures, quotas and counters, ten times a second) ends it
    once it is RENDER_MAX_AGE old. A vGPU's figures are read from its blocks
    once per view, when first asked for; an answer is rendered once per view.
    """

    def __init__(self, changes: int, ticks: int, at: float) -> None:
        self.changes = changes
        self.ticks = ticks
        self.at = at  # time.monotonic() when made
        # Each vGPU's figures, with the usage block's counters they were read
        # from (UsageBlock.devices() answers the same tuple while its words
        # are unchanged).
        self.vgpus: dict[str, tuple[tuple[UsageDevice, ...], VgpuFigures]] = {}
        self.rendered: dict[Hashable, bytes] = {}

    def current(self, changes: int, ticks: int, now: float) -> bool:
        return changes == self.changes and (ticks == self.ticks or now - self.at < RENDER_MAX_AGE)


@dataclass(frozen=True)
class _Static:
    """The part of a vGPU's answer that changes only with its definition,
    serialised once: the JSON before its "gpus" and after its "processes"."""

    vgpu: Vgpu
    paths: recipe.Paths
    head: bytes
    tail: bytes


@dataclass(frozen=True)
class _Body:
    static: _Static
    figures: VgpuFigures
    body: bytes


STANDALONE_READ_ONLY = "standalone vGPU: its limits come from the container's environment"


class GpuInventory(Protocol):
    """The part of nvml.NvmlGateway / NullNvml the API reads."""

    def devices(self) -> Sequence[Any]: ...
    def topology(self, uuid_a: str, uuid_b: str) -> int | None: ...


@dataclass(frozen=True)
class GpuFigures:
    """The latest NVML figures of one GPU (None: not known)."""

    memory_used: int | None = None
    utilization: float | None = None
    process_util: dict[int, float] | None = None


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
        # The read routes render the daemon's state, not one answer per
        # request (64 clients listing 100 vGPUs must not rebuild it 64
        # times): a change (``changed``: through the API, or a new scan) makes
        # every answer stale at once; the loops' ticks (``ticked``: new NVML
        # figures, new quotas and counters, ten times a second) make them
        # stale once they are RENDER_MAX_AGE old.
        self._changes = 0
        self._ticks = 0
        self._view = View(-1, -1, 0.0)
        # Serialised once per definition / per set of figures / per tracked
        # process (the tracker hands back the same object while it is unchanged).
        self._static: dict[str, _Static] = {}
        self._bodies: dict[str, _Body] = {}
        self._processes: dict[int, tuple[TrackedProcess, bytes]] = {}
        self._figures: dict[str, GpuFigures] = {}  # by GPU uuid, from the sampler
        self._sample: NvmlSample | None = None  # the sampler's latest
        self._track: TrackSnapshot | None = None  # the last scan
        # Budgets the reaper set back to their slots' sum (usage.drift events).
        self.drift_repairs = 0
        self.drift_bytes = 0
        # Held while the scan's thread reads the blocks: the tracker's own
        # (standalone) blocks and a usage block's repair wait for it.
        self.blocks_lock = asyncio.Lock()
        # Looks at a vGPU's blocks before a delete unmaps them (Watch's last
        # look at its counters: an OOM since the last scan is still news).
        self._before_delete: Callable[[Entry], None] = lambda _entry: None

    def on_delete(self, hook: Callable[[Entry], None]) -> None:
        """``hook(entry)`` runs before each delete, while the blocks are mapped."""
        self._before_delete = hook

    # --- the state the answers are rendered from -------------------------------

    @property
    def figures(self) -> dict[str, GpuFigures]:
        return self._figures

    @figures.setter
    def figures(self, value: dict[str, GpuFigures]) -> None:
        self._figures = value
        self.ticked()

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
        self.changed()  # who runs where: shown from the scan that found it

    def changed(self) -> None:
        """vGPUs or processes changed: every answer rendered before is stale."""
        self._changes += 1

    def ticked(self) -> None:
        """A loop moved the figures on (NVML's, the blocks' counters, the
        quotas): answers rendered before are stale once RENDER_MAX_AGE old."""
        self._ticks += 1

    def view(self) -> View:
        """The current view (see View): a new one after a change, or after
        a tick once the last is RENDER_MAX_AGE old."""
        now = time.monotonic()
        if not self._view.current(self._changes, self._ticks, now):
            self._view = View(self._changes, self._ticks, now)
        return self._view

    def rendered(self, key: Hashable, build: Callable[[], bytes]) -> bytes:
        """The body of a read route, built at most once per view."""
        answers = self.view().rendered
        body = answers.get(key)
        if body is None:
            body = build()
            if len(answers) >= RENDERED_MAX:  # keys carry query strings: bounded
                answers.clear()
            answers[key] = body
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

    # --- views ------------------------------------------------------------------

    def processes_body(self) -> bytes:
        """The last scan's processes as JSON; each process serialised once
        while the tracker hands back the same object for it."""
        track = self.track
        known, parts = self._processes, []
        fresh: dict[int, tuple[TrackedProcess, bytes]] = {}
        for pid, p in (track.processes if track is not None else {}).items():
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

    def standalone_vgpus(self) -> list[VgpuUse]:
        """The standalone vGPUs the last scan adopted (env-limited containers)."""
        track = self.track
        return [] if track is None else [u for u in track.vgpus.values() if u.standalone]

    def standalone(self, key: str) -> VgpuUse | None:
        use = self.track.vgpus.get(key) if self.track is not None else None
        return use if use is not None and use.standalone else None

    def refuse_standalone(self, key: str) -> None:
        """A standalone vGPU is read-only: nothing of it is the daemon's to change."""
        if self.registry.entries.get(key) is None and self.standalone(key) is not None:
            raise Conflict(STANDALONE_READ_ONLY)

    def find_body(self, key: str) -> bytes:
        """One vGPU's answer by id or name, daemon-owned or standalone."""
        use = self.standalone(key) if key not in self.registry.entries else None
        if use is not None:
            return json.dumps(self.standalone_json(use)).encode()
        return self.vgpu_body(self.registry.get(key))

    def list_body(self, gpu: str | None, label: str | None, owner_pod: str | None) -> bytes:
        parts = [
            self.vgpu_body(e) for e in self.registry.all() if self.matches(e, gpu, label, owner_pod)
        ]
        if label is None and owner_pod is None:  # a standalone vGPU has neither
            index = {g.uuid: str(g.index) for g in self.gpus.devices()}
            parts += [
                json.dumps(self.standalone_json(u)).encode()
                for u in self.standalone_vgpus()
                if gpu is None or any(gpu in (uuid, index.get(uuid)) for uuid in u.gpus)
            ]
        return _json_list(parts)

    def standalone_json(self, use: VgpuUse) -> dict[str, Any]:
        """What the last scan read of an adopted standalone vGPU's usage block:
        the environment's limits (memory per GPU, share), counters, processes."""
        index = {g.uuid: g.index for g in self.gpus.devices()}
        gpus = []
        shares = []
        for uuid, g in use.gpus.items():
            c = g.counters
            # share_ppm 0: the environment set no compute limit (the whole GPU).
            share = ppm_to_percent(c.share_ppm) if c is not None and c.share_ppm else 100
            shares.append(share)
            gpus.append(
                {
                    "uuid": uuid,
                    "index": index.get(uuid),
                    "memory_limit": g.limit,
                    "memory_used": g.hooked_used,
                    "memory_peak": c.peak if c is not None else 0,
                    "oom_count": c.oom_count if c is not None else 0,
                    "gpu_time_ns": c.gpu_time_ns if c is not None else 0,
                    "throttled_ns": c.throttled_ns if c is not None else 0,
                    "quota_ppm": g.steered_ppm or 0,
                    "share": share,
                    "utilization": self.vgpu_utilization(use.vgpu_id, uuid),
                    "processes": g.processes,
                }
            )
        return {
            "id": use.vgpu_id,
            "kind": "standalone",
            "name": None,
            "share": max(shares, default=100),
            "mode": "hard",  # a standalone hook enforces even a soft limit as hard
            "gpus": gpus,
            "processes": use.live_slots,
            "pids": list(use.pids),
        }

    def vgpu_json(self, entry: Entry) -> dict[str, Any]:
        """A daemon-owned vGPU's answer as an object (create and update add to it)."""
        answer: dict[str, Any] = json.loads(self.vgpu_body(entry))
        return answer

    def vgpu_body(self, entry: Entry) -> bytes:
        """A daemon-owned vGPU's answer: the definition's part serialised
        once, the figures' part once per change of its figures."""
        v = entry.vgpu
        figures = self.vgpu_figures(entry)
        static = self._static.get(v.id)
        if static is None or static.vgpu is not v or static.paths is not entry.paths:
            static = self._static[v.id] = _static(entry, self.driver_env)
            self._static = _pruned(self._static, self.registry.entries)
        known = self._bodies.get(v.id)
        if known is not None and known.static is static and known.figures == figures:
            return known.body
        body = b"".join(
            (
                static.head,
                json.dumps([g.to_json() for g in figures.gpus]).encode(),
                b', "processes": %d, ' % figures.processes,
                static.tail,
            )
        )
        self._bodies[v.id] = _Body(static, figures, body)
        self._bodies = _pruned(self._bodies, self.registry.entries)
        return body

    def vgpu_figures(self, entry: Entry) -> VgpuFigures:
        """The vGPU's figures in the current view. Its usage counters are
        always the block's latest (reading them is cheap, and a peak or an
        OOM written just before a process exits must show in the next GET);
        the rest is read once per view."""
        view = self.view()
        v = entry.vgpu
        counters = entry.usage.devices()
        known = view.vgpus.get(v.id)
        if known is not None and known[0] is counters:
            return known[1]
        share_ppm = percent_to_ppm(v.limits.share)
        figures = VgpuFigures(
            processes=self.process_count(entry),
            gpus=tuple(
                SliceFigures(
                    uuid=s.gpu_uuid,
                    gpu_index=s.gpu_index,
                    memory_limit=s.memory,
                    memory_used=u.used,
                    memory_peak=u.peak,
                    oom_count=u.oom_count,
                    gpu_time_ns=u.gpu_time_ns,
                    throttled_ns=u.throttled_ns,
                    quota_ppm=entry.control.read_throttle(i).quota_ppm,
                    share_ppm=share_ppm,
                    utilization=self.vgpu_utilization(v.id, s.gpu_uuid),
                    processes=self.vgpu_gpu_processes(v.id, s.gpu_uuid),
                )
                for i, (s, u) in enumerate(zip(v.slices, counters, strict=True))
            ),
        )
        view.vgpus[v.id] = (counters, figures)
        return figures

    def vgpu_gpu_processes(self, vgpu_id: str, uuid: str) -> int:
        """The vGPU's processes that NVML listed on one of its GPUs at the
        last scan (0 before the first)."""
        use = self.track.vgpus.get(vgpu_id) if self.track is not None else None
        gpu = use.gpus.get(uuid) if use is not None else None
        return gpu.processes if gpu is not None else 0

    def vgpu_utilization(self, vgpu_id: str, uuid: str) -> float | None:
        figures = self.figures.get(uuid)
        if figures is None or figures.process_util is None:
            return None
        use = self.track.vgpus.get(vgpu_id) if self.track is not None else None
        per_pid = figures.process_util
        pids = use.pids if use is not None else ()
        return round(sum(per_pid[pid] for pid in pids if pid in per_pid), 1)

    def matches(
        self, entry: Entry, gpu: str | None, label: str | None, owner_pod: str | None
    ) -> bool:
        v = entry.vgpu
        if gpu is not None and not any(gpu in (s.gpu_uuid, str(s.gpu_index)) for s in v.slices):
            return False
        if label is not None:
            key, _, value = label.partition("=")
            if v.labels.get(key) != value:
                return False
        return owner_pod is None or v.owner.get("pod_uid") == owner_pod

    def devices_json(self) -> list[dict[str, Any]]:
        on_gpu: dict[str, list[str]] = {}
        for e in self.registry.all():
            for uuid in e.vgpu.uuids:
                on_gpu.setdefault(uuid, []).append(e.vgpu.id)
        out = []
        for g in self.gpus.devices():
            f = self.figures.get(g.uuid, GpuFigures())
            out.append(
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "memory_total": g.memory_total,
                    "memory_used": f.memory_used,
                    "sms": getattr(g, "sms", None),
                    "compute_capability": getattr(g, "compute_capability", None),
                    "utilization": f.utilization,
                    "mig_mode": bool(g.mig_mode),
                    "healthy": g.healthy,
                    "health_reason": getattr(g, "health_reason", None),
                    "vgpus": on_gpu.get(g.uuid, []),
                }
            )
        return out

    def health_json(self) -> dict[str, Any]:
        devices = self.gpus.devices()
        return {
            "status": "ok",
            "version": _version(),
            "uptime_s": round(time.time() - self.started, 3),
            "gpus": len(devices),
            "gpus_unhealthy": sum(1 for g in devices if not g.healthy),
            "vgpus": len(self.registry.entries),
            "nvml": bool(getattr(self.gpus, "available", True)),
            "driver_version": getattr(self.gpus, "driver_version", None),
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
        "container": {
            "runtime": str(ref.runtime),
            "id": ref.container_id,
            "pod_uid": ref.pod_uid,
            "cgroup": ref.cgroup_path,
        },
    }


def _static(entry: Entry, driver_env: Mapping[str, str]) -> _Static:
    """A vGPU's definition, recipes included, as the JSON around its figures
    (the same bytes json.dumps gives the whole answer: key order kept)."""
    v = entry.vgpu
    head = {
        "id": v.id,
        "kind": "managed",
        "name": v.name,
        "created_at": v.created_at,
        "memory": v.limits.memory.to_json(),
        "share": v.limits.share,
        "mode": v.limits.mode,
        "weight": v.limits.weight,
        "oversubscribe": v.oversubscribe,
        "exclusive": v.exclusive,
        "labels": dict(v.labels),
        "owner": dict(v.owner),
        "user": {"uid": v.user.uid, "gid": v.user.gid},
    }
    tail = {
        "recipe": recipe.container_recipe(v, entry.paths),
        "host_env": recipe.host_env(v, entry.paths, driver_env),
    }
    return _Static(
        v,
        entry.paths,
        json.dumps(head)[:-1].encode() + b', "gpus": ',
        json.dumps(tail)[1:].encode(),
    )


def _pruned(cache: dict[str, T], live: Mapping[str, object]) -> dict[str, T]:
    """``cache`` without the vGPUs deleted since, once they are as many as
    the live ones (amortised: a churn of creates and deletes stays bounded)."""
    if len(cache) <= 2 * len(live) + 16:
        return cache
    return {key: value for key, value in cache.items() if key in live}


def _json_list(parts: Sequence[bytes]) -> bytes:
    """A JSON array of serialised items, as json.dumps writes one."""
    return b"[" + b", ".join(parts) + b"]"


def _version() -> str:
    from vgpud import __version__

    return __version__
