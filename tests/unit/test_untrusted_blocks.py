"""A container can truncate its usage block under the daemon's mapping: the
daemon must survive it (vgpu_guard.c), only that block is affected, and the
daemon recreates it.

Each case runs in a child Python, so a regression kills the child with
SIGBUS and fails the assertion instead of taking pytest down.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ROOT
from tests.unit.fakes import create, gpus
from vgpud.policy.placement import Rules
from vgpud.units import parse_memory
from vgpud.vgpus.abi import TURN_WANT, ControlC, ControlDeviceC, TurnC, UsageC, UsageDeviceC
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.blocks import UsageBlock
from vgpud.vgpus.model import CreateRequest, Limits
from vgpud.vgpus.registry import Registry
from vgpud.vgpus.state import StateStore

MiB = 1 << 20


def run_child(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    prelude = textwrap.dedent(
        f"""
        import os
        from pathlib import Path
        from vgpud.vgpus.blocks import UsageBlock
        tmp = Path({str(tmp_path)!r})
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_truncated_usage_block_reads_as_empty_and_is_marked_lost(tmp_path: Path) -> None:
    done = run_child(
        """
        victim = UsageBlock.create(tmp / "victim", device_count=1)
        other = UsageBlock.create(tmp / "other", device_count=1)
        other.write_steer(0, 500_000)
        assert not victim.lost
        os.truncate(tmp / "victim", 0)  # what a container can do to its block
        # Every daemon path over the block: reads, repairs, steering.
        assert [d.used for d in victim.devices()] == [0]
        assert victim.slots() == []
        assert victim.reset_used(0) == 0
        victim.write_steer(0, 100_000)
        victim.steer_heartbeat(1)
        victim.standalone_limits()
        assert victim.lost
        # Another vGPU's block is untouched.
        assert not other.lost and other.read_steer(0).quota_ppm == 500_000
        victim.close()
        other.close()
        print("alive")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "alive"


def test_a_partly_truncated_block_is_caught_too(tmp_path: Path) -> None:
    done = run_child(
        """
        block = UsageBlock.create(tmp / "u", device_count=1)
        os.truncate(tmp / "u", 4096)
        block.slots()  # the slots live past the first page: lost
        assert block.lost
        print("alive")
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr


def test_a_sigbus_elsewhere_still_kills(tmp_path: Path) -> None:
    # The guard catches faults in the blocks it watches, nothing else.
    done = run_child(
        """
        import mmap
        UsageBlock.create(tmp / "u", device_count=1)  # installs the guard
        with open(tmp / "plain", "wb+") as f:
            f.truncate(4096)
            m = mmap.mmap(f.fileno(), 4096)
            f.truncate(0)
            m[0]
        """,
        tmp_path,
    )
    assert done.returncode == -signal.SIGBUS


def test_a_removed_guard_frees_its_entry() -> None:
    # More blocks over a daemon's life than the guard has entries at once.
    atomics = Atomics.load()
    buffer = ctypes.create_string_buffer(4096)
    for _ in range(5000):
        guard = atomics.guard_add(ctypes.addressof(buffer), len(buffer))
        assert guard >= 0
        atomics.guard_remove(guard)


def test_the_daemon_recreates_a_usage_block_cut_short(tmp_path: Path) -> None:
    registry = Registry(
        tmp_path / "run",
        StateStore(tmp_path / "state"),
        tmp_path / "lib.so",
        Atomics.load(),
    )
    registry.adopt()
    limits = Limits(memory=parse_memory("1g"), share=30, mode="hard", weight=100)
    entry = create(registry, CreateRequest(), limits, gpus(1), Rules())
    path = entry.paths.usage

    os.truncate(path, 100)
    assert registry.repair_usage() == []  # nothing touched the lost pages yet
    entry.usage.slots()  # a scan does
    [repair] = registry.repair_usage()
    assert (repair.vgpu, repair.block) == (entry.vgpu.id, "usage")

    fresh = UsageBlock.open(path, device_count=1)  # a whole, valid block again
    fresh.close()
    assert not registry.get(entry.vgpu.id).usage.lost
    registry.close()


def test_a_remade_usage_block_keeps_its_place_in_the_gpu_turn(tmp_path: Path) -> None:
    """The broker's account of the vGPU (its turn credit; libhook/tests/
    test_broker.c) goes on with the new block: the same entries, now
    hearing the new block's request. Taken out and entered afresh, a
    tenant that cut its block short at every scan started each with full
    credit and held the GPU past its quota plus the slack."""
    atomics = Atomics.load()
    registry = Registry(tmp_path / "run", StateStore(tmp_path / "state"), tmp_path / "l", atomics)
    registry.adopt()
    limits = Limits(memory=parse_memory("1g"), share=30, mode="hard", weight=100)
    entry = create(registry, CreateRequest(), limits, gpus(1), Rules())
    turns = list(entry.turns)
    assert turns

    calls: list[str] = []
    broker = registry.broker

    def recorded(name: str) -> Callable[..., object]:
        method = getattr(broker, name)

        def call(*args: object) -> object:
            calls.append(name)
            return method(*args)

        return call

    for name in ("add", "remove", "rebind"):
        setattr(broker, name, recorded(name))

    os.truncate(entry.paths.usage, 100)
    entry.usage.slots()
    assert len(registry.repair_usage()) == 1
    assert calls == ["rebind"] * len(turns)  # never out and in again: that reset its credit
    assert registry.get(entry.vgpu.id).turns == turns

    usage, control = entry.usage, entry.control
    turn = UsageC.devices.offset + UsageDeviceC.turn.offset
    request = usage._base + turn + TurnC.request.offset
    grant = control._base + ControlC.devices.offset + ControlDeviceC.turn_grant.offset
    atomics.store_u32(request, TURN_WANT)
    atomics.futex_wake_all(request)
    for _ in range(2000):  # the broker grants within a look; bounded, not timed
        if atomics.load_u32(grant) > TURN_WANT:
            break
        time.sleep(0.001)
    assert atomics.load_u32(grant) > TURN_WANT
    registry.close()


def test_a_usage_block_its_tenant_grew_is_cut_back_at_the_next_scan(tmp_path: Path) -> None:
    """The tenant owns its usage block and may grow it and write past the
    layout: on /run's tmpfs that is the node's memory (a full /run stops
    the daemon's creates and the node's services). The scan's repair cuts
    the file back to the layout, reports it, and the vGPU's counters and
    mapping are untouched."""
    registry = Registry(
        tmp_path / "run", StateStore(tmp_path / "state"), tmp_path / "l", Atomics.load()
    )
    registry.adopt()
    limits = Limits(memory=parse_memory("1g"), share=30, mode="hard", weight=100)
    entry = create(registry, CreateRequest(), limits, gpus(1), Rules())
    path = entry.paths.usage
    size = path.stat().st_size
    assert registry.repair_usage() == []  # a block of its own size is left alone

    with open(path, "r+b") as f:  # as the tenant: 8 MiB written past the layout
        f.seek(size)
        f.write(b"x" * (8 * MiB))
    [repair] = registry.repair_usage()
    assert (repair.vgpu, repair.block) == (entry.vgpu.id, "usage")
    assert path.stat().st_size == size
    assert path.stat().st_blocks * 512 <= size + 4096
    assert not entry.usage.lost and registry.get(entry.vgpu.id).usage is entry.usage
    entry.usage.slots()  # still mapped and whole
    assert registry.repair_usage() == []
    registry.close()
