"""vgpud as vgpud-k8s sees it: the few calls it makes on the daemon's socket,
through vgpuctl's client, off the event loop (the client is synchronous).

vgpud stays the one owner of vGPUs on the node; vgpud-k8s only asks it.
"""

from __future__ import annotations

import asyncio
import http.client
from dataclasses import dataclass
from typing import Any

from vgpud.ctl.client import ApiFailure, Client, DaemonUnreachable

# Every vGPU made for Kubernetes carries this label, so that vgpud-k8s finds
# its own after a restart and never touches anyone else's.
MANAGED_BY = "vgpud.io/managed-by"


@dataclass(frozen=True)
class Gpu:
    uuid: str
    index: int
    name: str
    memory_total: int
    healthy: bool
    compute_capability: str | None = None  # "major.minor"; None: the driver does not say
    reason: str | None = None  # why it is unhealthy, in words


class Daemon:
    def __init__(self, socket_path: str | None = None, timeout: float = 10.0) -> None:
        self.client = Client(socket_path, timeout=timeout)

    async def gpus(self) -> list[Gpu]:
        answer = await self._call("GET", "/v1/devices")
        return [_gpu(d) for d in answer]

    async def vgpus(self, owner: str) -> list[dict[str, Any]]:
        """The vGPUs ``owner`` (a MANAGED_BY value) made."""
        answer: list[dict[str, Any]] = await self._call(
            "GET", f"/v1/vgpus?label={MANAGED_BY}={owner}"
        )
        return answer

    async def vgpu(self, key: str) -> dict[str, Any] | None:
        try:
            answer: dict[str, Any] = await self._call("GET", f"/v1/vgpus/{key}")
        except ApiFailure as exc:
            if exc.status == 404:
                return None
            raise
        return answer

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("POST", "/v1/vgpus", body)
        return answer

    async def update(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("PATCH", f"/v1/vgpus/{key}", body)
        return answer

    async def delete(self, key: str) -> bool:
        """Delete a vGPU no process uses; False when processes still use it
        (vgpud refuses, 409) or it is already gone."""
        try:
            await self._call("DELETE", f"/v1/vgpus/{key}")
        except ApiFailure as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            return await asyncio.to_thread(self.client.request, method, path, body)
        except (OSError, http.client.HTTPException) as exc:
            # Connected, then no answer in time or the connection cut: vgpud
            # stalled or restarting is as unreachable as vgpud down (devices
            # unhealthy, calls UNAVAILABLE), never the end of vgpud-k8s.
            raise DaemonUnreachable(
                f"vgpud did not answer {method} {path}: {exc or type(exc).__name__}"
            ) from None


def _gpu(d: dict[str, Any]) -> Gpu:
    """A GPU of vgpud's /v1/devices; one in MIG mode is not to be sliced."""
    if d.get("mig_mode", False):
        reason: str | None = "MIG mode is on: vgpud does not slice it"
    elif not d["healthy"]:
        reason = str(d.get("health_reason") or "unhealthy")
    else:
        reason = None
    return Gpu(
        uuid=str(d["uuid"]),
        index=int(d["index"]),
        name=str(d["name"]),
        memory_total=int(d["memory_total"]),
        healthy=reason is None,
        compute_capability=d.get("compute_capability"),
        reason=reason,
    )


__all__ = ["MANAGED_BY", "ApiFailure", "Daemon", "DaemonUnreachable", "Gpu"]
