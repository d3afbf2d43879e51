"""The node's state as every surface shows it: one immutable snapshot.

What the read routes and /metrics show comes from three sources: the
sample tick's NVML figures, the last scan (the tracker's processes and the
standalone vGPUs it adopted) and the registry's vGPUs with what their
blocks say (counters, quotas, live slots). ``fold`` folds them into one
``NodeSnapshot`` when one of them changes (the Service says when), never
per request, and the surfaces render from the snapshot alone: a figure that
the API and /metrics both show (a vGPU's utilization, quota, process count,
a GPU's vGPUs) is worked out once, here.

A snapshot is immutable: frozen dataclasses, tuples and read-only mappings.
What did not change is carried over from the previous snapshot as the same
object, so what was serialised of it (a vGPU's answer, kept on the object;
its metric lines, kept by metrics.py by identity) is not serialised again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, NamedTuple

from vgpud.errors import NotFound
from vgpud.observe.nvml import NvmlSample
from vgpud.observe.tracker import ProcessKind, TrackedProcess, TrackSnapshot, VgpuUse
from vgpud.units import percent_to_ppm, ppm_to_percent
from vgpud.vgpus import recipe
from vgpud.vgpus.blocks import UsageDevice
from vgpud.vgpus.model import GpuLike, Vgpu
from vgpud.vgpus.registry import Entry

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


class SliceFigures(NamedTuple):
    """One GPU of a vGPU as its blocks and NVML show it (a tuple: made for
    100 vGPUs at every snapshot, and compared as fast)."""

    uuid: str
    gpu_index: int | None  # None: a standalone vGPU's GPU that is not present
    memory_limit: int | None  # None: a standalone vGPU's environment set none
    memory_used: int
    memory_peak: int
    oom_count: int
    gpu_time_ns: int
    throttled_ns: int
    # The controller's quota now; a standalone vGPU's last steered (0: never).
    quota_ppm: int
    # The configured share; a standalone vGPU's environment's (0: none set).
    share_ppm: int
    utilization: float | None  # NVML, summed over its processes
    processes: int  # its processes NVML listed on this GPU at the last scan

    def to_json(self, standalone: bool = False) -> dict[str, Any]:
        """As the API shows it; a standalone vGPU's GPU with its share (%)."""
        out: dict[str, Any] = {
            "uuid": self.uuid,
            "index": self.gpu_index,
            "memory_limit": self.memory_limit,
            "memory_used": self.memory_used,
            "memory_peak": self.memory_peak,
            "oom_count": self.oom_count,
            "gpu_time_ns": self.gpu_time_ns,
            "throttled_ns": self.throttled_ns,
            "quota_ppm": self.quota_ppm,
        }
        if standalone:
            out["share"] = _share_percent(self.share_ppm)
        out["utilization"] = self.utilization
        out["processes"] = self.processes
        return out

    def with_counters(self, u: UsageDevice) -> SliceFigures:
        return self._replace(
            memory_used=u.used,
            memory_peak=u.peak,
            oom_count=u.oom_count,
            gpu_time_ns=u.gpu_time_ns,
            throttled_ns=u.throttled_ns,
        )


@dataclass(frozen=True)
class VgpuFigures:
    """What changes of a vGPU between two changes of its definition."""

    processes: int  # slots ACTIVE now
    gpus: tuple[SliceFigures, ...]


@dataclass(frozen=True, eq=False)
class Definition:
    """The part of a daemon-owned vGPU's answer that changes only with its
    definition, serialised once: the JSON before its "gpus" and after its
    "processes" (the registry replaces ``vgpu`` on an update)."""

    vgpu: Vgpu
    paths: recipe.Paths
    head: bytes
    tail: bytes

    @classmethod
    def of(cls, entry: Entry, driver_env: Mapping[str, str]) -> Definition:
        """The same bytes json.dumps gives the whole answer: key order kept."""
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
        return cls(
            v,
            entry.paths,
            json.dumps(head)[:-1].encode() + b', "gpus": ',
            json.dumps(tail)[1:].encode(),
        )

    @classmethod
    def reused(
        cls, made: Definition | None, entry: Entry, driver_env: Mapping[str, str]
    ) -> Definition:
        """``made`` when it is the entry's definition (the same vGPU and
        paths), else the entry's made now."""
        if made is not None and made.vgpu is entry.vgpu and made.paths is entry.paths:
            return made
        return cls.of(entry, driver_env)


