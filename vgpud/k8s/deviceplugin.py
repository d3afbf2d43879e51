"""The kubelet's DevicePlugin service (v1beta1) for one resource: gRPC in,
the inventory and the allocator behind, gRPC errors out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import grpc

from vgpud.k8s.allocate import Allocator, NotYet, Refused
from vgpud.k8s.daemon import DaemonUnreachable
from vgpud.k8s.inventory import Inventory
from vgpud.k8s.proto.deviceplugin.v1beta1 import api_pb2 as dp
from vgpud.k8s.proto.deviceplugin.v1beta1 import api_pb2_grpc as dp_grpc
from vgpud.k8s.resources import VGPU, BadRequest, preferred

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
T = TypeVar("T")


def options(resource: str) -> dp.DevicePluginOptions:
    """Only the slots need a say in placement and a call before the start."""
    return dp.DevicePluginOptions(
        pre_start_required=resource == VGPU,
        get_preferred_allocation_available=resource == VGPU,
    )


class DevicePlugin(dp_grpc.DevicePluginServicer):
    def __init__(self, resource: str, inventory: Inventory, allocator: Allocator, inject: str):
        self.resource = resource
        self.inventory = inventory
        self.allocator = allocator
        self.inject = inject  # "cdi", "env" or "both"

    async def GetDevicePluginOptions(
        self, request: dp.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.DevicePluginOptions:
        return options(self.resource)

    async def ListAndWatch(
        self, request: dp.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[dp.ListAndWatchResponse]:
        async for devices in self.inventory.watch(self.resource):
            yield dp.ListAndWatchResponse(
                devices=[
                    dp.Device(ID=d.id, health=HEALTHY if d.healthy else UNHEALTHY) for d in devices
                ]
            )

    async def GetPreferredAllocation(
        self, request: dp.PreferredAllocationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.PreferredAllocationResponse:
        return dp.PreferredAllocationResponse(
            container_responses=[
                dp.ContainerPreferredAllocationResponse(
                    deviceIDs=preferred(
                        r.available_deviceIDs, r.must_include_deviceIDs, r.allocation_size
                    )
                )
                for r in request.container_requests
            ]
        )

    async def Allocate(
        self, request: dp.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.AllocateResponse:
        answers = []
        for container in request.container_requests:
            recipe = await _answer(
                context, partial(self.allocator.allocate, self.resource, container.devices_ids)
            )
            answers.append(self._response(recipe))
        return dp.AllocateResponse(container_responses=answers)

    async def PreStartContainer(
        self, request: dp.PreStartContainerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> dp.PreStartContainerResponse:
        if self.resource == VGPU:
            await _answer(context, lambda: self.allocator.prestart(request.devices_ids))
        return dp.PreStartContainerResponse()

    def _response(self, recipe: dict[str, Any] | None) -> dp.ContainerAllocateResponse:
        answer = dp.ContainerAllocateResponse()
        if recipe is None:
            return answer
        if self.inject in ("cdi", "both"):
            answer.cdi_devices.append(dp.CDIDevice(name=recipe["cdi_device"]))
        if self.inject in ("env", "both"):
            answer.envs.update(recipe["env"])
            answer.mounts.extend(
                dp.Mount(
                    container_path=m["container_path"],
                    host_path=m["host_path"],
                    read_only=m["read_only"],
                )
                for m in recipe["mounts"]
            )
        return answer


async def _answer(
    context: grpc.aio.ServicerContext[Any, Any], call: Callable[[], Awaitable[T]]
) -> T:
    """Run ``call``; a refusal becomes the gRPC status the kubelet shows."""
    try:
        return await call()
    except BadRequest as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except Refused as exc:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except (NotYet, DaemonUnreachable) as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    raise AssertionError("unreachable: abort raises")
