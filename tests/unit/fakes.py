"""Test doubles for the daemon's collaborators (a GPU inventory without NVML)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from vgpud.policy import placement
from vgpud.policy.placement import Rules
from vgpud.vgpus.model import CreateRequest, GpuLike, Limits, UpdateRequest
from vgpud.vgpus.registry import Deleted, Entry, Registry, Updated

GIB = 1 << 30


@dataclass(frozen=True)
class FakeGpu:
    index: int
    uuid: str
    name: str = "Fake H100"
    memory_total: int = 80 * GIB
    mig_mode: bool = False
    healthy: bool = True
    sms: int | None = 132
    compute_capability: str | None = "9.0"
    health_reason: str | None = None


def gpus(n: int = 2, **kw: object) -> list[FakeGpu]:
    return [FakeGpu(i, f"GPU-{i:08x}-0000-0000-0000-000000000000", **kw) for i in range(n)]  # type: ignore[arg-type]


class FakeInventory:
    available = True
    driver_version = "fake"

    def __init__(
        self, devices: list[FakeGpu], links: dict[frozenset[str], int] | None = None
    ) -> None:
        self._devices = devices
        self.links = links or {}

    def devices(self) -> list[FakeGpu]:
        return list(self._devices)

    def set_devices(self, devices: list[FakeGpu]) -> None:
        self._devices = devices

    def topology(self, uuid_a: str, uuid_b: str) -> int | None:
        return self.links.get(frozenset((uuid_a, uuid_b)))


# --- the registry's changes, run to the end from a test without a loop ------


def create(
    reg: Registry,
    req: CreateRequest,
    limits: Limits,
    devices: Sequence[GpuLike],
    rules: Rules | None = None,
) -> Entry:
    where = placement.placer(req, devices, rules or Rules())
    return asyncio.run(reg.create(req, limits, where))


def update(
    reg: Registry,
    key: str,
    req: UpdateRequest,
    devices: Sequence[GpuLike],
    rules: Rules | None = None,
) -> Updated:
    return asyncio.run(reg.update(key, req, placement.refitter(devices, rules or Rules())))


def delete(reg: Registry, key: str, *, force: bool = False, processes: int = 0) -> Deleted:
    return asyncio.run(reg.delete(key, force=force, processes=processes))
