"""The control tick: quotas into every control block, with a heartbeat.

Until the compute controller (vgpud/controller.py) is wired in, each vGPU is
simply given its configured share as its quota (a hard cap even for soft
vGPUs: they never get spare time yet). ``Steering.tick`` is the one place
that changes when the controller lands.
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpud.blocks import PPM_FULL
from vgpud.registry import Entry

WINDOW_NS = 0  # the hook's default accounting window


class Steering:
    def tick(self, entries: Iterable[Entry], now_ns: int) -> int:
        """Write quotas and heartbeats; returns how many quotas changed."""
        changed = 0
        for entry in entries:
            share_ppm = entry.vgpu.limits.share * (PPM_FULL // 100)
            for dev in range(len(entry.vgpu.slices)):
                changed += entry.control.write_throttle(dev, share_ppm, WINDOW_NS)
            entry.control.heartbeat(now_ns)
        return changed
