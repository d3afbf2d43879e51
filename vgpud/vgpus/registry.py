"""The vGPUs this node has: admission, blocks on disk, durable state.

Every change is all-or-nothing: a create that fails at any step removes what
it made; an update is saved before it is applied to the control block, so a
crash in between is repaired at the next start (the state file is the truth
and adoption re-applies it).

Run dir layout (docs/security.md, "Files, owners and the API"): run_dir and
each <run_dir>/<vgpu_id>/ 0711 (no one but root lists them); in it control
(root, 0644: read-only for everyone) and usage, owned by the vGPU's user
(mode 0600, 0660 when a group shares it): writable by its tenant and the
daemon alone. Adoption gives a usage block back to its recorded user,
whatever changed it. No file is shared by two vGPUs: every vGPU's blocks are
entered in the turn broker (``TurnBroker``), which grants each GPU's turn to
one vGPU at a time through the control blocks (docs/security.md, "The GPU turn").
Adoption at start: each recorded vGPU's blocks are opened and validated, not
recreated, so running processes do not notice; a missing or corrupt block is
recreated and reported; a vGPU with no directory at all (a run dir emptied
by a reboot, a create cut between its save and its blocks) gets its blocks
made, not reported as damage. What a crash left is removed and logged: directories
in run_dir named like a vGPU with no state entry, and temporary files of
unfinished writes (a process that maps a removed file keeps its mapping).
"""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from vgpud.dirs import make_dirs
from vgpud.errors import (
    ApiError,
    Conflict,
    InsufficientStorage,
    InUse,
    NotFound,
    ServerError,
    Unprocessable,
    storage_error,
)
from vgpud.log import tenant_said
from vgpud.threadname import name_this_thread
from vgpud.units import format_bytes, percent_to_ppm
from vgpud.vgpus.abi import FLAG_OVERSUBSCRIBE, BlockError
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.blocks import Access, ControlBlock, DeviceSlice, TurnBroker, UsageBlock
from vgpud.vgpus.cdi import NullPublisher, SpecPublisher
from vgpud.vgpus.model import (
    ID_PATTERN,
    ROOT_USER,
    BlockUser,
    CreateRequest,
    Limits,
    Slice,
    UpdateRequest,
    Vgpu,
    valid_name,
)
from vgpud.vgpus.recipe import Paths
from vgpud.vgpus.state import StateError, StateStore, remove_temps

log = structlog.get_logger(__name__)
# A usage block's bytes, and the most its file may hold beyond them (the
# rounding to a page of a file whose pages are all allocated).
_USAGE_BYTES = ctypes.sizeof(UsageBlock.struct)
_PAGE = mmap.PAGESIZE

# run_dir and each vGPU's directory: anyone may pass through to a file whose
# own mode lets them in (a host process opens its blocks by path), no one
# but root may list or add.
DIR_MODE = 0o711

# Where a vGPU goes, decided by the caller's policy (policy/placement.py)
# from every vGPU the registry counts, under the registry's lock: a new
# vGPU's slices from its limits; an updated one's from its new limits.
# Either raises the ApiError that refuses the change.
Placer = Callable[[Limits, Sequence[Vgpu]], tuple[Slice, ...]]
Refitter = Callable[[Vgpu, Limits, Sequence[Vgpu]], tuple[Slice, ...]]


@dataclass(frozen=True)
class Repair:
    """A block found missing or corrupt and made again."""

    vgpu: str
    block: str  # "control" or "usage"
    reason: str


@dataclass(frozen=True)
class Adoption:
    """What a start found: the vGPUs served again, the blocks remade."""

    adopted: list[Vgpu]
    repairs: list[Repair]


@dataclass(frozen=True)
class Updated:
    entry: Entry
    warnings: list[str]  # a limit set below what is in use now


@dataclass(frozen=True)
class Deleted:
    vgpu: Vgpu
    forced: bool  # deleted with processes still in it


