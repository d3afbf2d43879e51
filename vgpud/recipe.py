"""The injection recipe: what a container or a process needs to run in a vGPU.

Built as a pipeline of small steps over an empty answer (environment,
mounts, CDI name), once for containers (paths as mounted inside) and once
for plain processes on the host (host paths).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpud.model import Vgpu

CONTAINER_BLOCK_DIR = Path("/run/vgpud/vgpu")
CONTAINER_LIBRARY = Path("/usr/lib/vgpud/libvgpu.so")
CDI_KIND = "vgpud.io/vgpu"


@dataclass(frozen=True)
class Paths:
    """Where a vGPU's pieces are on the host."""

    control: Path
    usage: Path
    library: Path


def container_recipe(vgpu: Vgpu, host: Paths) -> dict[str, Any]:
    env = _env(
        vgpu,
        Paths(
            control=CONTAINER_BLOCK_DIR / "control",
            usage=CONTAINER_BLOCK_DIR / "usage",
            library=CONTAINER_LIBRARY,
        ),
    )
    mounts = [
        _mount(host.control, CONTAINER_BLOCK_DIR / "control", read_only=True),
        # The one writable mount: the hook's usage counters and its vGPU's
        # own turn. Nothing a container can write is another vGPU's: the
        # GPU's turn between vGPUs comes read-only, in the control block
        # (docs/security.md, "The GPU turn").
        _mount(host.usage, CONTAINER_BLOCK_DIR / "usage", read_only=False),
        _mount(host.library, CONTAINER_LIBRARY, read_only=True),
    ]
    return {"env": env, "mounts": mounts, "cdi_device": cdi_device(vgpu)}


def host_env(vgpu: Vgpu, host: Paths) -> dict[str, str]:
    return _env(vgpu, host)


def cdi_device(vgpu: Vgpu) -> str:
    return f"{CDI_KIND}={vgpu.name or vgpu.id}"


def _env(vgpu: Vgpu, at: Paths) -> dict[str, str]:
    uuids = ",".join(vgpu.uuids)
    return {
        "LD_PRELOAD": str(at.library),
        "VGPU_ID": vgpu.id,
        "VGPU_CONTROL": str(at.control),
        "VGPU_USAGE": str(at.usage),
        # UUIDs rather than indices: right both on the host and in a
        # container that sees only its own GPUs, renumbered from 0.
        "CUDA_VISIBLE_DEVICES": uuids,
        "NVIDIA_VISIBLE_DEVICES": uuids,
        # NCCL's NVLink SHARP (NVLS) binds multicast memory the hook does
        # not count, and the hook refuses cuMulticastCreate: NCCL must not
        # plan on it.
        "NCCL_NVLS_ENABLE": "0",
    }


def _mount(host_path: Path, container_path: Path, *, read_only: bool) -> dict[str, Any]:
    return {
        "host_path": str(host_path),
        "container_path": str(container_path),
        "read_only": read_only,
    }