@dataclass(frozen=True, eq=False)
class ManagedVgpu:
    """A daemon-owned vGPU: its definition and its figures."""

    definition: Definition
    counters: tuple[UsageDevice, ...]  # its usage block's, as read (the same tuple while unmoved)
    figures: VgpuFigures

    @property
    def vgpu(self) -> Vgpu:
        return self.definition.vgpu

    @cached_property
    def body(self) -> bytes:
        """Its answer, serialised on first use (once per object)."""
        d, f = self.definition, self.figures
        return b"".join(
            (
                d.head,
                json.dumps([g.to_json() for g in f.gpus]).encode(),
                b', "processes": %d, ' % f.processes,
                d.tail,
            )
        )

    def with_counters(self, counters: tuple[UsageDevice, ...]) -> ManagedVgpu:
        """The same vGPU with newer usage counters, the rest as folded."""
        gpus = tuple(g.with_counters(u) for g, u in zip(self.figures.gpus, counters, strict=True))
        return ManagedVgpu(self.definition, counters, VgpuFigures(self.figures.processes, gpus))

    def matches(self, gpu: str | None, label: str | None, owner_pod: str | None) -> bool:
        v = self.vgpu
        if gpu is not None and not any(gpu in (s.gpu_uuid, str(s.gpu_index)) for s in v.slices):
            return False
        if label is not None:
            key, _, value = label.partition("=")
            if v.labels.get(key) != value:
                return False
        return owner_pod is None or v.owner.get("pod_uid") == owner_pod


@dataclass(frozen=True, eq=False)
class StandaloneVgpu:
    """A standalone vGPU the last scan adopted (an env-limited container):
    its limits are the environment's, its figures what the scan read of its
    usage block (the scan owns those blocks: nothing else reads them)."""

    id: str
    pids: tuple[int, ...]
    figures: VgpuFigures

    @property
    def share(self) -> float:
        return max((_share_percent(g.share_ppm) for g in self.figures.gpus), default=100)

    @cached_property
    def body(self) -> bytes:
        answer = {
            "id": self.id,
            "kind": "standalone",
            "name": None,
            "share": self.share,
            "mode": "hard",  # a standalone hook enforces even a soft limit as hard
            "gpus": [g.to_json(standalone=True) for g in self.figures.gpus],
            "processes": self.figures.processes,
            "pids": list(self.pids),
        }
        return json.dumps(answer).encode()

    def on(self, gpu: str | None) -> bool:
        return gpu is None or any(gpu in (g.uuid, str(g.gpu_index)) for g in self.figures.gpus)


@dataclass(frozen=True)
class GpuState:
    """One GPU as /v1/devices and /metrics show it."""

    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int | None  # NVML's latest (None: not known)
    sms: int | None
    compute_capability: Any
    utilization: float | None
    mig_mode: bool
    healthy: bool
    health_reason: str | None
    vgpus: tuple[str, ...]  # the daemon-owned vGPUs placed on it
    # Processes on it that are in no daemon-owned vGPU (_outside_vgpus).
    processes_outside_vgpus: int

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memory_total": self.memory_total,
            "memory_used": self.memory_used,
            "sms": self.sms,
            "compute_capability": self.compute_capability,
            "utilization": self.utilization,
            "mig_mode": self.mig_mode,
            "healthy": self.healthy,
            "health_reason": self.health_reason,
            "vgpus": list(self.vgpus),
            "processes_outside_vgpus": self.processes_outside_vgpus,
        }


@dataclass(frozen=True, eq=False)
class NodeSnapshot:
    """The node's state, folded once per change of a source."""

    version: int
    at: float  # time.monotonic() when folded
    sample: NvmlSample | None
    track: TrackSnapshot | None
    gpus: tuple[GpuState, ...]
    vgpus: Mapping[str, ManagedVgpu]  # by id, oldest first
    names: Mapping[str, str]  # a named vGPU's id by its name
    standalone: Mapping[str, StandaloneVgpu]  # by id
    processes: Mapping[int, TrackedProcess]  # the last scan's, by host pid
    nvml: bool
    driver_version: str | None
    drift_repairs: int  # budgets the reaper set back to their slots' sum
    drift_bytes: int

    def find(self, key: str) -> ManagedVgpu:
        """A daemon-owned vGPU by id or name."""
        found = self.vgpus.get(key) or self.vgpus.get(self.names.get(key, ""))
        if found is None:
            raise NotFound(f"no vGPU {key!r}")
        return found


