"""Who is on the GPU: host processes mapped to vGPUs, once per tick.

Public interface
----------------
``Tracker(proc_root="/proc", *, sees_all_pids=None)``
    ``scan(vgpus, nvml) -> TrackSnapshot``: synchronous (it reads /proc and
    the blocks; run it with ``asyncio.to_thread``). ``vgpus`` maps vGPU ids
    to anything with ``usage`` (blocks.UsageBlock) and ``control``
    (blocks.ControlBlock, or None): ``VgpuBlocks`` is such a pair. ``nvml``
    is the tick's ``nvml.NvmlSample`` or None.
    ``close()``: unmaps the standalone blocks it adopted.
``TrackSnapshot``: frozen; ``processes`` (host pid -> ``TrackedProcess``),
``vgpus`` (id -> ``VgpuUse``, adopted standalone vGPUs included),
``slots`` (every non-free slot with the host pid holding it, or None when
no live process has its identity: what the reaper acts on),
``standalone`` (id -> the adopted blocks, for the reaper and controller),
``arrivals`` / ``exits`` since the previous scan, ``sees_all_pids``.

How a process is mapped (docs/tracking.md has the long form)
-------------------------------------------------------------
1. Every slot of every vGPU's usage block names its process by (PID
   namespace inode, pid inside that namespace, start time). The slots are
   read BEFORE /proc: a process seen in a slot existed before the /proc
   scan began, so missing from it means dead, never "too new".
2. /proc gives each live host process's PID namespace inode and NSpid
   chain; the slot's process is the one with the same namespace, the same
   innermost NSpid and the same start time (PID reuse cannot alias it).
   The host pid is written to ``control.slot_host_pid[slot]`` (0 when gone)
   so hooks in PID namespaces can filter NVML's host-pid process lists.
   An identity is looked for once, when a slot first shows it: directly
   (a process of the /proc mount's own namespace: its pid is the host pid),
   else in one listing of /proc for the scan. The process found is then
   watched (exitwatch.py: a pidfd, or its stat file where pidfds cannot be
   had) and no /proc file of it is read again until it ends: a scan of
   unchanged slots reads the blocks and one epoll set, not /proc. What is
   known of a process (comm, uid, container) is what /proc said then.
3. Processes NVML lists but no slot holds: with libvgpu in LD_PRELOAD, seed
   limits in the env and no VGPU_CONTROL, the hook runs standalone; its
   usage block (a shared mapping of exactly the block's size) is opened
   through /proc/<pid>/map_files and validated, and the processes sharing
   one block (same st_dev, st_ino) become one standalone vGPU
   ``sa-<dev>-<ino>``. Other hooked processes are ``HOOKED`` (seen, not
   adoptable); the rest are ``UNMANAGED`` and are attributed to a vGPU
   when they share its container (see ``attributable``) — the backstop
   counts their memory against that vGPU.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from vgpud.blocks import (
    MAX_PROCS,
    SLOT_ACTIVE,
    SLOT_CLAIMING,
    BlockError,
    ControlBlock,
    SlotView,
    UsageBlock,
    UsageC,
    UsageDevice,
)
from vgpud.cgroups import ContainerRef, Runtime, classify, parse_cgroup_file
from vgpud.exitwatch import ExitWatch
from vgpud.nvml import NvmlSample
from vgpud.procfs import Identity, MappedFile, Process, ProcessTable, ProcFS

log = logging.getLogger(__name__)

HOOK_LIBRARY = "libvgpu"
SEED_LIMIT_PREFIXES = ("CUDA_MEM_LIMIT", "CUDA_CORE_LIMIT", "CUDA_CORE_SOFT_LIMIT")
# A usage block is mapped whole: its mapping is the block size in pages.
USAGE_MAPPING_SIZE = -(-ctypes.sizeof(UsageC) // mmap.PAGESIZE) * mmap.PAGESIZE
UNKNOWN_CONTAINER = ContainerRef(runtime=Runtime.HOST, cgroup_path="?")

SlotIdentity = tuple[int, int, int]  # (PID namespace inode, pid inside it, start time)


class VgpuView(Protocol):
    @property
    def usage(self) -> UsageBlock: ...
    @property
    def control(self) -> ControlBlock | None: ...


@dataclass(frozen=True)
class VgpuBlocks:
    usage: UsageBlock
    control: ControlBlock | None = None


class ProcessKind(StrEnum):
    VGPU = "vgpu"  # holds a slot of a daemon-owned vGPU
    STANDALONE = "standalone"  # holds a slot of an adopted standalone block
    HOOKED = "hooked"  # the hook is preloaded but no slot or block was found
    UNMANAGED = "unmanaged"  # on the GPU without the hook


@dataclass(frozen=True)
class TrackedProcess:
    pid: int  # host pid
    ns_pid: int  # the pid it sees for itself
    pidns: int
    start_time: int
    comm: str
    uid: int
    container: ContainerRef
    kind: ProcessKind
    vgpu_id: str | None  # for UNMANAGED: the vGPU whose container it shares
    slot: int | None
    memory: Mapping[str, int] = field(default_factory=dict)  # NVML bytes per GPU uuid
    sm_util: Mapping[str, float] = field(default_factory=dict)  # NVML % per GPU uuid
    hooked: Mapping[str, int] = field(default_factory=dict)  # its slot's bytes per GPU uuid

    @property
    def identity(self) -> Identity:
        return (self.pid, self.start_time)


@dataclass(frozen=True)
class SlotState:
    vgpu_id: str
    slot: SlotView
    host_pid: int | None  # None: no live process has the slot's identity


@dataclass(frozen=True)
class GpuUse:
    uuid: str
    limit: int | None  # bytes, None when the block does not say
    hooked_used: int  # the usage block's word: bytes the hook reserved
    nvml_used: int  # NVML's per-process figures summed over the vGPU's processes
    sm_util: float | None  # NVML per-process utilization summed; None: no new sample
    processes: int
    # The usage block's counters of this GPU as this scan read them (None:
    # the block has no entry for it), and for an adopted standalone vGPU the
    # quota the daemon last steered (0: never; None for daemon-owned ones,
    # whose control block has theirs). Read here, by the scan that owns the
    # adopted blocks, so the API never reads a block the scan may unmap.
    counters: UsageDevice | None = None
    steered_ppm: int | None = None


@dataclass(frozen=True)
class VgpuUse:
    vgpu_id: str
    standalone: bool
    gpus: Mapping[str, GpuUse]  # by GPU uuid
    pids: tuple[int, ...]  # host pids counted (slot holders and attributed ones)
    live_slots: int


@dataclass(frozen=True)
class TrackSnapshot:
    monotonic: float
    processes: Mapping[int, TrackedProcess]
    vgpus: Mapping[str, VgpuUse]
    slots: tuple[SlotState, ...]
    standalone: Mapping[str, VgpuBlocks]
    arrivals: tuple[TrackedProcess, ...]
    exits: tuple[TrackedProcess, ...]
    sees_all_pids: bool


def attributable(ref: ContainerRef) -> bool:
    """May an unmanaged process be charged to a vGPU for sharing this cgroup?

    Only when the group is one workload's: a container, a pod, a transient
    scope (systemd-run), a custom cgroup. Never the root, a slice, a login
    session, a service or init: those hold unrelated processes.
    """
    if ref.container_id is not None or ref.pod_uid is not None:
        return True
    leaf = ref.cgroup_path.rstrip("/").rsplit("/", 1)[-1]
    if ref.runtime is Runtime.SYSTEMD:
        return leaf.endswith(".scope") and not leaf.startswith(("session-", "init."))
    return (
        ref.runtime is Runtime.HOST
        and leaf not in ("", "?")
        and not leaf.endswith((".slice", ".service"))
    )


def _seen_from_init_pidns() -> bool:
    """vgpud must see every PID namespace to judge slots; it does only from
    the host's (initial) namespace, where NSpid has a single entry."""
    process = ProcFS().process(os.getpid())
    return process is not None and len(process.nspid) == 1


