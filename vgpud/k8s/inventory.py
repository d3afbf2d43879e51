"""The node's devices for ListAndWatch, kept fresh from vgpud.

One poller for the three resources: every ``interval`` it reads vgpud's
GPUs; a change (a GPU unhealthy, added, gone) wakes every ListAndWatch
stream. vgpud unreachable marks every device unhealthy (nothing new is
scheduled here) without touching running containers; its return heals them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial

import structlog

from vgpud.k8s.daemon import Daemon, DaemonUnreachable, Gpu
from vgpud.k8s.resources import Device, Units, inventory

log = structlog.get_logger(__name__)


class Inventory:
    def __init__(self, daemon: Daemon, units: Units, interval: float) -> None:
        self.daemon = daemon
        self.units = units
        self.interval = interval
        self.gpus: list[Gpu] = []
        self._changed = asyncio.Condition()
        self._version = 0

    async def refresh(self) -> None:
        try:
            gpus = await self.daemon.gpus()
        except DaemonUnreachable as exc:
            if any(g.healthy for g in self.gpus):
                log.warning("vgpud unreachable: devices unhealthy", reason=str(exc))
            gpus = [replace(g, healthy=False) for g in self.gpus]
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

    def devices(self, resource: str) -> list[Device]:
        return inventory(resource, self.gpus, self.units)

    async def watch(self, resource: str) -> AsyncIterator[list[Device]]:
        """The devices now, then again at every change."""
        seen = -1
        while True:
            async with self._changed:
                await self._changed.wait_for(partial(self._newer_than, seen))
                seen = self._version
                devices = self.devices(resource)
            yield devices

    def _newer_than(self, version: int) -> bool:
        return self._version != version
