"""The kubelet's side of DRA for vgpud-k8s's tests, over real gRPC: the
plugin watcher's registration (GetInfo, NotifyRegistrationStatus) and the
DRA service's NodePrepareResources / NodeUnprepareResources, batched per
claim as the kubelet sends them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc

from tests.k8s.loop import LoopThread
from vgpud.k8s.proto.dra.v1 import api_pb2 as dra
from vgpud.k8s.proto.dra.v1 import api_pb2_grpc as dra_grpc
from vgpud.k8s.proto.pluginregistration.v1 import api_pb2 as reg
from vgpud.k8s.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

T = TypeVar("T")
Claim = tuple[str, str, str]  # namespace, name, uid


class DraKubelet:
    def __init__(self) -> None:
        self._thread = LoopThread()
        self.info: reg.PluginInfo | None = None

    def register(self, registration_socket: Path) -> reg.PluginInfo:
        """What the plugin watcher does when the socket appears."""
        self.info = self._run(self._register(registration_socket))
        return self.info

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
        self._thread.close()

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
