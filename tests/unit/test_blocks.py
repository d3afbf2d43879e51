"""vgpud.vgpus.blocks: creating, validating and repairing the shared blocks."""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from vgpud import units
from vgpud.vgpus import abi, blocks
from vgpud.vgpus.abi import BlockError
from vgpud.vgpus.blocks import Access, ControlBlock, DeviceSlice, UsageBlock

UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID1 = "GPU-99999999-1111-2222-3333-444444444444"
GIB = 1 << 30


@pytest.fixture
def control(tmp_path: Path) -> Iterator[ControlBlock]:
    slices = [DeviceSlice(UUID0, 2 * GIB, 300_000), DeviceSlice(UUID1, GIB, 500_000, True, 4)]
    block = ControlBlock.create(tmp_path / "control", "vg-1", slices, abi.FLAG_OVERSUBSCRIBE)
    yield block
    block.close()


@pytest.fixture
def usage(tmp_path: Path) -> Iterator[UsageBlock]:
    block = UsageBlock.create(tmp_path / "usage", device_count=2)
    yield block
    block.close()


class HookSide:
    """What a hook does to a usage block, through a mapping of its own."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR)
        self.mm = mmap.mmap(fd, ctypes.sizeof(abi.UsageC))
        os.close(fd)
        self.c = abi.UsageC.from_buffer(self.mm)

    def take_slot(self, index: int, pid: int, pidns: int, start: int, used: list[int]) -> None:
        slot = self.c.slots[index]
        slot.pid, slot.pidns, slot.start_time = pid, pidns, start
        for d, n in enumerate(used):
            slot.dev[d].used = n
            self.c.devices[d].used += n
        slot.state = abi.SLOT_ACTIVE

    def close(self) -> None:
        del self.c
        self.mm.close()


def test_control_block_reads_back_what_was_created(control: ControlBlock) -> None:
    reopened = ControlBlock.open(control.path)
    assert reopened.vgpu_id == "vg-1"
    assert reopened.uuids == [UUID0, UUID1]
    assert reopened.flags == abi.FLAG_OVERSUBSCRIBE
    devs = reopened.devices()
    assert [d.mem_limit for d in devs] == [2 * GIB, GIB]
    assert [(d.share_ppm, d.soft, d.weight) for d in devs] == [
        (300_000, False, 1),
        (500_000, True, 4),
    ]
    # Before the controller's first tick a vGPU runs at its share.
    assert [d.throttle.quota_ppm for d in devs] == [300_000, 500_000]
    reopened.close()


def test_blocks_have_the_modes_their_readers_need_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o777)
    try:
        ControlBlock.create(tmp_path / "c", "x", [DeviceSlice(UUID0, GIB)]).close()
        UsageBlock.create(tmp_path / "u").close()
        me = Access(0o660, os.geteuid(), os.getegid())  # giving it away needs root
        UsageBlock.create(tmp_path / "shared", access=me).close()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "c").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "u").stat().st_mode) == 0o600  # no tenant: the daemon's
    shared = (tmp_path / "shared").stat()
    assert (stat.S_IMODE(shared.st_mode), shared.st_uid, shared.st_gid) == (0o660, me.uid, me.gid)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_live_limit_and_share_changes_land_in_the_block(control: ControlBlock) -> None:
    control.set_mem_limit(1, 3 * GIB)
    control.set_share(0, 700_000, soft=True, weight=9)
    view = ControlBlock.open(control.path)
    assert view.devices()[1].mem_limit == 3 * GIB
    assert (view.devices()[0].share_ppm, view.devices()[0].soft, view.devices()[0].weight) == (
        700_000,
        True,
        9,
    )
    view.close()


def test_throttle_write_bumps_epoch_only_on_change_and_leaves_seq_even(
    control: ControlBlock,
) -> None:
    before = control.read_throttle(0)
    assert control.write_throttle(0, 420_000, 50_000_000)
    after = control.read_throttle(0)
    assert (after.quota_ppm, after.window_ns, after.epoch) == (
        420_000,
        50_000_000,
        before.epoch + 1,
    )
    assert not control.write_throttle(0, 420_000, 50_000_000)
    assert control.read_throttle(0).epoch == after.epoch
    assert control._c.devices[0].throttle.seq % 2 == 0
    assert control.read_throttle(1).quota_ppm == 500_000  # the other device is untouched


SYS_FUTEX = {"x86_64": 202, "aarch64": 98}[os.uname().machine]
FUTEX_WAIT = 0


def test_a_new_quota_wakes_hooks_sleeping_on_the_throttle_entry(control: ControlBlock) -> None:
    """A hook's pacer sleeps on the entry's seq word, in its own read-only
    shared mapping (as in a container); writing a quota wakes it at once,
    long before the 10 s it asked to sleep."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    libc.mmap.argtypes += [ctypes.c_int, ctypes.c_long]
    size = ctypes.sizeof(abi.ControlC)
    fd = os.open(control.path, os.O_RDONLY)
    base = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    os.close(fd)
    assert base not in (None, ctypes.c_void_p(-1).value)
    seq = ctypes.c_uint32.from_address(
        base
        + abi.ControlC.devices.offset
        + abi.ControlDeviceC.throttle.offset
        + abi.ThrottleC.seq.offset
    )
    seen = seq.value
    timeout = (ctypes.c_long * 2)(10, 0)
    woke: list[float] = []

    def sleep_in_pacer() -> None:
        t0 = time.monotonic()
        libc.syscall(SYS_FUTEX, ctypes.byref(seq), FUTEX_WAIT, seen, timeout, None, 0)
        woke.append(time.monotonic() - t0)

    sleeper = threading.Thread(target=sleep_in_pacer)
    sleeper.start()
    time.sleep(0.1)  # let it go to sleep (if it has not, it sees the moved word)
    assert control.write_throttle(0, 700_000)
    sleeper.join(timeout=15)
    libc.munmap(ctypes.c_void_p(base), ctypes.c_size_t(size))
    assert woke and woke[0] < 5, woke


