"""Ordered access to the blocks' words: C11 atomics, the SIGBUS guard and
the throttle seqlock, through build/libvgpu-atomics.so.

Python has no atomic stores or compare-and-swap on shared memory, and the
hooks change the same words concurrently: every access that must be ordered
or must not lose a concurrent update goes through this library (plain loads
of aligned words, which observation needs, do not). The seqlock's reader is
bounded, since a tenant holds the seq word of its own usage block.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from vgpud.libpaths import find_library
from vgpud.vgpus.abi import BlockError, ThrottleC, u32, u64

ATOMICS_LIBRARY = "libvgpu-atomics.so"
# Tries of a seqlock read before it counts as unreadable: far more than a live
# writer's few stores need, few enough that a stuck entry costs microseconds.
SEQLOCK_TRIES = 64


class Atomics:
    """C11 atomics on addresses inside our mappings, via libvgpu-atomics.so."""

    def __init__(self, path: Path) -> None:
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise BlockError(f"cannot load {path}: {exc}") from exc
        self.path = path
        vp = ctypes.c_void_p
        self.load_u64 = bind(lib, "vgpu_atomic_load_u64", u64, vp)
        self.store_u64 = bind(lib, "vgpu_atomic_store_u64", None, vp, u64)
        self.fetch_add_u64 = bind(lib, "vgpu_atomic_fetch_add_u64", u64, vp, u64)
        self.sub_clamp_u64 = bind(lib, "vgpu_atomic_sub_clamp_u64", ctypes.c_int, vp, u64)
        self.cas_u64 = bind(lib, "vgpu_atomic_cas_u64", ctypes.c_int, vp, u64, u64)
        self.load_u32 = bind(lib, "vgpu_atomic_load_u32", u32, vp)
        self.store_u32 = bind(lib, "vgpu_atomic_store_u32", None, vp, u32)
        self.cas_u32 = bind(lib, "vgpu_atomic_cas_u32", ctypes.c_int, vp, u32, u32)
        self.futex_wake_all = bind(lib, "vgpu_futex_wake_all", None, vp)
        # Many words in one call (the control tick's counters and heartbeats).
        words = ctypes.POINTER(vp)
        self.load_u64_each = bind(
            lib, "vgpu_atomic_load_u64_each", None, words, ctypes.c_size_t, ctypes.POINTER(u64)
        )
        self.store_u64_each = bind(
            lib, "vgpu_atomic_store_u64_each", None, words, ctypes.c_size_t, u64
        )
        # SIGBUS guard for mappings of files a container can shrink (vgpu_guard.c).
        self.guard_add = bind(lib, "vgpu_guard_add", ctypes.c_int, vp, ctypes.c_size_t)
        self.guard_remove = bind(lib, "vgpu_guard_remove", None, ctypes.c_int)
        self.guard_lost = bind(lib, "vgpu_guard_lost", ctypes.c_int, ctypes.c_int)

    @staticmethod
    def load(lib_dir: Path | None = None) -> Atomics:
        """The atomics library from ``lib_dir``, else where it is usually found."""
        return _load_atomics(find_library(ATOMICS_LIBRARY, lib_dir))


@cache
def _load_atomics(path: Path) -> Atomics:
    return Atomics(path)


def bind(lib: ctypes.CDLL, name: str, restype: object, *argtypes: object) -> Callable[..., Any]:
    """A C function of ``lib`` with its types declared (ctypes guesses int otherwise)."""
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Throttle:
    """One throttle entry (vgpu_throttle) as a consistent seqlock read saw it."""

    quota_ppm: int
    window_ns: int
    epoch: int


def seqlock_write(atomics: Atomics, base: int, quota_ppm: int, window_ns: int) -> None:
    """Writer side of the throttle seqlock at address ``base``: seq odd,
    fields, seq even; epoch + 1. Every store is seq_cst through the
    atomics library, so no reader can see new fields with an old even seq.
    Then the hooks' threads sleeping in the pacer on seq are woken, so that
    a new quota takes effect at once, not at the end of their sleep."""
    t = ThrottleC
    seq_addr = base + t.seq.offset
    seq = atomics.load_u32(seq_addr)
    epoch = atomics.load_u64(base + t.epoch.offset)
    atomics.store_u32(seq_addr, (seq | 1) & 0xFFFFFFFF)
    atomics.store_u32(base + t.quota_ppm.offset, quota_ppm)
    atomics.store_u64(base + t.window_ns.offset, window_ns)
    atomics.store_u64(base + t.epoch.offset, epoch + 1)
    atomics.store_u32(seq_addr, ((seq | 1) + 1) & 0xFFFFFFFF)
    atomics.futex_wake_all(seq_addr)


def seqlock_read(atomics: Atomics, base: int) -> Throttle | None:
    """Reader side, bounded: None when no consistent copy was seen in
    SEQLOCK_TRIES tries. A writer holds seq odd for a handful of stores, so
    only a writer that died mid-write, or a tenant that wrote an odd seq into
    its own usage block, makes a read fail; an unbounded retry would let that
    tenant stall whichever daemon thread reads (DESIGN.md, "Trust";
    docs/security.md, "Files, owners and the API")."""
    t = ThrottleC
    for _ in range(SEQLOCK_TRIES):
        seq = atomics.load_u32(base + t.seq.offset)
        if seq & 1:
            continue  # a writer is in the middle (or died there)
        quota = atomics.load_u32(base + t.quota_ppm.offset)
        window = atomics.load_u64(base + t.window_ns.offset)
        epoch = atomics.load_u64(base + t.epoch.offset)
        if atomics.load_u32(base + t.seq.offset) == seq:
            return Throttle(quota, window, epoch)
    return None