@dataclass(frozen=True)
class _Devices:
    """A vGPU's devices as its blocks state them, by usage-block index."""

    uuids: tuple[str, ...]  # "" where a standalone hook did not say
    limits: tuple[int | None, ...]

    @staticmethod
    def of(view: VgpuView) -> _Devices:
        if view.control is not None:
            return _Devices(tuple(view.control.uuids), view.control.mem_limits())
        own = view.usage.standalone_limits()
        return _Devices(own.uuids, tuple(limit or None for limit in own.mem_limit))

    def per_uuid(self, values: Sequence[int]) -> dict[str, int]:
        return {uuid: v for uuid, v in zip(self.uuids, values, strict=False) if uuid}


@dataclass
class _Adopted:
    vgpu_id: str
    blocks: VgpuBlocks


@dataclass
class _SlotSearch:
    """One scan's search for the processes slots name."""

    ended: set[Identity]  # watched processes that ended (learnt after the slots were read)
    seen: set[SlotIdentity] = field(default_factory=set)
    by_ns: dict[tuple[int, int], Process] | None = None  # all of /proc, listed when needed


@dataclass(frozen=True)
class _Held:
    """What a scan made of one slot holder, and from what."""

    slot: SlotView
    devices: _Devices
    process: Process
    tracked: TrackedProcess