def test_out_of_range_writes_are_refused(control: ControlBlock) -> None:
    with pytest.raises(ValueError, match="quota_ppm"):
        control.write_throttle(0, units.PPM_FULL + 1)
    with pytest.raises(IndexError):
        control.set_mem_limit(2, GIB)
    with pytest.raises(BlockError, match="does not fit"):
        ControlBlock.create(control.path.parent / "c2", "x" * 64, [DeviceSlice(UUID0, GIB)])


def test_heartbeat_and_slot_host_pids(control: ControlBlock) -> None:
    control.heartbeat(123_456_789)
    control.set_slot_host_pid(255, 4_000_000)
    control.set_slot_host_pid(0, 0)
    assert control.heartbeat_ns == 123_456_789
    assert control.slot_host_pid(255) == 4_000_000
    with pytest.raises(IndexError):
        control.set_slot_host_pid(256, 1)


def test_open_refuses_a_symlink_even_to_a_good_block(control: ControlBlock) -> None:
    link = control.path.parent / "link"
    link.symlink_to(control.path)
    with pytest.raises(BlockError, match="cannot open control block"):
        ControlBlock.open(link)


def test_open_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(BlockError, match="not a regular file"):
        UsageBlock.open(tmp_path / "fifo")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("magic", abi.CONTROL_MAGIC, "bad magic"),
        ("version", 1, "layout version 1"),  # the layout before the GPU turn moved in
        ("size", 12, "header size 12"),
    ],
)
def test_open_refuses_foreign_or_other_version_blocks(
    usage: UsageBlock, field: str, value: int, message: str
) -> None:
    setattr(usage._c.hdr, field, value)
    with pytest.raises(BlockError, match=message):
        UsageBlock.open(usage.path)


def test_open_refuses_a_truncated_file_and_a_missing_one(usage: UsageBlock, tmp_path: Path) -> None:
    os.truncate(usage.path, 4096)
    with pytest.raises(BlockError, match="has 4096 bytes"):
        UsageBlock.open(usage.path)
    with pytest.raises(BlockError, match="No such file"):
        UsageBlock.open(tmp_path / "absent")


def test_slots_lists_only_live_slots_with_their_counters(usage: UsageBlock) -> None:
    hook = HookSide(usage.path)
    hook.take_slot(3, pid=42, pidns=4026531836, start=1000, used=[GIB, 5])
    hook.c.slots[3].dev[1].launches = 7
    hook.c.slots[9].state = abi.SLOT_CLAIMING
    slots = usage.slots()
    assert [(s.index, s.state_name) for s in slots] == [(3, "active"), (9, "claiming")]
    s = slots[0]
    assert (s.pid, s.pidns, s.start_time, s.used) == (42, 4026531836, 1000, GIB + 5)
    assert s.devices[1].launches == 7
    assert [d.used for d in usage.devices()] == [GIB, 5]
    hook.close()


