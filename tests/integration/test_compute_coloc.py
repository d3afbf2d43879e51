"""Co-location on the simulated GPU: several limited processes share one
device and each gets its own share, measured by the work it completed.

The simulator stamps an event when its stream reaches it, so a process's
event pair around a batch also spans the other processes' work that runs in
between, as on a GPU that time-slices contexts (docs/simulator.md). A pacer
that charged itself for that time would throttle every tenant too hard;
taking turns on the GPU (the arbiter block) keeps each batch alone on it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import BUILD
from tests.integration.compute_harness import Burn, Sampler, device_util

SECONDS = 4.5
WARMUP = 1.0
TOLERANCE = 5.0  # points of the device, per tenant

pytestmark = pytest.mark.skipif(
    not (BUILD / "vgpu-burn").is_file() or not (BUILD / "libvgpu.so").is_file(),
    reason="run `make` first (build/vgpu-burn, build/libvgpu.so)",
)


def tenant(sim_env: dict[str, str], tmp_path: Path, name: str, share: int) -> Burn:
    """A standalone limited process with its own usage block (its own bucket)."""
    env = {
        **sim_env,
        "LD_PRELOAD": str(BUILD / "libvgpu.so"),
        "VGPU_USAGE": str(tmp_path / f"usage-{name}"),
        "CUDA_CORE_LIMIT": str(share),
    }
    # Synchronising every 8 launches, like a training loop: the device is
    # never left idle waiting for one CPU thread to wake up (a program that
    # synchronises after every kernel idles the GPU in its own gaps while it
    # holds the turn; docs/compute.md).
    cmd = [str(BUILD / "vgpu-burn"), "--json", "--seconds", str(SECONDS), "--kernel-us", "2000"]
    cmd += ["--sync", "8"]
    return Burn.start(cmd, env, kernel_us=2000)


@pytest.mark.parametrize("shares", [(30, 70), (20, 30, 50)])
def test_colocated_tenants_get_their_shares(
    sim_env: dict[str, str], tmp_path: Path, shares: tuple[int, ...]
) -> None:
    sampler = Sampler(sim_env, device=0)
    try:
        sampler.wait_ready()
        start = time.time()
        burns = [tenant(sim_env, tmp_path, str(i), s) for i, s in enumerate(shares)]
        for b in burns:
            b.finish(timeout=SECONDS + 60)
        sampler.wait_past(start + SECONDS)
        busy = device_util(sampler.samples, start + WARMUP, start + SECONDS)
    finally:
        sampler.stop()
    got = [round(100 * b.work, 1) for b in burns]
    for share, work in zip(shares, got, strict=True):
        assert work == pytest.approx(share, abs=TOLERANCE), f"shares {shares}, work {got}"
    # Nobody idles the device to keep the others' shares.
    assert busy >= 90, f"device busy {busy:.1f} %, work {got}"
