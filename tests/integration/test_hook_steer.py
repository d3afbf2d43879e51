"""Steering obeyed: a standalone process paces to min(CUDA_CORE_LIMIT, the
steer quota) while the steer heartbeat is fresh, and back to its own limit
once it goes stale (simulated GPU, utilization read through NVML).

In standalone mode the daemon writes the usage block's steer area (quota and
heartbeat) for processes it adopted; here the test writes it through
vgpud/vgpus/blocks.py as the daemon's tick would, so the hook's side is checked
alone. The heartbeat counts as fresh for 2 s (PACER_STEER_FRESH_NS in
libhook/src/pacer.h).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BUILD
from tests.integration.compute_harness import Burn, Sampler, device_util, series
from vgpud.vgpus.abi import BlockError
from vgpud.vgpus.blocks import UsageBlock

ENV_LIMIT = 80  # %
STEER = 30  # %
FRESH_S = 2.0  # how long a heartbeat counts
TICK_S = 0.1  # the daemon's tick
SETTLE_S = 1.0  # the first second of each phase is not measured
TOLERANCE = 5.0  # points; the simulator is exact, the box is loaded
KERNEL_US = 20000

pytestmark = pytest.mark.skipif(
    not (BUILD / "vgpu-burn").is_file() or not (BUILD / "libvgpu.so").is_file(),
    reason="run `make` first (build/vgpu-burn, build/libvgpu.so)",
)


@pytest.fixture
def sampler(sim_env: dict[str, str]) -> Iterator[Sampler]:
    s = Sampler(sim_env, device=0)
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def open_when_created(path: Path, timeout: float = 30) -> UsageBlock:
    """The standalone block, once the hook has created and filled it in."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return UsageBlock.open(path)
        except BlockError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_fresh_steering_lowers_the_env_limit_and_stale_steering_does_not(
    sampler: Sampler, sim_env: dict[str, str], tmp_path: Path
) -> None:
    usage_path = tmp_path / "usage"
    env = {
        **sim_env,
        "LD_PRELOAD": str(BUILD / "libvgpu.so"),
        "VGPU_USAGE": str(usage_path),
        "CUDA_CORE_LIMIT": str(ENV_LIMIT),
    }
    seconds = 10.5
    cmd = [str(BUILD / "vgpu-burn"), "--json", "--seconds", str(seconds)]
    start = time.time()
    b = Burn.start([*cmd, "--kernel-us", str(KERNEL_US)], env, KERNEL_US)
    with open_when_created(usage_path) as usage:
        sampler.wait_past(start + 2.5)  # at its own limit for a while
        steered = time.time()
        usage.write_steer(0, STEER * 10_000)
        while time.time() < steered + 3.0:  # the daemon's tick keeps it fresh
            usage.steer_heartbeat(time.monotonic_ns())
            time.sleep(TICK_S)
        released = time.time()  # the daemon is gone: no more heartbeats
    b.finish(timeout=seconds + 60)
    end = start + seconds
    sampler.wait_past(end)

    phases = {
        "own limit": (start + SETTLE_S, steered, ENV_LIMIT),
        "steered": (steered + SETTLE_S, released, STEER),
        "stale": (released + FRESH_S + SETTLE_S, end, ENV_LIMIT),
    }
    for name, (begin, finish, expected) in phases.items():
        steps = series(sampler.samples, b.pids, begin, finish)
        device = device_util(sampler.samples, begin, finish)
        assert mean(steps) == pytest.approx(expected, abs=TOLERANCE), f"{name}: {steps}"
        assert device == pytest.approx(expected, abs=TOLERANCE), f"{name}: device {device:.1f}"