class Tracker:
    def __init__(
        self,
        proc_root: str | os.PathLike[str] = "/proc",
        *,
        sees_all_pids: bool | None = None,
        pidfds: bool | None = None,
    ) -> None:
        self.procfs = ProcFS(proc_root)
        self._table = ProcessTable(self.procfs)
        self.sees_all_pids = _seen_from_init_pidns() if sees_all_pids is None else sees_all_pids
        if not self.sees_all_pids:
            log.error(
                "vgpud is not in the host PID namespace: it cannot tell dead processes "
                "from invisible ones, so no slot will be reported dead (run it with hostPID)"
            )
        self._exits = ExitWatch(
            self.procfs, pidfds=_is_own_proc(proc_root) if pidfds is None else pidfds
        )
        self._containers: dict[Identity, ContainerRef] = {}
        self._envs: dict[Identity, dict[str, str] | None] = {}
        self._host_pids: dict[str, dict[int, int]] = {}  # vgpu -> slot -> host pid written
        self._adopted: dict[tuple[int, int], _Adopted] = {}
        self._previous: dict[Identity, TrackedProcess] = {}
        # Slot identities resolved to their (watched) process, and those that
        # no live process had when looked for: a process that has ended never
        # comes back, so neither is looked up in /proc again.
        self._holders: dict[SlotIdentity, Process] = {}
        self._absent: set[SlotIdentity] = set()
        self._devices: dict[str, _Devices] = {}  # by vGPU, kept while unchanged
        self._held: dict[Identity, _Held] = {}  # what the last scan made of each slot holder

    def close(self) -> None:
        for adopted in self._adopted.values():
            adopted.blocks.usage.close()
        self._adopted.clear()
        self._exits.close()

    def scan(self, vgpus: Mapping[str, VgpuView], nvml: NvmlSample | None) -> TrackSnapshot:
        self._drop_idle_standalone()
        views: dict[str, VgpuView] = dict(vgpus)
        views.update({a.vgpu_id: a.blocks for a in self._adopted.values()})
        # Slots first, /proc second: see the module docstring, point 1.
        slots = {vgpu_id: view.usage.slots() for vgpu_id, view in views.items()}
        gpu_pids = nvml.pids() if nvml is not None else set()
        search = _SlotSearch(ended=self._exits.ended())

        devices = {vgpu_id: self._devices_of(vgpu_id, view) for vgpu_id, view in views.items()}
        slot_states: list[SlotState] = []
        claimed: dict[int, tuple[str, SlotView, Process]] = {}  # host pid -> vGPU, slot, process
        for vgpu_id, vgpu_slots in slots.items():
            for slot in vgpu_slots:
                holder = self._holder(slot, search)
                if holder is not None:
                    claimed[holder.pid] = (vgpu_id, slot, holder)
                if holder is not None or self.sees_all_pids:
                    slot_states.append(
                        SlotState(vgpu_id, slot, None if holder is None else holder.pid)
                    )
        self._forget_slots(search.seen)
        self._publish_host_pids(views, claimed)
        for gone in set(self._devices) - set(views):
            del self._devices[gone]

        tracked: dict[int, TrackedProcess] = {}
        standalone_ids = {a.vgpu_id for a in self._adopted.values()}
        on_gpu = nvml.figured_pids() if nvml is not None else set()
        for pid, (vgpu_id, slot, process) in claimed.items():
            kind = ProcessKind.STANDALONE if vgpu_id in standalone_ids else ProcessKind.VGPU
            tracked[pid] = self._holder_tracked(
                process, kind, vgpu_id, slot, devices[vgpu_id], nvml, pid in on_gpu
            )
        self._held = {i: h for i, h in self._held.items() if h.process.pid in claimed}
        for pid in sorted(gpu_pids - set(claimed)):
            unslotted = self._table.lookup(pid)
            if unslotted is not None:
                tracked[pid] = self._unslotted(unslotted, nvml)
        tracked = _attribute_unmanaged(tracked)

        current = {p.identity: p for p in tracked.values()}
        self._forget_gone(current)
        arrivals = tuple(p for i, p in current.items() if i not in self._previous)
        exits = tuple(p for i, p in self._previous.items() if i not in current)
        self._previous = current
        standalone = {a.vgpu_id: a.blocks for a in self._adopted.values()}
        all_views: dict[str, VgpuView] = {**vgpus, **standalone}
        members: dict[str | None, list[TrackedProcess]] = {}
        for p in tracked.values():
            members.setdefault(p.vgpu_id, []).append(p)
        live_slots: dict[str, int] = {}
        for s in slot_states:
            if s.host_pid is not None:
                live_slots[s.vgpu_id] = live_slots.get(s.vgpu_id, 0) + 1
        return TrackSnapshot(
            monotonic=time.monotonic(),
            processes=tracked,
            vgpus={
                vgpu_id: _usage(
                    vgpu_id,
                    view,
                    devices.get(vgpu_id) or _Devices.of(view),
                    vgpu_id in standalone,
                    members.get(vgpu_id, []),
                    live_slots.get(vgpu_id, 0),
                )
                for vgpu_id, view in all_views.items()
            },
            slots=tuple(slot_states),
            standalone=standalone,
            arrivals=arrivals,
            exits=exits,
            sees_all_pids=self.sees_all_pids,
        )

    # slots and host pids

    def _holder(self, slot: SlotView, search: _SlotSearch) -> Process | None:
        """The live process a slot names (point 2 of the module docstring).

        A process found once is watched (exitwatch.py) and answered from
        memory until it ends; an identity is looked for in /proc only when
        the slot shows it for the first time."""
        if slot.state not in (SLOT_ACTIVE, SLOT_CLAIMING):
            return None
        key = (slot.pidns, slot.pid, slot.start_time)
        search.seen.add(key)
        process = self._holders.get(key)
        if process is not None:
            if process.identity not in search.ended:
                return process
            del self._holders[key]
            self._absent.add(key)
            return None
        if key in self._absent:
            return None
        process = self._find(key, search)
        if process is None or not self._exits.watch(process):
            self._absent.add(key)
            return None
        self._holders[key] = process
        return process

    def _find(self, key: SlotIdentity, search: _SlotSearch) -> Process | None:
        pidns, ns_pid, start_time = key
        # A process of the /proc mount's own namespace: its pid there is its
        # host pid, so one process is read rather than all of /proc.
        process = self._table.lookup(ns_pid)
        if process is not None and (process.pidns, process.ns_pid) == (pidns, ns_pid):
            return process if process.start_time == start_time else None
        if search.by_ns is None:  # one listing of /proc per scan, when needed
            search.by_ns = {(p.pidns, p.ns_pid): p for p in self._table.refresh().values()}
        process = search.by_ns.get((pidns, ns_pid))
        return process if process is not None and process.start_time == start_time else None

    def _forget_slots(self, seen: set[SlotIdentity]) -> None:
        """Stop watching the processes no slot names any more."""
        for key in [k for k in self._holders if k not in seen]:
            self._exits.unwatch(self._holders.pop(key).identity)
        self._absent &= seen

    def _publish_host_pids(
        self, views: Mapping[str, VgpuView], claimed: Mapping[int, tuple[str, SlotView, Process]]
    ) -> None:
        wanted: dict[str, dict[int, int]] = {vgpu_id: {} for vgpu_id in views}
        for pid, (vgpu_id, slot, _) in claimed.items():
            wanted[vgpu_id][slot.index] = pid
        for vgpu_id, view in views.items():
            control = view.control
            if control is None:
                continue
            mine = wanted[vgpu_id]
            written = self._host_pids.get(vgpu_id)
            if written is None:  # first sight (or a restarted daemon): trust nothing stored
                written = {i: control.slot_host_pid(i) for i in range(MAX_PROCS)}
                written = {i: pid for i, pid in written.items() if pid}
            if written != mine:
                for index in set(written) | set(mine):
                    pid = mine.get(index, 0)
                    if written.get(index, 0) != pid:
                        control.set_slot_host_pid(index, pid)
            self._host_pids[vgpu_id] = mine
        for gone in set(self._host_pids) - set(views):
            del self._host_pids[gone]

    def _devices_of(self, vgpu_id: str, view: VgpuView) -> _Devices:
        """The vGPU's devices; the same object while they do not change, so
        that what was derived from them can be reused."""
        devices = _Devices.of(view)
        known = self._devices.get(vgpu_id)
        if known == devices:
            return known
        self._devices[vgpu_id] = devices
        return devices

    def _holder_tracked(
        self,
        process: Process,
        kind: ProcessKind,
        vgpu_id: str,
        slot: SlotView,
        devices: _Devices,
        nvml: NvmlSample | None,
        on_gpu: bool,
    ) -> TrackedProcess:
        """A slot holder as tracked; the last scan's, when nothing it is made
        of changed (blocks.py hands back the same SlotView for unchanged slot
        words) and NVML has no figure of it (those change with every sample)."""
        identity = process.identity
        held = self._held.get(identity)
        if (
            held is not None
            and not on_gpu
            and held.slot is slot
            and held.devices is devices
            and held.process is process
            and held.tracked.vgpu_id == vgpu_id
            and not held.tracked.memory
            and not held.tracked.sm_util
        ):
            return held.tracked
        hooked = devices.per_uuid([d.used for d in slot.devices])
        tracked = self._tracked(process, kind, vgpu_id, slot.index, nvml, hooked)
        self._held[identity] = _Held(slot, devices, process, tracked)
        return tracked

    # processes no slot holds

    def _unslotted(self, process: Process, nvml: NvmlSample | None) -> TrackedProcess:
        env = self._environ(process)
        if env is None or HOOK_LIBRARY not in env.get("LD_PRELOAD", ""):
            return self._tracked(process, ProcessKind.UNMANAGED, None, None, nvml)
        if "VGPU_CONTROL" in env or not any(k.startswith(SEED_LIMIT_PREFIXES) for k in env):
            return self._tracked(process, ProcessKind.HOOKED, None, None, nvml)
        adopted = self._adopt(process)
        if adopted is None:
            return self._tracked(process, ProcessKind.HOOKED, None, None, nvml)
        slot = next(
            (
                s
                for s in adopted.blocks.usage.slots()
                if (s.pidns, s.pid, s.start_time)
                == (process.pidns, process.ns_pid, process.start_time)
            ),
            None,
        )
        if slot is None:
            return self._tracked(process, ProcessKind.STANDALONE, adopted.vgpu_id, None, nvml)
        hooked = _Devices.of(adopted.blocks).per_uuid([d.used for d in slot.devices])
        return self._tracked(
            process, ProcessKind.STANDALONE, adopted.vgpu_id, slot.index, nvml, hooked
        )

    def _adopt(self, process: Process) -> _Adopted | None:
        """The standalone usage block this process maps, adopted once per file."""
        for mapping in self.procfs.maps(process.pid) or ():
            if not _may_be_usage_block(mapping):
                continue
            name = f"/proc/{process.pid}/map_files/{mapping.range_name}"
            try:
                fd = self.procfs.open_mapped(process.pid, mapping, write=True)
            except OSError as err:
                log.debug("cannot open %s: %s", name, err)
                continue
            try:
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
                if key in self._adopted:
                    return self._adopted[key]
                usage = UsageBlock.open_fd(fd, name)
            except (BlockError, OSError) as err:
                log.debug("%s is not a usage block: %s", name, err)
                continue
            finally:
                os.close(fd)
            adopted = _Adopted(f"sa-{key[0]:x}-{key[1]}", VgpuBlocks(usage))
            self._adopted[key] = adopted
            log.info(
                "adopted standalone vGPU %s (block mapped by pid %d)", adopted.vgpu_id, process.pid
            )
            return adopted
        return None

    def _drop_idle_standalone(self) -> None:
        """An adopted block with no slot in use is done with: unmap it."""
        for key, adopted in list(self._adopted.items()):
            if not adopted.blocks.usage.slots():
                log.info("standalone vGPU %s has no process left: released", adopted.vgpu_id)
                adopted.blocks.usage.close()
                del self._adopted[key]

    # per-process reads, cached for the process's lifetime

    def _tracked(
        self,
        process: Process,
        kind: ProcessKind,
        vgpu_id: str | None,
        slot: int | None,
        nvml: NvmlSample | None,
        hooked: Mapping[str, int] | None = None,
    ) -> TrackedProcess:
        memory: dict[str, int] = {}
        util: dict[str, float] = {}
        if nvml is not None:
            memory = nvml.memory_of(process.pid)
            util = {
                uuid: gpu.process_util[process.pid]
                for uuid, gpu in nvml.gpus.items()
                if process.pid in gpu.process_util
            }
        return TrackedProcess(
            pid=process.pid,
            ns_pid=process.ns_pid,
            pidns=process.pidns,
            start_time=process.start_time,
            comm=process.comm,
            uid=process.uid,
            container=self._container(process),
            kind=kind,
            vgpu_id=vgpu_id,
            slot=slot,
            memory=memory,
            sm_util=util,
            hooked=hooked or {},
        )

    def _container(self, process: Process) -> ContainerRef:
        identity = (process.pid, process.start_time)
        ref = self._containers.get(identity)
        if ref is None:
            text = self.procfs.cgroup(process.pid)
            ref = UNKNOWN_CONTAINER if text is None else classify(parse_cgroup_file(text))
            self._containers[identity] = ref
        return ref

    def _environ(self, process: Process) -> dict[str, str] | None:
        identity = (process.pid, process.start_time)
        if identity not in self._envs:
            self._envs[identity] = self.procfs.environ(process.pid)
        return self._envs[identity]

    def _forget_gone(self, current: Mapping[Identity, TrackedProcess]) -> None:
        for cache in (self._containers, self._envs):
            for identity in [i for i in cache if i not in current]:
                del cache[identity]


