"""The device plugins' life beside the kubelet: serve each resource's
socket in the kubelet's device plugin directory, register it, and do both
again whenever the kubelet restarts (it recreates ``kubelet.sock`` and
empties the directory, our sockets with it)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

import grpc
import structlog

from vgpud.k8s.deviceplugin import DevicePlugin, options
from vgpud.k8s.pluginwatcher import remove_stale
from vgpud.k8s.proto.deviceplugin.v1beta1 import api_pb2 as dp
from vgpud.k8s.proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc

DEFAULT_DIR = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
log = structlog.get_logger(__name__)


def socket_name(resource: str) -> str:
    """vgpud.io/vgpu-memory -> vgpud-vgpu-memory.sock"""
    return f"vgpud-{resource.rsplit('/', 1)[-1]}.sock"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class Plugins:
    def __init__(
        self, directory: str, plugins: Mapping[str, DevicePlugin], watch_interval: float = 0.5
    ) -> None:
        self.directory = Path(directory)
        self.plugins = plugins
        self.watch_interval = watch_interval
        self._servers: list[grpc.aio.Server] = []
        self.registrations = 0  # how many times the set was registered (for logs, tests)

    async def run(self) -> None:
        """Serve and register until cancelled; again after each kubelet restart."""
        try:
            while True:
                kubelet = await self._kubelet_appears()
                await self._serve()
                if await self._register_all():
                    await self._until_kubelet_restarts(kubelet)
                await self._stop()
        finally:
            await self._stop()

    async def _kubelet_appears(self) -> tuple[int, int]:
        logged = False
        while (found := _identity(self.directory / KUBELET_SOCKET)) is None:
            if not logged:
                log.info("waiting for the kubelet", socket=str(self.directory / KUBELET_SOCKET))
                logged = True
            await asyncio.sleep(self.watch_interval)
        return found

    async def _serve(self) -> None:
        for resource, plugin in self.plugins.items():
            path = self.directory / socket_name(resource)
            remove_stale(path)
            server = grpc.aio.server()
            dp_grpc.add_DevicePluginServicer_to_server(plugin, server)
            server.add_insecure_port(f"unix://{path}")
            await server.start()
            self._servers.append(server)

    async def _register_all(self) -> bool:
        target = f"unix://{self.directory / KUBELET_SOCKET}"
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = dp_grpc.RegistrationStub(channel)
                for resource in self.plugins:
                    await stub.Register(
                        dp.RegisterRequest(
                            version=API_VERSION,
                            endpoint=socket_name(resource),
                            resource_name=resource,
                            options=options(resource),
                        ),
                        timeout=10,
                    )
                    log.info("registered with the kubelet", resource=resource)
        except grpc.aio.AioRpcError as exc:
            log.warning("registration failed; retrying", reason=exc.details())
            await asyncio.sleep(self.watch_interval)
            return False
        self.registrations += 1
        return True

    async def _until_kubelet_restarts(self, kubelet: tuple[int, int]) -> None:
        sockets = [self.directory / socket_name(r) for r in self.plugins]
        while True:
            await asyncio.sleep(self.watch_interval)
            if _identity(self.directory / KUBELET_SOCKET) != kubelet:
                break
            if any(_identity(s) is None for s in sockets):
                break
        log.info("the kubelet restarted (or our sockets went): registering again")

    async def _stop(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            await server.stop(grace=1)
        for resource in self.plugins:
            remove_stale(self.directory / socket_name(resource))