@dataclass(frozen=True)
class Sources:
    """What a snapshot is folded from, as the Service holds it."""

    entries: Sequence[Entry]  # the registry's, oldest first
    devices: Sequence[GpuLike]
    sample: NvmlSample | None
    track: TrackSnapshot | None
    # The quotas the last control tick gave, by (vGPU id, GPU uuid): what it
    # wrote into the control blocks, so not read back from them (a vGPU made
    # since, or before the first tick, has its control block read).
    quotas: Mapping[tuple[str, str], int]
    nvml: bool
    driver_version: str | None
    drift_repairs: int
    drift_bytes: int
    driver_env: Mapping[str, str]
    # Definitions made since the previous snapshot, by vGPU id: those that
    # the answers to changes before this fold were rendered from
    # (Service.vgpu_body).
    made: Mapping[str, Definition]


def fold(
    sources: Sources, previous: NodeSnapshot | None, version: int, at: float, *, reread: bool
) -> NodeSnapshot:
    """The snapshot of ``sources``. With ``reread`` every vGPU's blocks are
    read again (a tick, a sample, a scan); without (a change through the
    API), a vGPU whose definition did not change keeps its figures from
    ``previous``: only what changed is read, and NVML's figures and the
    scan are those of ``previous`` (what the figures kept were worked out
    from; a newer sample is shown from the next tick's fold)."""
    sample, track = sources.sample, sources.track
    if previous is not None and not reread:
        sample, track = previous.sample, previous.track
    known = previous.vgpus if previous is not None else _EMPTY
    utilization = _Utilization(sample, track, previous)
    vgpus: dict[str, ManagedVgpu] = {}
    for entry in sources.entries:
        v = entry.vgpu
        before = known.get(v.id)
        if before is None or before.vgpu is not v or before.definition.paths is not entry.paths:
            definition = Definition.reused(sources.made.get(v.id), entry, sources.driver_env)
            vgpus[v.id] = _managed(entry, definition, None, sources.quotas, utilization)
        elif reread:
            vgpus[v.id] = _managed(entry, before.definition, before, sources.quotas, utilization)
        else:
            vgpus[v.id] = before
    if (
        previous is not None
        and _same_objects(vgpus, previous.vgpus)
        and [g.uuid for g in previous.gpus] == [g.uuid for g in sources.devices]
    ):
        # The same vGPUs on the same GPUs as last time (most folds): their
        # index is the same.
        kept, names = previous.vgpus, previous.names
        by_gpu = {g.uuid: g.vgpus for g in previous.gpus}
    else:
        kept = MappingProxyType(vgpus)
        names = MappingProxyType({m.vgpu.name: i for i, m in vgpus.items() if m.vgpu.name})
        by_gpu = _by_gpu(vgpus)
    if previous is not None and previous.track is track:  # most folds: the same scan
        outside = {g.uuid: g.processes_outside_vgpus for g in previous.gpus}
    else:
        outside = _outside_vgpus(track)
    gpus = tuple(
        _gpu(g, sample, by_gpu.get(g.uuid, ()), outside.get(g.uuid, 0)) for g in sources.devices
    )
    return NodeSnapshot(
        version=version,
        at=at,
        sample=sample,
        track=track,
        gpus=gpus,
        vgpus=kept,
        names=names,
        standalone=_standalone(track, gpus, previous, utilization),
        processes=track.processes if track is not None else _EMPTY,
        nvml=sources.nvml,
        driver_version=sources.driver_version,
        drift_repairs=sources.drift_repairs,
        drift_bytes=sources.drift_bytes,
    )


def managed(
    entry: Entry,
    definition: Definition,
    previous: NodeSnapshot,
    quotas: Mapping[tuple[str, str], int],
) -> ManagedVgpu:
    """One daemon-owned vGPU whose definition changed, as the fold of a
    change through the API (``fold`` without ``reread``) after
    ``previous`` shows it: the change's answer, before that fold."""
    utilization = _Utilization(previous.sample, previous.track, previous)
    return _managed(entry, definition, None, quotas, utilization)


