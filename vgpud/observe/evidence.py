"""What the host says about a process: the facts a tenant cannot forge.

A usage block is the tenant's word (docs/security.md, "Attribution"): a
slot names a process, and nothing stops a container from naming someone
else's. Before the daemon charges, kills or names a process for a vGPU it
looks for one of these, which only the kernel writes:

- **the block files it maps**: /proc/<pid>/maps gives, for each file
  mapping, the device and inode of the file the kernel maps. A process that
  maps a vGPU's usage or control block file is that vGPU's — a container
  can open only its own vGPU's files.
- **the block files mounted into its mount namespace**: /proc/<pid>/mountinfo
  gives, for each mount, the device and the path inside that filesystem of
  what is mounted. A container given a vGPU (CDI, ``vgpuctl env --docker``)
  has the vGPU's block files bind-mounted whatever its processes' environment
  says, so a process that unset ``VGPU_CONTROL`` or never loads the hook is
  still known to be in that vGPU.

(The third fact, the cgroup, is the tracker's: a workload cgroup shared with
a proven member.)

Every read is bounded: /proc/<pid>/maps by ``procfs.MAPS_LIMIT`` (a maps file
cut there proves nothing either way), at most ``reads_per_scan`` maps files
per vGPU and scan (a vGPU that names thousands of processes delays only its
own verdicts), and each process's answer is kept for its lifetime, each
mount namespace's while a tracked process is in it.

Public interface
----------------
``BlockFile.of(path)``: a block file's (st_dev, st_ino) and its path inside
its filesystem (what mountinfo shows for a bind mount of it), or None.
``Evidence(procfs, reads_per_scan=...)``:
    ``begin_scan()``; ``maps(process, budget_key, paid=False) -> MapsFacts | None``
    (None: not read yet, the budget of ``budget_key`` is spent, or the
    process is gone; ``paid``: its unit was taken already);
    ``take(budget_key) -> bool`` spends one unit of the scan's budget (False:
    none left); ``mounts(process) -> Mounts`` (with their maker);
    ``keep(identities, mntns)`` drops what belongs to processes gone.
``proves(facts, key) -> bool | None``: True maps it, False does not, None
unknown (maps cut short).
"""

from __future__ import annotations

import os
from collections.abc import Set
from dataclasses import dataclass

from vgpud.observe.procfs import Identity, MappedFile, Mount, Process, ProcFS

FileKey = tuple[int, int]  # (st_dev, st_ino)
READS_PER_SCAN = 16


@dataclass(frozen=True)
class BlockFile:
    key: FileKey
    fs_path: str | None  # None: its filesystem's mount was not found
    uid: int = 0  # its owner: the vGPU's user for a usage block

    @staticmethod
    def of(path: str | os.PathLike[str]) -> BlockFile | None:
        """The block file at ``path`` (a daemon-owned path: never a
        container's). None when it cannot be stat()ed."""
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        return BlockFile(
            (st.st_dev, st.st_ino), _fs_path(os.path.realpath(path), st.st_dev), st.st_uid
        )


@dataclass(frozen=True)
class MapsFacts:
    shared: frozenset[FileKey]  # files it maps MAP_SHARED
    candidates: tuple[MappedFile, ...]  # shared mappings, for the tracker's block search
    complete: bool  # False: the maps file was cut at the limit


@dataclass(frozen=True)
class Mounts:
    """A mount namespace's mounts, and who could have made them: any user
    may bind-mount a file it can reach into a namespace of its own
    (``unshare -Urm``), so a mount is evidence only where its maker is root
    (the container runtime) or the vGPU's own user (rootless runtimes)."""

    mounts: frozenset[Mount]
    maker: int | None  # uid owning the namespace's user namespace; None: unknown

    def made_by(self, uid: int) -> bool:
        return self.maker is not None and self.maker in (0, uid)


NO_MOUNTS = Mounts(frozenset(), None)


def proves(facts: MapsFacts | None, key: FileKey | None) -> bool | None:
    """Whether the process is shown mapping the file ``key``; None: unknown."""
    if facts is None or key is None:
        return None
    if key in facts.shared:
        return True
    return False if facts.complete else None


class Evidence:
    def __init__(self, procfs: ProcFS, *, reads_per_scan: int = READS_PER_SCAN) -> None:
        self.procfs = procfs
        self.reads_per_scan = reads_per_scan
        self._maps: dict[Identity, MapsFacts] = {}
        self._mounts: dict[int, Mounts] = {}  # by mount namespace inode
        self._mntns: dict[Identity, int | None] = {}
        self._spent: dict[str, int] = {}

    def begin_scan(self) -> None:
        self._spent.clear()

    def take(self, budget_key: str) -> bool:
        """One unit of ``budget_key``'s budget for this scan, if any is left."""
        spent = self._spent.get(budget_key, 0)
        if spent >= self.reads_per_scan:
            return False
        self._spent[budget_key] = spent + 1
        return True

    def maps(self, process: Process, budget_key: str, *, paid: bool = False) -> MapsFacts | None:
        facts = self._maps.get(process.identity)
        if facts is not None:
            return facts
        if not paid and not self.take(budget_key):
            return None
        read = self.procfs.maps(process.pid)
        if read is None:
            return None
        shared = tuple(m for m in read.files if m.shared)
        facts = MapsFacts(frozenset(m.file_key for m in shared), shared, read.complete)
        self._maps[process.identity] = facts
        return facts

    def mounts(self, process: Process) -> Mounts:
        if process.identity not in self._mntns:
            self._mntns[process.identity] = self.procfs.mntns(process.pid)
        ns = self._mntns[process.identity]
        if ns is None:
            return NO_MOUNTS
        mounts = self._mounts.get(ns)
        if mounts is None:
            mounts = Mounts(
                frozenset(self.procfs.mountinfo(process.pid) or ()),
                self.procfs.mount_maker(process.pid),
            )
            self._mounts[ns] = mounts
        return mounts

    def keep(self, identities: Set[Identity]) -> None:
        """Forget the processes not in ``identities`` and the mount
        namespaces none of those is in (an inode number is reused once its
        namespace is gone)."""
        for cache in (self._maps, self._mntns):
            for identity in cache.keys() - identities:
                del cache[identity]
        live = set(self._mntns.values())
        for ns in [n for n in self._mounts if n not in live]:
            del self._mounts[ns]


def _fs_path(path: str, dev: int) -> str | None:
    """``path`` as the root field of mountinfo names it: relative to the
    root of its filesystem. The daemon's own mount table says where that
    filesystem (device ``dev``) is mounted; the deepest mount of that device
    above ``path`` is the one that holds it."""
    best: Mount | None = None
    for m in ProcFS().mountinfo(os.getpid()) or ():
        inside = path == m.point or path.startswith(m.point.rstrip("/") + "/")
        if m.dev == dev and inside and (best is None or len(m.point) > len(best.point)):
            best = m
    if best is None:
        return None
    rest = path[len(best.point.rstrip("/")) :]
    return best.root.rstrip("/") + rest if rest else best.root
