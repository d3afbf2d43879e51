"""Co-location on the simulated GPU: several limited processes share one
device and each gets its own share, measured by the work it completed.

The simulator stamps an event when its stream reaches it, so a process's
event pair around a batch also spans the other processes' work that runs in
between, as on a GPU that time-slices contexts (docs/simulator.md). A pacer
that charged itself for that time would throttle every tenant too hard;
taking turns on the GPU (the arbiter block) keeps each batch alone on it,
including a hooked process with no compute limit next to a paced one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import BUILD
from tests.integration.compute_harness import Burn, Sampler, device_util
from vgpud.blocks import PPM_FULL, ControlBlock, DeviceSlice, UsageBlock

SECONDS = 4.5
WARMUP = 1.0
TOLERANCE = 5.0  # points of the device, per tenant
SIM_GPU0 = "GPU-5117a000-0000-4000-8000-000000000000"  # the simulator's default UUID

pytestmark = pytest.mark.skipif(
    not (BUILD / "vgpu-burn").is_file() or not (BUILD / "libvgpu.so").is_file(),
    reason="run `make` first (build/vgpu-burn, build/libvgpu.so)",
)


def tenant(sim_env: dict[str, str], tmp_path: Path, name: str, limits: dict[str, str]) -> Burn:
    """A standalone hooked process under `limits` (the hook's environment)
    with its own usage block (its own bucket)."""
    env = {
        **sim_env,
        "LD_PRELOAD": str(BUILD / "libvgpu.so"),
        "VGPU_USAGE": str(tmp_path / f"usage-{name}"),
        **limits,
    }
    # Synchronising every 8 launches, like a training loop: the device is
    # never left idle waiting for one CPU thread to wake up (a program that
    # synchronises after every kernel idles the GPU in its own gaps while it
    # holds the turn; docs/compute.md).
    cmd = [str(BUILD / "vgpu-burn"), "--json", "--seconds", str(SECONDS), "--kernel-us", "2000"]
    cmd += ["--sync", "8"]
    return Burn.start(cmd, env, kernel_us=2000)


def colocate(
    sim_env: dict[str, str], tmp_path: Path, tenants: list[dict[str, str]]
) -> tuple[list[float], float]:
    """Run the tenants at once: the work each did (% of the device) and how
    busy NVML saw the device."""
    sampler = Sampler(sim_env, device=0)
    try:
        sampler.wait_ready()
        start = time.time()
        burns = [tenant(sim_env, tmp_path, str(i), t) for i, t in enumerate(tenants)]
        for b in burns:
            b.finish(timeout=SECONDS + 60)
        sampler.wait_past(start + SECONDS)
        busy = device_util(sampler.samples, start + WARMUP, start + SECONDS)
    finally:
        sampler.stop()
    return [round(100 * b.work, 1) for b in burns], busy


@pytest.mark.parametrize("shares", [(30, 70), (20, 30, 50)])
def test_colocated_tenants_get_their_shares(
    sim_env: dict[str, str], tmp_path: Path, shares: tuple[int, ...]
) -> None:
    got, busy = colocate(sim_env, tmp_path, [{"CUDA_CORE_LIMIT": str(s)} for s in shares])
    for share, work in zip(shares, got, strict=True):
        assert work == pytest.approx(share, abs=TOLERANCE), f"shares {shares}, work {got}"
    # Nobody idles the device to keep the others' shares.
    assert busy >= 90, f"device busy {busy:.1f} %, work {got}"


def vgpu_share_100(tmp_path: Path) -> dict[str, str]:
    """The blocks of a vGPU at share 100 as the daemon makes them (no daemon
    running: the quota stays the share, 100 %)."""
    control, usage = tmp_path / "control", tmp_path / "usage-vgpu"
    ControlBlock.create(
        control, "unlimited", [DeviceSlice(SIM_GPU0, 1 << 30, share_ppm=PPM_FULL)], 0
    ).close()
    UsageBlock.create(usage, device_count=1).close()
    return {"VGPU_CONTROL": str(control), "VGPU_USAGE": str(usage)}


@pytest.mark.parametrize("unlimited_mode", ["standalone", "vgpu"])
def test_paced_tenant_next_to_an_unlimited_one(
    sim_env: dict[str, str], tmp_path: Path, unlimited_mode: str
) -> None:
    """A hooked process whose quota is 100 % (standalone with a memory limit
    only, or a vGPU at share 100) takes turns while the other paces, so its
    work stays out of the paced one's event pairs (without that the 30 %
    tenant charged itself for both and got ~6 %); it is never held back."""
    unlimited = (
        {"CUDA_MEM_LIMIT": "1g"} if unlimited_mode == "standalone" else vgpu_share_100(tmp_path)
    )
    got, busy = colocate(sim_env, tmp_path, [{"CUDA_CORE_LIMIT": "30"}, unlimited])
    assert got[0] == pytest.approx(30, abs=TOLERANCE), f"work {got}"
    assert got[1] >= 55, f"work {got}"
    assert busy >= 90, f"device busy {busy:.1f} %, work {got}"