@dataclass
class _Pending:
    """A change decided and counted by admission, waiting for the state
    file. ``record`` is the vGPU as the file will hold it (None: deleted).
    On the loop, while the writer's thread writes and flushes the file:
    ``prepare`` makes what the change needs before it is seen (a new
    vGPU's blocks; if it fails, the change alone fails, and the file is
    saved again without it). On the writer's thread: ``publish`` what
    follows the saved file on disk (CDI, removing a deleted vGPU's
    directory). On the loop: ``apply`` makes the change seen in the
    instant the save ends, ``undo`` removes what ``prepare`` made when the
    save fails."""

    vgpu_id: str
    record: Vgpu | None
    apply: Callable[[], None]
    publish: Callable[[], None]
    done: asyncio.Future[None]
    prepare: Callable[[], None] | None = None
    undo: Callable[[], None] | None = None


@dataclass(frozen=True)
class _Saved:
    """What a save left: the changes that failed, by vGPU id, and whether
    the file still names those (their second save failed too)."""

    unmade: Mapping[str, Exception]
    still_recorded: bool = False


@dataclass
class Entry:
    """A vGPU with its mapped blocks."""

    vgpu: Vgpu
    control: ControlBlock
    usage: UsageBlock
    paths: Paths
    turns: list[int] = field(default_factory=list)  # its devices' ids in the turn broker

    def close(self) -> None:
        self.control.close()
        self.usage.close()


def _still_recorded(vgpu_id: str, err: Exception, save: OSError) -> ApiError:
    """A create whose blocks failed, and whose removal from the state file
    failed too: the caller's error, saying what the node keeps."""
    detail = (
        f"{err}; the state file could not be saved without vGPU {vgpu_id} either "
        f"({save.strerror or save}): it stays recorded and counted, without blocks, "
        "until the next start makes them"
    )
    return type(err)(detail) if isinstance(err, ApiError) else ServerError(detail)


def device_slices(v: Vgpu) -> list[DeviceSlice]:
    share_ppm = percent_to_ppm(v.limits.share)
    soft = v.limits.mode == "soft"
    return [DeviceSlice(s.gpu_uuid, s.memory, share_ppm, soft, v.limits.weight) for s in v.slices]


def usage_access(user: BlockUser) -> Access:
    """The usage block's owner, group and mode for a vGPU's user."""
    return Access(user.mode, user.uid, -1 if user.gid is None else user.gid)


def apply_limits(control: ControlBlock, v: Vgpu) -> None:
    """Write a vGPU's limits into its control block (live: hooks read them
    at the next allocation or pacer refresh)."""
    for i, d in enumerate(device_slices(v)):
        control.set_mem_limit(i, d.mem_limit)
        control.set_share(i, d.share_ppm, d.soft, d.weight)
    control.set_flags(FLAG_OVERSUBSCRIBE if v.oversubscribe else 0)