def _same_objects(now: Mapping[str, object], before: Mapping[str, object]) -> bool:
    return len(now) == len(before) and all(
        a is b for a, b in zip(now.values(), before.values(), strict=True)
    )


def _by_gpu(vgpus: Mapping[str, ManagedVgpu]) -> dict[str, tuple[str, ...]]:
    """The vGPUs on each GPU, by its uuid."""
    out: dict[str, list[str]] = {}
    for vgpu_id, m in vgpus.items():
        for s in m.vgpu.slices:
            out.setdefault(s.gpu_uuid, []).append(vgpu_id)
    return {uuid: tuple(ids) for uuid, ids in out.items()}


class _Utilization:
    """Each vGPU's share of a GPU as NVML's per-process figures show it, and
    its processes NVML listed at the last scan; and whether those may have
    changed since the previous snapshot."""

    def __init__(
        self, sample: NvmlSample | None, track: TrackSnapshot | None, previous: NodeSnapshot | None
    ) -> None:
        self._gpus = sample.gpus if sample is not None else _EMPTY
        self._vgpus = track.vgpus if track is not None else _EMPTY
        # The GPUs whose per-process figures moved (None: no previous
        # snapshot, every vGPU's may have), and the last scan's vGPUs (a
        # scan makes every VgpuUse anew, the same or not).
        self._moved: frozenset[str] | None = None
        self._was: Mapping[str, VgpuUse] = self._vgpus
        if previous is not None:
            was = previous.sample.gpus if previous.sample is not None else _EMPTY
            now = self._gpus
            self._moved = frozenset(
                uuid
                for uuid in now.keys() | was.keys()
                if uuid not in was
                or uuid not in now
                or was[uuid].process_util != now[uuid].process_util
            )
            if previous.track is not track:
                self._was = previous.track.vgpus if previous.track is not None else _EMPTY

    def unchanged(self, v: Vgpu) -> bool:
        """Whether the vGPU's figures here are those of the previous snapshot."""
        moved = self._moved
        if moved is None or any(s.gpu_uuid in moved for s in v.slices):
            return False
        now, was = self._vgpus.get(v.id), self._was.get(v.id)
        if now is was:
            return True
        return (
            now is not None
            and was is not None
            and now.pids == was.pids
            and all(_listed(now, s.gpu_uuid) == _listed(was, s.gpu_uuid) for s in v.slices)
        )

    def of(self, vgpu_id: str, uuid: str) -> float | None:
        gpu = self._gpus.get(uuid)
        if gpu is None:
            return None
        per_pid = gpu.process_util
        use: VgpuUse | None = self._vgpus.get(vgpu_id)
        pids = use.pids if use is not None else ()
        return round(sum(per_pid[pid] for pid in pids if pid in per_pid), 1)

    def processes(self, vgpu_id: str, uuid: str) -> int:
        """The vGPU's processes NVML listed on one of its GPUs at the last scan."""
        use: VgpuUse | None = self._vgpus.get(vgpu_id)
        return _listed(use, uuid) if use is not None else 0


def _listed(use: VgpuUse, uuid: str) -> int:
    gpu = use.gpus.get(uuid)
    return gpu.processes if gpu is not None else 0


def _managed(
    entry: Entry,
    definition: Definition,
    before: ManagedVgpu | None,
    quotas: Mapping[tuple[str, str], int],
    utilization: _Utilization,
) -> ManagedVgpu:
    """The vGPU with its figures read now: the previous object again when
    they are what they were (its answer and metric lines are then reused),
    found without building them for most vGPUs at most ticks: the same
    counters (the usage block hands back the same tuple), live slots,
    quotas and NVML figures."""
    v = entry.vgpu
    counters = entry.usage.devices()
    processes = entry.usage.active_slots()
    given = [_quota(entry, quotas, i, s.gpu_uuid) for i, s in enumerate(v.slices)]
    if (
        before is not None
        and before.definition is definition
        and before.counters is counters
        and before.figures.processes == processes
        and [g.quota_ppm for g in before.figures.gpus] == given
        and utilization.unchanged(v)
    ):
        return before
    share_ppm = percent_to_ppm(v.limits.share)
    figures = VgpuFigures(
        processes=processes,
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
                quota_ppm=quota,
                share_ppm=share_ppm,
                utilization=utilization.of(v.id, s.gpu_uuid),
                processes=utilization.processes(v.id, s.gpu_uuid),
            )
            for s, u, quota in zip(v.slices, counters, given, strict=True)
        ),
    )
    if before is not None and before.definition is definition and before.figures == figures:
        return before
    return ManagedVgpu(definition, counters, figures)


