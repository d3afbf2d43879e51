"""Registration of the DRA driver with the kubelet's plugin watcher: a
socket in ``plugins_registry/`` answers GetInfo (type DRAPlugin, our name,
the DRA socket, the services served) and hears whether the kubelet took it.
The kubelet finds the socket again after its own restart."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import grpc
import structlog

from vgpud.k8s import drahealth
from vgpud.k8s.proto.pluginregistration.v1 import api_pb2 as reg
from vgpud.k8s.proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

DEFAULT_REGISTRY = "/var/lib/kubelet/plugins_registry"
PLUGIN_TYPE = "DRAPlugin"
# The DRA gRPC services this driver serves on its socket: the kubelet
# dials the health stream only when its name is listed.
SERVICES = ["v1.DRAPlugin", drahealth.SERVICE]
log = structlog.get_logger(__name__)


class Registrar(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.status: reg.RegistrationStatus | None = None

    async def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=SERVICES,
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        self.status = request
        if request.plugin_registered:
            log.info("registered with the kubelet", driver=self.driver)
        else:
            log.error("the kubelet refused the driver", reason=request.error)
        return reg.RegistrationStatusResponse()


def registration_socket(registry: str, driver: str) -> Path:
    return Path(registry) / f"{driver}-reg.sock"


def remove_stale(socket: Path) -> None:
    """A socket left by an earlier run (binding would fail on it)."""
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()


async def serve(registrar: Registrar, socket: Path) -> grpc.aio.Server:
    remove_stale(socket)
    server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(registrar, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server
