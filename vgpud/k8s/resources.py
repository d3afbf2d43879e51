"""The device plugin's three resources, as pure functions: which device ids
a node advertises, what an id names, and what size a container's vGPU gets.

- ``vgpud.io/vgpu``: ``shares`` slots per GPU; a container's slots pick the
  GPUs of its vGPU (one vGPU per container, on the slots' distinct GPUs).
- ``vgpud.io/vgpu-memory``: units of ``memory_unit`` bytes (256 MiB by
  default), ``floor(memory / unit)`` per GPU; a container's units are its
  vGPU's memory, split evenly over its GPUs.
- ``vgpud.io/vgpu-cores``: percent of one GPU's time, 100 per GPU; a
  container's cores are its vGPU's share, split evenly over its GPUs.

Ids carry the GPU's UUID (lower case), so health follows the GPU and a
plugin restart reads the same ids back: ``gpu-<uuid>-s3`` (slot 3),
``gpu-<uuid>-m17`` (memory unit 17), ``gpu-<uuid>-c42`` (core 42).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vgpud.k8s.daemon import Gpu

VGPU = "vgpud.io/vgpu"
MEMORY = "vgpud.io/vgpu-memory"
CORES = "vgpud.io/vgpu-cores"
RESOURCES = (VGPU, MEMORY, CORES)
_KIND = {VGPU: "s", MEMORY: "m", CORES: "c"}
_RESOURCE = {kind: resource for resource, kind in _KIND.items()}

MIB = 1 << 20
DEFAULT_MEMORY_UNIT = 256 * MIB
MIN_MEMORY_UNIT = 2 * MIB  # vgpud's smallest vGPU: one allocation granule
CORES_PER_GPU = 100
_ID = re.compile(r"^(?P<gpu>[a-z0-9-]{1,50})-(?P<kind>[smc])(?P<number>0|[1-9][0-9]{0,6})$")


class BadRequest(ValueError):
    """A request the kubelet made that vgpud-k8s refuses, said for a person."""


@dataclass(frozen=True)
class Units:
    shares: int = 4  # vgpud.io/vgpu slots per GPU
    memory_unit: int = DEFAULT_MEMORY_UNIT  # bytes per vgpud.io/vgpu-memory

    def __post_init__(self) -> None:
        if not 1 <= self.shares <= 64:
            raise ValueError(f"shares per GPU must be 1-64, not {self.shares}")
        if self.memory_unit < MIN_MEMORY_UNIT or self.memory_unit % MIB:
            raise ValueError(
                f"the memory unit must be a whole number of MiB, at least 2 MiB, "
                f"not {self.memory_unit} bytes"
            )


@dataclass(frozen=True)
class DeviceId:
    gpu: str  # the GPU's UUID, lower case
    resource: str
    number: int

    def __str__(self) -> str:
        return f"{self.gpu}-{_KIND[self.resource]}{self.number}"


@dataclass(frozen=True)
class Device:
    id: str
    healthy: bool


@dataclass(frozen=True)
class Size:
    """What a container's vGPU is made of."""

    gpus: tuple[str, ...]  # UUIDs, as vgpud names them
    memory: int | None  # bytes on each GPU; None: vgpud's default
    share: int | None  # percent of each GPU; None: vgpud's default


def parse(device_id: str) -> DeviceId | None:
    match = _ID.match(device_id)
    if match is None:
        return None
    return DeviceId(match["gpu"], _RESOURCE[match["kind"]], int(match["number"]))


def per_gpu(resource: str, gpu: Gpu, units: Units) -> int:
    """How many devices of ``resource`` one GPU gives."""
    if resource == VGPU:
        return units.shares
    if resource == MEMORY:
        return gpu.memory_total // units.memory_unit
    return CORES_PER_GPU


def inventory(resource: str, gpus: Iterable[Gpu], units: Units) -> list[Device]:
    """The devices of ``resource`` on this node, healthy when their GPU is."""
    return [
        Device(str(DeviceId(gpu.uuid.lower(), resource, n)), gpu.healthy)
        for gpu in gpus
        for n in range(per_gpu(resource, gpu, units))
    ]