def _quota(entry: Entry, quotas: Mapping[tuple[str, str], int], index: int, uuid: str) -> int:
    """The quota the last tick gave one GPU of the vGPU, or its control
    block's (before the tick has given one)."""
    given = quotas.get((entry.vgpu.id, uuid))
    return given if given is not None else entry.control.read_throttle(index).quota_ppm


def _standalone(
    track: TrackSnapshot | None,
    gpus: Iterable[GpuState],
    previous: NodeSnapshot | None,
    utilization: _Utilization,
) -> Mapping[str, StandaloneVgpu]:
    """The standalone vGPUs of the last scan (the same objects while their
    figures are the same)."""
    if track is None:
        return _EMPTY
    index = {g.uuid: g.index for g in gpus}
    known = previous.standalone if previous is not None else _EMPTY
    out: dict[str, StandaloneVgpu] = {}
    for use in track.vgpus.values():
        if not use.standalone:
            continue
        slices = []
        for uuid, g in use.gpus.items():
            c = g.counters
            slices.append(
                SliceFigures(
                    uuid=uuid,
                    gpu_index=index.get(uuid),
                    memory_limit=g.limit,
                    memory_used=g.hooked_used,
                    memory_peak=c.peak if c is not None else 0,
                    oom_count=c.oom_count if c is not None else 0,
                    gpu_time_ns=c.gpu_time_ns if c is not None else 0,
                    throttled_ns=c.throttled_ns if c is not None else 0,
                    quota_ppm=g.steered_ppm or 0,
                    share_ppm=c.share_ppm if c is not None else 0,
                    utilization=utilization.of(use.vgpu_id, uuid),
                    processes=g.processes,
                )
            )
        figures = VgpuFigures(use.live_slots, tuple(slices))
        before = known.get(use.vgpu_id)
        if before is not None and before.pids == use.pids and before.figures == figures:
            out[use.vgpu_id] = before
        else:
            out[use.vgpu_id] = StandaloneVgpu(use.vgpu_id, use.pids, figures)
    return MappingProxyType(out)


def _outside_vgpus(track: TrackSnapshot | None) -> dict[str, int]:
    """By GPU uuid, how many processes the scan found there (NVML lists
    their memory) that are in no daemon-owned vGPU: standalone, hooked
    without a proven slot, or unmanaged. They take no turns with the
    vGPUs, so their GPU time enters the paced vGPUs' event pairs and those
    are charged it (an H200 vGPU at 30 beside a GEMM in no vGPU got ~26
    points of a GEMM's work, ~6 of a decode chain's: docs/compute.md). An
    operator sees it here rather than as a share that does not hold."""
    counts: dict[str, int] = {}
    if track is None:
        return counts
    for p in track.processes.values():
        if p.kind in (ProcessKind.VGPU, ProcessKind.EXITED):
            continue
        for uuid in p.memory:
            counts[uuid] = counts.get(uuid, 0) + 1
    return counts


def _gpu(g: GpuLike, sample: NvmlSample | None, vgpus: tuple[str, ...], outside: int) -> GpuState:
    s = sample.gpus.get(g.uuid) if sample is not None else None
    return GpuState(
        index=g.index,
        uuid=g.uuid,
        name=g.name,
        memory_total=g.memory_total,
        memory_used=s.memory_used if s is not None else None,
        sms=getattr(g, "sms", None),
        compute_capability=getattr(g, "compute_capability", None),
        utilization=(
            float(s.utilization_gpu) if s is not None and s.utilization_gpu is not None else None
        ),
        mig_mode=bool(g.mig_mode),
        healthy=g.healthy,
        health_reason=getattr(g, "health_reason", None),
        vgpus=vgpus,
        processes_outside_vgpus=outside,
    )


def _share_percent(share_ppm: int) -> float:
    """A standalone vGPU's share: 0 means its environment set no compute
    limit (the whole GPU)."""
    return ppm_to_percent(share_ppm) if share_ppm else 100
