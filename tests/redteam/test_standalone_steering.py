"""A standalone tenant's words in the control tick.

An adopted standalone block is its tenant's: every word of it, its
device_count and its device entries included, may change at any time and
say anything. The control tick steers every vGPU of the node at once, so
what one such block says must neither stop the tick (no quota and no
heartbeat for anyone, then the watchdog kills the daemon) nor weigh more in
the controller than one honest hook's entries would.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.unit.fakes import create, gpus
from vgpud.loops.control import Steering
from vgpud.observe.tracker import TrackSnapshot, VgpuBlocks, VgpuUse
from vgpud.policy.placement import Rules
from vgpud.units import parse_memory
from vgpud.vgpus.abi import MAX_DEVICES, UsageC
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.blocks import UsageBlock
from vgpud.vgpus.model import CreateRequest, Limits
from vgpud.vgpus.registry import Entry, Registry
from vgpud.vgpus.state import StateStore

TICK_NS = 100_000_000
GPUS = gpus(2)
GPU = GPUS[0].uuid
SA = "sa-1000-1"  # the adopted standalone block's id


@contextmanager
def node(tmp: Path, *vgpus: tuple[int, str]) -> Iterator[Registry]:
    """A registry with daemon-owned vGPUs (share, mode) on the first GPU."""
    reg = Registry(tmp / "run", StateStore(tmp / "state"), tmp / "lib.so", Atomics.load())
    reg.adopt()
    for share, mode in vgpus:
        limits = Limits(parse_memory("1g"), share, mode, 1)
        create(reg, CreateRequest(gpus=(GPU,)), limits, GPUS, Rules())
    try:
        yield reg
    finally:
        reg.close()


def mapped(path: Path) -> Any:
    """A process's own mapping of a block, as its hook (or a hostile
    tenant) writes it; unmapped when the structure is collected."""
    fd = os.open(path, os.O_RDWR)
    try:
        return UsageC.from_buffer(mmap.mmap(fd, 0, mmap.MAP_SHARED))
    finally:
        os.close(fd)


def standalone_block(path: Path, entries: list[tuple[str, int]]) -> UsageBlock:
    """A standalone block whose hook recorded ``entries`` (UUID, share in
    ppm), adopted by the daemon as it finds it."""
    UsageBlock.create(path, device_count=1).close()
    c = mapped(path)
    c.device_count = len(entries)
    for i, (uuid, share_ppm) in enumerate(entries):
        c.uuids[i].value = uuid.encode()
        c.devices[i].share_ppm = share_ppm
    return UsageBlock.open(path)


def busy(entries: list[Entry], usage: UsageBlock | None = None) -> TrackSnapshot:
    """A scan that found processes in every vGPU (and the standalone block)."""
    uses = {e.vgpu.id: VgpuUse(e.vgpu.id, False, {}, (), 1) for e in entries}
    blocks = {}
    if usage is not None:
        uses[SA] = VgpuUse(SA, True, {}, (), 1)
        blocks = {SA: VgpuBlocks(usage)}
    return TrackSnapshot(0.0, {}, uses, (), blocks, (), (), True)


def test_a_standalone_tenant_that_changes_device_count_after_adoption_does_not_stop_the_other_vgpus_quotas_and_heartbeats(  # noqa: E501
    tmp_path: Path,
) -> None:
    with node(tmp_path, (30, "hard"), (40, "soft")) as reg:
        usage = standalone_block(tmp_path / "sa", [(GPU, 200_000)])
        assert usage.device_count == 1  # fixed at adoption
        entries = reg.all()
        track = busy(entries, usage)
        steering = Steering(Atomics.load())
        now = 1_000_000_000
        tenant = mapped(usage.path)
        for i in range(1, MAX_DEVICES):
            tenant.uuids[i].value = GPUS[1].uuid.encode()
            tenant.devices[i].share_ppm = 500_000
        for count in (2, MAX_DEVICES, 2**32 - 1, 0, 1):
            tenant.device_count = count  # after adoption: the tenant's word
            now += TICK_NS
            quotas = steering.tick(entries, track.standalone, track, None, now)
            for e in entries:
                assert (e.vgpu.id, GPU) in quotas
                assert e.control.heartbeat_ns == now
            # Its own device, fixed at adoption, still steered; nothing beyond.
            assert {k for k in quotas if k[0] == SA} == ({(SA, GPU)} if count else set())
        usage.close()


def test_a_standalone_block_that_cannot_be_read_is_left_out_of_the_tick_with_one_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with node(tmp_path, (30, "hard"), (40, "soft")) as reg:
        usage = standalone_block(tmp_path / "sa", [(GPU, 200_000)])
        entries = reg.all()
        track = busy(entries, usage)
        steering = Steering(Atomics.load())

        def broken() -> None:
            raise ValueError("whatever a block can do that no one thought of")

        monkeypatch.setattr(usage, "standalone_limits", broken)
        now = 1_000_000_000
        with structlog.testing.capture_logs() as logs:
            for _ in range(20):
                now += TICK_NS
                quotas = steering.tick(entries, track.standalone, track, None, now)
                assert {k[0] for k in quotas} == {e.vgpu.id for e in entries}
                assert all(e.control.heartbeat_ns == now for e in entries)
        said = [entry for entry in logs if entry.get("vgpu") == SA]
        assert len(said) == 1 and said[0]["log_level"] == "warning"
        # Fail static: its hooks see no heartbeat and keep their last quota.
        assert mapped(usage.path).steer.heartbeat_ns == 0
        usage.close()


def soft_quota_beside(tmp: Path, entries: int) -> int:
    """The quota a soft vGPU at 30 that wants more is given on a GPU beside
    a standalone block listing that GPU in ``entries`` device entries, each
    with a share of 30 and forged pacer waits (it says it is held back)."""
    with node(tmp, (30, "soft")) as reg:
        (victim,) = reg.all()
        usage = standalone_block(tmp / "sa", [(GPU, 300_000)] * entries)
        hooks = mapped(victim.usage.path)
        tenant = mapped(usage.path)
        track = busy([victim], usage)
        steering = Steering(Atomics.load())
        now = 1_000_000_000
        for _ in range(60):
            now += TICK_NS
            hooks.devices[0].gpu_time_ns += 95_000_000  # uses what it is given
            hooks.devices[0].throttled_ns += 50_000_000  # and waits for more
            for i in range(entries):
                tenant.devices[i].throttled_ns += 50_000_000
            quotas = steering.tick([victim], track.standalone, track, None, now)
        usage.close()
        return quotas[(victim.vgpu.id, GPU)]


@pytest.mark.parametrize("entries", [2, 3, MAX_DEVICES])
def test_duplicated_uuids_give_a_soft_vgpu_the_same_quota_as_a_single_entry_would(
    tmp_path: Path, entries: int
) -> None:
    single = soft_quota_beside(tmp_path / "single", 1)
    # One honest entry claims its share and no more, forged waits or not:
    # the soft vGPU keeps its 30 and the 40 nobody claims.
    assert single == 700_000
    with structlog.testing.capture_logs() as logs:
        assert soft_quota_beside(tmp_path / "many", entries) == single
    said = [entry for entry in logs if entry.get("vgpu") == SA]
    assert len(said) == 1 and said[0]["uuids"] == [GPU]


def adopted_block(path: Path, entries: list[tuple[str, int]], uid: int) -> UsageBlock:
    """``standalone_block`` as the tracker adopts it: through an fd, known
    as its user's (the log lines its words cause are bounded per user)."""
    standalone_block(path, entries).close()
    fd = os.open(path, os.O_RDWR)
    try:
        return UsageBlock.open_fd(fd, str(path), tenant=f"uid {uid}")
    finally:
        os.close(fd)