def check_ids(resource: str, ids: Sequence[str], gpus: Sequence[Gpu], units: Units) -> None:
    """Refuse ids this node never advertised for ``resource``."""
    by_uuid = {gpu.uuid.lower(): gpu for gpu in gpus}
    if not ids:
        raise BadRequest(f"no {resource} device ids in the request")
    for device_id in ids:
        parsed = parse(device_id)
        gpu = by_uuid.get(parsed.gpu) if parsed else None
        if (
            parsed is None
            or gpu is None
            or parsed.resource != resource
            or parsed.number >= per_gpu(resource, gpu, units)
        ):
            raise BadRequest(f"unknown device id {device_id[:80]!r} for {resource} on this node")
    if len(set(ids)) != len(ids):
        raise BadRequest(f"a {resource} device id is given twice")


def slot_gpus(slots: Sequence[str], gpus: Sequence[Gpu]) -> tuple[str, ...]:
    """The distinct GPUs of a container's slots, in the slots' order, by UUID."""
    by_uuid = {gpu.uuid.lower(): gpu.uuid for gpu in gpus}
    chosen: list[str] = []
    for slot in slots:
        parsed = parse(slot)
        uuid = by_uuid.get(parsed.gpu) if parsed else None
        if uuid is None:
            raise BadRequest(f"unknown device id {slot[:80]!r} for {VGPU} on this node")
        if uuid not in chosen:
            chosen.append(uuid)
    return tuple(chosen)


def size(
    slots: Sequence[str], memory_units: int, cores: int, gpus: Sequence[Gpu], units: Units
) -> Size:
    """The vGPU for a container holding ``slots``, ``memory_units`` and ``cores``."""
    chosen = slot_gpus(slots, gpus)
    count = len(chosen)
    memory = None
    if memory_units:
        memory = memory_units * units.memory_unit // count
        smallest = min(g.memory_total for g in gpus if g.uuid in chosen)
        if memory > smallest:
            raise BadRequest(
                f"{MEMORY}: {memory_units} units of {units.memory_unit // MIB} MiB "
                f"= {memory // MIB} MiB on each of {count} GPU(s), more than a GPU "
                f"holds ({smallest // MIB} MiB)"
            )
    share = None
    if cores:
        share = cores // count
        if share > CORES_PER_GPU:
            raise BadRequest(
                f"{CORES}: {cores} over {count} GPU(s) is a share of {share} per GPU, "
                f"over 100; ask for more {VGPU} or fewer cores"
            )
        if share < 1:
            raise BadRequest(f"{CORES}: {cores} over {count} GPU(s) is less than 1 per GPU")
    return Size(chosen, memory, share)


def preferred(available: Sequence[str], must: Sequence[str], count: int) -> list[str]:
    """Slots to give a container: ``must`` first, then spread over distinct
    GPUs, the least used GPU first (fewest of its slots already taken)."""
    free_per_gpu: dict[str, int] = {}
    for device_id in available:
        parsed = parse(device_id)
        if parsed is not None:
            free_per_gpu[parsed.gpu] = free_per_gpu.get(parsed.gpu, 0) + 1
    chosen = list(dict.fromkeys(must))[:count]
    used = {p.gpu for p in map(parse, chosen) if p is not None}
    rest = [d for d in available if d not in chosen]
    while len(chosen) < count and rest:
        # a GPU not yet used first, then the one with most free slots, then by id
        best = min(rest, key=lambda d: _spread_key(d, used, free_per_gpu))
        rest.remove(best)
        chosen.append(best)
        parsed = parse(best)
        if parsed is not None:
            used.add(parsed.gpu)
    return chosen


def _spread_key(device_id: str, used: set[str], free: dict[str, int]) -> tuple[bool, int, str]:
    parsed = parse(device_id)
    gpu = parsed.gpu if parsed else ""
    return (gpu in used, -free.get(gpu, 0), device_id)
