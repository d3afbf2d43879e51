"""A vGPU over two simulated GPUs: each GPU's memory slice holds on its own.

The vGPU's control block names its GPUs by UUID with a limit each; the hook
matches a CUDA device to its slice through cuDeviceGetUuid, so whatever
CUDA_VISIBLE_DEVICES does to ordinals (hiding one GPU, or listing them in
reverse), an allocation is charged to, and refused by, the slice of the GPU
it lands on. Both shapes of a multi-GPU program are covered: one process
using both devices, and one process per device (each seeing its GPU as
ordinal 0, as torchrun's ranks do).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.memprobe import InteractiveProbe, MiB, hooked, probe
from vgpud.vgpus.blocks import ControlBlock, DeviceSlice, UsageBlock

GPU0 = "GPU-5117a000-0000-4000-8000-000000000000"  # the simulator's default UUIDs
GPU1 = "GPU-5117a000-0000-4000-8000-000000000001"
LIMITS = {GPU0: 64 * MiB, GPU1: 32 * MiB}
OK, OOM = "CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"


def two_gpu_vgpu(sim_env: dict[str, str], tmp_path: Path, **extra: str) -> dict[str, str]:
    """A vGPU over both simulated GPUs (GPU0 64 MiB, GPU1 32 MiB), blocks as
    the daemon makes them (made by the first call); the environment of one
    of its processes."""
    if not (tmp_path / "usage").exists():
        slices = [DeviceSlice(uuid, limit) for uuid, limit in LIMITS.items()]
        ControlBlock.create(tmp_path / "control", "two-gpus", slices).close()
        UsageBlock.create(tmp_path / "usage", device_count=2).close()
    blocks = {"VGPU_CONTROL": str(tmp_path / "control"), "VGPU_USAGE": str(tmp_path / "usage")}
    return hooked(sim_env, VGPU_SIM_CTX_OVERHEAD="0", **blocks, **extra)


def used_by_gpu(tmp_path: Path) -> dict[str, int]:
    usage = UsageBlock.open(tmp_path / "usage", device_count=2)
    try:
        return dict(zip(LIMITS, (d.used for d in usage.devices()), strict=True))
    finally:
        usage.close()


@pytest.mark.parametrize("visible", ["0,1", "1,0"])
def test_one_process_on_both_gpus_is_held_to_each_gpus_slice(
    sim_env: dict[str, str], tmp_path: Path, visible: str
) -> None:
    env = two_gpu_vgpu(sim_env, tmp_path, CUDA_VISIBLE_DEVICES=visible)
    # Ordinal i is the GPU that CUDA_VISIBLE_DEVICES lists i-th.
    order = [GPU0, GPU1] if visible == "0,1" else [GPU1, GPU0]
    proc = InteractiveProbe(
        env,
        [
            "device:0",
            "meminfo",
            "alloc:alloc:40m",
            "alloc:vmm:24m",
            "device:1",
            "meminfo",
            "alloc:alloc:40m",
            "alloc:vmm:24m",
            "wait",
        ],
    )
    try:
        lines = proc.until_wait()
        held = used_by_gpu(tmp_path)
    finally:
        proc.resume()
        run = proc.finish()
    assert run.returncode == 0, run.stderr
    allocs = [line for line in lines if line["op"] == "alloc"]
    meminfo = [line for line in lines if line["op"] == "meminfo"]
    expected: dict[str, int] = {}
    for n, uuid in enumerate(order):
        # Each device shows its own slice, and takes what fits in it.
        assert meminfo[n]["total"] == meminfo[n]["total_mem"] == LIMITS[uuid]
        results = [a["result"] for a in allocs[2 * n : 2 * n + 2]]
        assert results == ([OK, OK] if uuid == GPU0 else [OOM, OK]), f"{uuid}: {results}"
        expected[uuid] = 64 * MiB if uuid == GPU0 else 24 * MiB
    assert held == expected
    assert used_by_gpu(tmp_path) == {GPU0: 0, GPU1: 0}


def test_one_process_per_gpu_each_charges_its_own_slice(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    """Two ranks, each with one GPU visible as ordinal 0: GPU1's rank fills
    its 32 MiB and is refused beyond it, while GPU0's rank still has its 64."""
    rank1 = InteractiveProbe(
        two_gpu_vgpu(sim_env, tmp_path, CUDA_VISIBLE_DEVICES="1"),
        ["alloc:alloc:32m", "alloc:alloc:1m", "wait"],
    )
    try:
        lines = rank1.until_wait()
        assert [line["result"] for line in lines if line["op"] == "alloc"] == [OK, OOM]
        rank0 = probe(
            two_gpu_vgpu(sim_env, tmp_path, CUDA_VISIBLE_DEVICES="0"),
            "meminfo",
            "alloc:alloc:48m",
            "alloc:alloc:16m",
            "alloc:alloc:1m",
            "meminfo",
        )
        assert [a["result"] for a in rank0.ops("alloc")] == [OK, OK, OOM]
        before, after = rank0.ops("meminfo")
        assert (before["total"], before["free"], after["free"]) == (64 * MiB, 64 * MiB, 0)
        assert used_by_gpu(tmp_path) == {GPU0: 0, GPU1: 32 * MiB}
    finally:
        rank1.resume()
        rank1.finish()


def test_a_gpu_outside_the_vgpu_gets_nothing_whatever_its_ordinal(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    """A vGPU on GPU1 only; the process sees both GPUs, GPU1 first: ordinal
    0 is the vGPU's GPU, ordinal 1 (GPU0) is not the vGPU's: even its
    context is refused, so nothing can be allocated there."""
    ControlBlock.create(tmp_path / "control", "gpu1-only", [DeviceSlice(GPU1, 32 * MiB)]).close()
    UsageBlock.create(tmp_path / "usage", device_count=1).close()
    env = hooked(
        sim_env,
        VGPU_SIM_CTX_OVERHEAD="0",
        VGPU_CONTROL=str(tmp_path / "control"),
        VGPU_USAGE=str(tmp_path / "usage"),
        CUDA_VISIBLE_DEVICES="1,0",
    )
    run = probe(env, "alloc:alloc:16m", "device:1", "meminfo")
    assert run.ops("alloc")[0]["result"] == OK
    assert run.ops("device")[0]["result"] == OOM
    assert "device 1 (GPU-5117a000-0000-4000-8000-000000000000) is not part of" in run.stderr
    # Ordinal 0 stays current and is GPU1's slice.
    assert run.ops("meminfo")[0]["total"] == 32 * MiB
