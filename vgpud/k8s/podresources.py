"""The kubelet's pod resources API (v1): which running pod's container holds
which device ids. It tells PreStartContainer whose slots it is sizing, and
the reconciler which vGPUs no pod holds any more. The kubelet lists active
pods only: a pod that is gone or has finished is not listed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import grpc

from vgpud.k8s.proto.podresources.v1 import api_pb2 as pr
from vgpud.k8s.proto.podresources.v1 import api_pb2_grpc as pr_grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# A node of many pods answers more than gRPC's default 4 MiB.
_MAX_MESSAGE = 16 << 20


@dataclass(frozen=True)
class Holder:
    """One container and the device ids it holds, per resource."""

    namespace: str
    pod: str
    container: str
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def count(self, resource: str) -> int:
        return len(self.devices.get(resource, ()))


class PodResources:
    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    async def holders(self) -> list[Holder]:
        """Every container of every active pod with the devices it holds;
        raises grpc.aio.AioRpcError when the kubelet does not answer."""
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE)]
        async with grpc.aio.insecure_channel(f"unix://{self.socket_path}", options=options) as ch:
            stub = pr_grpc.PodResourcesListerStub(ch)
            answer = await stub.List(pr.ListPodResourcesRequest(), timeout=self.timeout)
        return list(holders(answer.pod_resources))


def holders(pods: Iterable[pr.PodResources]) -> Iterable[Holder]:
    for pod in pods:
        for container in pod.containers:
            devices: dict[str, tuple[str, ...]] = {}
            for group in container.devices:
                devices[group.resource_name] = (
                    *devices.get(group.resource_name, ()),
                    *group.device_ids,
                )
            yield Holder(pod.namespace, pod.name, container.name, devices)


def holder_of(found: Iterable[Holder], resource: str, ids: Iterable[str]) -> Holder | None:
    """The container holding all of ``ids`` of ``resource``."""
    wanted = set(ids)
    return next((h for h in found if wanted <= set(h.devices.get(resource, ()))), None)


def held(found: Iterable[Holder], resource: str) -> set[str]:
    return {device_id for h in found for device_id in h.devices.get(resource, ())}