class Registry:
    """The vGPUs. Changes are made on the event loop, which is their lock:
    each is decided (placement, names, ids) against every vGPU recorded
    or pending, and counted from that instant. It is durable, and seen,
    once a save of the state file that holds it has ended: the writer
    (``_write``) saves on a thread, for every change that arrived while the
    last save was in flight at once (group commit: one write and flush for
    many). A second change to a vGPU waits for the first to be saved."""

    def __init__(
        self,
        run_dir: Path,
        store: StateStore,
        library: Path,
        atomics: Atomics,
        clock: Callable[[], float] = time.time,
        cdi: SpecPublisher | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.store = store
        self.library = library
        self.atomics = atomics
        self.clock = clock
        self.entries: dict[str, Entry] = {}
        self._listed: tuple[tuple[Entry, ...], tuple[Entry, ...]] = ((), ())  # for all()
        self.cdi = cdi or NullPublisher()  # CDI specs follow every change
        # Blocks let go of (a deleted vGPU's, a replaced usage block) while a
        # reader holds a pin: unmapped when the last pin goes (see ``pin``).
        self._pins = 0
        self._retired: list[ControlBlock | UsageBlock] = []
        # Recorded vGPUs whose blocks could not be made at start (a full run
        # dir): kept in the state file and in admission's sums, not served.
        self.skipped: dict[str, Vgpu] = {}
        self.broker = TurnBroker(atomics)
        self._pending: dict[str, _Pending] = {}
        self._writer: asyncio.Task[None] | None = None
        # Told, on the loop, how long each save of the state file took to
        # write and flush (seconds): the disk's share of a change's answer.
        self.on_saved: Callable[[float], None] = lambda seconds: None
        # Repairs made since the last ``adopt``/``repair_usage`` answer.
        self._repairs: list[Repair] = []

    # --- lookup ----------------------------------------------------------

    def all(self) -> list[Entry]:
        """The vGPUs, oldest first (asked for on every control tick: sorted
        again only when the entries changed)."""
        now = tuple(self.entries.values())
        if now != self._listed[0]:
            self._listed = (now, tuple(sorted(now, key=lambda e: e.vgpu.created_at)))
        return list(self._listed[1])

    def get(self, key: str) -> Entry:
        """By id or by name."""
        entry = self.entries.get(key)
        if entry is None:
            entry = next((e for e in self.entries.values() if e.vgpu.name == key), None)
        if entry is None:
            raise NotFound(f"no vGPU {key!r}")
        return entry

    # --- who may unmap a block, and when ----------------------------------------

    def pin(self) -> None:
        """Keep every block mapped that is mapped now, until ``unpin``: a
        scan reads the blocks of the vGPUs it was given on a thread and
        then on the loop, and a vGPU deleted meanwhile must still be
        readable there (its files are gone; reading them harms nothing)."""
        self._pins += 1

    def unpin(self) -> None:
        self._pins -= 1
        if self._pins == 0:
            retired, self._retired = self._retired, []
            for block in retired:
                block.close()

    @contextmanager
    def pinned(self) -> Iterator[None]:
        self.pin()
        try:
            yield
        finally:
            self.unpin()

    def _retire(self, *blocks: ControlBlock | UsageBlock) -> None:
        """Unmap now, or when the last reader lets go."""
        if self._pins:
            self._retired.extend(blocks)
        else:
            for block in blocks:
                block.close()

    # --- start --------------------------------------------------------------

    def adopt(self) -> Adoption:
        """Reload the recorded vGPUs and take over their blocks as they are."""
        make_dirs(self.run_dir, DIR_MODE)
        os.chmod(self.run_dir, DIR_MODE)  # an older daemon made it 0755
        try:
            recorded = self.store.load()
        except StateError as exc:
            raise ServerError(str(exc)) from exc
        for v in recorded:
            try:
                entry = self._adopt_one(v)
            except (OSError, BlockError, ApiError) as exc:
                log.error(
                    "vGPU skipped: its blocks cannot be made (it stays recorded and counted; "
                    "the next start tries again)",
                    vgpu=v.id,
                    error=str(exc),
                )
                self.skipped[v.id] = v
                continue
            self.entries[v.id] = entry
            self._enter(entry)
        self._clean_leftovers()
        self.cdi.sync((e.vgpu, e.paths) for e in self.all())
        repairs, self._repairs = self._repairs, []
        return Adoption([e.vgpu for e in self.all()], repairs)

    def _adopt_one(self, v: Vgpu) -> Entry:
        paths = self.paths(v.id)
        if not os.path.lexists(paths.control.parent):
            # Nothing of it on disk: a run dir the node emptied (a reboot,
            # /run is a tmpfs) or a create the daemon died in, between its
            # save and its blocks (they are made beside the save). Not a
            # damage to report.
            log.info("blocks made for a recorded vGPU that had none", vgpu=v.id)
            return self._make_blocks(v)
        paths.control.parent.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(paths.control.parent, DIR_MODE)
        try:
            control = ControlBlock.open(paths.control, atomics=self.atomics)
            if control.uuids != v.uuids or control.vgpu_id != v.id:
                control.close()
                raise BlockError(f"control block {paths.control} belongs to another vGPU")
        except BlockError as exc:
            control = ControlBlock.create(
                paths.control, v.id, device_slices(v), atomics=self.atomics
            )
            self._repaired(v, "control", str(exc))
        # The state file is the truth: re-applying equal limits is invisible
        # to running processes, and repairs an update a crash interrupted.
        apply_limits(control, v)
        access = usage_access(v.user)
        try:
            usage = UsageBlock.open(paths.usage, device_count=len(v.slices), atomics=self.atomics)
        except BlockError as exc:
            try:
                usage = UsageBlock.create(
                    paths.usage, device_count=len(v.slices), atomics=self.atomics, access=access
                )
            except BaseException:
                control.close()
                raise
            self._repaired(v, "usage", str(exc))
        else:
            try:
                usage.set_access(access)
            except OSError as exc:  # not root: the block stays as it is
                log.warning("cannot give the usage block to its user", vgpu=v.id, error=str(exc))
        return Entry(v, control, usage, paths)

    def _enter(self, entry: Entry) -> None:
        """Enter the vGPU's devices in the turn broker. One it cannot take
        (its tables full) leaves that vGPU's processes there without grants:
        they run unarbitrated between vGPUs (over-counting), nobody else
        is touched."""
        for dev in range(len(entry.vgpu.slices)):
            try:
                entry.turns.append(self.broker.add(entry.control, entry.usage, dev))
            except BlockError as exc:
                log.warning("no GPU turn for the vGPU", vgpu=entry.vgpu.id, error=str(exc))

    def _leave(self, entry: Entry) -> None:
        """Out of the turn broker, before its blocks are let go of (the
        broker's thread reads them while entered)."""
        for handle in entry.turns:
            self.broker.remove(handle)
        entry.turns.clear()

    def repair_usage(self) -> list[Repair]:
        """Cut back the usage blocks their tenants grew, and recreate those
        a container cut short under our mapping (``UsageBlock.lost``): the
        new file serves the vGPU's next processes; those that mapped the old
        one broke it themselves. The caller makes sure no other thread reads
        the blocks meanwhile."""
        for entry in self.entries.values():
            self._trim_grown(entry)
            if entry.usage.lost:
                try:
                    usage = UsageBlock.create(
                        entry.paths.usage,
                        device_count=len(entry.vgpu.slices),
                        atomics=self.atomics,
                        access=usage_access(entry.vgpu.user),
                    )
                except (OSError, BlockError) as exc:
                    # A full run dir: the lost block (zeros) stays until a scan can.
                    tenant_said(
                        log,
                        "warning",
                        "cannot recreate a lost usage block",
                        tenant=entry.vgpu.id,
                        vgpu=entry.vgpu.id,
                        error=str(exc),
                    )
                    continue
                # The broker's account of the vGPU (its turn credit) goes on
                # with the new block: entered afresh, a tenant that cut its
                # block short at every scan would start each with full credit.
                for handle in entry.turns:
                    self.broker.rebind(handle, usage)
                self._retire(entry.usage)
                entry.usage = usage
                self._repaired(entry.vgpu, "usage", "truncated under the daemon's mapping")
        repairs, self._repairs = self._repairs, []
        return repairs

    def _trim_grown(self, entry: Entry) -> bool:
        """A usage block is its layout's size. Its tenant owns the file and
        may grow it and write past the layout: on the run directory's tmpfs
        that fills it, and a full run directory stops the daemon's creates
        and repairs. What it wrote there is cut off at each scan (and when
        a create finds the directory full); its processes map only the
        layout. Whether it was cut."""
        size = _USAGE_BYTES
        try:
            st = os.stat(entry.paths.usage, follow_symlinks=False)
            if st.st_size <= size and st.st_blocks * 512 <= size + _PAGE:
                return False  # its size, or cut short (the lost-block repair's)
            fd = os.open(entry.paths.usage, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False  # gone or replaced: the lost-block repair sees to it
        try:
            os.ftruncate(fd, size)
        except OSError as exc:
            tenant_said(
                log,
                "warning",
                "cannot cut a grown usage block back",
                tenant=entry.vgpu.id,
                vgpu=entry.vgpu.id,
                error=str(exc),
            )
            return False
        finally:
            os.close(fd)
        self._repaired(entry.vgpu, "usage", f"grown by its tenant to {st.st_size} bytes")
        return True

    def _repaired(self, v: Vgpu, which: str, why: str) -> None:
        # A tenant may regrow or cut its block before every scan: the line
        # is bounded (the repair itself is reported in full, as an event).
        tenant_said(
            log,
            "warning",
            "block missing or corrupt: recreated",
            tenant=v.id,
            kind=which,
            vgpu=v.id,
            block=which,
            reason=why,
        )
        self._repairs.append(Repair(v.id, which, why))

    def _clean_leftovers(self) -> None:
        """What a crash leaves: the blocks of a vGPU made but not recorded
        (or recorded deleted but not yet removed), temporary files of
        writes never renamed into place, and vgpus.json beside the
        vgpus.state that replaced it. Only names vgpud makes, only real
        directories and files (never through a symlink). A process that
        still maps a removed block keeps its mapping; nothing is freed
        under it."""
        for orphan in self._orphans():
            try:
                shutil.rmtree(orphan)
            except OSError as exc:
                log.warning("cannot remove blocks of no vGPU", path=str(orphan), error=str(exc))
                continue
            log.warning("removed blocks of no vGPU in the state file", path=str(orphan))
        dirs = [e.paths.control.parent for e in self.all()]
        for directory in [self.store.dir, *dirs]:
            for temp in remove_temps(directory):
                log.warning("removed a temporary file a crash left", path=str(temp))
        superseded = self.store.remove_superseded()
        if superseded is not None:
            log.warning("removed a state file of the old format a crash left", path=str(superseded))

    def _orphans(self) -> list[Path]:
        try:
            entries = sorted(os.scandir(self.run_dir), key=lambda e: e.name)
        except OSError:
            return []
        return [
            Path(e.path)
            for e in entries
            if ID_PATTERN.fullmatch(e.name)
            and e.name not in self.entries
            and e.name not in self.skipped
            and e.is_dir(follow_symlinks=False)
        ]

    # --- changes --------------------------------------------------------------

    async def create(
        self, req: CreateRequest, limits: Limits, place: Placer, user: BlockUser = ROOT_USER
    ) -> Entry:
        """Admit, place, make the blocks, record. ``limits`` are the
        request's with the configured defaults filled in; ``user`` is who
        may write the usage block (the Service decides it from the caller)."""
        if req.name is not None:
            self._check_name(req.name)
        if req.exclusive:
            limits = replace(limits, share=100, mode="hard")
        vgpu = Vgpu(
            id=self._new_id(),
            name=req.name,
            slices=place(limits, self._counted()),
            limits=limits,
            oversubscribe=req.oversubscribe,
            exclusive=req.exclusive,
            created_at=self.clock(),
            labels=dict(req.labels),
            owner=dict(req.owner),
            user=user,
        )
        made: list[Entry] = []

        def apply() -> None:
            self.entries[vgpu.id] = made[0]
            self._enter(made[0])

        def undo() -> None:
            for entry in made:
                entry.close()
                shutil.rmtree(entry.paths.control.parent, ignore_errors=True)

        # Published by the writer's thread once saved, maybe before the
        # loop has made the blocks (their paths are known): a spec whose
        # blocks fail is withdrawn, one a crash leaves is removed at start.
        paths = self.paths(vgpu.id)
        pending = self._reserve(vgpu.id, vgpu, apply, lambda: self.cdi.publish(vgpu, paths))
        pending.prepare = lambda: made.append(self._make_blocks(vgpu))
        pending.undo = undo
        await self._saved(pending, "cannot record the vGPU")
        log.info("vGPU created", vgpu=vgpu.id, name=vgpu.name, gpus=vgpu.uuids)
        return made[0]

    async def update(self, key: str, req: UpdateRequest, refit: Refitter) -> Updated:
        """New limits, live. Returns the entry and warnings (memory set
        below what is in use now: allowed, said)."""
        entry = await self._settled(key)
        old = entry.vgpu
        if old.exclusive and (req.memory is not None or req.share is not None or req.mode):
            raise Unprocessable(
                "an exclusive vGPU holds whole GPUs: its memory and share are fixed"
            )
        limits = Limits(
            memory=req.memory or old.limits.memory,
            share=req.share if req.share is not None else old.limits.share,
            mode=req.mode or old.limits.mode,
            weight=req.weight if req.weight is not None else old.limits.weight,
        )
        new = replace(old, limits=limits, slices=refit(old, limits, self._counted()))

        def apply() -> None:
            apply_limits(entry.control, new)
            entry.vgpu = new

        pending = self._reserve(old.id, new, apply, lambda: self.cdi.publish(new, entry.paths))
        await self._saved(pending, "cannot record the change")
        log.info("vGPU updated", vgpu=new.id, memory=str(limits.memory), share=limits.share)
        return Updated(entry, self._below_use(entry))

    async def delete(self, key: str, *, force: bool, processes: int) -> Deleted:
        entry = await self._settled(key)
        if processes and not force:
            raise InUse(f"vGPU {entry.vgpu.id} is used by {processes} process(es)")

        def apply() -> None:
            del self.entries[entry.vgpu.id]
            self._leave(entry)
            self._retire(entry.control, entry.usage)

        def publish() -> None:
            shutil.rmtree(entry.paths.control.parent, ignore_errors=True)
            self.cdi.withdraw(entry.vgpu.id)

        pending = self._reserve(entry.vgpu.id, None, apply, publish)
        await self._saved(pending, "cannot record the deletion")
        log.info("vGPU deleted", vgpu=entry.vgpu.id, processes=processes)
        return Deleted(entry.vgpu, bool(processes))

    # --- the writer ---------------------------------------------------------------

    def _reserve(
        self,
        vgpu_id: str,
        record: Vgpu | None,
        apply: Callable[[], None],
        publish: Callable[[], None],
    ) -> _Pending:
        """Count a change from now on (admission sees it), before it is saved."""
        done = asyncio.get_running_loop().create_future()
        pending = _Pending(vgpu_id, record, apply, publish, done)
        self._pending[vgpu_id] = pending
        return pending

    def _release(self, pending: _Pending) -> None:
        del self._pending[pending.vgpu_id]

    async def _settled(self, key: str) -> Entry:
        """The entry, once no change to it waits for the state file."""
        while True:
            entry = self.get(key)
            pending = self._pending.get(entry.vgpu.id)
            if pending is None:
                return entry
            await asyncio.wait([pending.done])

    async def _saved(self, pending: _Pending, what: str) -> None:
        """Wait until the change is durable; a failed save raises its error
        (after the change is undone and counted no more)."""
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write())
        try:
            await asyncio.shield(pending.done)
        except OSError as exc:
            raise storage_error(what, exc) from exc

    async def _write(self) -> None:
        """Save until no change waits: each save holds every change that
        waits when it starts."""
        try:
            while batch := list(self._pending.values()):
                try:
                    await self._commit(batch)
                except Exception as exc:  # the save failed: each of its changes does
                    for p in batch:
                        if self._pending.get(p.vgpu_id) is p:  # not applied
                            self._release(p)
                            if p.undo is not None:
                                p.undo()
                        if not p.done.done():
                            p.done.set_exception(exc)
        finally:
            self._writer = None

    async def _commit(self, batch: list[_Pending]) -> None:
        """One save: the file is written and flushed on a thread (one hop
        for the whole batch) while the loop prepares (a create's blocks,
        whose time the disk's flush then hides). Its changes are applied
        together in the instant it ends (no await between the save and the
        applying, so no vGPU is ever neither counted nor served), then
        their callers are answered."""
        records = self._recorded()
        # Submitted here, not at the next await: the disk starts at once.
        saving = asyncio.get_running_loop().run_in_executor(
            None, self._save, batch, self.store.encode(records)
        )
        unmade = self._prepare(batch)
        self.on_saved(await saving)
        saved = _Saved(unmade)
        if unmade:
            saved = await asyncio.to_thread(self._save_without, records, unmade)
        for p in batch:
            self._release(p)
            failed = saved.unmade.get(p.vgpu_id)
            if failed is None:
                p.apply()
                p.done.set_result(None)
                continue
            if saved.still_recorded and p.record is not None:
                # The file still names it: counted, as a vGPU adoption
                # could not make blocks for, until a start makes them.
                self.skipped[p.vgpu_id] = p.record
            p.done.set_exception(failed)

    def _save(self, batch: list[_Pending], data: bytes) -> float:
        """The writer's thread: the file, then what follows it on disk.
        Returns how long the file took (seconds)."""
        name_this_thread("vgpud-save")  # a pool's thread, named for what it does now
        start = time.perf_counter()
        self.store.write(data)
        seconds = time.perf_counter() - start
        for p in batch:
            p.publish()
        return seconds

    def _prepare(self, batch: list[_Pending]) -> dict[str, Exception]:
        """The changes that could not be prepared, by vGPU id."""
        unmade: dict[str, Exception] = {}
        for p in batch:
            if p.prepare is not None:
                try:
                    p.prepare()
                except Exception as exc:
                    unmade[p.vgpu_id] = exc
        return unmade

    def _save_without(self, records: list[Vgpu], unmade: dict[str, Exception]) -> _Saved:
        """On a thread: the file just saved names vGPUs whose blocks could
        not be made; save it again without them, and withdraw their CDI
        specs. If that save fails too, the file still names them: they stay
        counted and are made at the next start, and their callers are told
        so."""
        for vid in unmade:
            self.cdi.withdraw(vid)
        try:
            self.store.write(self.store.encode(v for v in records if v.id not in unmade))
        except OSError as exc:
            log.error(
                "vGPUs recorded without blocks: counted, made at the next start",
                vgpus=sorted(unmade),
                error=str(exc),
            )
            told = {vid: _still_recorded(vid, err, exc) for vid, err in unmade.items()}
            return _Saved(told, still_recorded=True)
        return _Saved(unmade)

    def _recorded(self) -> list[Vgpu]:
        """What the next save holds: the recorded vGPUs with the waiting
        changes made, oldest first, then the new ones."""
        queued = {p.vgpu_id: p.record for p in self._pending.values()}
        out = []
        for v in self._vgpus():
            record = queued.pop(v.id, v)
            if record is not None:
                out.append(record)
        return out + [v for v in queued.values() if v is not None]

    def _counted(self) -> list[Vgpu]:
        """What admission counts: the recorded vGPUs and every pending
        change's vGPU. An update counts both its old and its new limits until
        it is saved, a delete its vGPU: whatever a failed save leaves, no
        GPU holds more than admission allowed."""
        return self._vgpus() + [p.record for p in self._pending.values() if p.record is not None]

    def close(self) -> None:
        """At shutdown, after every reader has stopped."""
        for entry in self.entries.values():
            self._leave(entry)
            entry.close()
        self.entries.clear()
        for block in self._retired:
            block.close()
        self._retired.clear()
        self.broker.stop()

    # --- helpers --------------------------------------------------------------

    def paths(self, vgpu_id: str) -> Paths:
        d = self.run_dir / vgpu_id
        return Paths(
            control=d / "control",
            usage=d / "usage",
            library=self.library,
        )

    def _vgpus(self) -> list[Vgpu]:
        """Every recorded vGPU: what admission counts and what is saved."""
        return [e.vgpu for e in self.all()] + list(self.skipped.values())

    def _new_id(self) -> str:
        while True:
            vid = f"vg-{secrets.token_hex(4)}"
            if (
                vid not in self.entries
                and vid not in self._pending
                and vid not in self.skipped
                and not (self.run_dir / vid).exists()
            ):
                return vid

    def _check_name(self, name: str) -> None:
        if not valid_name(name):
            raise Unprocessable(
                f"name {name!r}: use 1-63 lower-case letters, digits, '-' or '.', "
                "starting and ending with a letter or digit, not shaped like an id (vg-xxxxxxxx)"
            )
        if any(v.name == name for v in self._counted()):
            raise Conflict(f"a vGPU named {name!r} exists")

    def _make_blocks(self, v: Vgpu) -> Entry:
        """The vGPU's blocks. On a full run directory, the blocks tenants
        grew are cut back first and the blocks tried once more: a tenant
        writing past its block's layout in a loop fills the run directory
        between two scans, and each create in between was refused (507)."""
        try:
            return self._try_make_blocks(v)
        except InsufficientStorage:
            grown = [e for e in self.entries.values() if self._trim_grown(e)]
            if not grown:
                raise
            return self._try_make_blocks(v)

    def _try_make_blocks(self, v: Vgpu) -> Entry:
        paths = self.paths(v.id)
        directory = paths.control.parent
        control: ControlBlock | None = None
        try:
            directory.mkdir(mode=DIR_MODE)
            os.chmod(directory, DIR_MODE)  # not the umask's choice
            control = ControlBlock.create(
                paths.control, v.id, device_slices(v), atomics=self.atomics
            )
            apply_limits(control, v)
            usage = UsageBlock.create(
                paths.usage,
                device_count=len(v.slices),
                atomics=self.atomics,
                access=usage_access(v.user),
            )
        except (OSError, BlockError) as exc:
            if control is not None:
                control.close()
            shutil.rmtree(directory, ignore_errors=True)
            what = f"cannot create the blocks in {directory}"
            if isinstance(exc, OSError):
                raise storage_error(what, exc) from exc
            raise ServerError(f"{what}: {exc}") from exc
        return Entry(v, control, usage, paths)

    def _below_use(self, entry: Entry) -> list[str]:
        out = []
        for s, dev in zip(entry.vgpu.slices, entry.usage.devices(), strict=True):
            if dev.used > s.memory:
                out.append(
                    f"GPU {s.gpu_index}: limit {format_bytes(s.memory)} is below the "
                    f"{format_bytes(dev.used)} in use; allocations fail until use drops"
                )
        return out
