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
A usage block is the tenant's word; what the daemon charges, kills or names
rests on what the host shows (``evidence.py``; docs/security.md,
"Attribution").

1. Every slot of every vGPU's usage block names its process by (PID
   namespace inode, pid inside that namespace, start time). The slots are
   read BEFORE /proc: a process seen in a slot existed before the /proc
   scan began, so missing from it means dead, never "too new".
2. /proc gives each live host process's PID namespace inode and NSpid
   chain; the slot's candidate is the process with the same namespace, the
   same innermost NSpid and the same start time (PID reuse cannot alias
   it). An identity is looked for once, when a slot first shows it, and the
   process found is then watched (exitwatch.py) until it ends.
3. The candidate holds the slot only if /proc/<pid>/maps shows it mapping
   this vGPU's usage block file (same device and inode): then, and only
   then, it is charged to the vGPU by its slot and its host pid is written
   to ``control.slot_host_pid[slot]`` (so hooks in PID namespaces can
   filter NVML's host-pid process lists). A daemon-owned vGPU's proof wins
   over an adopted standalone block's.
4. Membership without a slot: a process is in a daemon-owned vGPU if that
   vGPU's block files are bind-mounted into its mount namespace (what CDI
   and ``vgpuctl env --docker`` do), else in the one vGPU whose proven slot
   holders share its workload cgroup (see ``attributable``).
5. A slot whose candidate does not map the block (its maps file was read
   whole) and is not a member by point 4 names nobody the vGPU may claim:
   like a dead identity it is reclaimed, so a right guess of another
   tenant's identity and a wrong one look the same. An identity new to a
   vGPU's slots costs one unit of the vGPU's evidence budget, live or not
   (its /proc lookup and its maps read); once the budget is spent, every
   new identity waits, kept and unproven, for a later scan. A candidate
   whose maps were cut at the limit keeps its slot, unproven.
