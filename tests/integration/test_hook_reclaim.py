"""Bytes of processes that are gone come back; bytes of live ones never go.

A SIGKILLed process cannot free anything: the next process of the vGPU
reclaims its slot (standalone, no daemon). Identity is (PID namespace, pid,
start time), so a reused pid neither keeps a dead process's bytes alive nor
lets anyone free a live process's bytes; slots of other PID namespaces are
not ours to judge. A forked child is a process of its own.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

from tests.fixtures.hook import FakeHook
from tests.helpers.memprobe import InteractiveProbe, MiB, hooked, probe
from vgpud.vgpus.blocks import UsageBlock

LIMIT = 256 * MiB


def env_for(sim_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return hooked(
        sim_env,
        CUDA_MEM_LIMIT=str(LIMIT),
        VGPU_USAGE=str(tmp_path / "usage"),
        VGPU_SIM_CTX_OVERHEAD="0",
    )


def start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[19])


def used(tmp_path: Path) -> int:
    with UsageBlock.open(tmp_path / "usage") as usage:
        return usage.devices()[0].used


def test_sigkill_at_random_instants_leaks_nothing(sim_env: dict[str, str], tmp_path: Path) -> None:
    env = env_for(sim_env, tmp_path)
    rng = random.Random(1234)
    for _ in range(8):
        worker = InteractiveProbe(env, ["alloc:alloc:4m", "churn:alloc:1m"])
        worker.until_wait()  # it is allocating and freeing in a loop now
        # The kill lands anywhere in the loop: that is the point of the delay.
        time.sleep(rng.uniform(0, 0.03))
        worker.kill()
    assert used(tmp_path) >= 4 * MiB  # the dead hold bytes until someone looks
    fresh = InteractiveProbe(env, ["alloc:alloc:2m", "wait"])
    try:
        fresh.until_wait()
        with UsageBlock.open(tmp_path / "usage") as usage:
            slots = usage.slots()
            assert [s.pid for s in slots] == [fresh.proc.pid]
            assert usage.devices()[0].used == slots[0].used == 2 * MiB
    finally:
        fresh.resume()
        fresh.finish()
    assert used(tmp_path) == 0


def test_pid_reuse_neither_steals_nor_keeps_bytes(sim_env: dict[str, str], tmp_path: Path) -> None:
    env = env_for(sim_env, tmp_path)
    assert probe(env).init["result"] == "CUDA_SUCCESS"  # creates the block
    live = subprocess.Popen(["sleep", "600"])
    try:
        ours = os.stat("/proc/self/ns/pid").st_ino
        hook = FakeHook(tmp_path / "usage")
        # A live pid with another start time: that process is gone.
        hook.claim(
            5, pid=live.pid, pidns=ours, start_time=start_time(live.pid) + 1, used={0: 10 * MiB}
        )
        # The live process itself.
        hook.claim(6, pid=live.pid, pidns=ours, start_time=start_time(live.pid), used={0: 20 * MiB})
        # A pid of another PID namespace: not ours to judge, even if no such pid here.
        hook.claim(7, pid=2**22 + 7, pidns=ours + 1, start_time=1, used={0: 40 * MiB})
        hook.close()
        fresh = InteractiveProbe(env, ["alloc:alloc:1m", "wait"])
        try:
            fresh.until_wait()
            with UsageBlock.open(tmp_path / "usage") as usage:
                slots = {s.index: s for s in usage.slots()}
                mine = [s for s in slots.values() if s.pid == fresh.proc.pid]
                assert sorted(slots) == sorted([6, 7, mine[0].index])
                assert mine[0].used == 1 * MiB and mine[0].index not in (5, 6, 7)
                assert usage.devices()[0].used == 61 * MiB
        finally:
            fresh.resume()
            fresh.finish()
        assert used(tmp_path) == 60 * MiB
    finally:
        live.kill()
        live.wait()
    # Now that identity is dead too: the next process returns its bytes.
    assert probe(env).init["result"] == "CUDA_SUCCESS"
    assert probe(env, "alloc:alloc:1m").ops("alloc")[0]["result"] == "CUDA_SUCCESS"
    assert used(tmp_path) == 40 * MiB


def test_leak_of_an_idle_vgpu_is_reset(sim_env: dict[str, str], tmp_path: Path) -> None:
    """A kill between charging the vGPU total and the slot leaves bytes no
    slot owns; once no process is left, the next one resets them."""
    env = env_for(sim_env, tmp_path)
    assert probe(env).init["result"] == "CUDA_SUCCESS"
    hook = FakeHook(tmp_path / "usage")
    hook.block.devices[0].used += 7 * MiB
    hook.close()
    live = InteractiveProbe(env, ["alloc:alloc:1m", "wait"])
    try:
        live.until_wait()
        assert used(tmp_path) == 1 * MiB
    finally:
        live.resume()
        live.finish()
    assert used(tmp_path) == 0


def test_forked_child_has_its_own_slot(sim_env: dict[str, str], tmp_path: Path) -> None:
    run = probe(env_for(sim_env, tmp_path), "alloc:alloc:8m", "fork", "alloc:alloc:4m", "meminfo")
    assert run.ops("forked") == [{"op": "forked", "status": 0}]
    # The child's try (CUDA does not survive fork) and its exit touch
    # nothing of the parent's: the parent still holds its 8 MiB, plus 4.
    assert run.ops("meminfo")[-1]["free"] == LIMIT - 12 * MiB
    with UsageBlock.open(tmp_path / "usage") as usage:
        assert usage.devices()[0].used == 0 and usage.slots() == []


def test_forked_child_that_uses_cuda_is_charged_on_a_slot_of_its_own(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    """A child that starts CUDA anew (the simulator lets it; a real driver
    refuses CUDA in the child of a process that had started it) takes its
    own slot: its bytes are its own, and its exit returns only them."""
    proc = InteractiveProbe(
        env_for(sim_env, tmp_path),
        ["alloc:alloc:8m", "fork", "reinit", "alloc:alloc:4m", "wait"],
    )
    try:
        child = proc.until_wait()
        assert [x["result"] for x in child if x["op"] in ("reinit", "alloc")][-2:] == [
            "CUDA_SUCCESS",
            "CUDA_SUCCESS",
        ]
        with UsageBlock.open(tmp_path / "usage") as usage:
            slots = usage.slots()
            assert len({s.pid for s in slots}) == 2
            assert sorted(s.devices[0].used for s in slots) == [4 * MiB, 8 * MiB]
            assert usage.devices()[0].used == 12 * MiB
        proc.resume()  # the child exits
        parent = proc.until_wait()
        assert {"op": "forked", "status": 0} in parent
        with UsageBlock.open(tmp_path / "usage") as usage:
            # The child's 4 MiB went with it; the parent's 8 MiB and the
            # parent's own 4 MiB (it ran the same commands) stay.
            assert [s.devices[0].used for s in usage.slots()] == [12 * MiB]
        proc.resume()
    finally:
        run = proc.finish()
    assert run.returncode == 0, run.stderr
    with UsageBlock.open(tmp_path / "usage") as usage:
        assert usage.devices()[0].used == 0 and usage.slots() == []