def test_slot_views_follow_every_change_of_the_slot(usage: UsageBlock) -> None:
    """Views of unchanged slots are reused; any word the hook changes shows."""
    hook = HookSide(usage.path)
    hook.take_slot(0, pid=42, pidns=7, start=1000, used=[GIB, 0])
    first = usage.slots()[0]
    assert usage.slots()[0] is first
    hook.c.slots[0].dev[1].gpu_time_ns = 5
    assert usage.slots()[0].devices[1].gpu_time_ns == 5
    hook.c.slots[0].state = abi.SLOT_CLAIMING
    assert usage.slots()[0].state_name == "claiming"
    hook.c.slots[0].state = abi.SLOT_FREE
    assert usage.slots() == []
    hook.take_slot(0, pid=43, pidns=7, start=1001, used=[0, 0])
    assert (usage.slots()[0].pid, usage.slots()[0].devices[0].used) == (43, 0)
    hook.close()


# A change the hook makes to one slot: a header word, or a device counter
# (the usage block reads device_count=2 devices: the last one is its last word).
SLOT_CHANGES: tuple[Callable[[Any], None], ...] = (
    lambda s: setattr(s, "heartbeat_ns", s.heartbeat_ns + 1),
    lambda s: setattr(s, "start_time", s.start_time + 1),
    lambda s: setattr(s.dev[0], "used", s.dev[0].used + 1),
    lambda s: setattr(s.dev[1], "throttled_ns", s.dev[1].throttled_ns + 1),
    lambda s: setattr(s, "state", abi.SLOT_CLAIMING),
)


@pytest.mark.parametrize("indices", [(0, 1, 2), (4, 90, 200)], ids=["dense", "spread"])
def test_a_steady_block_keeps_its_views_and_shows_any_change(
    usage: UsageBlock, indices: tuple[int, ...]
) -> None:
    """Slots read again unchanged are the same views (a dense block's are
    read in one copy); a change to any word of any slot the daemon reads
    shows at the next read, and only that slot's view is new."""
    hook = HookSide(usage.path)
    for n, index in enumerate(indices):
        hook.take_slot(index, pid=40 + n, pidns=7, start=1000 + n, used=[GIB, 0])
    before = usage.slots()
    assert all(a is b for a, b in zip(usage.slots(), before, strict=True))
    for n, index in enumerate(indices):
        for change in SLOT_CHANGES:
            words = bytes(hook.c.slots[index])
            change(hook.c.slots[index])
            now = usage.slots()
            assert [s.index for s in now] == list(indices)
            assert now == _fresh_read(usage.path)
            assert now[n] != before[n] and bytes(hook.c.slots[index]) != words
            assert all(a is b for k, (a, b) in enumerate(zip(now, before, strict=True)) if k != n)
            before = now
    hook.c.slots[indices[1]].state = abi.SLOT_FREE
    assert [s.index for s in usage.slots()] == [indices[0], indices[2]]
    hook.close()


def _fresh_read(path: Path) -> list[blocks.SlotView]:
    """The slots as a reader with nothing cached sees them."""
    block = UsageBlock.open(path, device_count=2)
    try:
        return block.slots()
    finally:
        block.close()


def test_device_counters_and_the_active_count_follow_every_change(usage: UsageBlock) -> None:
    """Both are read again only when their words changed: any word the hook
    changes shows at the next read."""
    hook = HookSide(usage.path)
    assert (usage.active_slots(), [d.used for d in usage.devices()]) == (0, [0, 0])
    first = usage.devices()
    assert usage.devices() is first  # nothing changed: not parsed again
    hook.take_slot(5, pid=42, pidns=7, start=1000, used=[GIB, 0])
    hook.c.slots[6].state = abi.SLOT_CLAIMING  # not a process yet
    assert (usage.active_slots(), [d.used for d in usage.devices()]) == (1, [GIB, 0])
    for field, value in (("oom_count", 3), ("peak", 2 * GIB), ("throttled_ns", 9)):
        setattr(hook.c.devices[1], field, value)
        assert getattr(usage.devices()[1], field) == value
    hook.c.devices[0].used = 1 << 62  # absurd: still clamped when read again
    assert usage.devices()[0].clamped == ("used",)
    hook.c.slots[6].state = abi.SLOT_ACTIVE
    assert usage.active_slots() == 2
    hook.c.slots[5].state = abi.SLOT_FREE
    assert usage.active_slots() == 1
    hook.close()


