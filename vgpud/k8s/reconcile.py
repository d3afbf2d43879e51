"""Deleting the vGPUs of pods that are gone.

A device plugin's vGPU is named after its first slot (``k8s-<slot id>``);
while a container holds that slot the vGPU is its. Once no active pod
holds it (the kubelet's pod resources list), the vGPU is deleted — through
vgpud's ordinary delete, which refuses while any process still uses it, so
a container that is still shutting down keeps its vGPU until the next round.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
import structlog

from vgpud.k8s.daemon import ApiFailure, Daemon, DaemonUnreachable
from vgpud.k8s.podresources import PodResources, held
from vgpud.k8s.resources import VGPU

NAME_PREFIX = "k8s-"
log = structlog.get_logger(__name__)


def vgpu_name(slots: Iterable[str]) -> str:
    return NAME_PREFIX + min(slots)


def orphans(
    vgpus: Iterable[Mapping[str, Any]], holding: set[str], now: float, grace: float
) -> list[str]:
    """Ids of the vGPUs whose slot no container holds, older than ``grace``
    seconds (the kubelet lists a container's devices only after Allocate has
    answered: a vGPU just made is not an orphan yet)."""
    return [
        str(v["id"])
        for v in vgpus
        if str(v.get("name") or "").startswith(NAME_PREFIX)
        and str(v["name"])[len(NAME_PREFIX) :] not in holding
        and now - float(v["created_at"]) >= grace
    ]


class Reconciler:
    def __init__(
        self, daemon: Daemon, pods: PodResources, owner: str, interval: float, grace: float
    ) -> None:
        self.daemon = daemon
        self.pods = pods
        self.owner = owner
        self.interval = interval
        self.grace = grace

    async def run(self) -> None:
        while True:
            await self.once()
            await asyncio.sleep(self.interval)

    async def once(self) -> list[str]:
        """One round; the ids deleted. Nothing is deleted unless both the
        kubelet and vgpud answered."""
        try:
            holding = held(await self.pods.holders(), VGPU)
            vgpus = await self.daemon.vgpus(self.owner)
        except (grpc.aio.AioRpcError, DaemonUnreachable, ApiFailure) as exc:
            log.warning("reconcile skipped", reason=str(exc).splitlines()[0])
            return []
        deleted = []
        for vgpu_id in orphans(vgpus, holding, time.time(), self.grace):
            # One answer vgpud gets wrong (a 500) is that vGPU's, for this
            # round: never the end of the loop, and of vgpud-k8s with it.
            try:
                gone = await self.daemon.delete(vgpu_id)
            except (DaemonUnreachable, ApiFailure) as exc:
                log.warning("orphan not deleted this round", vgpu=vgpu_id, reason=str(exc))
                continue
            if gone:
                log.info("vGPU of a pod that is gone deleted", vgpu=vgpu_id)
                deleted.append(vgpu_id)
        return deleted
