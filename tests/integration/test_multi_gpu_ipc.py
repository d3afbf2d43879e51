"""Memory shared between processes and devices, on the simulated GPUs.

Each byte is charged once, to the vGPU whose process allocated it: an
importer in another vGPU (a legacy IPC handle, a VMM handle passed as a
file descriptor) is charged nothing and can neither free nor grow the
exporter's charge. The exporter's charge outlives its own free while it
lives, because another process may still map the memory (on a real driver
it stays on the GPU until every mapping goes): without that, a tenant could
export, have a second process map, free, and allocate the same bytes again.
Peer access and peer copies charge nothing beyond the allocations on each
side. NVLink multicast objects are refused in a limited process.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.memprobe import InteractiveProbe, MiB, hooked, probe
from vgpud.vgpus.blocks import ControlBlock, DeviceSlice, UsageBlock

GPU0 = "GPU-5117a000-0000-4000-8000-000000000000"  # the simulator's default UUIDs
GPU1 = "GPU-5117a000-0000-4000-8000-000000000001"
LIMIT = 100 * MiB
OK, OOM = "CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"


def vgpu(
    sim_env: dict[str, str], tmp_path: Path, name: str, uuids: tuple[str, ...] = (GPU0,)
) -> dict[str, str]:
    """A vGPU of LIMIT bytes on each GPU named; the env of its processes."""
    control, usage = tmp_path / f"control-{name}", tmp_path / f"usage-{name}"
    ControlBlock.create(control, name, [DeviceSlice(u, LIMIT) for u in uuids]).close()
    UsageBlock.create(usage, device_count=len(uuids)).close()
    return hooked(
        sim_env, VGPU_SIM_CTX_OVERHEAD="0", VGPU_CONTROL=str(control), VGPU_USAGE=str(usage)
    )


def used(tmp_path: Path, name: str, devices: int = 1) -> list[int]:
    usage = UsageBlock.open(tmp_path / f"usage-{name}", device_count=devices)
    try:
        return [d.used for d in usage.devices()]
    finally:
        usage.close()


def test_a_vmm_handle_passed_as_a_descriptor_is_charged_once_to_its_exporter(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    exporter = InteractiveProbe(
        vgpu(sim_env, tmp_path, "a"),
        ["alloc:vmm:8m", "vmm-export", "wait", "free", "meminfo", "alloc:alloc:96m", "wait"],
    )
    try:
        lines = exporter.until_wait()
        export = next(line for line in lines if line["op"] == "vmm-export")
        assert export["result"] == OK
        # The importer, in vGPU b, maps all of it, then unmaps it: its own
        # budget never moves, and the exporter's neither.
        importer = probe(
            vgpu(sim_env, tmp_path, "b"),
            "meminfo",
            f"vmm-import:{export['pid']}:{export['fd']}",
            "meminfo",
            "free",
            "meminfo",
        )
        assert importer.ops("vmm-import")[0]["result"] == OK
        assert importer.ops("vmm-import")[0]["size"] == 8 * MiB
        assert [m["free"] for m in importer.ops("meminfo")] == [LIMIT] * 3
        assert used(tmp_path, "a") == [8 * MiB]
        assert used(tmp_path, "b") == [0]
        # The exporter releases its handle: the bytes stay charged to it
        # while it lives, so it cannot allocate them again.
        exporter.resume()
        lines = exporter.until_wait()
        assert [m["free"] for m in lines if m["op"] == "meminfo"] == [LIMIT - 8 * MiB]
        assert [a["result"] for a in lines if a["op"] == "alloc"] == [OOM]
        assert used(tmp_path, "a") == [8 * MiB]
    finally:
        exporter.resume()
        run = exporter.finish()
    assert run.returncode == 0, run.stderr
    assert used(tmp_path, "a") == [0]  # its exit gives everything back


def test_an_ipc_allocation_is_charged_once_and_stays_charged_after_its_free(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    exporter = InteractiveProbe(
        vgpu(sim_env, tmp_path, "a"),
        ["alloc:alloc:8m", "fill:7", "ipc-export", "wait", "free", "alloc:alloc:96m", "wait"],
    )
    try:
        lines = exporter.until_wait()
        handle = next(line for line in lines if line["op"] == "ipc-export")["handle"]
        importer = probe(vgpu(sim_env, tmp_path, "b"), f"ipc-open:{handle}", "meminfo")
        assert importer.ops("ipc-open")[0] == {"op": "ipc-open", "result": OK, "first": 7}
        assert importer.ops("meminfo")[0]["free"] == LIMIT
        assert (used(tmp_path, "a"), used(tmp_path, "b")) == ([8 * MiB], [0])
        exporter.resume()
        lines = exporter.until_wait()
        assert [a["result"] for a in lines if a["op"] == "alloc"] == [OOM]
        assert used(tmp_path, "a") == [8 * MiB]
    finally:
        exporter.resume()
        exporter.finish()
    assert used(tmp_path, "a") == [0]


def test_memory_never_exported_is_given_back_at_its_free(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    """Only exported memory is held past its free."""
    run = probe(
        vgpu(sim_env, tmp_path, "a"), "alloc:vmm:8m", "free", "alloc:alloc:8m", "free", "meminfo"
    )
    assert run.ops("meminfo")[0]["free"] == LIMIT


def test_peer_access_and_peer_copies_charge_only_the_allocations(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    """One process of a vGPU on both GPUs: 8 MiB on GPU0, copied to a new
    8 MiB allocation on GPU1 with peer access enabled both ways."""
    env = vgpu(sim_env, tmp_path, "tp", (GPU0, GPU1))
    proc = InteractiveProbe(env, ["alloc:alloc:8m", "fill:7", "peer-copy:1", "wait"])
    try:
        lines = proc.until_wait()
        copy = next(line for line in lines if line["op"] == "peer-copy")
        assert copy == {"op": "peer-copy", "result": OK, "first": 7}
        assert used(tmp_path, "tp", devices=2) == [8 * MiB, 8 * MiB]
    finally:
        proc.resume()
        proc.finish()


def test_nvlink_multicast_is_refused_in_a_limited_process(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    limited = probe(vgpu(sim_env, tmp_path, "a"), "multicast:2m", "multicast:2m")
    assert [m["result"] for m in limited.ops("multicast")] == ["CUDA_ERROR_NOT_SUPPORTED"] * 2
    refusals = [line for line in limited.stderr.splitlines() if "cuMulticastCreate refused" in line]
    assert len(refusals) == 1  # once per process
    # Without limits the call reaches the driver (the simulator has no NVLink).
    free = probe(hooked(sim_env), "multicast:2m")
    assert "cuMulticastCreate refused" not in free.stderr
