"""The name the kernel shows for the calling thread (``top -H``, ``ps -L``,
/proc/<pid>/task/<tid>/comm): which of the daemon's threads spends the CPU
(the scan, NVML's worker, a save) is then plain to an operator. Python
before 3.14 names only its own Thread objects, not the kernel's threads."""

from __future__ import annotations

import ctypes

PR_SET_NAME = 15
COMM_MAX = 15  # bytes the kernel keeps, without the NUL

_libc = ctypes.CDLL(None, use_errno=True)


def name_this_thread(name: str) -> None:
    """Best effort: a name is a courtesy, never worth a failure."""
    _libc.prctl(PR_SET_NAME, name.encode()[:COMM_MAX], 0, 0, 0)
