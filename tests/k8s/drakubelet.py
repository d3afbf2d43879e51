"""The kubelet's side of DRA for vgpud-k8s's tests, over real gRPC: the
plugin watcher's registration (GetInfo, NotifyRegistrationStatus), the
DRA service's NodePrepareResources / NodeUnprepareResources, batched per
claim as the kubelet sends them, and, when registration lists the health
service, the NodeWatchResources stream followed for as long as the plugin
serves it (every report is kept)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc

from tests.k8s.loop import LoopThread
from vgpud.k8s.proto.dra.v1 import api_pb2 as dra
from vgpud.k8s.proto.dra.v1 import api_pb2_grpc as dra_grpc
from vgpud.k8s.proto.drahealth.v1alpha1 import api_pb2 as health
from vgpud.k8s.proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from vgpud.k8s.proto.pluginregistration.v1 import api_pb2 as reg
from vgpud.k8s.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

T = TypeVar("T")
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"
Claim = tuple[str, str, str]  # namespace, name, uid


class DraKubelet:
    def __init__(self) -> None:
        self._thread = LoopThread()
        self.info: reg.PluginInfo | None = None
        self.health_reports: list[health.NodeWatchResourcesResponse] = []
        self._health_follower: asyncio.Future[None] | None = None

    def register(self, registration_socket: Path) -> reg.PluginInfo:
        """What the plugin watcher does when the socket appears; then, as
        the kubelet's DRA manager does, follow the health stream if served."""
        self.info = self._run(self._register(registration_socket))
        if HEALTH_SERVICE in self.info.supported_versions:
            self._run(self._watch_health(self.info.endpoint))
        return self.info

    def health(self) -> dict[str, tuple[str, str]]:
        """The latest report: device name -> (health, message)."""
        if not self.health_reports:
            return {}
        return {
            d.device.device_name: (health.HealthStatus.Name(d.health), d.message)
            for d in self.health_reports[-1].devices
        }

    def prepare(self, *claims: Claim) -> dra.NodePrepareResourcesResponse:
        request = dra.NodePrepareResourcesRequest(claims=[_claim(c) for c in claims])
        answer: dra.NodePrepareResourcesResponse = self._run(
            self._call(lambda stub: stub.NodePrepareResources(request, timeout=30))
        )
        return answer

    def unprepare(self, *claims: Claim) -> dra.NodeUnprepareResourcesResponse:
        request = dra.NodeUnprepareResourcesRequest(claims=[_claim(c) for c in claims])
        answer: dra.NodeUnprepareResourcesResponse = self._run(
            self._call(lambda stub: stub.NodeUnprepareResources(request, timeout=30))
        )
        return answer

    def close(self) -> None:
        self._run(self._stop_health())
        self._thread.close()

    async def _watch_health(self, endpoint: str) -> None:
        await self._stop_health()  # a plugin registered again: its new stream
        self._health_follower = asyncio.ensure_future(self._follow_health(endpoint))

    async def _follow_health(self, endpoint: str) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async with grpc.aio.insecure_channel(f"unix://{endpoint}") as channel:
                stub = health_grpc.DRAResourceHealthStub(channel)
                async for report in stub.NodeWatchResources(health.NodeWatchResourcesRequest()):
                    self.health_reports.append(report)

    async def _stop_health(self) -> None:
        if self._health_follower is not None:
            self._health_follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_follower
            self._health_follower = None

    async def _register(self, socket: Path) -> reg.PluginInfo:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg.InfoRequest(), timeout=10)
            ok = info.type == "DRAPlugin" and "v1.DRAPlugin" in info.supported_versions
            await stub.NotifyRegistrationStatus(
                reg.RegistrationStatus(
                    plugin_registered=ok, error="" if ok else "no service this kubelet speaks"
                ),
                timeout=10,
            )
        return info

    async def _call(self, call: Callable[[dra_grpc.DRAPluginStub], Awaitable[T]]) -> T:
        assert self.info is not None, "register first"
        async with grpc.aio.insecure_channel(f"unix://{self.info.endpoint}") as channel:
            return await call(dra_grpc.DRAPluginStub(channel))

    def _run(self, work: Awaitable[T]) -> T:
        return self._thread.run(work)


def _claim(c: Claim) -> dra.Claim:
    return dra.Claim(namespace=c[0], name=c[1], uid=c[2])
