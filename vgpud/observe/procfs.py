"""Reading /proc: processes, their PID namespaces, cgroups, env and mappings.

The only module that reads /proc. Everything is read relative to a root
(default ``/proc``) so that tests can point it at a fixture tree. Processes
vanish at any moment: a file that is gone (ENOENT/ESRCH) or closed to us
(EACCES/EPERM) means "skip this process", never an error.

Public interface
----------------
``ProcFS(root="/proc")`` — single reads, each returning ``None`` when the
process is gone or unreadable:
    ``pids() -> list[int]``
    ``stat(pid) -> ProcStat | None``        comm, state, ppid, threads, start_time
    ``process(pid) -> Process | None``      stat + NSpid chain, uid, PID namespace,
                                            thread group (a thread's /proc/<tid> is
                                            reachable though not listed)
    ``cgroup(pid) -> str | None``           text of /proc/<pid>/cgroup
    ``environ(pid) -> dict[str, str] | None`` only the variables in ``ENV_KEYS``
                                            or with a prefix in ``ENV_PREFIXES``;
                                            waited for at most MEMORY_READ_WAIT_S
                                            (ReadPending while one is stuck)
    ``maps(pid, limit) -> Maps | None``      file-backed mappings, at most
                                            ``limit`` bytes of the file read
    ``mountinfo(pid) -> list[Mount] | None`` its mount namespace's mounts
    ``mntns(pid) -> int | None``            inode of its mount namespace
    ``mount_maker(pid) -> int | None``      uid owning that namespace's user namespace
    ``open_mapped(pid, mapping, write) -> int | None`` an fd on the mapped
                                            object, off FUSE; waited for like
                                            ``environ``
``ProcessTable(procfs)`` — the incremental scan the tracker uses:
    ``refresh(watch=()) -> dict[int, Process]``  every live process by host pid
    ``lookup(pid) -> Process | None``           one process, read now

Cost (why ProcessTable is shaped like this): a Python read of one small
/proc file costs ~6-15 us, a stat() ~2 us. Each refresh lists /proc and
stats each pid's directory (a reused pid has a new directory inode); only
new processes and the watched ones (slot holders, GPU processes: their
state and start time matter now) get their ``stat`` file read. A process's
``status`` and ``ns/pid`` (NSpid chain, uid, namespace — fixed for its
lifetime) are read once, when its (pid, start_time) is first seen. Cgroup,
env and mappings are read on demand, only for candidates.

Trust: /proc/<pid>/root and paths inside a container are never followed. A
mapped file is reached only through /proc/<pid>/map_files/<range>, a kernel
link to the exact object the process maps (reading it needs CAP_SYS_ADMIN).
PID namespace inodes come from readlink of /proc/<pid>/ns/pid
(``pid:[4026531836]``); fixture trees store the same text as a symlink.

Lines are split at "\n" only (``_lines``), never with ``str.splitlines``:
the kernel keeps "\n" out of the names it prints (maps writes it ``\012``,
mountinfo octal-escapes it with space, tab and backslash, comm and a cgroup
name cannot hold it) but prints "\r", "\v", "\f", "\x1c"-"\x1e" and
U+0085/U+2028/U+2029 as they are, where ``splitlines`` also breaks: a file,
mount point, cgroup or process named by a tenant held a whole line of its
choosing (docs/security.md, the attacks' table).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import queue
import re
import struct
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Generic, TypeVar

import structlog

from vgpud.log import tenant_said

# Environment variables the tracker may need: the hook's mode and limits.
log = structlog.get_logger(__name__)

ENV_KEYS = frozenset({"LD_PRELOAD", "GPU_DEVICES_UUID", "CUDA_MEMORY_OVERSUBSCRIBE"})
ENV_PREFIXES = ("VGPU_", "CUDA_MEM_LIMIT", "CUDA_CORE_")

# Errors that mean the process is gone or not ours to read.
_VANISHED = frozenset({errno.ENOENT, errno.ESRCH, errno.EACCES, errno.EPERM})
_ENVIRON_MAX = 1 << 20  # the kernel caps argv+env far below this in practice
# How long a read of a process's memory (environ) is waited for. Its pages
# are the process's to map: a file of a filesystem that never answers (a
# FUSE server of its own) would hold the reading thread for ever.
MEMORY_READ_WAIT_S = 0.5
# A process chooses how many mappings it has: 60,000 of them make a 5 MB
# maps file that costs the daemon tens of milliseconds to read (docs/security.md,
# "Bounded reads"). Past these sizes the rest is not read.
MAPS_LIMIT = 2 << 20
_MOUNTINFO_LIMIT = 1 << 20
_SMALL_FILE = 8192
_STATFS_SIZE = 256  # struct statfs is 120 bytes on 64-bit Linux; f_type comes first
_PRUNE_MIN = 1024
# ioctl_ns(2): _IO(0xb7, 0x1) and _IO(0xb7, 0x4).
_NS_GET_USERNS = 0xB701
_NS_GET_OWNER_UID = 0xB704


T = TypeVar("T")

Identity = tuple[int, int]  # (host pid, start time): one process, never a reused pid


def _ended(state: str, threads: int) -> bool:
    """A zombie with no thread left: it holds no memory, only a pid.

    A zombie thread-group leader whose other threads still run is alive.
    """
    return state in ("Z", "X") and threads <= 1


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ppid: int
    threads: int
    start_time: int  # clock ticks since boot: field 22, same in every namespace

    @property
    def exited(self) -> bool:
        return _ended(self.state, self.threads)


@dataclass(frozen=True)
class Process:
    pid: int  # in the PID namespace of the /proc mount (the host's for vgpud)
    start_time: int
    comm: str
    state: str
    threads: int
    uid: int
    nspid: tuple[int, ...]  # NSpid: outermost first, the process's own view last
    pidns: int  # inode of its PID namespace
    # Its thread group (Tgid): ``pid`` itself for a process. /proc/<tid> of
    # any thread can be opened though /proc does not list it, so a pid that
    # a tenant names may be a thread's: not a process (no pidfd, no exit).
    tgid: int

    @property
    def leader(self) -> bool:
        """A thread-group leader: a process, not one of its other threads."""
        return self.tgid == self.pid

    @property
    def ns_pid(self) -> int:
        """The pid the process sees for itself (what the hook writes in a slot)."""
        return self.nspid[-1]

    @cached_property
    def identity(self) -> Identity:
        # Cached: a scan asks it several times of each of 1000s of processes.
        return (self.pid, self.start_time)

    @property
    def exited(self) -> bool:
        return _ended(self.state, self.threads)


@dataclass(frozen=True)
class MappedFile:
    start: int
    end: int
    perms: str  # e.g. "rw-s"
    offset: int
    dev: int  # os.makedev(major, minor) as in st_dev
    inode: int
    path: str  # as the process sees it: informational only, never opened

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def shared(self) -> bool:
        return self.perms[3:4] == "s"

    @property
    def range_name(self) -> str:
        """The entry name in /proc/<pid>/map_files (hex without padding)."""
        return f"{self.start:x}-{self.end:x}"

    @property
    def file_key(self) -> tuple[int, int]:
        """(st_dev, st_ino) of the mapped file, as os.stat would give them."""
        return (self.dev, self.inode)


@dataclass(frozen=True)
class Maps:
    files: tuple[MappedFile, ...]
    complete: bool  # False: the file was longer than the limit; ``files`` is its start


@dataclass(frozen=True)
class Mount:
    """One line of /proc/<pid>/mountinfo."""

    dev: int  # os.makedev(major, minor) of the mounted filesystem
    root: str  # the path inside that filesystem that is mounted (a bind mount's source)
    point: str  # where, as the process sees it: the tenant's choice, informational only


class ProcFS:
    def __init__(
        self, root: str | os.PathLike[str] = "/proc", *, memory_wait_s: float = MEMORY_READ_WAIT_S
    ) -> None:
        self.root = Path(root)
        self._prefix = str(self.root)  # paths built as strings: this runs 1000s of times a tick
        self._memory_reads = _BoundedReads(memory_wait_s)

    def pids(self) -> list[int]:
        return [int(name) for name in os.listdir(self._prefix) if name.isdigit()]

    def dir_inode(self, pid: int) -> int | None:
        try:
            return os.stat(f"{self._prefix}/{pid}").st_ino
        except OSError as err:
            _raise_unless_vanished(err)
            return None

    def stat(self, pid: int) -> ProcStat | None:
        data = self._read(pid, "stat", _SMALL_FILE, whole=True)
        return None if data is None else parse_stat(pid, data)

    def process(self, pid: int, stat: ProcStat | None = None) -> Process | None:
        stat = stat or self.stat(pid)
        status = self._read(pid, "status", _SMALL_FILE, whole=True)
        pidns = self.pidns(pid)
        if stat is None or status is None or pidns is None:
            return None
        uid, nspid, tgid = parse_status(pid, status)
        return Process(
            pid=pid,
            start_time=stat.start_time,
            comm=stat.comm,
            state=stat.state,
            threads=stat.threads,
            uid=uid,
            nspid=nspid,
            pidns=pidns,
            tgid=tgid,
        )

    def pidns(self, pid: int) -> int | None:
        try:
            link = os.readlink(f"{self._prefix}/{pid}/ns/pid")
        except OSError as err:
            _raise_unless_vanished(err)
            return None
        return parse_ns_link(link)

    def cgroup(self, pid: int) -> str | None:
        data = self._read(pid, "cgroup", _SMALL_FILE * 4, whole=True)
        return None if data is None else data.decode(errors="replace")

    def environ(self, pid: int) -> dict[str, str] | None:
        data = self._memory_reads.run(self._read, pid, "environ", _ENVIRON_MAX)
        return None if data is None else parse_environ(data)

    def maps(self, pid: int, limit: int = MAPS_LIMIT) -> Maps | None:
        data = self._read(pid, "maps", limit + 1)
        if data is None:
            return None
        complete = len(data) <= limit
        if not complete:  # drop the line the limit cut
            data = data[: data.rfind(b"\n", 0, limit) + 1]
        return Maps(tuple(parse_maps(data.decode(errors="surrogateescape"))), complete)

    def mountinfo(self, pid: int) -> list[Mount] | None:
        data = self._read(pid, "mountinfo", _MOUNTINFO_LIMIT)
        return None if data is None else parse_mountinfo(data.decode(errors="surrogateescape"))

    def mntns(self, pid: int) -> int | None:
        try:
            link = os.readlink(f"{self._prefix}/{pid}/ns/mnt")
        except OSError as err:
            _raise_unless_vanished(err)
            return None
        return parse_ns_link(link)

    def mount_maker(self, pid: int) -> int | None:
        """The host uid that owns the user namespace of the process's mount
        namespace: who could make its mounts. 0 for the host's (and for
        namespaces root made); another uid for a namespace an unprivileged
        user made (``unshare -Urm``), whose mounts are that user's doing.
        None when it cannot be told (gone, or not this kernel's /proc)."""
        try:
            fd = os.open(f"{self._prefix}/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            _raise_unless_vanished(err)
            return None
        try:
            userns = fcntl.ioctl(fd, _NS_GET_USERNS)
        except OSError:  # a fixture tree's plain file, or a kernel without it
            return None
        finally:
            os.close(fd)
        try:
            raw = fcntl.ioctl(userns, _NS_GET_OWNER_UID, bytes(4))
        except OSError:
            return None
        finally:
            os.close(userns)
        return int(struct.unpack("=I", raw)[0])

    def open_mapped(self, pid: int, mapping: MappedFile, *, write: bool) -> int | None:
        """An fd on the object behind a mapping, never by its path in the container.

        The file may be on a FUSE filesystem of the tenant's own, whose
        server answers the open, and every later read of a page not in the
        page cache, when it likes: the open is made on the memory-read
        thread (waited for at most MEMORY_READ_WAIT_S; None when it did not
        return, ReadPending while an earlier one is stuck), and a FUSE file
        is refused (``OSError``), for what the daemon then reads of it
        through its mapping would be its server's to hold. Raises OSError
        too when the process or mapping is gone, or we lack CAP_SYS_ADMIN;
        the caller validates what it got (fstat: a regular file; the
        block's magic, version and size).
        """
        flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_CLOEXEC
        path = f"{self._prefix}/{pid}/map_files/{mapping.range_name}"
        return self._memory_reads.run(_open_off_fuse, path, flags, late=os.close)

    def _read(self, pid: int, name: str, limit: int | None, *, whole: bool = False) -> bytes | None:
        """Read a /proc file. ``whole``: the kernel produces it in one read
        call when the buffer is large enough (stat, status, cgroup are
        single-record seq files), so a short read is the end of it."""
        try:
            fd = os.open(f"{self._prefix}/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as err:
            _raise_unless_vanished(err)
            return None
        try:
            if whole and limit is not None:
                data = os.read(fd, limit)
                return data if len(data) < limit else data + _read_all(fd, None)
            return _read_all(fd, limit)
        except OSError as err:
            _raise_unless_vanished(err)
            return None
        finally:
            os.close(fd)


class ProcessTable:
    """Every live process, re-validated each refresh as cheaply as possible.

    A reused pid gets a new /proc/<pid> directory (a new inode), so one
    stat() of the directory tells an unchanged process from a new one.
    ``watch`` names the pids whose state matters now (slot holders, GPU
    processes): their ``stat`` file is read every refresh, so a zombie or a
    reused pid among them is seen at once, whatever the directory says.
    """

    def __init__(self, procfs: ProcFS) -> None:
        self.procfs = procfs
        self._known: dict[int, tuple[int, Process]] = {}  # pid -> (dir inode, process)
        # lookup() adds what it reads and nothing else removes it until the
        # next refresh (which may not come for hours): past this size the
        # entries whose /proc directory is gone are dropped (amortised O(1)).
        self._prune_at = _PRUNE_MIN

    def refresh(self, watch: Collection[int] = ()) -> dict[int, Process]:
        seen: dict[int, tuple[int, Process]] = {}
        for pid in self.procfs.pids():
            inode = self.procfs.dir_inode(pid)
            if inode is None:
                continue
            known = self._known.get(pid)
            if known is not None and known[0] == inode and pid not in watch:
                seen[pid] = known
                continue
            stat = self.procfs.stat(pid)
            if stat is None:
                continue
            if known is not None and known[1].start_time == stat.start_time:
                seen[pid] = (inode, _with_stat(known[1], stat))
            elif (process := self.procfs.process(pid, stat)) is not None:
                seen[pid] = (inode, process)
        # Zombies stay known (no second deep read) but are not live.
        self._known = seen
        return {pid: p for pid, (_, p) in seen.items() if not p.exited}

    def lookup(self, pid: int) -> Process | None:
        """One live process read now, without listing /proc (its ``stat``
        always; its identity only when the pid is new or was reused). A
        thread's id that is not its group's is no process: None."""
        inode = self.procfs.dir_inode(pid)
        stat = None if inode is None else self.procfs.stat(pid)
        if inode is None or stat is None:
            return None
        known = self._known.get(pid)
        if known is not None and known[1].start_time == stat.start_time:
            process: Process | None = _with_stat(known[1], stat)
        else:
            process = self.procfs.process(pid, stat)
        if process is None:
            return None
        self._known[pid] = (inode, process)  # the next refresh need not read it again
        if len(self._known) > self._prune_at:
            self._known = {
                p: known for p, known in self._known.items() if self.procfs.dir_inode(p) == known[0]
            }
            self._prune_at = 2 * len(self._known) + _PRUNE_MIN
        return None if process.exited or not process.leader else process

    def __len__(self) -> int:
        return len(self._known)


def _with_stat(known: Process, stat: ProcStat) -> Process:
    if (known.comm, known.state, known.threads) == (stat.comm, stat.state, stat.threads):
        return known
    return Process(
        pid=known.pid,
        start_time=known.start_time,
        comm=stat.comm,
        state=stat.state,
        threads=stat.threads,
        uid=known.uid,
        nspid=known.nspid,
        pidns=known.pidns,
        tgid=known.tgid,
    )


def parse_stat(pid: int, data: bytes) -> ProcStat | None:
    """Fields of /proc/<pid>/stat; comm may hold spaces and parentheses."""
    text = data.decode(errors="replace")
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        return None
    comm = text[open_paren + 1 : close_paren]
    # Fields after comm start at field 3 (state); field N is rest[N - 3].
    rest = text[close_paren + 1 :].split()
    if len(rest) < 20:
        return None
    try:
        return ProcStat(
            pid=pid,
            comm=comm,
            state=rest[0],
            ppid=int(rest[1]),
            threads=int(rest[17]),
            start_time=int(rest[19]),
        )
    except ValueError:
        return None


def parse_status(pid: int, data: bytes) -> tuple[int, tuple[int, ...], int]:
    """(real uid, NSpid chain, Tgid) from /proc/<pid>/status.

    Kernels before 4.1 have no NSpid line: the process is then taken to be
    in the namespace of the /proc mount, with no inner pid. Every kernel
    writes Tgid; a fixture tree without it describes a process (``pid``).
    """
    uid = -1
    nspid: tuple[int, ...] = (pid,)
    tgid = pid
    for line in _lines(data.decode(errors="replace")):
        key, _, value = line.partition(":")
        if key == "Uid":
            fields = value.split()
            uid = int(fields[0]) if fields and fields[0].isdigit() else -1
        elif key == "NSpid":
            chain = tuple(int(v) for v in value.split() if v.isdigit())
            nspid = chain or nspid
        elif key == "Tgid" and value.strip().isdigit():
            tgid = int(value)
    return uid, nspid, tgid


def parse_ns_link(link: str) -> int | None:
    """``pid:[4026531836]`` -> 4026531836."""
    prefix, _, rest = link.partition(":[")
    if not prefix or not rest.endswith("]") or not rest[:-1].isdigit():
        return None
    return int(rest[:-1])


def parse_environ(data: bytes) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if not sep:
            continue
        name = key.decode(errors="replace")
        if name in ENV_KEYS or name.startswith(ENV_PREFIXES):
            env[name] = value.decode(errors="surrogateescape")
    return env


def parse_maps(text: str) -> list[MappedFile]:
    """File-backed mappings (inode != 0) of /proc/<pid>/maps."""
    mappings: list[MappedFile] = []
    for line in _lines(text):
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[4] == "0":
            continue
        try:
            start_hex, end_hex = fields[0].split("-")
            major, minor = fields[3].split(":")
            mappings.append(
                MappedFile(
                    start=int(start_hex, 16),
                    end=int(end_hex, 16),
                    perms=fields[1],
                    offset=int(fields[2], 16),
                    dev=os.makedev(int(major, 16), int(minor, 16)),
                    inode=int(fields[4]),
                    path=fields[5],
                )
            )
        except ValueError:
            continue
    return mappings


def parse_mountinfo(text: str) -> list[Mount]:
    """(device, root) of each mount in /proc/<pid>/mountinfo.

    ``36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw``: the
    third field is the device, the fourth the mounted path inside it, with
    space, tab, newline and backslash written as octal escapes. Fields are
    split at a space only: a path may hold other whitespace ("\x1f") as it is.
    """
    mounts: list[Mount] = []
    for line in _lines(text):
        fields = line.split(" ", 4)
        if len(fields) < 5:
            continue
        major, _, minor = fields[2].partition(":")
        try:
            dev = os.makedev(int(major), int(minor))
        except ValueError:
            continue
        point = fields[4].split(" ", 1)[0]
        mounts.append(Mount(dev, _unescape_mount_path(fields[3]), _unescape_mount_path(point)))
    return mounts


def _lines(text: str) -> list[str]:
    """The lines of a /proc file, split where the kernel ends them (the
    module's docstring says why: not ``str.splitlines``)."""
    return text.split("\n")


def _unescape_mount_path(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _read_all(fd: int, limit: int | None) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while limit is None or total < limit:
        chunk = os.read(fd, 65536 if limit is None else min(65536, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


# statfs(2)'s f_type of every FUSE filesystem (fuse, fuseblk, virtiofs).
_FUSE_SUPER_MAGIC = 0x65735546
_libc = ctypes.CDLL(None, use_errno=True)


def _open_off_fuse(path: str, flags: int) -> int:
    """``open(path)``, refused (OSError) when the file is on FUSE: of the
    filesystems a local user may mount (in a user namespace of its own),
    the only one whose reads a process of the user's answers."""
    fd = os.open(path, flags)
    try:
        buf = ctypes.create_string_buffer(_STATFS_SIZE)
        if _libc.fstatfs(fd, buf) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        if ctypes.c_long.from_buffer(buf).value == _FUSE_SUPER_MAGIC:
            raise OSError(errno.EOPNOTSUPP, "a file on FUSE (its server answers its reads)", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _raise_unless_vanished(err: OSError) -> None:
    if err.errno not in _VANISHED:
        raise err


class ReadPending(Exception):
    """An earlier read of a process's memory has not returned: this one is
    not made now (ask again later)."""


class _BoundedReads:
    """Reads of a process's memory through /proc (and opens of what it
    maps), on one thread of their own, waited for at most ``wait_s``. A
    read that does not return in time is answered None (unreadable) and
    its thread is left to it: while it is stuck every other read raises
    ReadPending at once, so the caller never waits longer and never more
    than one thread is held. What a read given up on returns after all is
    handed to its ``late`` (an fd closed)."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[_MemoryRead[Any]] = queue.SimpleQueue()
        self._stuck: _MemoryRead[Any] | None = None
        self._thread: threading.Thread | None = None

    def run(
        self,
        fn: Callable[..., T | None],
        *args: object,
        late: Callable[[T], object] | None = None,
    ) -> T | None:
        with self._lock:
            if self._stuck is not None and not self._stuck.done.is_set():
                raise ReadPending
            self._stuck = None
            if self._thread is None:
                # A daemon thread: one stuck in a read must not hold the exit.
                self._thread = threading.Thread(
                    target=self._serve, name="vgpud-memreads", daemon=True
                )
                self._thread.start()
            read: _MemoryRead[T] = _MemoryRead(fn, args, late)
            self._requests.put(read)
            read.done.wait(self.wait_s)
            with read.lock:  # it returns now, or its result goes to ``late``
                if read.done.is_set():
                    if read.error is not None:
                        raise read.error
                    return read.result
                read.abandoned = True
            self._stuck = read
            # A process's user decides when its read comes back, and so
            # how often another can be stuck: bounded for the node (the read
            # does not know whose vGPU the process is in; one is stuck at most).
            tenant_said(
                log,
                "warning",
                "a read of a process's memory did not return: left to its thread",
                tenant="node",
            )
            return None

    def _serve(self) -> None:
        while True:
            read = self._requests.get()
            result, error = None, None
            try:
                result = read.fn(*read.args)
            except Exception as exc:  # handed to the caller, whose thread raises it
                error = exc
            with read.lock:
                read.result, read.error = result, error
                read.done.set()
                abandoned = read.abandoned
            if abandoned and result is not None and read.late is not None:
                read.late(result)


@dataclass
class _MemoryRead(Generic[T]):
    fn: Callable[..., T | None]
    args: tuple[object, ...]
    late: Callable[[T], object] | None
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    abandoned: bool = False
    result: T | None = None
    error: Exception | None = None
