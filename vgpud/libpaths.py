"""Where vgpud's own shared libraries are: an installed node's lib_dir, or
the build/ of the source checkout the package runs from.

libvgpu.so (the hook), libvgpu-atomics.so and the simulated driver are built
by the Makefile, not shipped in the Python package: the daemon, vgpuctl and
the demo find them here, in one order.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_LIB_DIR = Path("/usr/lib/vgpud")


class LibraryNotFound(FileNotFoundError):
    """A vgpud library in none of the places looked; the message names them."""


def checkout_build_dir() -> Path | None:
    """build/ of the source checkout this package runs from, if it is one."""
    root = Path(__file__).resolve().parent.parent
    if (root / "Makefile").is_file() and (root / "libhook").is_dir():
        return root / "build"
    return None


def find_library(name: str, lib_dir: Path | None = None) -> Path:
    """Where a vgpud library is: ``lib_dir``, $VGPUD_LIB_DIR, the checkout's
    build/ (running from the repo), then /usr/lib/vgpud; the first that has it."""
    candidates: list[Path] = []
    if lib_dir is not None:
        candidates.append(Path(lib_dir))
    env = os.environ.get("VGPUD_LIB_DIR")
    if env:
        candidates.append(Path(env))
    build = checkout_build_dir()
    if build is not None:
        candidates.append(build)
    candidates.append(DEFAULT_LIB_DIR)
    for directory in candidates:
        if (directory / name).is_file():
            return directory / name
    looked = ", ".join(str(d) for d in candidates)
    raise LibraryNotFound(f"{name} not found (looked in {looked}); run `make` or `make install`")
