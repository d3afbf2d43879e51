"""The one place the budget can leak, made deterministic (simulated GPU).

The hook charges the vGPU total first and its slot second, and gives back
its slot first and the total second (docs/hook.md, "The budget"). A process
SIGKILLed between the two leaves the bytes of that one call in the total
with no slot owning them: the total is too high, never too low, so the
limit still holds. VGPU_TEST_STOP_IN makes the process stop itself inside
the window, so the kill lands exactly there; the leak is then repaired as
soon as the vGPU has no live process, by the next process's slot claim or
by the daemon's reaper.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.memprobe import InteractiveProbe, MiB, hooked, probe
from vgpud.loops.repairs import reap
from vgpud.observe.tracker import Tracker, VgpuBlocks
from vgpud.policy.reaper import ReaperState
from vgpud.vgpus.blocks import ControlBlock, DeviceSlice, UsageBlock

GPU0 = "GPU-5117a000-0000-4000-8000-000000000000"
LIMIT = 16 * MiB
HELD = 4 * MiB  # what a live process holds throughout
CALL = 8 * MiB  # the allocation the victim dies in the middle of
OOM = "CUDA_ERROR_OUT_OF_MEMORY"

# The commands that take the victim into each window.
WINDOWS = {
    "reserve": ["alloc:alloc:8m", "wait"],  # total charged, slot not yet
    "release": ["alloc:alloc:8m", "free", "wait"],  # slot given back, total not yet
}


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def stopped_in_window(victim: InteractiveProbe, timeout: float = 30) -> None:
    """Wait until the victim has stopped itself (SIGSTOP) inside the window."""
    deadline = time.monotonic() + timeout
    while state_of(victim.proc.pid) != "T":
        assert victim.proc.poll() is None, "the victim exited before its window"
        assert time.monotonic() < deadline, "the victim never reached its window"
        time.sleep(0.005)


def budget(usage_path: Path) -> tuple[int, int]:
    """(the vGPU total, the sum of the slots) on device 0."""
    with UsageBlock.open(usage_path, device_count=1) as usage:
        return usage.devices()[0].used, sum(s.devices[0].used for s in usage.slots())


def kill_in_window(env: dict[str, str], window: str, usage_path: Path) -> None:
    """Run a victim into `window` while a holder of HELD lives, and kill it there."""
    victim = InteractiveProbe({**env, "VGPU_TEST_STOP_IN": window}, WINDOWS[window])
    try:
        stopped_in_window(victim)
        # Inside the window: the total holds the call's bytes, no slot does.
        assert budget(usage_path) == (HELD + CALL, HELD)
    finally:
        victim.kill()


@pytest.fixture
def standalone(sim_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return hooked(
        sim_env,
        CUDA_MEM_LIMIT=str(LIMIT),
        VGPU_USAGE=str(tmp_path / "usage"),
        VGPU_SIM_CTX_OVERHEAD="0",
    )


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_a_kill_in_the_window_leaks_that_call_until_the_vgpu_is_idle(
    standalone: dict[str, str], tmp_path: Path, window: str
) -> None:
    usage = tmp_path / "usage"
    holder = InteractiveProbe(standalone, ["alloc:alloc:4m", "wait"])
    try:
        holder.until_wait()
        kill_in_window(standalone, window, usage)
        # A newcomer reclaims the victim's slot but cannot tell the leak from
        # a live reservation: it counts, so the limit is kept (conservatively).
        late = probe(standalone, "alloc:alloc:8m")
        assert late.ops("alloc")[0]["result"] == OOM
        assert budget(usage) == (HELD + CALL, HELD)  # bounded: exactly that one call
    finally:
        holder.resume()
        holder.finish()
    assert budget(usage) == (CALL, 0)  # nobody left: only the leak
    # The next process finds the vGPU idle and resets the totals at its claim.
    run = probe(standalone, "alloc:alloc:8m", "meminfo")
    assert run.ops("alloc")[0]["result"] == "CUDA_SUCCESS"
    assert run.ops("meminfo")[0]["free"] == LIMIT - CALL
    assert budget(usage) == (0, 0)


@pytest.fixture
def vgpu(sim_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    ControlBlock.create(tmp_path / "control", "test-vgpu", [DeviceSlice(GPU0, LIMIT)]).close()
    UsageBlock.create(tmp_path / "usage").close()
    yield hooked(
        sim_env,
        VGPU_CONTROL=str(tmp_path / "control"),
        VGPU_USAGE=str(tmp_path / "usage"),
        VGPU_SIM_CTX_OVERHEAD="0",
    )


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_the_reaper_repairs_the_leak_once_the_vgpu_is_idle(
    vgpu: dict[str, str], tmp_path: Path, window: str
) -> None:
    usage = UsageBlock.open(tmp_path / "usage", device_count=1)
    control = ControlBlock.open(tmp_path / "control")
    views = {"test-vgpu": VgpuBlocks(usage, control)}
    tracker, state = Tracker("/proc", sees_all_pids=True), ReaperState()

    def tick() -> list[tuple[str, tuple[int, ...]]]:
        nonlocal state
        events, state = reap(tracker.scan(views, None), views, state)
        return [(e.kind, e.freed) for e in events]

    try:
        holder = InteractiveProbe(vgpu, ["alloc:alloc:4m", "wait"])
        try:
            holder.until_wait()
            kill_in_window(vgpu, window, tmp_path / "usage")
            # The dead slot goes; the leak stays while a process lives.
            assert tick() == [("slot_reclaimed", (0,))]
            assert tick() == []
            assert budget(tmp_path / "usage") == (HELD + CALL, HELD)
        finally:
            holder.resume()
            holder.finish()
        assert tick() == [("usage_reset", (CALL,))]
        assert budget(tmp_path / "usage") == (0, 0)
    finally:
        usage.close()
        control.close()
