"""Memory amounts as people write them: 8589934592, "8g", "512M", "25%";
and GPU time shares, in percent for people and in parts per million of the
GPU (ppm) in the shared blocks, converted here and nowhere else.

Suffixes are binary multiples (k = 1024), one letter, any case, optionally
followed by "i" and/or "b" ("8Gi", "8GiB", "8gb" all mean 8 x 2**30), so the
seed's CUDA_MEM_LIMIT style and Kubernetes-like spellings both work. Numbers
are ASCII digits only (at most 16; a percentage at most 6 decimals).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# ASCII digits only (re.ASCII: \d would take "١٢٣" too), and few of them: 16
# digits hold any byte count a GPU has, and int() never sees a huge string.
_BYTES = re.compile(r"([0-9]{1,16})\s*([kmgt]?)(?:ib?|b)?", re.IGNORECASE | re.ASCII)
_PERCENT = re.compile(r"([0-9]{1,3}(?:\.[0-9]{1,6})?)\s*%", re.ASCII)

# The smallest vGPU: NVIDIA's allocation granularity (the 2 MiB large page,
# cuMemGetAllocationGranularity's minimum on every current GPU). A smaller
# limit cannot hold a single physical allocation: it is a typo or a probe.
MIN_VGPU_MEMORY = 2 << 20
# The largest: 1 PiB, above any GPU's memory even oversubscribed, and far
# below the 2^64 of the control block's field (no wrap-around).
MAX_VGPU_MEMORY = 1 << 50


@dataclass(frozen=True)
class MemoryAmount:
    """Either an absolute number of bytes or a percentage of a GPU."""

    nbytes: int | None = None
    percent: float | None = None

    def resolve(self, gpu_total: int) -> int:
        if self.percent is not None:
            return int(gpu_total * self.percent / 100)
        assert self.nbytes is not None
        return self.nbytes

    def to_json(self) -> int | str:
        """Bytes as an integer, a percentage as "NN%": parse_memory reads both."""
        if self.percent is not None:
            return f"{self.percent:g}%"
        assert self.nbytes is not None
        return self.nbytes

    def __str__(self) -> str:
        if self.percent is not None:
            return f"{self.percent:g}%"
        return format_bytes(self.nbytes or 0)


def parse_bytes(text: str) -> int:
    """ "8g" -> 8 x 2**30. ValueError with the reason on anything else."""
    m = _BYTES.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a size: use bytes or a number with k/m/g/t")
    return int(m.group(1)) * _SUFFIX[m.group(2).lower()]


def parse_memory(value: object) -> MemoryAmount:
    """A memory request: an integer of bytes, a size string, or "NN%" (1-100)."""
    if isinstance(value, bool):
        raise ValueError("memory must be bytes, a size like '8g', or a percentage like '25%'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"memory must be positive, not {value}")
        return MemoryAmount(nbytes=value)
    if not isinstance(value, str):
        raise ValueError("memory must be bytes, a size like '8g', or a percentage like '25%'")
    pm = _PERCENT.fullmatch(value.strip())
    if pm is not None:
        percent = float(pm.group(1))
        if not 0 < percent <= 100:
            raise ValueError(f"memory percentage must be in (0, 100], not {value}")
        return MemoryAmount(percent=percent)
    nbytes = parse_bytes(value)
    if nbytes <= 0:
        raise ValueError(f"memory must be positive, not {value}")
    return MemoryAmount(nbytes=nbytes)


# The whole GPU, in the blocks' unit for shares and quotas (VGPU_PPM_FULL of
# libhook/include/vgpu_abi.h; test_abi_layout checks they agree).
PPM_FULL = 1_000_000
PPM_PER_PERCENT = PPM_FULL // 100


def percent_to_ppm(percent: int) -> int:
    """A share as the API takes it (whole percent) in the blocks' unit."""
    return percent * PPM_PER_PERCENT


def ppm_to_percent(ppm: int) -> float:
    return ppm / PPM_PER_PERCENT


def ppm_to_fraction(ppm: int) -> float:
    """0..1 of the GPU, as the metrics and the controller's model have it."""
    return ppm / PPM_FULL


def format_bytes(n: int) -> str:
    """Short human form: 8589934592 -> "8.0GiB"."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}TiB"