BLOCKS_IN_TURN = 12  # a user's processes, one after another, each with a block of its own


def test_a_users_blocks_left_out_of_the_tick_one_after_another_get_a_bounded_number_of_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Said once per block, each block was a line: a user starting processes
    in a loop, each with a new unreadable block, wrote the journal at will."""
    event = "standalone block left out of the control tick"
    with node(tmp_path, (30, "hard")) as reg:
        entries = reg.all()
        steering = Steering(Atomics.load())
        now = 1_000_000_000
        with structlog.testing.capture_logs() as logs:
            for i in range(BLOCKS_IN_TURN):
                usage = adopted_block(tmp_path / f"sa{i}", [(GPU, 200_000)], uid=1000)

                def broken() -> None:
                    raise ValueError("a word no one thought of")

                monkeypatch.setattr(usage, "standalone_limits", broken)
                vgpu_id = f"sa-1000-{i}"
                uses = {e.vgpu.id: VgpuUse(e.vgpu.id, False, {}, (), 1) for e in entries}
                uses[vgpu_id] = VgpuUse(vgpu_id, True, {}, (), 1)
                blocks = {vgpu_id: VgpuBlocks(usage)}
                track = TrackSnapshot(0.0, {}, uses, (), blocks, (), (), True)
                for _ in range(3):
                    now += TICK_NS
                    steering.tick(entries, track.standalone, track, None, now)
                usage.close()
        assert [e["vgpu"] for e in logs if e["event"] == event] == ["sa-1000-0"]


def test_a_users_blocks_with_steer_entries_held_odd_get_a_bounded_number_of_lines(
    tmp_path: Path,
) -> None:
    event = "usage block's steer entry unreadable (seq held odd): shown as never steered"
    with structlog.testing.capture_logs() as logs:
        for i in range(BLOCKS_IN_TURN):
            usage = adopted_block(tmp_path / f"sa{i}", [(GPU, 200_000)], uid=1000)
            tenant = mapped(usage.path)
            tenant.steer.throttle[0].seq = 1  # held odd, as a writer mid-store
            for _ in range(3):
                assert usage.read_steer(0).quota_ppm == 0  # never steered
            usage.close()
    assert len([e for e in logs if e["event"] == event]) == 1
