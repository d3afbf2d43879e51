"""What the device plugin does in vgpud for a container.

Allocate (``vgpud.io/vgpu``) makes the container's vGPU on its slots' GPUs,
at a placeholder size (2 MiB, share 1): the kubelet asks each resource's
plugin separately and in no fixed order, so at Allocate the plugin cannot
know the container's memory and cores. PreStartContainer, which the
kubelet calls once every resource is allocated and before the container is
created, reads the container's memory and cores from the pod resources API
and sizes the vGPU; the container never runs at the placeholder size.

A request refused at either step leaves nothing behind: the vGPU made at
Allocate is deleted and the refusal is kept (in memory), so the kubelet's
retries of PreStartContainer get the same clear answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import structlog

from vgpud.k8s.daemon import MANAGED_BY, ApiFailure, Daemon, Gpu
from vgpud.k8s.podresources import PodResources, holder_of
from vgpud.k8s.reconcile import vgpu_name
from vgpud.k8s.resources import (
    CORES,
    CORES_PER_GPU,
    MEMORY,
    MIB,
    MIN_MEMORY_UNIT,
    VGPU,
    BadRequest,
    Units,
    check_ids,
    size,
)

PLACEHOLDER = {"memory": MIN_MEMORY_UNIT, "share": 1}
DEVICE_PLUGIN_OWNER = "device-plugin"
log = structlog.get_logger(__name__)


class Refused(Exception):
    """vgpud or the node refuses the request: said for a person."""


class NotYet(Exception):
    """The kubelet has not recorded the container's devices yet: retry."""


@dataclass(frozen=True)
class Settings:
    units: Units
    mode: str = "hard"
    user: dict[str, int] | None = None  # None: vgpud's default (the plugin's own uid)


class Allocator:
    def __init__(self, daemon: Daemon, pods: PodResources, settings: Settings) -> None:
        self.daemon = daemon
        self.pods = pods
        self.settings = settings
        self.refusals: dict[str, str] = {}  # vGPU name -> why its start was refused

    async def allocate(self, resource: str, ids: Sequence[str]) -> dict[str, Any] | None:
        """The recipe of the container's new vGPU (None for memory and cores,
        which only size it)."""
        gpus = await self.daemon.gpus()
        check_ids(resource, ids, gpus, self.settings.units)
        if resource != VGPU:
            return None
        name = vgpu_name(ids)
        await self._drop_stale(name)
        self.refusals.pop(name, None)
        chosen = size(ids, 0, 0, gpus, self.settings.units).gpus
        body: dict[str, Any] = {
            "name": name,
            "gpus": list(chosen),
            "count": len(chosen),
            "mode": self.settings.mode,
            "labels": {MANAGED_BY: DEVICE_PLUGIN_OWNER},
            **PLACEHOLDER,
        }
        if self.settings.user is not None:
            body["user"] = self.settings.user
        try:
            vgpu = await self.daemon.create(body)
        except ApiFailure as exc:
            raise Refused(f"vgpud refused a vGPU on {', '.join(chosen)}: {exc.detail}") from None
        log.info("vGPU allocated", vgpu=vgpu["id"], name=name, gpus=chosen)
        recipe: dict[str, Any] = vgpu["recipe"]
        return recipe

    async def prestart(self, ids: Sequence[str]) -> dict[str, Any]:
        """Size the vGPU of the container holding slots ``ids``."""
        name = vgpu_name(ids)
        if name in self.refusals:
            raise Refused(self.refusals[name])
        gpus = await self.daemon.gpus()
        check_ids(VGPU, ids, gpus, self.settings.units)
        holder = holder_of(await self.pods.holders(), VGPU, ids)
        if holder is None:
            raise NotYet(f"the kubelet lists no container holding {', '.join(ids)} yet")
        where = f"{holder.namespace}/{holder.pod}/{holder.container}"
        try:
            wanted = size(ids, holder.count(MEMORY), holder.count(CORES), gpus, self.settings.units)
            body = {
                "memory": wanted.memory or _even_memory(gpus, wanted.gpus, self.settings.units),
                "share": wanted.share or CORES_PER_GPU // self.settings.units.shares,
            }
            vgpu = await self.daemon.update(name, body)
        except BadRequest as exc:
            await self._refuse(name, f"{where}: {exc}")
        except ApiFailure as exc:
            if exc.status == 404:
                raise Refused(f"{where}: its vGPU {name} is gone (deleted by hand?)") from None
            await self._refuse(name, f"{where}: vgpud refused the size: {exc.detail}")
        log.info("vGPU sized", vgpu=vgpu["id"], container=where, **body)
        return vgpu

    async def _refuse(self, name: str, why: str) -> NoReturn:
        self.refusals[name] = why
        await self.daemon.delete(name)
        log.warning("container refused", vgpu=name, reason=why)
        raise Refused(why)

    async def _drop_stale(self, name: str) -> None:
        """A vGPU left on slots the kubelet gives out again belongs to a pod
        that is gone (the reconciler had not reached it yet)."""
        if await self.daemon.vgpu(name) is None:
            return
        if not await self.daemon.delete(name):
            raise Refused(f"vGPU {name} of an earlier pod still has processes on these slots")
        log.info("stale vGPU deleted before its slots were given out again", vgpu=name)


def _even_memory(gpus: Sequence[Gpu], chosen: Sequence[str], units: Units) -> int:
    """A container that asks no memory gets one slot's part of its GPU."""
    smallest = min(g.memory_total for g in gpus if g.uuid in chosen)
    return max(MIN_MEMORY_UNIT, smallest // units.shares // MIB * MIB)
