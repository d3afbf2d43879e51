"""Domain data of vgpud: what a vGPU is, as recorded and as answered."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from vgpud.units import MemoryAmount

MODES = ("hard", "soft")
# A vGPU's id names its directory in the run dir: nothing else may pass.
ID_PATTERN = re.compile(r"vg-[0-9a-f]{8}")
NAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?")


def valid_name(name: str) -> bool:
    """A DNS-label-like name that cannot be taken for an id."""
    return bool(NAME_PATTERN.fullmatch(name)) and not ID_PATTERN.fullmatch(name)


class GpuLike(Protocol):
    """What placement and the API need to know about a physical GPU
    (nvml.GpuInfo provides it)."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def memory_total(self) -> int: ...
    @property
    def mig_mode(self) -> bool: ...
    @property
    def healthy(self) -> bool: ...


@dataclass(frozen=True)
class Slice:
    """The part of one GPU a vGPU holds."""

    gpu_uuid: str
    gpu_index: int
    memory: int  # bytes: the vGPU's limit on this GPU


@dataclass(frozen=True)
class Limits:
    """The live-updatable limits of a vGPU (same on each of its GPUs)."""

    memory: MemoryAmount
    share: int  # percent of GPU time, 1..100
    mode: str  # "hard" | "soft"
    weight: int  # 1..1000: how soft vGPUs divide spare time


@dataclass(frozen=True)
class Credentials:
    """A process's user and group, as the kernel vouches for them (the API
    socket's SO_PEERCRED)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class BlockUser:
    """Who may write a vGPU's usage block besides the daemon: the host uid
    its processes run as and, when given, a group that shares it. Nobody
    else can open it for writing (docs/security.md, "Files, owners and the API")."""

    uid: int
    gid: int | None = None  # None: the uid alone

    @property
    def mode(self) -> int:
        """The usage block's permission bits: a group shares it only when named."""
        return 0o660 if self.gid is not None else 0o600


# The user of a vGPU recorded before blocks had one: root alone.
ROOT_USER = BlockUser(0)


@dataclass(frozen=True)
class Vgpu:
    id: str
    name: str | None
    slices: tuple[Slice, ...]
    limits: Limits
    oversubscribe: bool
    exclusive: bool
    created_at: float
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: Mapping[str, str] = field(default_factory=dict)
    user: BlockUser = ROOT_USER

    @property
    def uuids(self) -> list[str]:
        return [s.gpu_uuid for s in self.slices]

    def on_gpu(self, uuid: str) -> Slice | None:
        return next((s for s in self.slices if s.gpu_uuid == uuid), None)


@dataclass(frozen=True)
class CreateRequest:
    """A validated create request; None = use the configured default."""

    name: str | None = None
    gpus: tuple[str, ...] = ("any",)
    count: int = 1
    memory: MemoryAmount | None = None
    share: int | None = None
    mode: str | None = None
    weight: int | None = None
    oversubscribe: bool = False
    exclusive: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    owner: Mapping[str, str] = field(default_factory=dict)
    user: BlockUser | None = None  # None: the caller's own uid


@dataclass(frozen=True)
class UpdateRequest:
    """A validated PATCH; None = unchanged."""

    memory: MemoryAmount | None = None
    share: int | None = None
    mode: str | None = None
    weight: int | None = None


# What the placed vGPUs hold on each GPU: admission sums it (policy/placement.py),
# and the state file checks a restored node against it (vgpus/state.py).
@dataclass(frozen=True)
class GpuLoad:
    vgpus: int = 0
    hard_share: int = 0
    memory: int = 0
    exclusive: bool = False


def loads(vgpus: Iterable[Vgpu], skip: str | None = None) -> dict[str, GpuLoad]:
    """What the placed vGPUs (except ``skip``) hold on each GPU. Summed in
    plain lists, one GpuLoad per GPU at the end: admission runs this over
    every vGPU at each create, on the API's path (a frozen GpuLoad made per
    vGPU cost ~0.1 ms at 100 vGPUs)."""
    sums: dict[str, list[int]] = {}  # uuid -> [vGPUs, hard share, memory, exclusive]
    for v in vgpus:
        if v.id == skip:
            continue
        hard = v.limits.share if v.limits.mode == "hard" else 0
        for s in v.slices:
            acc = sums.get(s.gpu_uuid)
            if acc is None:
                acc = sums[s.gpu_uuid] = [0, 0, 0, 0]
            acc[0] += 1
            acc[1] += hard
            acc[2] += s.memory
            acc[3] |= v.exclusive
    return {
        uuid: GpuLoad(count, hard, memory, bool(exclusive))
        for uuid, (count, hard, memory, exclusive) in sums.items()
    }
