"""A kubelet stand-in for vgpud-k8s's tests: the kubelet's side of the
device plugin API over real gRPC on Unix sockets, as the kubelet does it.

- serves ``Registration`` on ``<dir>/kubelet.sock``; on ``Register`` it
  connects to the plugin's socket, asks its options, and follows its
  ``ListAndWatch`` stream (the latest device list per resource is kept);
- ``allocate`` calls ``Allocate`` for one container and, once it answered,
  records the container's devices (as the kubelet's checkpoint does);
- ``prestart`` calls ``PreStartContainer``; ``preferred`` calls
  ``GetPreferredAllocation``;
- serves the pod resources API (``List``) from what it recorded on its own
  socket; ``remove_pod`` forgets a pod, as when it is deleted;
- ``restart`` empties the directory and serves ``kubelet.sock`` anew, as a
  restarted kubelet does.

Its event loop runs on a thread of its own, so the tests stay synchronous
and may block (polling vgpud) while the plugin calls back into it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from tests.integration.daemon_harness import wait_for
from tests.k8s.loop import LoopThread
from vgpud.k8s.proto.deviceplugin.v1beta1 import api_pb2 as dp
from vgpud.k8s.proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from vgpud.k8s.proto.podresources.v1 import api_pb2 as pr
from vgpud.k8s.proto.podresources.v1 import api_pb2_grpc as pr_grpc

T = TypeVar("T")


@dataclass
class Plugin:
    """What the stand-in knows of one registered resource."""

    request: dp.RegisterRequest
    options: dp.DevicePluginOptions
    channel: grpc.aio.Channel
    stub: dp_grpc.DevicePluginStub
    devices: dict[str, str] = field(default_factory=dict)  # id -> health
    updates: int = 0
    follower: asyncio.Task[None] | None = None


@dataclass
class Container:
    namespace: str
    pod: str
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> ids


class _Registration(dp_grpc.RegistrationServicer):
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    async def Register(self, request: dp.RegisterRequest, context: Any) -> dp.Empty:
        await self.kubelet._connect(request)
        return dp.Empty()


class _PodResources(pr_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    async def List(self, request: pr.ListPodResourcesRequest, context: Any) -> Any:
        self.kubelet.lists += 1
        pods: dict[tuple[str, str], pr.PodResources] = {}
        for c in self.kubelet.containers:
            pod = pods.setdefault(
                (c.namespace, c.pod), pr.PodResources(name=c.pod, namespace=c.namespace)
            )
            pod.containers.append(
                pr.ContainerResources(
                    name=c.name,
                    devices=[
                        pr.ContainerDevices(resource_name=r, device_ids=ids)
                        for r, ids in c.devices.items()
                    ],
                )
            )
        return pr.ListPodResourcesResponse(pod_resources=list(pods.values()))


class Kubelet:
    def __init__(self, root: Path) -> None:
        self.plugin_dir = root / "device-plugins"
        self.pod_resources_socket = root / "pod-resources.sock"
        self.plugin_dir.mkdir(parents=True)
        self.plugins: dict[str, Plugin] = {}
        self.registrations: list[dp.RegisterRequest] = []
        self.containers: list[Container] = []
        self.lists = 0
        self._thread = LoopThread()
        self._registration: grpc.aio.Server | None = None
        self._pod_resources: grpc.aio.Server | None = None
        self._run(self._start())

    # -- what the tests call

    def wait_registered(self, *resources: str, after: int = 0) -> None:
        """Until each resource registered more than ``after`` times and its
        ListAndWatch stream sent a device list."""

        def done() -> bool:
            names = [r.resource_name for r in self.registrations]
            return all(
                names.count(r) > after and r in self.plugins and self.plugins[r].updates > 0
                for r in resources
            )

        wait_for(done, timeout=20, what=f"registration of {resources}")

    def devices(self, resource: str) -> dict[str, str]:
        return dict(self.plugins[resource].devices)

    def allocate(
        self, namespace: str, pod: str, container: str, resource: str, ids: list[str]
    ) -> dp.ContainerAllocateResponse:
        """Allocate for one container; its devices are recorded only if the
        plugin answered (raises grpc.aio.AioRpcError otherwise)."""
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
        )
        answer = self._call(lambda: self.plugins[resource].stub.Allocate(request))
        self._container(namespace, pod, container).devices[resource] = list(ids)
        response: dp.ContainerAllocateResponse = answer.container_responses[0]
        return response

    def prestart(self, resource: str, ids: list[str]) -> None:
        request = dp.PreStartContainerRequest(devices_ids=ids)
        self._call(lambda: self.plugins[resource].stub.PreStartContainer(request))

    def preferred(
        self, resource: str, available: list[str], must: list[str], size: int
    ) -> list[str]:
        request = dp.PreferredAllocationRequest(
            container_requests=[
                dp.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
                )
            ]
        )
        answer = self._call(lambda: self.plugins[resource].stub.GetPreferredAllocation(request))
        return list(answer.container_responses[0].deviceIDs)

    def remove_pod(self, namespace: str, pod: str) -> None:
        self.containers = [c for c in self.containers if (c.namespace, c.pod) != (namespace, pod)]

    def restart(self) -> None:
        """Stop, empty the plugin directory (the plugins' sockets go), start."""
        self._run(self._stop())
        for leftover in self.plugin_dir.iterdir():
            leftover.unlink()
        self._run(self._start())

    def close(self) -> None:
        self._run(self._stop())
        self._run(self._stop_pod_resources())
        self._thread.close()

    # -- the loop's side

    def _run(self, work: Awaitable[T]) -> T:
        return self._thread.run(work, timeout=30)

    def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        """A gRPC call, made on the loop's thread (grpc.aio binds a call to
        the running loop when the call is made)."""
        return self._run(_made_here(call))

    def _container(self, namespace: str, pod: str, name: str) -> Container:
        for c in self.containers:
            if (c.namespace, c.pod, c.name) == (namespace, pod, name):
                return c
        self.containers.append(Container(namespace, pod, name))
        return self.containers[-1]

    async def _start(self) -> None:
        self._registration = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(_Registration(self), self._registration)
        self._registration.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        await self._registration.start()
        if self._pod_resources is None:
            self._pod_resources = grpc.aio.server()
            pr_grpc.add_PodResourcesListerServicer_to_server(
                _PodResources(self), self._pod_resources
            )
            self._pod_resources.add_insecure_port(f"unix://{self.pod_resources_socket}")
            await self._pod_resources.start()

    async def _stop(self) -> None:
        if self._registration is not None:
            await self._registration.stop(grace=None)
            self._registration = None
        for plugin in self.plugins.values():
            if plugin.follower is not None:
                plugin.follower.cancel()
            await plugin.channel.close()
        self.plugins = {}

    async def _stop_pod_resources(self) -> None:
        if self._pod_resources is not None:
            await self._pod_resources.stop(grace=None)

    async def _connect(self, request: dp.RegisterRequest) -> None:
        assert request.version == "v1beta1", request.version
        old = self.plugins.pop(request.resource_name, None)
        if old is not None and old.follower is not None:
            old.follower.cancel()
        channel = grpc.aio.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}")
        stub = dp_grpc.DevicePluginStub(channel)
        options = await stub.GetDevicePluginOptions(dp.Empty(), timeout=10)
        plugin = Plugin(request, options, channel, stub)
        self.plugins[request.resource_name] = plugin
        self.registrations.append(request)
        plugin.follower = asyncio.ensure_future(self._follow(plugin))

    async def _follow(self, plugin: Plugin) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for answer in plugin.stub.ListAndWatch(dp.Empty()):
                plugin.devices = {d.ID: d.health for d in answer.devices}
                plugin.updates += 1


async def _made_here(call: Callable[[], Awaitable[T]]) -> T:
    return await call()
