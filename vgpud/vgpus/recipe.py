"""The injection recipe: what a container or a process needs to run in a vGPU.

Built as a pipeline of small steps over an empty answer (environment,
mounts, CDI name), once for containers (paths as mounted inside) and once
for plain processes on the host (host paths). A daemon on the simulated GPU
adds what a host process needs to reach the same simulated machine
(``sim_driver_env``): the simulated driver on the library path and the
machine's state file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpud.vgpus.model import Vgpu

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


def host_env(vgpu: Vgpu, host: Paths, driver_env: Mapping[str, str]) -> dict[str, str]:
    return {**_env(vgpu, host), **driver_env}


def sim_driver_env(sim_dir: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """What a host process needs to run on the daemon's simulated GPU: the
    simulated libcuda.so.1 first on the library path, and the daemon's
    simulated machine (its VGPU_SIM_STATE, when it names one; otherwise both
    use the simulator's default for the user, docs/simulator.md)."""
    env = {"LD_LIBRARY_PATH": str(sim_dir)}
    if environ.get("VGPU_SIM_STATE"):
        env["VGPU_SIM_STATE"] = environ["VGPU_SIM_STATE"]
    return env


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