6. Processes NVML lists that hold no proven slot: a member of a
   daemon-owned vGPU is charged to it whatever its environment says
   (``HOOKED`` with libvgpu in LD_PRELOAD, else ``UNMANAGED``), and the
   backstop counts its memory. Otherwise, with libvgpu in LD_PRELOAD, seed
   limits in the env and no VGPU_CONTROL, the hook runs standalone: its
   usage block (a shared mapping of exactly the block's size, owned by the
   process's uid and closed to others) is opened through
   /proc/<pid>/map_files and validated, and the processes sharing one block
   (same st_dev, st_ino) become one standalone vGPU ``sa-<dev>-<ino>``:
   the file the maps line named, one per process for its lifetime, at most
   ``STANDALONE_PER_UID`` per uid and ``STANDALONE_PER_NODE`` in all.
7. A pid NVML still lists after its process exited (a fork child keeps the
   memory through inherited descriptors) stays charged, as ``EXITED``, to
   the vGPU it was in. NVML's memory under a pid belongs to the process it
   was first charged to for as long as NVML lists the pid without a gap: a
   new process at that pid (the host reused it) is charged only what comes
   on top (docs/security.md, "Attribution").
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from typing import Protocol

import structlog

from vgpud.log import tenant_said
from vgpud.observe.cgroups import ContainerRef, Runtime, classify, parse_cgroup_file
from vgpud.observe.evidence import BlockFile, Evidence, FileKey, proves
from vgpud.observe.exitwatch import ExitWatch
from vgpud.observe.nvml import NvmlSample
from vgpud.observe.procfs import (
    Identity,
    MappedFile,
    Process,
    ProcessTable,
    ProcFS,
    ReadPending,
)
from vgpud.vgpus.abi import MAX_PROCS, SLOT_ACTIVE, SLOT_CLAIMING, BlockError, UsageC
from vgpud.vgpus.blocks import ControlBlock, SlotView, UsageBlock, UsageDevice

log = structlog.get_logger(__name__)

HOOK_LIBRARY = "libvgpu"
ADOPT_TRIES = 4  # distinct block-sized files opened per process and scan, at most
# Adopted standalone blocks, at most: each costs the daemon a mapping, and a
# vGPU to scan and to steer at every control tick (up to 16 devices: about
# 0.6 % of a core per block on the dev VM), and a user makes as many files
# as it likes, whereas the hook shares one per uid (/tmp/vgpud-<uid>.usage).
# A process gets one for its lifetime.
STANDALONE_PER_UID = 16
STANDALONE_PER_NODE = 64
STANDALONE_BUDGET = ""  # the evidence budget of processes no vGPU names yet
SEED_LIMIT_PREFIXES = ("CUDA_MEM_LIMIT", "CUDA_CORE_LIMIT", "CUDA_CORE_SOFT_LIMIT")
# A usage block is mapped whole: its mapping is the block size in pages.
USAGE_MAPPING_SIZE = -(-ctypes.sizeof(UsageC) // mmap.PAGESIZE) * mmap.PAGESIZE
UNKNOWN_CONTAINER = ContainerRef(runtime=Runtime.HOST, cgroup_path="?")

SlotIdentity = tuple[int, int, int]  # (PID namespace inode, pid inside it, start time)
NOBODY = -1  # the start time of "no live process": what a pid NVML lists with none is charged to


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
    HOOKED = "hooked"  # the hook is preloaded but holds no slot the host confirms
    UNMANAGED = "unmanaged"  # on the GPU without the hook
    EXITED = "exited"  # gone, but NVML still lists memory under its pid (a fork child holds it)


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
    host_pid: int | None  # the live process the host shows holding it; None: not proven
    # A live process has the slot's identity and may hold its bytes: it is
    # shown mapping the block, or could not be read (yet), or the host puts
    # it in this vGPU anyway. False: nobody the slot may name is alive — a
    # dead process's slot, or one naming another tenant's process.
    held: bool = False


@dataclass(frozen=True)
class GpuUse:
    uuid: str
    limit: int | None  # bytes, None when the block does not say
    hooked_used: int  # the usage block's word: bytes the hook reserved
    nvml_used: int  # NVML's per-process figures summed over the vGPU's processes
    sm_util: float | None  # NVML per-process utilization summed; None: no new sample
    processes: int
    # For an adopted standalone vGPU, its usage block's counters of this GPU
    # as this scan read them (None: the block has no entry for it) and the
    # quota the daemon last steered (0: never). Read here, by the scan that
    # owns the adopted blocks, so the API never reads a block the scan may
    # unmap. None for daemon-owned ones: the API and the controller read
    # their counters from the block, and their control block has the quota.
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
    # ``slots`` by vGPU, as the tracker judged them: a vGPU's tuple is the
    # same object from scan to scan while its slots are judged the same.
    # None (a snapshot made by hand): grouped from ``slots`` when asked.
    judged: Mapping[str, tuple[SlotState, ...]] | None = None

    @cached_property
    def slots_of(self) -> Mapping[str, tuple[SlotState, ...]]:
        """Each vGPU's entries of ``slots``, in their order."""
        if self.judged is not None:
            return self.judged
        grouped: dict[str, list[SlotState]] = {}
        for s in self.slots:
            grouped.setdefault(s.vgpu_id, []).append(s)
        return {vgpu_id: tuple(states) for vgpu_id, states in grouped.items()}


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
    key: FileKey  # the block file's (st_dev, st_ino)
    uid: int  # its owner: the user whose processes it is the budget of


@dataclass(frozen=True)
class _VgpuFiles:
    """A vGPU's block files as the host names them: what /proc/<pid>/maps
    and mountinfo are compared with."""

    usage: BlockFile | None
    control: BlockFile | None

    @property
    def usage_key(self) -> FileKey | None:
        return None if self.usage is None else self.usage.key

    def mount_keys(self) -> list[tuple[tuple[int, str], int]]:
        """(device, path in its filesystem) of each block file, as a bind
        mount of it shows in mountinfo, with the vGPU's user."""
        user = self.usage.uid if self.usage is not None else 0
        return [
            ((f.key[0], f.fs_path), user)
            for f in (self.usage, self.control)
            if f is not None and f.fs_path is not None
        ]


class _Membership:
    """Which vGPU the host puts a process in, by facts a tenant cannot forge:
    a daemon-owned vGPU's block file mounted into its mount namespace by
    root or by the vGPU's own user (``Mounts.made_by``), else a workload
    cgroup whose proven members are all of one vGPU.

    Asked only of processes no proven slot names (few, most scans none):
    the indexes are built at the first question of a scan."""

    def __init__(
        self,
        evidence: Evidence,
        container: Callable[[Process], ContainerRef],
        files: Mapping[str, _VgpuFiles],
        claimed: Mapping[int, tuple[str, SlotView, Process]],
    ) -> None:
        self._evidence = evidence
        self._container = container
        self._files = files  # daemon-owned vGPUs only: mounts prove nothing else
        self._claimed = claimed

    @cached_property
    def _mounted(self) -> dict[tuple[int, str], tuple[str, int]]:
        """(device, path in it) of each daemon-owned block file -> (vGPU, its user)."""
        return {
            key: (vgpu_id, user)
            for vgpu_id, files in self._files.items()
            for key, user in files.mount_keys()
        }

    @cached_property
    def _owners(self) -> dict[str, set[str]]:
        """Workload cgroup -> the vGPUs of the proven processes in it."""
        owners: dict[str, set[str]] = {}
        for vgpu_id, _, process in self._claimed.values():
            owners.setdefault(self._container(process).key, set()).add(vgpu_id)
        return owners

    def of(self, process: Process) -> str | None:
        if self._mounted:
            ns = self._evidence.mounts(process)
            found = {
                hit[0]
                for m in ns.mounts
                if (hit := self._mounted.get((m.dev, m.root))) is not None and ns.made_by(hit[1])
            }
            if found:  # two vGPUs' blocks in one container: nobody to charge
                return found.pop() if len(found) == 1 else None
        ref = self._container(process)
        owners = self._owners.get(ref.key, set()) if attributable(ref) else set()
        return next(iter(owners)) if len(owners) == 1 else None


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


Named = tuple[SlotView, Process | None, bool | None]  # a slot, its holder, the proof
Claims = dict[int, tuple[str, SlotView, Process]]  # host pid -> vGPU, slot, process


@dataclass(eq=False)
class _Unit:
    """What a scan made of one vGPU's slots, and what followed from them.

    The next scan takes it whole (``reusable``) while the slots are the
    same (blocks.py hands back the same SlotView for unchanged words), its
    block files and devices are the same objects, none of its holders
    ended, and it is ``complete``: every slot named a live process shown
    mapping the block and claimed here, so its states need nothing of the
    other vGPUs. Then no slot of it is looked at again and what was derived
    from it (states, host pids, tracked processes while NVML's figures are
    the same, its VgpuUse) is the same object. Anything else, and the
    vGPU's slots are gone through again, each as before."""

    slots: list[SlotView]
    files: _VgpuFiles
    devices: _Devices
    kind: ProcessKind
    named: list[Named]
    claimed: Claims  # the holders claimed here (not by an earlier vGPU), in slot order
    complete: bool
    keys: tuple[SlotIdentity, ...]  # the identities its slots show
    holders: frozenset[Identity]  # the live processes its slots name, proven or not
    host_pids: dict[int, int]  # slot -> host pid, what is published for it
    # The identities its slots showed that were looked at (their unit of the
    # evidence budget paid), and the slots whose new identity must wait.
    shown: frozenset[SlotIdentity]
    deferred: frozenset[int]
    states: tuple[SlotState, ...] | None = None  # judged once every vGPU's claims are known
    live: int = 0  # states held
    held: dict[Identity, _Held] = field(default_factory=dict)
    tracked: dict[int, TrackedProcess] = field(default_factory=dict)  # by host pid
    current: dict[Identity, TrackedProcess] = field(default_factory=dict)
    # The last VgpuUse made of it, with what it was made of: (the usage
    # block's memory words, ``tracked``, ``live``), kept while no other
    # process counts.
    use: tuple[tuple[int, ...], dict[int, TrackedProcess], int, VgpuUse] | None = None

    def reusable(
        self,
        slots: list[SlotView],
        files: _VgpuFiles,
        devices: _Devices,
        kind: ProcessKind,
        ended: set[Identity],
        claimed: Claims,
    ) -> bool:
        return (
            self.complete
            and slots == self.slots
            and files is self.files
            and devices is self.devices
            and kind is self.kind
            and ended.isdisjoint(self.holders)
            and claimed.keys().isdisjoint(self.claimed)
        )


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
        self._evidence = Evidence(self.procfs)
        self._files: dict[str, tuple[UsageBlock, ControlBlock | None, _VgpuFiles]] = {}
        self._ghosts: dict[int, TrackedProcess] = {}  # exited pids NVML still lists
        # Per pid NVML lists: the process its memory was first charged to,
        # kept while NVML lists the pid at every scan; and, once another
        # process lives at that pid, the part of the memory that stays the
        # first one's (never more than NVML listed when the other came).
        self._owners: dict[int, Identity] = {}
        self._kept: dict[int, dict[str, int]] = {}
        self._held_back: dict[int, Mapping[str, int]] = {}  # this scan's, by pid
        self._holders_held_back: dict[int, Mapping[str, int]] = {}
        self._exits = ExitWatch(
            self.procfs, pidfds=_is_own_proc(proc_root) if pidfds is None else pidfds
        )
        self._containers: dict[Identity, ContainerRef] = {}
        self._envs: dict[Identity, dict[str, str] | None] = {}
        self._host_pids: dict[str, dict[int, int]] = {}  # vgpu -> slot -> host pid written
        self._adopted: dict[tuple[int, int], _Adopted] = {}
        # The one standalone block each process was given, for its lifetime
        # (while it is tracked or the block adopted), and the processes
        # whose adoption was refused (one log line each).
        self._adopted_by: dict[Identity, FileKey] = {}
        self._refused: set[Identity] = set()
        # Processes a mapped file of which did not open in time (a FUSE
        # server of the tenant's that never answers): never tried again,
        # or each would cost every scan the wait.
        self._unanswered: set[Identity] = set()
        self._previous: dict[Identity, TrackedProcess] = {}
        # Slot identities resolved to their (watched) process, and those that
        # no live process had when looked for: a process that has ended never
        # comes back, so neither is looked up in /proc again.
        self._holders: dict[SlotIdentity, Process] = {}
        self._absent: set[SlotIdentity] = set()
        self._devices: dict[str, _Devices] = {}  # by vGPU, kept while unchanged
        self._units: dict[str, _Unit] = {}  # the last scan's, by vGPU
        # NVML's per-process figures the last scan saw, by GPU uuid: while
        # they are the same, so is every tracked process's part of them.
        self._figures: dict[str, tuple[Mapping[int, int | None], Mapping[int, float]]] = {}

    def close(self) -> None:
        for adopted in self._adopted.values():
            adopted.blocks.usage.close()
        self._adopted.clear()
        self._exits.close()

    def scan(self, vgpus: Mapping[str, VgpuView], nvml: NvmlSample | None) -> TrackSnapshot:
        self._drop_idle_standalone()
        self._evidence.begin_scan()
        # Daemon-owned vGPUs first: a process proven in one of them is never
        # an adopted standalone block's, whatever that block's slots say.
        views: dict[str, VgpuView] = dict(vgpus)
        views.update({a.vgpu_id: a.blocks for a in self._adopted.values()})
        # Slots first, /proc second: see the module docstring, point 1.
        slots = {vgpu_id: view.usage.slots() for vgpu_id, view in views.items()}
        gpu_pids = nvml.pids() if nvml is not None else set()
        if nvml is not None:
            self._forget_unlisted(gpu_pids)
        search = _SlotSearch(ended=self._exits.ended())

        standalone_ids = {a.vgpu_id for a in self._adopted.values()}
        figures = {u: (g.processes, g.process_util) for u, g in (nvml.gpus if nvml else {}).items()}
        same_figures = figures == self._figures
        self._figures = figures

        devices = {vgpu_id: self._devices_of(vgpu_id, view) for vgpu_id, view in views.items()}
        files = {vgpu_id: self._files_of(vgpu_id, view) for vgpu_id, view in views.items()}
        units: dict[str, _Unit] = {}
        claimed: Claims = {}
        for vgpu_id, vgpu_slots in slots.items():
            kind = ProcessKind.STANDALONE if vgpu_id in standalone_ids else ProcessKind.VGPU
            unit = self._units.get(vgpu_id)
            args = (vgpu_slots, files[vgpu_id], devices[vgpu_id], kind)
            if unit is not None and unit.reusable(*args, search.ended, claimed):
                search.seen.update(unit.keys)
            else:
                shown = unit.shown if unit is not None else frozenset()
                unit = self._read_slots(vgpu_id, *args, search, claimed, shown)
            claimed.update(unit.claimed)
            units[vgpu_id] = unit
        self._forget_slots(search.seen)
        self._publish_host_pids(views, units)
        for gone in set(self._devices) - set(views):
            del self._devices[gone]
        for gone in set(self._files) - set(views):
            del self._files[gone]

        membership = _Membership(
            self._evidence,
            self._container,
            {vgpu_id: files[vgpu_id] for vgpu_id in vgpus},
            claimed,
        )
        slot_states: list[SlotState] = []
        for vgpu_id, unit in units.items():
            if unit.states is None:
                self._judge(vgpu_id, unit, membership, self._units.get(vgpu_id))
            slot_states.extend(unit.states or ())

        self._held_back = {}
        held_back = {
            pid: kept
            for pid in gpu_pids & claimed.keys()
            if nvml is not None
            and (kept := self._earlier(pid, claimed[pid][2].identity, nvml)) is not None
        }
        same_figures = same_figures and held_back == self._holders_held_back
        self._holders_held_back = held_back

        tracked: dict[int, TrackedProcess] = {}
        current: dict[Identity, TrackedProcess] = {}
        on_gpu: set[int] | None = None
        for vgpu_id, unit in units.items():
            before = self._units.get(vgpu_id)
            if unit is not before or not same_figures:
                if on_gpu is None:
                    on_gpu = nvml.figured_pids() if nvml is not None else set()
                self._track_holders(vgpu_id, unit, before, nvml, on_gpu)
            tracked.update(unit.tracked)
            current.update(unit.current)
        self._units = units
        others: dict[str | None, list[TrackedProcess]] = {}  # processes no slot of theirs holds
        ghosts: set[Identity] = set()
        for pid in sorted(gpu_pids - claimed.keys()):
            assert nvml is not None  # gpu_pids is empty without a sample
            unslotted = self._table.lookup(pid)
            earlier = self._earlier(pid, None if unslotted is None else unslotted.identity, nvml)
            if unslotted is not None:
                member = membership.of(unslotted)
                p = self._unslotted(unslotted, nvml, member, member in vgpus)
                tracked[pid] = current[p.identity] = p
                others.setdefault(p.vgpu_id, []).append(p)
            if earlier is not None and (ghost := self._ghost(pid, earlier)) is not None:
                tracked.setdefault(pid, ghost)  # a live process at the pid is the one named
                current[ghost.identity] = ghost
                ghosts.add(ghost.identity)
                others.setdefault(ghost.vgpu_id, []).append(ghost)
        # A slot holder at a pid NVML lists an exited process's memory under.
        for pid, kept in held_back.items():
            if (ghost := self._ghost(pid, kept)) is not None:
                current[ghost.identity] = ghost
                ghosts.add(ghost.identity)
                others.setdefault(ghost.vgpu_id, []).append(ghost)

        self._forget_gone(current, units.values())
        arrivals, exits = self._changes(current, ghosts)
        self._previous = current
        standalone = {a.vgpu_id: a.blocks for a in self._adopted.values()}
        all_views: dict[str, VgpuView] = {**vgpus, **standalone}
        return TrackSnapshot(
            monotonic=time.monotonic(),
            processes=tracked,
            vgpus={
                vgpu_id: self._use(
                    vgpu_id,
                    view,
                    devices.get(vgpu_id) or _Devices.of(view),
                    vgpu_id in standalone,
                    units.get(vgpu_id),
                    others.get(vgpu_id, []),
                )
                for vgpu_id, view in all_views.items()
            },
            slots=tuple(slot_states),
            standalone=standalone,
            arrivals=arrivals,
            exits=exits,
            sees_all_pids=self.sees_all_pids,
            judged={vgpu_id: unit.states or () for vgpu_id, unit in units.items() if unit.states},
        )

    # one vGPU's slots

    def _read_slots(
        self,
        vgpu_id: str,
        slots: list[SlotView],
        files: _VgpuFiles,
        devices: _Devices,
        kind: ProcessKind,
        search: _SlotSearch,
        claimed: Claims,
        shown: frozenset[SlotIdentity],
    ) -> _Unit:
        """The vGPU's slots gone through one by one: each one's holder, and
        whether the host shows it mapping the block (its proof).

        An identity its slots did not show last scan costs the vGPU one unit
        of its evidence budget before anything is looked up, whether a
        process has it or not: were only a live one's maps read charged, a
        slot naming another tenant's live process would be kept unproven
        when the budget ran out, and one naming nobody reclaimed — an answer
        to the guess. With the budget spent the identity waits, kept."""
        named: list[Named] = []
        mine: Claims = {}
        looked: set[SlotIdentity] = set()
        deferred: set[int] = set()
        for slot in slots:
            key = (slot.pidns, slot.pid, slot.start_time)
            new = False
            if slot.state in (SLOT_ACTIVE, SLOT_CLAIMING):  # (others name nobody: no lookup)
                new = key not in shown and key not in looked
                if new and not self._evidence.take(vgpu_id):
                    search.seen.add(key)
                    deferred.add(slot.index)
                    named.append((slot, None, None))
                    continue
                looked.add(key)
            holder = self._holder(slot, search)
            proof = None
            if holder is not None:
                facts = self._evidence.maps(holder, vgpu_id, paid=new)
                proof = proves(facts, files.usage_key)
                if proof and holder.pid not in claimed and holder.pid not in mine:
                    mine[holder.pid] = (vgpu_id, slot, holder)
            named.append((slot, holder, proof))
        return _Unit(
            slots=slots,
            files=files,
            devices=devices,
            kind=kind,
            named=named,
            claimed=mine,
            complete=all(h is not None and proof and h.pid in mine for _, h, proof in named),
            keys=tuple((s.pidns, s.pid, s.start_time) for s in slots),
            holders=frozenset(h.identity for _, h, _ in named if h is not None),
            host_pids={slot.index: pid for pid, (_, slot, _) in mine.items()},
            shown=frozenset(looked),
            deferred=frozenset(deferred),
        )

    def _judge(
        self, vgpu_id: str, unit: _Unit, membership: _Membership, before: _Unit | None
    ) -> None:
        """Each slot's state: held by whom, or by nobody the vGPU may claim
        (what the reaper acts on); the last scan's object where the same."""
        known = {s.slot.index: s for s in before.states or ()} if before is not None else {}
        states: list[SlotState] = []
        for slot, holder, proof in unit.named:
            held = slot.index in unit.deferred or (
                holder is not None and (proof is not False or membership.of(holder) == vgpu_id)
            )
            if held or self.sees_all_pids:
                host_pid = holder.pid if holder is not None and proof else None
                state = known.get(slot.index)
                if state is None or (state.slot, state.host_pid, state.held) != (
                    slot,
                    host_pid,
                    held,
                ):
                    state = SlotState(vgpu_id, slot, host_pid, held)
                states.append(state)
        unit.states = tuple(states)
        unit.live = sum(1 for s in states if s.held)

    def _track_holders(
        self,
        vgpu_id: str,
        unit: _Unit,
        before: _Unit | None,
        nvml: NvmlSample | None,
        on_gpu: set[int],
    ) -> None:
        """The unit's claimed processes as tracked; its dicts stay the same
        objects when every process is (what its VgpuUse is kept by)."""
        known = before.held if before is not None else {}
        held: dict[Identity, _Held] = {}
        tracked: dict[int, TrackedProcess] = {}
        for pid, (_, slot, process) in unit.claimed.items():
            h = self._holder_tracked(
                process, unit.kind, vgpu_id, slot, unit.devices, nvml, pid in on_gpu, known
            )
            held[process.identity] = h
            tracked[pid] = h.tracked
        unit.held = held
        if before is not None and _same_values(tracked, before.tracked):
            unit.tracked, unit.current = before.tracked, before.current
        else:
            unit.tracked = tracked
            unit.current = {p.identity: p for p in tracked.values()}

    def _use(
        self,
        vgpu_id: str,
        view: VgpuView,
        devices: _Devices,
        standalone: bool,
        unit: _Unit | None,
        others: list[TrackedProcess],
    ) -> VgpuUse:
        """The vGPU's use of its GPUs; the last scan's object while its
        memory words, processes and live slots are the same (a standalone
        vGPU's counters and steered quota are read anew: never kept).

        Of a daemon-owned vGPU's usage block only the memory words are read:
        its other counters (GPU time, launches) move at every launch of a
        busy vGPU, and the API and the controller read them from the block
        itself; keyed on them, every busy vGPU's use was made again at each
        scan, and the reaper's drift check with it (docs/benchmarks/daemon.md).
        """
        budgets = view.usage.devices() if standalone else None
        hooked = view.usage.memory_used() if budgets is None else tuple(b.used for b in budgets)
        if unit is None:
            return _usage(vgpu_id, view, devices, hooked, budgets, others, 0)
        kept = unit.use
        if (
            kept is not None
            and not others
            and kept[0] == hooked
            and kept[1] is unit.tracked
            and kept[2] == unit.live
        ):
            return kept[3]
        mine = [*unit.tracked.values(), *others]
        use = _usage(vgpu_id, view, devices, hooked, budgets, mine, unit.live)
        unit.use = None if standalone or others else (hooked, unit.tracked, unit.live, use)
        return use

    def _changes(
        self, current: Mapping[Identity, TrackedProcess], ghosts: set[Identity]
    ) -> tuple[tuple[TrackedProcess, ...], tuple[TrackedProcess, ...]]:
        """Arrivals and exits since the last scan; most scans have none,
        found by comparing the identities alone."""
        previous = self._previous
        arrivals: tuple[TrackedProcess, ...] = ()
        exits: tuple[TrackedProcess, ...] = ()
        if current.keys() - previous.keys():
            arrivals = tuple(
                p
                for i, p in current.items()
                if i not in previous and p.kind is not ProcessKind.EXITED
            )
        if previous.keys() - current.keys() or not ghosts.isdisjoint(previous):
            exits = tuple(
                p
                for i, p in previous.items()
                if p.kind is not ProcessKind.EXITED
                and (i not in current or current[i].kind is ProcessKind.EXITED)
            )
        return arrivals, exits

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
        for key in self._holders.keys() - seen:
            self._exits.unwatch(self._holders.pop(key).identity)
        self._absent &= seen

    def _publish_host_pids(self, views: Mapping[str, VgpuView], units: Mapping[str, _Unit]) -> None:
        for vgpu_id, view in views.items():
            control = view.control
            if control is None:
                continue
            mine = units[vgpu_id].host_pids
            written = self._host_pids.get(vgpu_id)
            if written is mine:  # a unit kept from a scan that published it
                continue
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

    def _files_of(self, vgpu_id: str, view: VgpuView) -> _VgpuFiles:
        """The vGPU's block files, stat()ed once per mapping the registry
        holds (a usage block replaced after a truncation is a new file)."""
        adopted = next((a for a in self._adopted.values() if a.vgpu_id == vgpu_id), None)
        if adopted is not None:
            return _VgpuFiles(BlockFile(adopted.key, None), None)
        known = self._files.get(vgpu_id)
        if known is not None and known[0] is view.usage and known[1] is view.control:
            return known[2]
        files = _VgpuFiles(
            BlockFile.of(view.usage.path),
            None if view.control is None else BlockFile.of(view.control.path),
        )
        self._files[vgpu_id] = (view.usage, view.control, files)
        return files

    def _holder_tracked(
        self,
        process: Process,
        kind: ProcessKind,
        vgpu_id: str,
        slot: SlotView,
        devices: _Devices,
        nvml: NvmlSample | None,
        on_gpu: bool,
        known: Mapping[Identity, _Held],
    ) -> _Held:
        """A slot holder as tracked; the last scan's (``known``), when
        nothing it is made of changed (blocks.py hands back the same
        SlotView for unchanged slot words) and NVML's figures of it are the
        same."""
        held = known.get(process.identity)
        memory, util = self._figures_of(process.pid, nvml if on_gpu else None)
        if (
            held is not None
            and held.slot is slot
            and held.devices is devices
            and held.process is process
            and held.tracked.vgpu_id == vgpu_id
            and held.tracked.kind is kind
            and held.tracked.memory == memory
            and held.tracked.sm_util == util
        ):
            return held
        hooked = devices.per_uuid([d.used for d in slot.devices])
        tracked = self._tracked(process, kind, vgpu_id, slot.index, nvml, hooked)
        return _Held(slot, devices, process, tracked)

    # processes no slot holds

    def _unslotted(
        self, process: Process, nvml: NvmlSample | None, member: str | None, managed: bool
    ) -> TrackedProcess:
        """A GPU process that holds no slot the host confirms. ``member``:
        the vGPU the host puts it in (``managed``: a daemon-owned one)."""
        env = self._environ(process)
        hooked = env is not None and HOOK_LIBRARY in env.get("LD_PRELOAD", "")
        kind = ProcessKind.HOOKED if hooked else ProcessKind.UNMANAGED
        # In a daemon-owned vGPU's container its memory is that vGPU's,
        # whatever its environment says: no standalone block of its own
        # (``env -u VGPU_CONTROL CUDA_CORE_LIMIT=100``) takes it out.
        if managed or env is None or not hooked or "VGPU_CONTROL" in env:
            return self._tracked(process, kind, member, None, nvml)
        if not any(k.startswith(SEED_LIMIT_PREFIXES) for k in env):
            return self._tracked(process, kind, member, None, nvml)
        adopted = self._adopt(process)
        if adopted is None:
            return self._tracked(process, kind, member, None, nvml)
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
        hooked_bytes = _Devices.of(adopted.blocks).per_uuid([d.used for d in slot.devices])
        return self._tracked(
            process, ProcessKind.STANDALONE, adopted.vgpu_id, slot.index, nvml, hooked_bytes
        )

    def _ghost(self, pid: int, memory: Mapping[str, int]) -> TrackedProcess | None:
        """An exited process NVML still lists memory under: a child it
        forked keeps that memory through inherited driver descriptors. It
        stays charged to the vGPU it was in while NVML lists it — the
        process NVML's memory under the pid was first charged to, never one
        that has the pid now."""
        owner = self._owners.get(pid)
        known = self._ghosts.get(pid)
        if known is None or known.identity != owner:
            known = self._previous.get(owner) if owner is not None else None
            if known is None or known.vgpu_id is None:
                return None
        ghost = replace(
            known, kind=ProcessKind.EXITED, slot=None, hooked={}, memory=memory, sm_util={}
        )
        self._ghosts[pid] = ghost
        return ghost

    def _earlier(
        self, pid: int, live: Identity | None, nvml: NvmlSample
    ) -> Mapping[str, int] | None:
        """The part of NVML's memory under ``pid`` that is an exited
        process's (None: all of it is ``live``'s, the process at the pid now).

        NVML lists memory by pid, and a fork child can keep an exited
        process's memory listed under its pid for as long as it likes:
        once the host gives the pid to another process, that memory is not
        the newcomer's (a tenant would escape its limit and have someone
        else's process killed for it). So the memory is the process it was
        first charged to while NVML lists the pid without a gap; a process
        found at the pid later is charged only what comes on top of what
        was listed when it came (the exited one's part shrinks with NVML's
        figure, never grows: it cannot hide the newcomer's own allocations
        beyond that). A gap in the listing ends it: a new process that
        allocates at a reused pid after one is charged in full."""
        owner = self._owners.setdefault(pid, live or (pid, NOBODY))
        if live is None:
            return nvml.memory_of(pid)
        if owner == live:
            return None
        memory = nvml.memory_of(pid)
        kept = self._kept.get(pid)
        if kept is None:
            kept = dict(memory)
        else:
            kept = {uuid: min(b, memory.get(uuid, 0)) for uuid, b in kept.items()}
        self._kept[pid] = kept
        self._held_back[pid] = kept
        return kept

    def _forget_unlisted(self, listed: set[int]) -> None:
        """A pid missing from a sample is a gap: its memory's owner is over."""
        if self._owners.keys() - listed:
            self._owners = {pid: o for pid, o in self._owners.items() if pid in listed}
            self._kept = {pid: k for pid, k in self._kept.items() if pid in listed}

    def _figures_of(
        self, pid: int, nvml: NvmlSample | None
    ) -> tuple[Mapping[str, int], Mapping[str, float]]:
        """NVML's memory and SM utilization of a live host process, per GPU
        uuid, less what an exited process keeps under its pid (``_earlier``)."""
        if nvml is None:
            return {}, {}
        memory = nvml.memory_of(pid)
        kept = self._held_back.get(pid)
        if kept:
            memory = {u: b - kept.get(u, 0) for u, b in memory.items() if b > kept.get(u, 0)}
        return memory, nvml.util_of(pid)

    def _adopt(self, process: Process) -> _Adopted | None:
        """The standalone usage block this process maps, adopted once per file.

        Only a file the process's own user owns, with no permission for
        anyone else (what the hook creates): another user's file is not
        this process's budget (docs/security.md, "Standalone blocks").
        One block per process for its lifetime, within the per-uid and
        per-node caps: /proc/<pid>/maps is read once in a process's life,
        and map_files/<range> opens whatever the range maps now, so a
        process remapping a new file there before each scan would
        otherwise get a new vGPU every scan."""
        mine = self._adopted_by.get(process.identity)
        if mine is not None and mine in self._adopted:
            return self._adopted[mine]
        if process.identity in self._unanswered:
            return None
        facts = self._evidence.maps(process, STANDALONE_BUDGET)
        managed = {f[2].usage_key for f in self._files.values()}
        tried: set[FileKey] = set()
        for mapping in facts.candidates if facts is not None else ():
            if not _may_be_usage_block(mapping) or mapping.file_key in managed | tried:
                continue
            if len(tried) == ADOPT_TRIES:  # a process chooses how many files it maps
                break
            tried.add(mapping.file_key)
            name = f"/proc/{process.pid}/map_files/{mapping.range_name}"
            try:
                fd = self.procfs.open_mapped(process.pid, mapping, write=True)
            except ReadPending:
                return None  # another's open is stuck: tried again at a later scan
            except OSError as err:
                log.debug("cannot open a mapped file", path=name, error=str(err))
                continue
            if fd is None:
                self._unanswered.add(process.identity)
                return None
            try:
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino)
                if key != mapping.file_key:  # remapped since its maps were read
                    log.debug("mapped file is not the one maps showed", path=name, pid=process.pid)
                    continue
                if mine is not None and key != mine:
                    self._refuse(process, "a second standalone block for one process")
                    continue
                if key in self._adopted:
                    self._adopted_by[process.identity] = key
                    return self._adopted[key]
                if st.st_uid != process.uid or st.st_mode & 0o077:
                    log.debug(
                        "mapped file is not the process's own",
                        path=name,
                        owner=st.st_uid,
                        mode=f"{st.st_mode & 0o777:o}",
                        pid=process.pid,
                    )
                    continue
                full = self._standalone_full(st.st_uid)
                if full is not None:
                    self._refuse(process, full)
                    return None
                usage = UsageBlock.open_fd(fd, name, tenant=f"uid {st.st_uid}")
            except (BlockError, OSError) as err:
                log.debug("mapped file is not a usage block", path=name, error=str(err))
                continue
            finally:
                os.close(fd)
            adopted = _Adopted(f"sa-{key[0]:x}-{key[1]}", VgpuBlocks(usage), key, st.st_uid)
            self._adopted[key] = adopted
            self._adopted_by[process.identity] = key
            # Per uid: a user's processes, each with a new block, come and go
            # as fast as it starts them.
            tenant_said(
                log,
                "info",
                "adopted standalone vGPU",
                tenant=f"uid {adopted.uid}",
                vgpu=adopted.vgpu_id,
                pid=process.pid,
            )
            return adopted
        return None

    def _standalone_full(self, uid: int) -> str | None:
        """Why no more standalone block can be adopted for ``uid``, if so."""
        if len(self._adopted) >= STANDALONE_PER_NODE:
            return f"the node has {STANDALONE_PER_NODE} standalone vGPUs adopted already"
        if sum(1 for a in self._adopted.values() if a.uid == uid) >= STANDALONE_PER_UID:
            return f"uid {uid} has {STANDALONE_PER_UID} standalone vGPUs adopted already"
        return None

    def _refuse(self, process: Process, why: str) -> None:
        """A standalone block not adopted: said once per process."""
        if process.identity not in self._refused:
            self._refused.add(process.identity)
            tenant_said(
                log,
                "warning",
                "standalone block not adopted",
                tenant=f"uid {process.uid}",
                pid=process.pid,
                uid=process.uid,
                why=why,
            )

    def _drop_idle_standalone(self) -> None:
        """An adopted block with no slot in use is done with: unmap it."""
        for key, adopted in list(self._adopted.items()):
            if not adopted.blocks.usage.slots():
                tenant_said(
                    log,
                    "info",
                    "standalone vGPU has no process left: released",
                    tenant=f"uid {adopted.uid}",
                    vgpu=adopted.vgpu_id,
                )
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
        memory, util = self._figures_of(process.pid, nvml)
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
        """Its environment, read once per lifetime. A read that never came
        back (docs/security.md, "Bounded reads") is taken as unreadable for
        the process's lifetime; others are read again at a later scan while
        that one holds the reader."""
        identity = (process.pid, process.start_time)
        if identity not in self._envs:
            try:
                self._envs[identity] = self.procfs.environ(process.pid)
            except ReadPending:
                return None
        return self._envs[identity]

    def _forget_gone(
        self, current: Mapping[Identity, TrackedProcess], units: Iterable[_Unit]
    ) -> None:
        keep = set(current).union(*(unit.holders for unit in units))
        for cache in (self._containers, self._envs):
            for identity in cache.keys() - keep:
                del cache[identity]
        self._evidence.keep(keep)
        self._ghosts = {pid: g for pid, g in self._ghosts.items() if g.identity in current}
        if self._adopted_by.keys() - keep:  # a process's block is its own while either lives
            self._adopted_by = {
                i: key for i, key in self._adopted_by.items() if i in keep or key in self._adopted
            }
        self._refused &= keep
        self._unanswered &= keep


def _is_own_proc(proc_root: str | os.PathLike[str]) -> bool:
    """Whether ``proc_root`` is a /proc of our own PID namespace (its pids are
    the ones pidfd_open takes), not a copy or another namespace's mount."""
    try:
        return os.readlink(os.path.join(proc_root, "self")) == str(os.getpid())
    except OSError:
        return False


def _same_values(a: Mapping[int, object], b: Mapping[int, object]) -> bool:
    """The same keys, each with the same object."""
    return a.keys() == b.keys() and all(v is b[k] for k, v in a.items())


def _may_be_usage_block(mapping: MappedFile) -> bool:
    return mapping.shared and mapping.offset == 0 and mapping.size == USAGE_MAPPING_SIZE


def _usage(
    vgpu_id: str,
    view: VgpuView,
    devices: _Devices,
    hooked: Sequence[int],
    budgets: Sequence[UsageDevice] | None,
    mine: Sequence[TrackedProcess],
    live_slots: int,
) -> VgpuUse:
    """``hooked``: each device's memory word; ``budgets``: a standalone
    vGPU's counters (None for a daemon-owned one)."""
    gpus: dict[str, GpuUse] = {}
    for index, uuid in enumerate(devices.uuids):
        if not uuid:
            continue  # a standalone hook without GPU_DEVICES_UUID: no NVML to match
        utils = [p.sm_util[uuid] for p in mine if uuid in p.sm_util]
        gpus[uuid] = GpuUse(
            uuid=uuid,
            limit=devices.limits[index],
            hooked_used=hooked[index] if index < len(hooked) else 0,
            nvml_used=sum(p.memory.get(uuid, 0) for p in mine),
            sm_util=sum(utils) if utils else None,
            processes=sum(1 for p in mine if uuid in p.memory or uuid in p.sm_util),
            counters=None if budgets is None or index >= len(budgets) else budgets[index],
            steered_ppm=None if budgets is None else view.usage.read_steer(index).quota_ppm,
        )
    return VgpuUse(
        vgpu_id=vgpu_id,
        standalone=budgets is not None,
        gpus=gpus,
        pids=tuple(sorted(p.pid for p in mine)),
        live_slots=live_slots,
    )
