"""Directories the daemon makes, with the modes it means, whatever the umask.

``Path.mkdir(mode, parents=True)`` gives the parents it makes the umask's
mode, not ``mode``: under umask 000 a nested ``cdi_dir`` got parents of
0777, where any local user could rename the spec directory away and put
one of their own in its place (a CDI spec names what a container mounts).
systemd's umask (0022) hides this; a daemon started by hand under another
does not. Here every directory made is given its mode explicitly, and one
that exists is left as it is (it is the operator's, or systemd's).
"""

from __future__ import annotations

import os
from pathlib import Path

# What a made parent gets: what `mkdir -p` gives it under the usual umask.
PARENT_MODE = 0o755


def make_dirs(path: Path, mode: int) -> None:
    """``path`` and each missing parent, the parents ``PARENT_MODE`` and
    ``path`` itself ``mode``, both set after the mkdir (the umask cannot
    widen them). Directories that exist keep their mode."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        want = mode if d == path else PARENT_MODE
        try:
            os.mkdir(d, want)
        except FileExistsError:  # made by another meanwhile: theirs
            continue
        os.chmod(d, want)
