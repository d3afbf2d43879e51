"""Which tracked processes have ended, without reading /proc for each one.

A pidfd (pidfd_open(2), Linux 5.3) refers to one process, not to a pid: it
cannot follow a reused pid to another process, and it becomes readable when
the process has ended (its whole thread group: what ``Process.exited``
calls exited; a zombie leader whose threads still run has not). The watch
keeps one pidfd per watched process in an epoll set, so learning which of a
thousand processes ended is one epoll_wait that returns only those.

Where a pidfd cannot be had, the process's ``stat`` file is read at each
``ended()`` instead (the cost every scan paid before): a /proc that is not
this kernel's view of our own namespace (a test's fixture tree), a kernel or
seccomp policy without pidfd_open (ENOSYS: then for every process), or a
pidfd_open refused for this one process (no file descriptor left,
RLIMIT_NOFILE, which the daemon raises at start; any other error). One
process's refusal never turns pidfds off for the others: a pid is the
tenant's word, and a thread's id (refused with EINVAL) must not cost the
node a /proc read per watched process and scan.

Public interface
----------------
``ExitWatch(procfs, *, pidfds=True)``
    ``watch(process) -> bool``  start watching; False when it has already
                                ended (or its pid is another process's now)
    ``ended() -> set[Identity]`` the watched processes that ended since the
                                last call; they are no longer watched
    ``unwatch(identity)``       stop watching one
    ``watched``                 the identities watched now
    ``close()``                 closes every pidfd (also done when collected)
"""

from __future__ import annotations

import errno
import os
import select
import weakref

import structlog

from vgpud.observe.procfs import Identity, Process, ProcFS

log = structlog.get_logger(__name__)

# No descriptor left: fall back to reading stat for this process only.
_FD_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE})
# The kernel (or a seccomp policy) has no pidfd_open: the only answer that
# says so for every process, and so the only one that turns pidfds off.
_NO_PIDFDS = frozenset({errno.ENOSYS})


class ExitWatch:
    def __init__(self, procfs: ProcFS, *, pidfds: bool = True) -> None:
        self.procfs = procfs
        self._pidfds = pidfds and hasattr(os, "pidfd_open")
        self._epoll = select.epoll()
        self._fds: dict[int, Identity] = {}  # pidfd -> the process it refers to
        self._by_identity: dict[Identity, int] = {}  # -1: watched by reading stat
        self._warned_fds = False
        self._warned_refused = False
        weakref.finalize(self, _close_all, self._epoll, self._fds)

    @property
    def watched(self) -> set[Identity]:
        return set(self._by_identity)

    def watch(self, process: Process) -> bool:
        identity = process.identity
        if identity in self._by_identity:
            return True
        if not process.leader:  # a thread: ends with its process, which is what counts
            return False
        fd = self._open(process.pid)
        # Opened after the process was read: a pid reused in between, or an
        # end in between, shows in stat now (the pidfd then names the new one).
        if not self._alive(identity):
            if fd >= 0:
                os.close(fd)
            return False
        if fd >= 0:
            self._epoll.register(fd, select.EPOLLIN)
            self._fds[fd] = identity
        self._by_identity[identity] = fd
        return True

    def ended(self) -> set[Identity]:
        gone: set[Identity] = set()
        while self._fds:
            ready = self._epoll.poll(0)
            if not ready:
                break
            gone.update(self._fds[fd] for fd, _ in ready)
            for fd, _ in ready:
                self._forget(self._fds[fd])
        for identity, fd in list(self._by_identity.items()):
            if fd < 0 and not self._alive(identity):
                gone.add(identity)
                self._forget(identity)
        return gone

    def unwatch(self, identity: Identity) -> None:
        if identity in self._by_identity:
            self._forget(identity)

    def close(self) -> None:
        _close_all(self._epoll, self._fds)
        self._by_identity.clear()

    def _forget(self, identity: Identity) -> None:
        fd = self._by_identity.pop(identity)
        if fd >= 0:
            del self._fds[fd]
            self._epoll.unregister(fd)
            os.close(fd)

    def _open(self, pid: int) -> int:
        if not self._pidfds:
            return -1
        try:
            return os.pidfd_open(pid)
        except ProcessLookupError:
            return -1  # gone already: _alive says so
        except OSError as err:
            if err.errno in _FD_EXHAUSTED:
                if not self._warned_fds:
                    self._warned_fds = True
                    log.warning(
                        "no file descriptor left for a pidfd: processes beyond the "
                        "watched ones are checked by reading /proc each scan; raise LimitNOFILE",
                        error=err.strerror,
                        watched=len(self._fds),
                    )
                return -1
            if err.errno in _NO_PIDFDS:
                log.warning(
                    "pidfd_open unavailable: process exits found by reading /proc", error=str(err)
                )
                self._pidfds = False
            elif not self._warned_refused:  # once: the pid may be a tenant's choice
                self._warned_refused = True
                log.warning(
                    "pidfd_open refused for a process: its exit is found by reading /proc",
                    pid=pid,
                    error=str(err),
                )
            return -1

    def _alive(self, identity: Identity) -> bool:
        stat = self.procfs.stat(identity[0])
        return stat is not None and stat.start_time == identity[1] and not stat.exited


def _close_all(epoll: select.epoll, fds: dict[int, Identity]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()
    epoll.close()