def _is_own_proc(proc_root: str | os.PathLike[str]) -> bool:
    """Whether ``proc_root`` is a /proc of our own PID namespace (its pids are
    the ones pidfd_open takes), not a copy or another namespace's mount."""
    try:
        return os.readlink(os.path.join(proc_root, "self")) == str(os.getpid())
    except OSError:
        return False


def _may_be_usage_block(mapping: MappedFile) -> bool:
    return mapping.shared and mapping.offset == 0 and mapping.size == USAGE_MAPPING_SIZE


def _attribute_unmanaged(tracked: dict[int, TrackedProcess]) -> dict[int, TrackedProcess]:
    """Charge unmanaged processes to the one vGPU whose container they share."""
    if not any(p.kind is ProcessKind.UNMANAGED for p in tracked.values()):
        return tracked
    owners: dict[str, set[str]] = {}
    for p in tracked.values():
        if p.vgpu_id is not None and p.kind is not ProcessKind.UNMANAGED:
            owners.setdefault(p.container.key, set()).add(p.vgpu_id)
    result = dict(tracked)
    for pid, p in tracked.items():
        if p.kind is not ProcessKind.UNMANAGED or not attributable(p.container):
            continue
        vgpu_ids = owners.get(p.container.key, set())
        if len(vgpu_ids) == 1:  # two vGPUs in one container: nobody to charge
            result[pid] = _with_vgpu(p, next(iter(vgpu_ids)))
    return result


