"""The node's GPUs and their health, kept fresh from vgpud, for the device
plugin's ListAndWatch streams and the DRA driver's health stream.

One poller for every stream: every ``interval`` it reads vgpud's GPUs; a
change (a GPU unhealthy, added, gone) wakes every stream. vgpud unreachable
marks every device unhealthy (nothing new is scheduled here) without
touching running containers; its return heals them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial

import structlog

from vgpud.k8s.daemon import Daemon, DaemonUnreachable, Gpu
from vgpud.k8s.resources import Device, Units, inventory

log = structlog.get_logger(__name__)
DAEMON_DOWN = "vgpud does not answer"


class Inventory:
    def __init__(self, daemon: Daemon, units: Units, interval: float) -> None:
        self.daemon = daemon
        self.units = units
        self.interval = interval
        self.gpus: list[Gpu] = []
        self.read_at = 0.0  # wall-clock time of the last read (or failed read)
        self._changed = asyncio.Condition()
        self._version = 0

    async def refresh(self) -> None:
        try:
            gpus = await self.daemon.gpus()
        except DaemonUnreachable as exc:
            if any(g.healthy for g in self.gpus):
                log.warning("vgpud unreachable: devices unhealthy", reason=str(exc))
            gpus = [replace(g, healthy=False, reason=DAEMON_DOWN) for g in self.gpus]
        self.read_at = time.time()
        if gpus != self.gpus:
            log.info(
                "devices", gpus=[(g.uuid, "healthy" if g.healthy else "unhealthy") for g in gpus]
            )
            async with self._changed:
                self.gpus = gpus
                self._version += 1
                self._changed.notify_all()

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.interval)

    async def watch(self, resource: str) -> AsyncIterator[list[Device]]:
        """The devices of ``resource`` now, then again at every change."""
        async for gpus in self.watch_gpus():
            yield inventory(resource, gpus, self.units)

    async def watch_gpus(self, heartbeat: float | None = None) -> AsyncIterator[list[Gpu]]:
        """The GPUs now, then again at every change, and after ``heartbeat``
        seconds without one (for a reader that forgets what it is not told)."""
        seen = -1
        while True:
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(heartbeat):
                        await self._changed.wait_for(partial(self._newer_than, seen))
                seen = self._version
                gpus = list(self.gpus)
            yield gpus

    def _newer_than(self, version: int) -> bool:
        return self._version != version
