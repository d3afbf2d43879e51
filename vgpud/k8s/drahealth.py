"""The DRA driver's device health for the kubelet (``v1alpha1.DRAResourceHealth``,
KEP-4680): one stream per kubelet, the health of every GPU of the node's pool
now, at every change vgpud shows (a critical Xid, a lost GPU, vgpud not
answering, and back), and every HEARTBEAT_S seconds without one, since the
kubelet takes a device it has not heard of within its timeout as Unknown.
The kubelet writes it into the status of the pods whose claims hold the GPU
(``allocatedResourcesStatus``); scheduling follows the ResourceSlice, from
which an unhealthy GPU is withdrawn."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from vgpud.k8s.daemon import Gpu
from vgpud.k8s.inventory import Inventory
from vgpud.k8s.proto.drahealth.v1alpha1 import api_pb2 as health
from vgpud.k8s.proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from vgpud.k8s.slices import device_name

SERVICE = "v1alpha1.DRAResourceHealth"  # as registration lists it
HEARTBEAT_S = 10.0
TIMEOUT_S = 30  # three heartbeats missed: the kubelet's Unknown
MESSAGE_MAX = 1024  # what the kubelet keeps of a message


def report(gpus: Sequence[Gpu], pool: str, read_at: float) -> health.NodeWatchResourcesResponse:
    """Every GPU's health, as vgpud last showed it at ``read_at``."""
    return health.NodeWatchResourcesResponse(
        devices=[
            health.DeviceHealth(
                device=health.DeviceIdentifier(pool_name=pool, device_name=device_name(g)),
                health=health.HEALTHY if g.healthy else health.UNHEALTHY,
                last_updated_time=int(read_at),
                health_check_timeout_seconds=TIMEOUT_S,
                message=(g.reason or "")[:MESSAGE_MAX],
            )
            for g in gpus
        ]
    )


class Health(health_grpc.DRAResourceHealthServicer):
    def __init__(self, inventory: Inventory, pool: str) -> None:
        self.inventory = inventory
        self.pool = pool

    async def NodeWatchResources(
        self, request: health.NodeWatchResourcesRequest, context: Any
    ) -> AsyncIterator[health.NodeWatchResourcesResponse]:
        async for gpus in self.inventory.watch_gpus(HEARTBEAT_S):
            yield report(gpus, self.pool, self.inventory.read_at)