def _with_vgpu(p: TrackedProcess, vgpu_id: str) -> TrackedProcess:
    return TrackedProcess(
        pid=p.pid,
        ns_pid=p.ns_pid,
        pidns=p.pidns,
        start_time=p.start_time,
        comm=p.comm,
        uid=p.uid,
        container=p.container,
        kind=p.kind,
        vgpu_id=vgpu_id,
        slot=p.slot,
        memory=p.memory,
        sm_util=p.sm_util,
        hooked=p.hooked,
    )


def _usage(
    vgpu_id: str,
    view: VgpuView,
    devices: _Devices,
    standalone: bool,
    mine: Sequence[TrackedProcess],
    live_slots: int,
) -> VgpuUse:
    budgets = view.usage.devices()
    gpus: dict[str, GpuUse] = {}
    for index, uuid in enumerate(devices.uuids):
        if not uuid:
            continue  # a standalone hook without GPU_DEVICES_UUID: no NVML to match
        utils = [p.sm_util[uuid] for p in mine if uuid in p.sm_util]
        counters = budgets[index] if index < len(budgets) else None
        gpus[uuid] = GpuUse(
            uuid=uuid,
            limit=devices.limits[index],
            hooked_used=counters.used if counters is not None else 0,
            nvml_used=sum(p.memory.get(uuid, 0) for p in mine),
            sm_util=sum(utils) if utils else None,
            processes=sum(1 for p in mine if uuid in p.memory or uuid in p.sm_util),
            counters=counters,
            steered_ppm=view.usage.read_steer(index).quota_ppm if standalone else None,
        )
    return VgpuUse(
        vgpu_id=vgpu_id,
        standalone=standalone,
        gpus=gpus,
        pids=tuple(sorted(p.pid for p in mine)),
        live_slots=live_slots,
    )
