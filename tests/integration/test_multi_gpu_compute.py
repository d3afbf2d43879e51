"""Compute shares of a vGPU over two simulated GPUs, and ranks that wait on
each other.

Each GPU of a vGPU has its own share (the control block's per-device
entry) and the hook paces a launch by the device its stream lives on, found
by UUID: whatever CUDA_VISIBLE_DEVICES does to ordinals, GPU0 runs at GPU0's
share and GPU1 at GPU1's, for one process driving both GPUs and for one
process per GPU. Utilization is read from outside, per GPU, through NVML.

Then the pattern of collectives (tensor parallelism, all-reduce): two ranks
that wait for each other after every step (`vgpu-burn --lockstep`, a pipe
each way), one paced at 30 %, one with no limit. The paced rank must not
stall the other for good (no deadlock: both finish, both progress), and it
holds its share; the unlimited rank follows its pace, as it would in a
collective.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest

from tests.conftest import BUILD
from tests.helpers.vgpus import BrokeredVgpus
from tests.integration.compute_harness import Burn, Sampler, device_util

GPU0 = "GPU-5117a000-0000-4000-8000-000000000000"  # the simulator's default UUIDs
GPU1 = "GPU-5117a000-0000-4000-8000-000000000001"
SECONDS = 4.5
WARMUP = 1.0
TOLERANCE = 5.0  # points of a device
KERNEL_US = 2000
FULL = 100

pytestmark = pytest.mark.skipif(
    not (BUILD / "vgpu-burn").is_file() or not (BUILD / "libvgpu.so").is_file(),
    reason="run `make` first (build/vgpu-burn, build/libvgpu.so)",
)


def burn(
    sim_env: dict[str, str],
    blocks: dict[str, str],
    devices: str,
    visible: str | None = None,
    lockstep: tuple[int, int] | None = None,
) -> Burn:
    """vgpu-burn in a vGPU on `devices` (ordinals), synchronising every 8
    launches like a training step."""
    env = {**sim_env, "LD_PRELOAD": str(BUILD / "libvgpu.so"), **blocks}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    cmd = [str(BUILD / "vgpu-burn"), "--json", "--seconds", str(SECONDS), "--device", devices]
    cmd += ["--kernel-us", str(KERNEL_US), "--sync", "8"]
    if lockstep is not None:
        cmd += ["--lockstep", f"{lockstep[0]},{lockstep[1]}"]
    return Burn.start(cmd, env, KERNEL_US, pass_fds=lockstep or ())


def run_on_both_gpus(sim_env: dict[str, str], start: Callable[[], list[Burn]]) -> list[float]:
    """NVML utilization of GPU0 and GPU1 (NVML indices ignore
    CUDA_VISIBLE_DEVICES) while the burns that `start` starts run, after a
    warm-up."""
    samplers = [Sampler(sim_env, device=d) for d in (0, 1)]
    try:
        for s in samplers:
            s.wait_ready()
        began = time.time()
        for b in start():
            b.finish(timeout=SECONDS + 60)
        for s in samplers:
            s.wait_past(began + SECONDS)
        return [device_util(s.samples, began + WARMUP, began + SECONDS) for s in samplers]
    finally:
        for s in samplers:
            s.stop()


@pytest.mark.parametrize("visible", ["0,1", "1,0"])
def test_one_process_on_two_gpus_runs_each_at_its_own_share(
    sim_env: dict[str, str], vgpus: BrokeredVgpus, visible: str
) -> None:
    blocks = vgpus.make("tp", {GPU0: 30, GPU1: 60})
    util = run_on_both_gpus(sim_env, lambda: [burn(sim_env, blocks, "0,1", visible)])
    assert util[0] == pytest.approx(30, abs=TOLERANCE), f"GPU0, GPU1: {util}"
    assert util[1] == pytest.approx(60, abs=TOLERANCE), f"GPU0, GPU1: {util}"


def test_one_process_per_gpu_each_runs_at_its_gpus_share(
    sim_env: dict[str, str], vgpus: BrokeredVgpus
) -> None:
    """Two ranks of one vGPU, each with one GPU visible as ordinal 0."""
    blocks = vgpus.make("ranks", {GPU0: 30, GPU1: 60})
    util = run_on_both_gpus(
        sim_env,
        lambda: [burn(sim_env, blocks, "0", visible=v) for v in ("0", "1")],
    )
    assert util[0] == pytest.approx(30, abs=TOLERANCE), f"GPU0, GPU1: {util}"
    assert util[1] == pytest.approx(60, abs=TOLERANCE), f"GPU0, GPU1: {util}"


def lockstep_pipes() -> tuple[tuple[int, int], tuple[int, int], list[int]]:
    """(in, out) descriptors of two ranks joined by a pipe each way."""
    a_to_b = os.pipe()
    b_to_a = os.pipe()
    return (b_to_a[0], a_to_b[1]), (a_to_b[0], b_to_a[1]), [*a_to_b, *b_to_a]


@pytest.mark.parametrize("placement", ["own-gpus", "same-gpu"])
def test_a_paced_rank_and_an_unlimited_rank_waiting_on_each_other_both_progress(
    sim_env: dict[str, str], vgpus: BrokeredVgpus, placement: str
) -> None:
    """Rank 0 in a vGPU at 30 %, rank 1 in a vGPU with no compute limit,
    stepping together. own-gpus: each rank on its own GPU (tensor
    parallelism across two vGPUs); same-gpu: both on GPU0, where the
    unlimited rank also takes turns with the paced one."""
    other = GPU1 if placement == "own-gpus" else GPU0
    paced = vgpus.make("paced", {GPU0: 30})
    free = vgpus.make("free", {other: FULL})
    rank0, rank1, fds = lockstep_pipes()
    try:
        burns = [
            burn(sim_env, paced, "0", visible="0", lockstep=rank0),
            burn(sim_env, free, "0", visible="1" if other == GPU1 else "0", lockstep=rank1),
        ]
    finally:
        for fd in fds:
            os.close(fd)  # the ranks hold their own copies
    for b in burns:
        b.finish(timeout=SECONDS + 60)  # raises if a rank failed; a deadlock times out
    work = [round(100 * b.work, 1) for b in burns]
    # The paced rank holds its share; the unlimited rank keeps step with it
    # (same kernels, same steps) rather than running ahead or stalling.
    assert work[0] == pytest.approx(30, abs=TOLERANCE), f"work {work}"
    assert work[1] == pytest.approx(work[0], abs=TOLERANCE), f"work {work}"
