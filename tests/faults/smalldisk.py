"""A small tmpfs in a private mount namespace, for full-disk tests (root).

A holder process keeps the namespace (and the tmpfs) alive across daemon
restarts; ``inside`` prefixes a command so that it runs in that namespace.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


class SmallDisk:
    def __init__(self, mountpoint: Path, size: str) -> None:
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.mountpoint = mountpoint
        script = 'mount -t tmpfs -o size="$1" tmpfs "$0" && echo mounted && exec sleep infinity'
        self.holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, mountpoint, size],
            stdout=subprocess.PIPE,
        )
        assert self.holder.stdout is not None
        line = self.holder.stdout.readline()  # the mount is done when this arrives
        if line.strip() != b"mounted":
            self.close()
            raise RuntimeError(f"cannot mount a tmpfs on {mountpoint} (root needed)")

    def inside(self, *argv: str) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-m", "--", *argv]

    def run(self, *argv: str) -> str:
        return subprocess.run(self.inside(*argv), check=True, capture_output=True, text=True).stdout

    def files(self) -> list[str]:
        """Every path under the mount point, relative, as seen inside."""
        out = self.run("find", str(self.mountpoint), "-mindepth", "1")
        return sorted(str(Path(p).relative_to(self.mountpoint)) for p in out.split())

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()
