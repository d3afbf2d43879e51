"""The shared-memory blocks: the only module that opens, maps and reads them.

What their bytes are is abi.py's (the mirror of libhook/include/vgpu_abi.h);
how a word is changed under the hooks' feet is atomics.py's. This module
gives the bytes their meaning: limits, budgets, slots, the throttle tables.

Public interface (what the tracker, the reaper and the steering use):

- ``DeviceSlice`` (frozen): what one control-block device entry says.
- ``ControlBlock.create(path, vgpu_id, devices, flags)`` / ``.open(path)``;
  ``.set_mem_limit(dev, bytes)``, ``.set_share(dev, share_ppm, soft, weight)``,
  ``.write_throttle(dev, quota_ppm, window_ns)`` (seqlock; epoch += 1 on a
  change, nothing written when nothing changes), ``.read_throttle(dev)``,
  ``.heartbeat(now_ns)``, ``.set_slot_host_pid(slot, pid)``,
  ``.slot_host_pid(slot)``, ``.devices()``, ``.uuids``, ``.vgpu_id``,
  ``.flags``, ``.set_flags(flags)``, ``.close()``.
- ``UsageBlock.create(path, device_count=0, access=DAEMON_ONLY)`` /
  ``.open(path, device_count=None)`` / ``.open_fd(fd, name, device_count=None)``;
  ``.set_access(access)`` (``Access``: owner, group and mode of the file);
  ``.devices() -> list[UsageDevice]``, ``.slots() -> list[SlotView]`` (non-FREE
  slots only), ``.reclaim_slot(index, expect) -> tuple[int, ...] | None``,
  ``.reset_used(dev)``, ``.write_steer(dev, quota_ppm, window_ns)``,
  ``.read_steer(dev)`` (UNSTEERED when unreadable), ``.steer_heartbeat(now_ns)``,
  ``.standalone_limits()``, ``.close()``.
- ``TurnBroker(atomics)``: ``.add(control, usage, dev) -> id``, ``.remove(id)``,
  ``.stop()``: the C thread that grants each GPU's turn to one vGPU at a
  time through the control blocks (docs/compute.md, "Taking turns").
- ``BlockError`` (abi.py): a block that is missing, not a regular file,
  foreign, of another layout version or size.

Reads are plain loads of naturally aligned words (single-copy atomic on
x86-64 and aarch64), which is all observation needs. Everything that must be
ordered or must not lose a concurrent update from a hook (slot state changes,
subtracting reclaimed bytes, the seqlock) goes through atomics.py.

The usage block is written by untrusted containers: nothing read from it is
believed blindly. Absurd figures are clamped and named in ``clamped`` so the
caller can report them; a block never makes the daemon crash, and never
makes it wait: every read of it is bounded (seqlock tries, CAS tries, the
fixed slot and device counts).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import structlog

from vgpud.log import tenant_said
from vgpud.units import PPM_FULL  # vgpu_abi.h's VGPU_PPM_FULL, kept with its conversions
from vgpud.vgpus.abi import (
    ABI_VERSION,
    CONTROL_MAGIC,
    DEV_CALIBRATED,
    DEV_SOFT,
    ID_LEN,
    MAX_DEVICES,
    MAX_PROCS,
    SLOT_ACTIVE,
    SLOT_CLAIMING,
    SLOT_FREE,
    SLOT_RECLAIMING,
    SLOT_STATE_NAMES,
    USAGE_MAGIC,
    UUID_LEN,
    AbiStruct,
    BlockError,
    BlockHeader,
    ControlC,
    ControlDeviceC,
    ProcDeviceC,
    ProcSlotC,
    UsageC,
    UsageDeviceC,
)
from vgpud.vgpus.atomics import Atomics, Throttle, bind, seqlock_read, seqlock_write

log = structlog.get_logger(__name__)

# A byte counter above 1 PiB is no real GPU's: the writer is broken or hostile.
ABSURD_BYTES = 2**50


@dataclass(frozen=True)
class Access:
    """Who may open a block file: owner and group (-1: the daemon's own)
    and mode."""

    mode: int
    uid: int = -1
    gid: int = -1

    def apply(self, fd: int) -> None:
        """Only a file's owner may chmod it, and the daemon's unit grants
        CAP_CHOWN, not CAP_FOWNER: take the file, set its mode, give it away."""
        os.fchown(fd, os.geteuid(), -1)
        os.fchmod(fd, self.mode)
        os.fchown(fd, self.uid, self.gid)


# The daemon's alone (a usage block with no tenant yet).
DAEMON_ONLY = Access(0o600)
# Read by anyone who can reach it, written by the daemon (the control block).
DAEMON_WRITES = Access(0o644)


# --- value types ------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSlice:
    """One GPU of a vGPU as the control block states it."""

    uuid: str
    mem_limit: int
    share_ppm: int = PPM_FULL
    soft: bool = False
    weight: int = 1


UNSTEERED = Throttle(quota_ppm=0, window_ns=0, epoch=0)


@dataclass(frozen=True)
class ControlDevice:
    """A control-block device entry as read back."""

    uuid: str
    mem_limit: int
    share_ppm: int
    soft: bool
    weight: int
    throttle: Throttle
    calibrated: bool = False  # the quota is corrected by NVML (set_calibrated)


@dataclass(frozen=True)
class UsageDevice:
    """The vGPU-wide counters of one device. ``clamped`` names the fields whose
    stored value was absurd and has been replaced by a bound."""

    used: int
    peak: int
    oom_count: int
    gpu_time_ns: int
    launches: int
    throttled_ns: int
    mem_limit: int
    share_ppm: int
    clamped: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlotDevice:
    used: int
    overhead: int
    gpu_time_ns: int
    launches: int
    throttled_ns: int


@dataclass(frozen=True)
class SlotView:
    """A non-free process slot. Identity is (pidns, pid, start_time)."""

    index: int
    state: int
    pid: int
    pidns: int
    start_time: int
    heartbeat_ns: int
    devices: tuple[SlotDevice, ...]
    clamped: tuple[str, ...] = ()

    @property
    def state_name(self) -> str:
        return SLOT_STATE_NAMES.get(self.state, f"unknown({self.state})")

    @property
    def used(self) -> int:
        return sum(d.used for d in self.devices)


@dataclass(frozen=True)
class StandaloneLimits:
    """What a standalone hook recorded from its environment."""

    device_count: int
    uuids: tuple[str, ...]
    mem_limit: tuple[int, ...]
    share_ppm: tuple[int, ...]
    flags: int


# --- mapping ----------------------------------------------------------------

_HEADER = ctypes.sizeof(BlockHeader)


class _Mapping:
    """A block file mapped shared; subclasses add the struct's meaning."""

    struct: ClassVar[type[AbiStruct]]
    magic: ClassVar[int]
    kind: ClassVar[str]

    def __init__(self, path: Path, mm: mmap.mmap, atomics: Atomics) -> None:
        self.path = path
        self._mm = mm
        self._atomics = atomics
        self._c = self.struct.from_buffer(mm)
        self._base = ctypes.addressof(self._c)

    @classmethod
    def _map(cls, path: Path, *, writable: bool, head: int = _HEADER) -> tuple[mmap.mmap, bytes]:
        """Map an existing block file, refusing anything but a regular file
        of exactly our layout. O_NOFOLLOW: a symlink planted by a container
        is refused, never followed. Returns what ``_map_fd`` does."""
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            raise BlockError(f"cannot open {cls.kind} block {path}: {exc.strerror}") from exc
        try:
            return cls._map_fd(fd, path, head)
        finally:
            os.close(fd)

    @classmethod
    def _map_fd(cls, fd: int, path: Path, head: int = _HEADER) -> tuple[mmap.mmap, bytes]:
        """Map an open block file; ``path`` only names it in errors. The
        caller keeps (and closes) ``fd``. Returns the mapping and the
        file's first ``head`` bytes (the header at least), read from the fd
        before it is mapped: a usage block is its tenant's, who may shrink
        it at any moment, and a byte read through a mapping no SIGBUS guard
        covers yet kills the daemon. Nothing is read through the mapping
        here; the caller guards it before it does. A file shrunk meanwhile
        is a BlockError, never a crash."""
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BlockError(f"{cls.kind} block {path} is not a regular file")
        size = ctypes.sizeof(cls.struct)
        if st.st_size != size:
            raise BlockError(
                f"{cls.kind} block {path} has {st.st_size} bytes, layout v{ABI_VERSION} "
                f"needs {size}"
            )
        try:
            raw = os.pread(fd, head, 0)
        except OSError as exc:
            raise BlockError(f"cannot read {cls.kind} block {path}: {exc.strerror}") from exc
        if len(raw) < head:
            raise BlockError(f"{cls.kind} block {path} shrank under the daemon")
        hdr = BlockHeader.from_buffer_copy(raw)
        problem = None
        if hdr.magic != cls.magic:
            problem = f"bad magic {hdr.magic:#x} (not a vgpud {cls.kind} block)"
        elif hdr.version != ABI_VERSION:
            problem = f"layout version {hdr.version}, this vgpud knows {ABI_VERSION}"
        elif hdr.size != size:
            problem = f"header size {hdr.size}, layout v{ABI_VERSION} needs {size}"
        if problem is not None:
            raise BlockError(f"{cls.kind} block {path}: {problem}")
        try:
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
        except (OSError, ValueError) as exc:
            # mmap checks the size again (ValueError): shrunk since fstat.
            raise BlockError(f"cannot map {cls.kind} block {path}: {exc}") from exc
        return mm, raw

    @classmethod
    def _create_file(
        cls, path: Path, access: Access, fill: Callable[[ctypes.Structure], None]
    ) -> mmap.mmap:
        """Write a new block beside ``path`` and rename it into place, so no
        reader ever maps a half-written block. Its access is set first and
        explicitly: the umask does not decide who may map it, and it has
        its name only once it is its tenant's. Its pages are allocated
        before it is mapped: a sparse file on a full file system would
        answer the first store through the mapping with SIGBUS, which kills
        the daemon (and every hook that maps it) without a word; allocated,
        a full disk is an OSError (ENOSPC) here and nothing is left."""
        size = ctypes.sizeof(cls.struct)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            access.apply(fd)
            os.posix_fallocate(fd, 0, size)
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED)
            c = cls.struct.from_buffer(mm)
            fill(c)
            c.hdr.size = size
            c.hdr.version = ABI_VERSION
            c.hdr.magic = cls.magic
            del c
            # No msync: every mapping of the file shares these pages, so a
            # reader sees the whole block from the rename on; only a power
            # cut could lose them, and then adoption finds the block corrupt
            # and remakes it, its limits from the state file (msync was
            # half of a create's block time, on the API's write path).
            os.rename(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        return mm

    def _addr(self, obj: ctypes.Structure, field: str) -> int:
        return ctypes.addressof(obj) + int(getattr(type(obj), field).offset)

    def close(self) -> None:
        if self._mm.closed:
            return
        del self._c
        self._mm.close()

    def __enter__(self) -> _Mapping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _put_text(field_len: int, value: str, what: str) -> bytes:
    data = value.encode()
    if len(data) >= field_len or b"\0" in data:
        raise BlockError(f"{what} {value!r} does not fit {field_len - 1} bytes")
    return data


def _check_ppm(value: int, what: str) -> None:
    if not 0 <= value <= PPM_FULL:
        raise ValueError(f"{what} {value} is outside 0..{PPM_FULL}")


# --- the control block ------------------------------------------------------


class ControlBlock(_Mapping):
    """Limits and throttle table of one vGPU; written only by the daemon."""

    struct = ControlC
    magic = CONTROL_MAGIC
    kind = "control"
    _c: ControlC

    def __init__(self, path: Path, mm: mmap.mmap, atomics: Atomics) -> None:
        super().__init__(path, mm, atomics)
        self._published: dict[int, tuple[int, int]] = {}  # dev -> (quota, window) written

    @classmethod
    def create(
        cls,
        path: Path,
        vgpu_id: str,
        devices: Sequence[DeviceSlice],
        flags: int = 0,
        *,
        atomics: Atomics | None = None,
    ) -> ControlBlock:
        if not 1 <= len(devices) <= MAX_DEVICES:
            raise BlockError(f"a vGPU has 1..{MAX_DEVICES} devices, not {len(devices)}")
        vid = _put_text(ID_LEN, vgpu_id, "vGPU id")
        uuids = [_put_text(UUID_LEN, d.uuid, "GPU UUID") for d in devices]
        for d in devices:
            _check_ppm(d.share_ppm, "share_ppm")

        def fill(c: ctypes.Structure) -> None:
            assert isinstance(c, ControlC)
            c.vgpu_id = vid
            c.device_count = len(devices)
            c.flags = flags
            for i, d in enumerate(devices):
                e = c.devices[i]
                e.uuid = uuids[i]
                e.mem_limit = d.mem_limit
                e.share_ppm = d.share_ppm
                e.flags = DEV_SOFT if d.soft else 0
                e.weight = d.weight
                # Until the controller's first tick a vGPU runs at its share.
                e.throttle.quota_ppm = d.share_ppm
                e.throttle.epoch = 1

        mm = cls._create_file(Path(path), DAEMON_WRITES, fill)
        return cls(Path(path), mm, atomics or Atomics.load())

    @classmethod
    def open(cls, path: Path, *, atomics: Atomics | None = None) -> ControlBlock:
        mm, _ = cls._map(Path(path), writable=True)
        block = cls(Path(path), mm, atomics or Atomics.load())
        if not 1 <= block._c.device_count <= MAX_DEVICES:
            count = block._c.device_count
            block.close()
            raise BlockError(f"control block {path}: device_count {count} out of range")
        return block

    @property
    def vgpu_id(self) -> str:
        return _text(self._c.vgpu_id)

    @property
    def device_count(self) -> int:
        return int(self._c.device_count)

    @property
    def uuids(self) -> list[str]:
        return [_text(self._c.devices[i].uuid) for i in range(self.device_count)]

    def mem_limits(self) -> tuple[int, ...]:
        """Each device's memory limit (what the tracker reads every scan,
        without the throttle reads of ``devices()``)."""
        return tuple(int(self._c.devices[i].mem_limit) for i in range(self.device_count))

    @property
    def flags(self) -> int:
        return int(self._atomics.load_u32(self._addr(self._c, "flags")))

    def set_flags(self, flags: int) -> None:
        self._atomics.store_u32(self._addr(self._c, "flags"), flags)

    def _dev(self, index: int) -> ControlDeviceC:
        if not 0 <= index < self.device_count:
            raise IndexError(f"device index {index} outside 0..{self.device_count - 1}")
        return self._c.devices[index]  # type: ignore[no-any-return]

    def devices(self) -> list[ControlDevice]:
        out = []
        for i in range(self.device_count):
            e = self._dev(i)
            out.append(
                ControlDevice(
                    uuid=_text(e.uuid),
                    mem_limit=int(e.mem_limit),
                    share_ppm=int(e.share_ppm),
                    soft=bool(e.flags & DEV_SOFT),
                    weight=int(e.weight),
                    throttle=self.read_throttle(i),
                    calibrated=bool(e.flags & DEV_CALIBRATED),
                )
            )
        return out

    def set_mem_limit(self, dev_index: int, nbytes: int) -> None:
        self._atomics.store_u64(self._addr(self._dev(dev_index), "mem_limit"), nbytes)

    def set_share(self, dev_index: int, share_ppm: int, soft: bool, weight: int) -> None:
        _check_ppm(share_ppm, "share_ppm")
        e = self._dev(dev_index)
        self._atomics.store_u32(self._addr(e, "weight"), weight)
        self._set_dev_flag(dev_index, DEV_SOFT, soft)
        self._atomics.store_u32(self._addr(e, "share_ppm"), share_ppm)

    def set_calibrated(self, dev_index: int, on: bool) -> None:
        """Say whether the controller calibrates this device's quota by
        NVML's device figure (the hook then estimates batches it would
        otherwise gate: docs/compute.md)."""
        self._set_dev_flag(dev_index, DEV_CALIBRATED, on)

    def _set_dev_flag(self, dev_index: int, flag: int, on: bool) -> None:
        # The daemon is the only writer, on its loop: load then store.
        addr = self._addr(self._dev(dev_index), "flags")
        flags = int(self._atomics.load_u32(addr))
        self._atomics.store_u32(addr, flags | flag if on else flags & ~flag)

    def write_throttle(self, dev_index: int, quota_ppm: int, window_ns: int = 0) -> bool:
        """Publish a quota; returns whether anything changed (and was written).
        The daemon is the only writer, so what it published last is what the
        entry holds: a repeated quota (most ticks) costs no read of the block."""
        _check_ppm(quota_ppm, "quota_ppm")
        if self._published.get(dev_index) == (quota_ppm, window_ns):
            return False
        base = self._addr(self._dev(dev_index), "throttle")
        wanted = (quota_ppm, window_ns)
        current = seqlock_read(self._atomics, base)
        # None (unreadable): a daemon died mid-write; writing makes it whole.
        changed = current is None or (current.quota_ppm, current.window_ns) != wanted
        if changed:
            seqlock_write(self._atomics, base, quota_ppm, window_ns)
        self._published[dev_index] = wanted
        return changed

    def read_throttle(self, dev_index: int) -> Throttle:
        """The entry as published. Only the daemon writes it, so one that
        stays odd was left mid-write by a daemon that died: its fields are
        then taken as they stand, and the next write_throttle repairs it."""
        entry = self._dev(dev_index).throttle
        read = seqlock_read(self._atomics, ctypes.addressof(entry))
        return read or Throttle(int(entry.quota_ppm), int(entry.window_ns), int(entry.epoch))

    def heartbeat(self, now_ns: int) -> None:
        self._atomics.store_u64(self.heartbeat_address(), now_ns)

    def heartbeat_address(self) -> int:
        """Where the heartbeat is, for the control tick's one store into
        every block (``Atomics.store_u64_each``); valid while mapped."""
        return self._addr(self._c, "heartbeat_ns")

    @property
    def heartbeat_ns(self) -> int:
        return int(self._atomics.load_u64(self._addr(self._c, "heartbeat_ns")))

    def set_slot_host_pid(self, slot: int, pid: int) -> None:
        if not 0 <= slot < MAX_PROCS:
            raise IndexError(f"slot {slot} outside 0..{MAX_PROCS - 1}")
        addr = ctypes.addressof(self._c) + ControlC.slot_host_pid.offset + 4 * slot
        self._atomics.store_u32(addr, pid & 0xFFFFFFFF)

    def slot_host_pid(self, slot: int) -> int:
        return int(self._c.slot_host_pid[slot])


# --- the usage block --------------------------------------------------------

_SLOTS_OFF = UsageC.slots.offset
# What a usage block's open reads from its file before mapping it: the
# header and the standalone hook's device_count (a u32).
_USAGE_COUNT = UsageC.device_count.offset
_USAGE_HEAD = _USAGE_COUNT + 4
_SLOT_SIZE = ctypes.sizeof(ProcSlotC)
_SLOT_WORDS = _SLOT_SIZE // 8
_UDEV_OFF = UsageC.devices.offset
_UDEV_SIZE = ctypes.sizeof(UsageDeviceC)
_PDEV_OFF = ProcSlotC.dev.offset
_PDEV_WORDS = ctypes.sizeof(ProcDeviceC) // 8
_UDEV_USED = UsageDeviceC.used.offset // 8
_UDEV_GPU_TIME = UsageDeviceC.gpu_time_ns.offset // 8
_UDEV_THROTTLED = UsageDeviceC.throttled_ns.offset // 8
_UDEV_LAUNCHES = UsageDeviceC.launches.offset // 8
# The word views below rely on every struct being a whole number of u64s.
assert _SLOT_SIZE % 8 == 0 and _UDEV_SIZE % 8 == 0 and _SLOTS_OFF % 8 == 0
assert _UDEV_OFF % 8 == 0 and _PDEV_OFF % 8 == 0 and ctypes.sizeof(UsageC) % 8 == 0


def _clamp(
    values: dict[str, int], bounds: dict[str, int]
) -> tuple[dict[str, int], tuple[str, ...]]:
    """Replace values above their bound by the bound; name the ones replaced."""
    clamped = tuple(k for k, bound in bounds.items() if values[k] > bound)
    for k in clamped:
        values[k] = bounds[k]
    return values, clamped


def _usage_device(
    used: int,
    peak: int,
    oom: int,
    gtime: int,
    launches: int,
    throttled: int,
    limit: int,
    share: int,
) -> UsageDevice:
    """A usage block's device entry from its first eight words."""
    share &= 0xFFFFFFFF
    if max(used, peak, limit) <= ABSURD_BYTES and share <= PPM_FULL:
        # Every word within its bound: most reads, at every scan and view.
        return UsageDevice(used, peak, oom, gtime, launches, throttled, limit, share)
    values, clamped = _clamp(
        {"used": used, "peak": peak, "mem_limit": limit, "share_ppm": share},
        {
            "used": ABSURD_BYTES,
            "peak": ABSURD_BYTES,
            "mem_limit": ABSURD_BYTES,
            "share_ppm": PPM_FULL,
        },
    )
    return UsageDevice(
        oom_count=oom,
        gpu_time_ns=gtime,
        launches=launches,
        throttled_ns=throttled,
        clamped=clamped,
        **values,
    )


class UsageBlock(_Mapping):
    """Per-device budgets and per-process slots; written by hooks (untrusted)."""

    struct = UsageC
    magic = USAGE_MAGIC
    kind = "usage"
    _c: UsageC

    def __init__(
        self,
        path: Path,
        mm: mmap.mmap,
        atomics: Atomics,
        device_count: int,
        tenant: str | None = None,
    ) -> None:
        super().__init__(path, mm, atomics)
        # The container may truncate the file under our mapping: the guard
        # turns the SIGBUS that would kill the daemon into zero pages.
        self._guard = atomics.guard_add(self._base, ctypes.sizeof(UsageC))
        if self._guard < 0:
            _Mapping.close(self)
            raise BlockError(f"usage block {path}: cannot guard its mapping")
        # Bulk reads go through word views: one slice per slot instead of a
        # ctypes object per field keeps a 1000-process scan cheap.
        self._w32 = memoryview(mm).cast("I")
        self._w64 = memoryview(mm).cast("Q")
        self.device_count = device_count
        self._device_words = [(_UDEV_OFF + d * _UDEV_SIZE) // 8 for d in range(device_count)]
        self._devices: tuple[list[list[int]], tuple[UsageDevice, ...]] = ([], ())
        self._active: tuple[bytes, int] = (b"", 0)  # slot states read last, ACTIVE among them
        # The last view built of each slot, with the words it was built from:
        # a slot whose words did not change since (most, most scans) is not
        # parsed again. A SlotView is a pure function of those words.
        self._views: dict[int, tuple[list[int], SlotView]] = {}
        self._states: list[int] = []  # every slot's state at the last read
        self._in_use: list[int] = []  # the indices of the non-free ones
        # Header (state and pid, pidns, start time, heartbeat) and device words.
        self._slot_words = _PDEV_OFF // 8 + _PDEV_WORDS * device_count
        # The states, the copy of the in-use slots' span and the views made
        # of them, at the last dense read.
        self._span: tuple[list[int], bytes, list[SlotView]] = ([], b"", [])
        self._steer_unreadable_said = False  # warned once per block, not per scan
        # Who writes the block, for the log lines its words cause
        # (vgpud.log.tenant_said): an adopted block's user, whose processes
        # may come and go each with a new block; by default the block itself.
        self.tenant = tenant or str(path)

    @classmethod
    def create(
        cls,
        path: Path,
        *,
        device_count: int = MAX_DEVICES,
        atomics: Atomics | None = None,
        access: Access = DAEMON_ONLY,
    ) -> UsageBlock:
        """An empty usage block for a daemon-owned vGPU, writable by its
        tenant (``access``, which the registry gives) and root alone.
        ``device_count`` is how many device entries this daemon reads; the
        block's own device_count field stays 0 (it is standalone-only)."""
        mm = cls._create_file(Path(path), access, lambda c: None)
        return cls(Path(path), mm, atomics or Atomics.load(), _check_count(device_count))

    def set_access(self, access: Access) -> None:
        """Give the block file (back) to its tenant: owner, group and mode
        as recorded, whatever anyone changed (an adopted block of an older
        daemon was 0666)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            access.apply(fd)
        finally:
            os.close(fd)

    @classmethod
    def open(
        cls, path: Path, *, device_count: int | None = None, atomics: Atomics | None = None
    ) -> UsageBlock:
        """Map an existing block. ``device_count`` None: a standalone block,
        which says itself how many devices its environment limited."""
        mm, head = cls._map(Path(path), writable=True, head=_USAGE_HEAD)
        return cls._open_mapped(mm, head, Path(path), device_count, atomics)

    @classmethod
    def open_fd(
        cls,
        fd: int,
        name: str,
        *,
        device_count: int | None = None,
        atomics: Atomics | None = None,
        tenant: str | None = None,
    ) -> UsageBlock:
        """Map a block from an fd opened read-write by the caller (the tracker
        reaches a standalone block through /proc/<pid>/map_files, a kernel
        link that O_NOFOLLOW would refuse); validated like ``open``."""
        mm, head = cls._map_fd(fd, Path(name), _USAGE_HEAD)
        return cls._open_mapped(mm, head, Path(name), device_count, atomics, tenant)

    @classmethod
    def _open_mapped(
        cls,
        mm: mmap.mmap,
        head: bytes,
        path: Path,
        device_count: int | None,
        atomics: Atomics | None,
        tenant: str | None = None,
    ) -> UsageBlock:
        """The block of a fresh mapping, guarded before anything reads it
        (``__init__``); a standalone block's own device count is taken
        from ``head``, read from the file, not through the mapping."""
        if device_count is None:
            own = int.from_bytes(head[_USAGE_COUNT:_USAGE_HEAD], sys.byteorder)
            device_count = min(own, MAX_DEVICES)
        try:
            count = _check_count(device_count)
        except BlockError:
            mm.close()
            raise
        return cls(Path(path), mm, atomics or Atomics.load(), count, tenant)

    def close(self) -> None:
        if self._mm.closed:
            return
        self._w32.release()
        self._w64.release()
        self._atomics.guard_remove(self._guard)
        super().close()

    @property
    def lost(self) -> bool:
        """The file shrank under our mapping (a container truncated it):
        what it shows now is zeros, not the hooks' counters; let it go."""
        return bool(self._atomics.guard_lost(self._guard))

    # reading

    def devices(self) -> tuple[UsageDevice, ...]:
        """The vGPU-wide counters per device; parsed again only when their
        words changed (read for every vGPU at every scan and API view)."""
        words = [self._w64[w : w + 8].tolist() for w in self._device_words]
        known = self._devices  # one attribute: the scan's thread reads it too
        if known[0] == words:
            return known[1]
        parsed = tuple(_usage_device(*w) for w in words)
        self._devices = (words, parsed)
        return parsed

    def memory_used(self) -> tuple[int, ...]:
        """Each device's memory word (bytes the hooks reserved), bounded as
        ``devices`` bounds it: of a busy vGPU's counters the one that moves
        seldom, which the scan reads without parsing the others."""
        w = self._w64
        return tuple(min(w[i + _UDEV_USED], ABSURD_BYTES) for i in self._device_words)

    def pacing_addresses(self) -> list[int]:
        """Where each device's gpu_time_ns, throttled_ns and launches are,
        in that order: the controller's inputs, which the control tick reads
        from every block in one call (``Atomics.load_u64_each``); valid
        while mapped."""
        out = []
        for d in range(self.device_count):
            w = self._base + _UDEV_OFF + d * _UDEV_SIZE
            out += [w + 8 * _UDEV_GPU_TIME, w + 8 * _UDEV_THROTTLED, w + 8 * _UDEV_LAUNCHES]
        return out

    def slots(self) -> list[SlotView]:
        states = self._slot_states().tolist()
        if states != self._states:  # which slots are in use changes rarely
            self._states = states
            self._in_use = [i for i, st in enumerate(states) if st != SLOT_FREE]
            self._views = {i: v for i, v in self._views.items() if i in self._in_use}
        states, in_use = self._states, self._in_use  # the same list while the states are
        if not in_use or in_use[-1] - in_use[0] >= 2 * len(in_use):
            return [self._slot(i, states[i]) for i in in_use]  # none, or spread out
        # Dense (a hook takes the lowest free slot): the words of the in-use
        # slots' span are copied at once, and the views are made from that
        # copy. A span whose bytes are the last read's, with the same states,
        # has the same views: no slot is gone through (most blocks, most scans).
        start = (_SLOTS_OFF + in_use[0] * _SLOT_SIZE) // 8
        span = self._w64[start : start + (in_use[-1] - in_use[0]) * _SLOT_WORDS + self._slot_words]
        copy = span.tobytes()
        known = self._span  # one attribute: the scan's thread reads slots too
        if known[0] is states and known[1] == copy:
            return list(known[2])
        words = memoryview(copy).cast("Q")
        views = [
            self._slot(i, states[i], words[(i - in_use[0]) * _SLOT_WORDS :][: self._slot_words])
            for i in in_use
        ]
        self._span = (states, copy, views)
        return list(views)

    def active_slots(self) -> int:
        """How many slots are ACTIVE: the states alone are read, and counted
        again only when they changed (the API asks for every vGPU in every
        view)."""
        states = self._slot_states().tobytes()
        known = self._active  # one attribute: the scan's thread may ask too
        if known[0] != states:
            known = (states, memoryview(states).cast("I").tolist().count(SLOT_ACTIVE))
            self._active = known
        return known[1]

    def _slot_states(self) -> memoryview:
        """Every slot's state word (a strided view of the block)."""
        first = _SLOTS_OFF // 4
        stride = _SLOT_SIZE // 4
        return self._w32[first : first + stride * MAX_PROCS : stride]

    def _slot(self, index: int, state: int, read: memoryview | None = None) -> SlotView:
        """The slot's view from its words (``read``: as copied by the caller;
        else read now)."""
        if read is None:
            w = (_SLOTS_OFF + index * _SLOT_SIZE) // 8
            read = self._w64[w : w + self._slot_words]
        words = read.tolist()
        cached = self._views.get(index)
        if cached is not None and cached[0] == words and cached[1].state == state:
            return cached[1]
        view = self._parse_slot(index, state, words)
        self._views[index] = (words, view)
        return view

    def _parse_slot(self, index: int, state: int, words: list[int]) -> SlotView:
        pid = words[0] >> 32
        pidns, start_time, heartbeat = words[1:4]
        words = words[_PDEV_OFF // 8 :]
        devices = []
        clamped: list[str] = []
        for d in range(self.device_count):
            used, overhead, gtime, launches, throttled = words[d * 5 : d * 5 + 5]
            if used > ABSURD_BYTES or overhead > ABSURD_BYTES:
                clamped.append(f"dev[{d}].used")
                used, overhead = min(used, ABSURD_BYTES), min(overhead, ABSURD_BYTES)
            devices.append(SlotDevice(used, overhead, gtime, launches, throttled))
        return SlotView(
            index=index,
            state=state,
            pid=pid - (1 << 32) if pid & 0x80000000 else pid,
            pidns=pidns,
            start_time=start_time,
            heartbeat_ns=heartbeat,
            devices=tuple(devices),
            clamped=tuple(clamped),
        )

    def standalone_limits(self) -> StandaloneLimits:
        """The limits its hook recorded, for at most the devices fixed at
        adoption: the tenant may raise its device_count word at any time,
        and what every other reading of the block (``devices()``, slots,
        pacing addresses) covers must bound what is read here."""
        word = int(self._atomics.load_u32(self._addr(self._c, "device_count")))
        count = min(word, self.device_count)
        devs = [self._c.devices[d] for d in range(count)]
        return StandaloneLimits(
            device_count=count,
            uuids=tuple(_text(self._c.uuids[d].value) for d in range(count)),
            mem_limit=tuple(min(int(e.mem_limit), ABSURD_BYTES) for e in devs),
            share_ppm=tuple(min(int(e.share_ppm), PPM_FULL) for e in devs),
            flags=int(self._atomics.load_u32(self._addr(self._c, "flags"))),
        )

    # repairing

    def reclaim_slot(self, index: int, expect: SlotView) -> tuple[int, ...] | None:
        """Return a dead process's bytes to the vGPU's budgets and free its
        slot, only if the slot still holds the identity seen in ``expect``.

        The CAS to RECLAIMING shuts out hooks racing for the same slot; the
        identity is checked again after it, since the slot may have been
        freed and claimed by another process between the caller's look and
        the CAS. Returns the bytes freed per device, or None when the slot
        changed hands (nothing touched)."""
        if expect.state not in (SLOT_ACTIVE, SLOT_CLAIMING):
            raise ValueError(f"cannot reclaim a slot in state {expect.state_name}")
        slot = self._c.slots[index]
        at = self._atomics
        state_addr = self._addr(slot, "state")
        if not at.cas_u32(state_addr, expect.state, SLOT_RECLAIMING):
            return None
        if not _same_identity(self._slot(index, SLOT_RECLAIMING), expect):
            # Another process owns it now: hand it back as it was (CAS, so a
            # claimer that moved on to ACTIVE meanwhile is not overwritten).
            at.cas_u32(state_addr, SLOT_RECLAIMING, expect.state)
            return None
        freed = []
        # Every entry, not only device_count: bytes a writer left anywhere
        # in the slot go back to the budget they came from.
        for d in range(MAX_DEVICES):
            pdev = slot.dev[d]
            nbytes = int(at.load_u64(self._addr(pdev, "used")))
            if nbytes:
                # Bounded (a tenant hammering the word): if it gives up, the
                # bytes stay charged to this vGPU alone until reset_used.
                at.sub_clamp_u64(self._addr(self._c.devices[d], "used"), nbytes)
            for field in ("used", "overhead", "gpu_time_ns", "launches", "throttled_ns"):
                at.store_u64(self._addr(pdev, field), 0)
            if d < self.device_count:
                freed.append(nbytes)
        for field in ("pidns", "start_time", "heartbeat_ns"):
            at.store_u64(self._addr(slot, field), 0)
        at.store_u32(self._addr(slot, "pid"), 0)
        at.store_u32(state_addr, SLOT_FREE)
        return tuple(freed)

    def swap_used(self, dev_index: int, expect: int, new: int) -> bool:
        """Set a device's budget to ``new`` if it still holds ``expect``
        (CAS: a hook that reserved or released meanwhile wins)."""
        addr = self._addr(self._c.devices[_index(dev_index, MAX_DEVICES)], "used")
        return bool(self._atomics.cas_u64(addr, expect, new))

    def reset_used(self, dev_index: int) -> int | None:
        """Zero a device's budget; only when no process of the vGPU lives
        (this also repairs any leak). Returns the bytes that were held, or
        None when a hook changed the budget meanwhile (CAS: a process that
        started after the caller looked reserves against the total, and a
        plain store would erase its reservation); the caller retries later."""
        addr = self._addr(self._c.devices[_index(dev_index, MAX_DEVICES)], "used")
        held = int(self._atomics.load_u64(addr))
        if held and not self._atomics.cas_u64(addr, held, 0):
            return None
        return held

    # steering adopted standalone processes

    def write_steer(self, dev_index: int, quota_ppm: int, window_ns: int = 0) -> None:
        _check_ppm(quota_ppm, "quota_ppm")
        entry = self._c.steer.throttle[_index(dev_index, MAX_DEVICES)]
        seqlock_write(self._atomics, ctypes.addressof(entry), quota_ppm, window_ns)

    def read_steer(self, dev_index: int) -> Throttle:
        """The quota last steered to, or UNSTEERED when the entry cannot be
        read: its seq word is in the tenant's hands, and a tenant that keeps
        it odd loses only the display of its own steering (the hooks' reader
        gives up too, and keeps its last quota). Said once per block. The
        quota is the tenant's to overwrite too: shown as at most a whole
        GPU (the hook takes a steered quota only as a lower limit)."""
        entry = self._c.steer.throttle[_index(dev_index, MAX_DEVICES)]
        read = seqlock_read(self._atomics, ctypes.addressof(entry))
        if read is not None:
            return replace(read, quota_ppm=min(read.quota_ppm, PPM_FULL))
        if not self._steer_unreadable_said:
            self._steer_unreadable_said = True
            tenant_said(
                log,
                "warning",
                "usage block's steer entry unreadable (seq held odd): shown as never steered",
                tenant=self.tenant,
                path=str(self.path),
                device=dev_index,
            )
        return UNSTEERED

    def steer_heartbeat(self, now_ns: int) -> None:
        self._atomics.store_u64(self._addr(self._c.steer, "heartbeat_ns"), now_ns)


def _same_identity(a: SlotView, b: SlotView) -> bool:
    return (a.pid, a.pidns, a.start_time) == (b.pid, b.pidns, b.start_time)


def _index(value: int, count: int) -> int:
    if not 0 <= value < count:
        raise IndexError(f"device index {value} outside 0..{count - 1}")
    return value


def _check_count(count: int) -> int:
    if not 0 <= count <= MAX_DEVICES:
        raise BlockError(f"device count {count} outside 0..{MAX_DEVICES}")
    return count


# --- the GPU turn's broker -------------------------------------------------


class TurnBroker:
    """The broker of the GPU turn between vGPUs (libhook/atomics/vgpu_broker.c):
    a C thread that releases the GIL, reads each entered vGPU's request in
    its usage block and grants one vGPU per GPU at a time through its
    control block. Blocks are entered per device and must be removed before
    they are closed; ``stop`` ends the thread (hooks then run unarbitrated
    between vGPUs once its beat is stale)."""

    def __init__(self, atomics: Atomics) -> None:
        lib = ctypes.CDLL(str(atomics.path))
        vp = ctypes.c_void_p
        self._add = bind(
            lib,
            "vgpu_broker_add",
            ctypes.c_int,
            ctypes.c_char_p,
            vp,
            ctypes.c_int,
            vp,
            ctypes.c_int,
        )
        self._rebind = bind(lib, "vgpu_broker_rebind", ctypes.c_int, ctypes.c_int, vp)
        self._remove = bind(lib, "vgpu_broker_remove", None, ctypes.c_int)
        self._stop = bind(lib, "vgpu_broker_stop", None)

    def add(self, control: ControlBlock, usage: UsageBlock, dev: int) -> int:
        """Enter device ``dev`` of a vGPU (its index in both blocks); any
        grant the control block held is taken back. Returns an id for
        ``remove``."""
        uuid = control.uuids[_index(dev, control.device_count)]
        handle = int(
            self._add(uuid.encode(), control._base, dev, usage._base, _index(dev, MAX_DEVICES))
        )
        if handle < 0:
            raise BlockError(f"the turn broker cannot take device {dev} of {control.path}")
        return handle

    def rebind(self, handle: int, usage: UsageBlock) -> None:
        """Point an entry at the vGPU's new usage block (before the old one
        is closed), the broker's account of the vGPU kept: a tenant gains
        no fresh turn credit by having its block remade."""
        if int(self._rebind(handle, usage._base)) < 0:
            raise BlockError(f"the turn broker has no entry {handle}")

    def remove(self, handle: int) -> None:
        self._remove(handle)

    def stop(self) -> None:
        self._stop()