def test_reclaim_returns_a_dead_process_bytes_and_frees_the_slot(usage: UsageBlock) -> None:
    hook = HookSide(usage.path)
    hook.take_slot(0, pid=10, pidns=1, start=5, used=[100, 0])
    hook.take_slot(1, pid=11, pidns=1, start=6, used=[40, 60])
    dead = usage.slots()[1]
    assert usage.reclaim_slot(1, dead) == (40, 60)
    assert [d.used for d in usage.devices()] == [100, 0]
    assert [s.index for s in usage.slots()] == [0]
    assert hook.c.slots[1].pid == 0 and hook.c.slots[1].dev[1].used == 0
    hook.close()


def test_reclaim_leaves_a_slot_that_changed_hands_alone(usage: UsageBlock) -> None:
    hook = HookSide(usage.path)
    hook.take_slot(0, pid=10, pidns=1, start=5, used=[100, 0])
    seen = usage.slots()[0]
    # The process died and PID 10 was reused by a newer process in the slot.
    hook.c.slots[0].start_time = 77
    assert usage.reclaim_slot(0, seen) is None
    assert hook.c.slots[0].state == abi.SLOT_ACTIVE
    assert usage.devices()[0].used == 100
    # Already freed by someone else: the CAS fails, nothing happens.
    hook.c.slots[0].state = abi.SLOT_FREE
    assert usage.reclaim_slot(0, seen) is None
    assert usage.devices()[0].used == 100
    hook.close()


def test_reclaim_never_wraps_a_budget_below_zero(usage: UsageBlock) -> None:
    hook = HookSide(usage.path)
    hook.take_slot(0, pid=10, pidns=1, start=5, used=[100, 0])
    hook.c.devices[0].used = 30  # a hostile writer shrank the total
    assert usage.reclaim_slot(0, usage.slots()[0]) == (100, 0)
    assert usage.devices()[0].used == 0
    hook.close()


def test_absurd_values_are_clamped_and_named(usage: UsageBlock) -> None:
    hook = HookSide(usage.path)
    hook.c.devices[0].used = 2**63
    hook.c.devices[0].share_ppm = 2**31
    hook.take_slot(2, pid=-5, pidns=1, start=1, used=[2**60, 0])
    dev = usage.devices()[0]
    assert dev.used == blocks.ABSURD_BYTES and dev.share_ppm == units.PPM_FULL
    assert set(dev.clamped) == {"used", "share_ppm"}
    slot = usage.slots()[0]
    assert slot.pid == -5 and slot.devices[0].used == blocks.ABSURD_BYTES
    assert slot.clamped == ("dev[0].used",)
    hook.close()


def test_reset_used_zeroes_a_leaked_budget(usage: UsageBlock) -> None:
    usage._c.devices[1].used = 12345
    assert usage.reset_used(1) == 12345
    assert usage.devices()[1].used == 0


def test_standalone_limits_and_steering(tmp_path: Path) -> None:
    path = tmp_path / "sa"
    UsageBlock.create(path).close()
    hook = HookSide(path)
    hook.c.device_count = 1
    hook.c.uuids[0].value = UUID0.encode()
    hook.c.devices[0].mem_limit = GIB
    hook.c.devices[0].share_ppm = 300_000
    block = UsageBlock.open(path)
    assert block.device_count == 1
    limits = block.standalone_limits()
    assert (limits.uuids, limits.mem_limit, limits.share_ppm) == ((UUID0,), (GIB,), (300_000,))
    block.write_steer(0, 200_000, 10_000_000)
    block.steer_heartbeat(99)
    steer = block.read_steer(0)
    assert (steer.quota_ppm, steer.window_ns, steer.epoch) == (200_000, 10_000_000, 1)
    assert hook.c.steer.heartbeat_ns == 99 and hook.c.steer.throttle[0].seq % 2 == 0
    block.close()
    hook.close()


def test_a_steered_quota_the_tenant_overwrote_reads_within_a_whole_gpu(tmp_path: Path) -> None:
    """The steer entry is in the tenant's own block: a quota it writes
    there (seq even, so the read is whole) is shown as at most 100 %, in
    the API's quota_ppm and /metrics' quota ratio (documented 0-1)."""
    path = tmp_path / "sa"
    UsageBlock.create(path).close()
    hook = HookSide(path)
    hook.c.device_count = 1
    block = UsageBlock.open(path)
    block.write_steer(0, 200_000)
    hook.c.steer.throttle[0].quota_ppm = 0xFFFFFFFF
    assert block.read_steer(0).quota_ppm == units.PPM_FULL
    block.close()
    hook.close()
