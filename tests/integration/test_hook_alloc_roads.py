"""Allocation roads that once left a vGPU's budget unchanged, or charged
forever, on the simulated GPU (attacks 5, 6 and 9 of docs/security.md).

Each test drives one road through ``vgpu-memprobe`` under a 100 MiB
standalone limit and checks two things: the hook's charge (what
``cuMemGetInfo`` shows, the usage block) follows the device memory the road
really holds, and the limit refuses what would pass it. The simulator
behaves like the real driver on each road (docs/simulator.md); the same
roads run against a real GPU in tests/gpu/test_memory_roads.py.
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers.memprobe import InteractiveProbe, MiB, hooked, probe
from vgpud.vgpus.blocks import UsageBlock

LIMIT = 100 * MiB
OK = "CUDA_SUCCESS"
OOM = "CUDA_ERROR_OUT_OF_MEMORY"


def limited(sim_env: dict[str, str], tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {"CUDA_MEM_LIMIT": str(LIMIT), "VGPU_USAGE": str(tmp_path / "usage")}
    env["VGPU_SIM_CTX_OVERHEAD"] = "0"
    env.update(extra)
    return hooked({**sim_env, "VGPU_SIM_CTX_OVERHEAD": "0"}, **env)


def used(run_meminfo: dict[str, int]) -> int:
    return run_meminfo["total"] - run_meminfo["free"]


def device_used(sim_env: dict[str, str]) -> int:
    """The simulated device's used memory, asked from outside the vGPU (an
    unhooked process that allocates nothing)."""
    outside = probe({**sim_env, "VGPU_SIM_CTX_OVERHEAD": "0"}, "nvml")
    return int(outside.ops("nvml")[0]["used"])


# ---- item 5a: VMM memory lives while mapped ----------------------------------


def test_a_released_handle_stays_charged_while_its_mapping_lives(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    env = limited(sim_env, tmp_path)
    holder = InteractiveProbe(env, ["alloc:vmmmap:60m", "meminfo", "wait", "free", "meminfo"])
    try:
        lines = holder.until_wait()
        assert [x["result"] for x in lines if x["op"] == "alloc"] == [OK]
        held = next(x for x in lines if x["op"] == "meminfo")
        # The handle is released, the mapping keeps the memory: still charged.
        assert used(held) == 60 * MiB
        assert device_used(sim_env) == 60 * MiB
        other = probe(env, "alloc:vmmmap:60m", "alloc:alloc:60m")
        assert [x["result"] for x in other.ops("alloc")] == [OOM, OOM]
    finally:
        holder.resume()
    run = holder.finish()
    assert [x["result"] for x in run.ops("free")] == [OK]
    assert used(run.ops("meminfo")[-1]) == 0
    with UsageBlock.open(tmp_path / "usage") as usage:
        assert usage.devices()[0].used == 0


def test_unmapping_the_last_mapping_gives_a_released_handle_back(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    run = probe(
        limited(sim_env, tmp_path),
        "alloc:vmmmap:60m",
        "free",
        "meminfo",
        "alloc:vmmmap:60m",
        "meminfo",
    )
    assert [x["result"] for x in run.ops("alloc")] == [OK, OK]
    freed, again = run.ops("meminfo")
    assert (used(freed), used(again)) == (0, 60 * MiB)


def test_a_handle_retained_from_its_mapping_keeps_the_memory_charged(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    run = probe(limited(sim_env, tmp_path), "vmm-retain:60m", "meminfo", "alloc:alloc:60m")
    assert run.ops("vmm-retain")[0]["result"] == OK
    assert used(run.ops("meminfo")[0]) == 60 * MiB
    assert run.ops("alloc")[0]["result"] == OOM


# ---- item 5b: context limits --------------------------------------------------


def test_a_stack_limit_is_charged_before_the_driver_reserves_it(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    # 4 SMs x 2048 threads: every KiB of stack per thread is 8 MiB.
    env = limited(sim_env, tmp_path, VGPU_SIM_SMS="4")
    run = probe(
        env,
        "limit:stack:4096",
        "meminfo",  # +3 KiB per thread: 24 MiB
        "limit:stack:16384",
        "meminfo",  # +15 KiB: 120 MiB, over the limit
        "limit:stack:1024",
        "meminfo",  # back to the default
        args=["--device", "0"],
    )
    assert [x["result"] for x in run.ops("limit")] == [OK, OOM, OK]
    grown, refused, back = (used(m) for m in run.ops("meminfo"))
    assert (grown, refused, back) == (24 * MiB, 24 * MiB, 0)
    assert "cuCtxSetLimit" in run.stderr


def test_heap_and_fifo_limits_are_charged_and_given_back_with_the_context(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    env = limited(sim_env, tmp_path)
    holder = InteractiveProbe(env, ["limit:heap:72m", "limit:fifo:33m", "meminfo", "wait"])
    try:
        lines = holder.until_wait()
        assert [x["result"] for x in lines if x["op"] == "limit"] == [OK, OK]
        # 64 MiB of heap and 32 MiB of FIFO beyond the defaults (8 MiB, 1 MiB).
        meminfo = next(x for x in lines if x["op"] == "meminfo")
        assert used(meminfo) == 96 * MiB == device_used(sim_env)
        assert probe(env, "alloc:alloc:8m").ops("alloc")[0]["result"] == OOM
    finally:
        holder.resume()
    holder.finish()
    with UsageBlock.open(tmp_path / "usage") as usage:
        assert usage.devices()[0].used == 0


# ---- item 5c: graph memory nodes by the generic roads -------------------------


def test_memory_nodes_added_by_cuGraphAddNode_are_charged(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    env = limited(sim_env, tmp_path)
    for args in (["--resolve", "procaddr"], ["--resolve", "dlsym"]):
        for path in ("graphnode", "graphnode2"):
            run = probe(
                env,
                f"alloc:{path}:60m",
                "meminfo",
                f"alloc:{path}:60m",
                "free",
                "trim",
                "meminfo",
                args=args,
            )
            assert [x["result"] for x in run.ops("alloc")] == [OK, OOM], (path, args)
            charged, trimmed = run.ops("meminfo")
            assert (used(charged), used(trimmed)) == (60 * MiB, 0), (path, args)


def test_captured_stream_ordered_memory_is_graph_memory(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    """cuMemAllocAsync on a capturing stream adds a memory node: after the
    graph runs, what it freed is held by the device's graph pool (on the
    real driver until cuDeviceGraphMemTrim; the simulator has no graph pool
    and frees it at once, so here the hook's charge is the driver's, not
    the simulator's), never given back by asking the stream's pool."""
    run = probe(
        limited(sim_env, tmp_path),
        "capture:60m",
        "meminfo",
        "alloc:alloc:60m",
        "trim",
        "meminfo",
        "alloc:alloc:60m",
    )
    assert run.ops("capture")[0]["result"] == OK
    held, trimmed = run.ops("meminfo")
    assert (used(held), used(trimmed)) == (60 * MiB, 0)
    assert [x["result"] for x in run.ops("alloc")] == [OOM, OK]


# ---- item 6: stream-ordered memory on the pool's or stream's device -----------


def test_stream_ordered_memory_is_charged_to_the_device_it_lands_on(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    env = limited(sim_env, tmp_path, CUDA_MEM_LIMIT_1="10m")
    run = probe(env, "async-on:1:30m", "pool-on:1:30m", "async-on:1:4m", "pool-on:1:4m", "meminfo")
    assert [x["result"] for x in run.ops("async-on")] == [OOM, OK]
    assert [x["result"] for x in run.ops("pool-on")] == [OOM, OK]
    assert used(run.ops("meminfo")[0]) == 0  # device 0, the current context's
    with UsageBlock.open(tmp_path / "usage") as usage:
        assert [d.oom_count for d in usage.devices()[:2]] == [0, 2]


def test_what_any_of_many_pools_keeps_stays_charged(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    # A pool keeps what is freed to it (until a synchronisation or a trim),
    # however many pools the process made before it.
    run = probe(limited(sim_env, tmp_path), "pools:100:60m", "meminfo", "alloc:alloc:60m")
    assert run.ops("pools")[0]["result"] == OK
    assert used(run.ops("meminfo")[0]) == 60 * MiB + 99 * 4096
    assert run.ops("alloc")[0]["result"] == OOM


# ---- item 9: what the driver frees is given back ------------------------------


def test_destroying_a_context_gives_back_what_was_allocated_in_it(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    run = probe(limited(sim_env, tmp_path), "ctx-leak:60m", "meminfo", "alloc:alloc:60m")
    assert run.ops("ctx-leak")[0]["result"] == OK
    assert used(run.ops("meminfo")[0]) == 0
    assert run.ops("alloc")[0]["result"] == OK


def test_what_is_freed_into_a_destroyed_pool_stays_charged(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    # A real driver keeps it on the device (H100, driver 580: still there
    # after later allocations), and the destroyed pool cannot be asked.
    run = probe(
        limited(sim_env, tmp_path),
        "alloc:pool:60m",
        "pool-destroy",
        "free",
        "meminfo",
        "sync",
        "alloc:alloc:60m",
    )
    assert run.ops("pool-destroy")[0]["result"] == OK
    assert used(run.ops("meminfo")[0]) == 60 * MiB
    assert run.ops("alloc")[-1]["result"] == OOM


def test_a_pool_destroyed_with_nothing_outstanding_gives_back_what_it_held(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    run = probe(
        limited(sim_env, tmp_path),
        "alloc:pool:60m",
        "free",
        "pool-destroy",
        "meminfo",
        "alloc:alloc:90m",
    )
    assert run.ops("pool-destroy")[0]["result"] == OK
    assert used(run.ops("meminfo")[0]) == 0
    assert run.ops("alloc")[-1]["result"] == OK


def test_a_graph_destroyed_before_instantiation_gives_its_memory_back(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    run = probe(limited(sim_env, tmp_path), "graph-drop:60m", "meminfo", "alloc:alloc:60m")
    assert run.ops("graph-drop")[0]["result"] == OK
    assert used(run.ops("meminfo")[0]) == 0
    assert run.ops("alloc")[0]["result"] == OK


def test_a_graph_that_ran_keeps_its_unfreed_memory_charged_past_its_destruction(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    run = probe(
        limited(sim_env, tmp_path),
        "graph-keep:60m",
        "meminfo",
        "alloc:alloc:60m",
        "free",
        "trim",
        "meminfo",
    )
    assert run.ops("graph-keep")[0]["result"] == OK
    kept, freed = run.ops("meminfo")
    assert used(kept) == 60 * MiB
    assert run.ops("alloc")[0]["result"] == OOM
    assert run.ops("free")[0]["result"] == OK
    assert used(freed) == 0


def test_a_layered_mipmap_is_charged_for_every_level_and_layer(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    # 512 x 512 floats, 32 layers; 100 levels asked, 10 exist (512 .. 1),
    # each level of each layer padded to 4 KiB by the simulated driver (a
    # real one pads too): the charge is what the device holds, not the texels.
    padded = sum(-(-((512 >> level) ** 2 * 4) // 4096) * 4096 for level in range(10))
    run = probe(limited(sim_env, tmp_path), "alloc:mipmaplayered:1m", "meminfo")
    assert run.ops("alloc")[0]["result"] == OK
    assert used(run.ops("meminfo")[0]) == padded * 32


def test_mipmaps_whose_padding_would_pass_the_limit_are_refused(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    # Two fit by their texels (2 x 44 739 200 bytes), not once padded.
    limit = 90_000_000
    env = limited(sim_env, tmp_path, CUDA_MEM_LIMIT=str(limit))
    run = probe(env, *["alloc:mipmaplayered:1m"] * 2, "meminfo")
    assert [x["result"] for x in run.ops("alloc")] == [OK, OOM]
    assert used(run.ops("meminfo")[0]) <= limit


# ---- memory of a kind the limit cannot account for ------------------------------

NOT_SUPPORTED = "CUDA_ERROR_NOT_SUPPORTED"
PINNED, MANAGED = 1, 2  # CUmemAllocationType
DEVICE, HOST, UNKNOWN = 1, 2, 9  # CUmemLocationType; 9: none the hook knows


def test_memory_of_a_kind_the_limit_cannot_account_for_is_refused(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    # A location type newer than the hook (drivers add some: a device's
    # locality domain) or a pool of managed memory was let through uncharged,
    # as if it were host memory: on a driver that takes it, device memory
    # outside the limit. A limited process is refused it before the driver
    # is asked; pinned device memory is charged and host memory passes, as
    # before, and an unlimited process is left to its driver.
    run = probe(
        limited(sim_env, tmp_path),
        f"kind:{PINNED}:{UNKNOWN}:4m",
        f"kind:{MANAGED}:{DEVICE}:4m",
        f"kind:{PINNED}:{DEVICE}:4m",
        "meminfo",
    )
    kinds = run.ops("kind")
    assert [x["result"] for x in kinds[:6]] == [NOT_SUPPORTED] * 6
    assert [x["result"] for x in kinds[6:]] == [OK] * 3
    assert used(run.ops("meminfo")[0]) >= 4 * MiB  # the pinned device handle, charged

    unlimited = probe({**sim_env, "VGPU_SIM_CTX_OVERHEAD": "0"}, f"kind:{PINNED}:{UNKNOWN}:4m")
    assert NOT_SUPPORTED not in [x["result"] for x in unlimited.ops("kind")]
