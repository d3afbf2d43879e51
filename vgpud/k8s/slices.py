"""The node's ResourceSlice for the DRA driver, built with the official
``kubernetes`` client models (resource.k8s.io/v1), and its publication.

One device per healthy GPU, named ``gpu-<uuid>``, with attributes (uuid,
productName, index, memoryMiB, computeCapability) and two capacities:
``memory`` (bytes) and ``cores`` (percent of the GPU's time). With
consumable capacity (Kubernetes ≥ 1.36, or 1.34-1.35 with the
DRAConsumableCapacity gate) a device allows multiple allocations: each claim
consumes the memory and cores it requests, in steps of the memory unit and
whole cores, and gets a vGPU of exactly that size; a third capacity,
``vgpus``, is the number of vGPUs vgpud lets a GPU have
(``max_vgpus_per_gpu``), of which each claim consumes exactly one.
Without it each claim takes a whole GPU.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog
from kubernetes import client as k8s

from vgpud.config import MAX_VGPUS_PER_GPU_RANGE, Config
from vgpud.k8s.daemon import Gpu
from vgpud.k8s.resources import CORES_PER_GPU, MIB, MIN_MEMORY_UNIT, Units

DRIVER = "vgpud.io"
# vgpud's own default; vgpud refuses a GPU's vGPU past its max_vgpus_per_gpu
# whatever memory and cores are left, so the scheduler must count them too.
DEFAULT_MAX_VGPUS = Config.max_vgpus_per_gpu
log = structlog.get_logger(__name__)


def device_name(gpu: Gpu) -> str:
    return gpu.uuid.lower() if gpu.uuid.lower().startswith("gpu-") else f"gpu-{gpu.uuid.lower()}"


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def attributes(gpu: Gpu) -> dict[str, k8s.V1DeviceAttribute]:
    """What a claim's CEL selector can test; the compute capability as a
    semantic version ("9.0" as 9.0.0), so that selectors compare it with
    ``.isGreaterThan(semver("8.0.0"))``."""
    found = {
        "uuid": k8s.V1DeviceAttribute(string=gpu.uuid),
        "productName": k8s.V1DeviceAttribute(string=gpu.name),
        "index": k8s.V1DeviceAttribute(int=gpu.index),
        "memoryMiB": k8s.V1DeviceAttribute(int=gpu.memory_total // MIB),
    }
    if gpu.compute_capability is not None:
        found["computeCapability"] = k8s.V1DeviceAttribute(version=f"{gpu.compute_capability}.0")
    return found


def device(
    gpu: Gpu, units: Units, consumable: bool, max_vgpus: int = DEFAULT_MAX_VGPUS
) -> k8s.V1Device:
    memory = k8s.V1DeviceCapacity(value=str(gpu.memory_total))
    cores = k8s.V1DeviceCapacity(value=str(CORES_PER_GPU))
    capacity = {"memory": memory, "cores": cores}
    if consumable:
        step = units.memory_unit
        part = max(step, gpu.memory_total // units.shares // step * step)
        memory.request_policy = k8s.V1CapacityRequestPolicy(
            default=str(part),
            valid_range=k8s.V1CapacityRequestPolicyRange(
                min=str(max(MIN_MEMORY_UNIT, step)), max=str(gpu.memory_total), step=str(step)
            ),
        )
        cores.request_policy = k8s.V1CapacityRequestPolicy(
            default=str(CORES_PER_GPU // units.shares),
            valid_range=k8s.V1CapacityRequestPolicyRange(min="1", max=str(CORES_PER_GPU), step="1"),
        )
        # Every claim is one vGPU of the GPU, however little it consumes of
        # the rest: without this the scheduler placed a 17th claim on a GPU
        # whose 16 claims of 256 MiB left it 137 GiB (an H200), vgpud
        # refused it a vGPU, and the pod never started.
        capacity["vgpus"] = k8s.V1DeviceCapacity(
            value=str(max_vgpus),
            request_policy=k8s.V1CapacityRequestPolicy(default="1", valid_values=["1"]),
        )
    return k8s.V1Device(
        name=device_name(gpu),
        attributes=attributes(gpu),
        capacity=capacity,
        allow_multiple_allocations=consumable or None,
    )


def build(
    node: str,
    gpus: Sequence[Gpu],
    units: Units,
    consumable: bool,
    generation: int,
    max_vgpus: int = DEFAULT_MAX_VGPUS,
) -> k8s.V1ResourceSlice:
    """The node's slice: its healthy GPUs (an unhealthy one is withdrawn, so
    nothing new is allocated on it; prepared claims stay)."""
    return k8s.V1ResourceSlice(
        api_version="resource.k8s.io/v1",
        kind="ResourceSlice",
        metadata=k8s.V1ObjectMeta(name=slice_name(node)),
        spec=k8s.V1ResourceSliceSpec(
            driver=DRIVER,
            node_name=node,
            pool=k8s.V1ResourcePool(name=node, generation=generation, resource_slice_count=1),
            devices=[device(g, units, consumable, max_vgpus) for g in gpus if g.healthy],
        ),
    )


class Publisher:
    """Keeps the node's slice in the API server equal to ``build``'s."""

    def __init__(
        self,
        api: k8s.ResourceV1Api,
        node: str,
        units: Units,
        consumable: bool,
        max_vgpus: int = DEFAULT_MAX_VGPUS,
    ):
        lo, hi = MAX_VGPUS_PER_GPU_RANGE
        if not lo <= max_vgpus <= hi:
            raise ValueError(f"vGPUs per GPU must be {lo}-{hi}, not {max_vgpus}")
        self.api = api
        self.node = node
        self.units = units
        self.consumable = consumable
        self.max_vgpus = max_vgpus
        self.generation = 0
        self.published: list[Gpu] | None = None

    async def publish(self, gpus: Sequence[Gpu]) -> None:
        if self.published == list(gpus):
            return
        self.generation += 1
        body = build(self.node, gpus, self.units, self.consumable, self.generation, self.max_vgpus)
        await asyncio.to_thread(self._put, body)
        self.published = list(gpus)
        log.info("ResourceSlice published", name=slice_name(self.node), devices=len(gpus))

    def _put(self, body: k8s.V1ResourceSlice) -> None:
        try:
            current = self.api.read_resource_slice(slice_name(self.node))
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
            self.api.create_resource_slice(body)
            return
        assert body.metadata is not None and current.metadata is not None
        body.metadata.resource_version = current.metadata.resource_version
        self.api.replace_resource_slice(slice_name(self.node), body)
