"""vGPUs' blocks as the daemon makes them, for tests that run hooked
processes without a daemon: every GPU of each vGPU is entered in a turn
broker run by the test process, and each quota stays its share."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from vgpud.units import PPM_FULL
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.blocks import ControlBlock, DeviceSlice, TurnBroker, UsageBlock

MEMORY = 1 << 30  # each GPU's slice


class BrokeredVgpus:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.atomics = Atomics.load()
        self.broker = TurnBroker(self.atomics)
        self.blocks: list[tuple[ControlBlock, UsageBlock]] = []
        self.handles: list[int] = []

    def make(self, name: str, shares: Mapping[str, int], memory: int = MEMORY) -> dict[str, str]:
        """A vGPU with `memory` bytes and a share (%) on each GPU named (by
        UUID); the environment of its processes (blocks only: add
        LD_PRELOAD)."""
        control, usage = self.tmp / f"control-{name}", self.tmp / f"usage-vgpu-{name}"
        slices = [
            DeviceSlice(uuid, memory, share_ppm=share * PPM_FULL // 100)
            for uuid, share in shares.items()
        ]
        c = ControlBlock.create(control, name, slices, 0, atomics=self.atomics)
        u = UsageBlock.create(usage, device_count=len(slices), atomics=self.atomics)
        self.blocks.append((c, u))
        self.handles += [self.broker.add(c, u, dev) for dev in range(len(slices))]
        return {"VGPU_CONTROL": str(control), "VGPU_USAGE": str(usage)}

    def close(self) -> None:
        for handle in self.handles:
            self.broker.remove(handle)
        for c, u in self.blocks:
            c.close()
            u.close()
        self.broker.stop()
