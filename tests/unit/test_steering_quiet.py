"""The control tick skips what did not change and changes nothing by it:
tick for tick, steering gives the quotas (written into the control
blocks, and where they are calibrated by NVML) and the controller state
that computing every tick in full gives; a vGPU whose counters move is
steered at the very next tick; and every block gets its heartbeat at every
tick, quiet or not."""

from __future__ import annotations

import ctypes
import mmap
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.fakes import create, gpus, update
from vgpud.loops.control import Steering
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.tracker import TrackSnapshot, VgpuBlocks, VgpuUse
from vgpud.policy import controller as ctl
from vgpud.policy.placement import Rules
from vgpud.units import PPM_FULL, parse_memory, percent_to_ppm
from vgpud.vgpus import abi
from vgpud.vgpus.abi import DEV_CALIBRATED, DEV_SOFT
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.blocks import UsageBlock
from vgpud.vgpus.model import CreateRequest, Limits, UpdateRequest
from vgpud.vgpus.registry import Entry, Registry
from vgpud.vgpus.state import StateStore

TICK_NS = 100_000_000
GPUS = gpus(2)
# (share, mode, weight, GPU): a hard and two soft vGPUs sharing a GPU, one
# soft alone on the other.
VGPUS = [(30, "hard", 1, 0), (20, "soft", 1, 0), (10, "soft", 3, 0), (50, "soft", 1, 1)]
# Hard vGPUs only: the controller fixes every GPU none of them is alone on
# (their quotas are their shares), and steering then skips ticks whatever
# the counters and figures do. Updates keep each GPU's hard shares within it.
HARD_VGPUS = [(30, "hard", 1, 0), (20, "hard", 1, 0), (10, "hard", 1, 1), (50, "hard", 1, 1)]
# Soft vGPUs whose shares fill their GPUs (100 and 120 %): fixed while the
# scan finds processes in all of them, as hard ones are; a vGPU without
# processes, or an update, leaves spare time to divide.
FULL_SOFT_VGPUS = [(60, "soft", 1, 0), (40, "soft", 3, 0), (70, "soft", 2, 1), (50, "soft", 1, 1)]
CHANGES = ["launch", "held", "scan", "figures", "device", "sample", "listed", "update", "stall"]
STRANGER = 99_999  # a process of no vGPU


@contextmanager
def registry(vgpus: list[tuple[int, str, int, int]]) -> Iterator[Registry]:
    with tempfile.TemporaryDirectory() as tmp:
        reg = Registry(
            Path(tmp) / "run",
            StateStore(Path(tmp) / "state"),
            Path(tmp) / "lib.so",
            Atomics.load(),
        )
        reg.adopt()
        for share, mode, weight, gpu in vgpus:
            limits = Limits(parse_memory("1g"), share, mode, weight)
            create(reg, CreateRequest(gpus=(GPUS[gpu].uuid,)), limits, GPUS, Rules())
        try:
            yield reg
        finally:
            reg.close()


def reference(
    entries: list[Entry],
    track: TrackSnapshot | None,
    sample: NvmlSample | None,
    fresh: bool,
    now_ns: int,
    state: ctl.ControllerState,
) -> tuple[dict[ctl.Key, int], ctl.ControllerState]:
    """The controller called in full, on inputs read here from the blocks,
    the scan and NVML's sample, as steering is documented to pass them."""
    allocations = []
    slices: dict[str, dict[str, ctl.SliceSample]] = {}
    for e in entries:
        v = e.vgpu
        use = track.vgpus.get(v.id) if track is not None else None
        for i, s in enumerate(v.slices):
            allocations.append(
                ctl.Allocation(
                    v.id,
                    s.gpu_uuid,
                    percent_to_ppm(v.limits.share),
                    v.limits.mode == "soft",
                    v.limits.weight,
                )
            )
            listed = set(sample.gpus[s.gpu_uuid].processes) if sample is not None else set()
            alone = use is not None and bool(listed) and listed <= set(use.pids)
            util = None
            if fresh and sample is not None and use is not None:
                gpu = sample.gpus[s.gpu_uuid]
                if alone:  # its processes are all NVML lists: the device figure is theirs
                    util = gpu.utilization_new
                else:
                    figures = gpu.process_util
                    seen = [figures[pid] for pid in use.pids if pid in figures]
                    util = sum(seen) if seen else None
            d = e.usage.devices()[i]
            active = use is not None and use.live_slots > 0
            slices.setdefault(s.gpu_uuid, {})[v.id] = ctl.SliceSample(
                active, util, d.gpu_time_ns, d.throttled_ns, d.launches, alone
            )
    device: dict[str, float | None] = {}
    if sample is not None:
        device = {
            uuid: None if g.utilization_gpu is None else float(g.utilization_gpu)
            for uuid, g in sample.gpus.items()
        }
    gpus = {uuid: ctl.GpuSample(device.get(uuid), s) for uuid, s in slices.items()}
    snapshot = ctl.Snapshot(now_ns, gpus)
    return ctl.compute_quotas(snapshot, allocations, state)


def nvml(
    device_util: int | None, figures: dict[int, float], listed: tuple[int, ...] = ()
) -> NvmlSample:
    """A sample with the same figures for every GPU, ``listed`` the
    processes NVML lists on each."""
    processes = dict.fromkeys(listed)
    return NvmlSample(
        0.0,
        {
            g.uuid: GpuSample(
                g.uuid,
                g.index,
                device_util,
                0,
                1 << 30,
                processes,
                figures,
                utilization_new=None if device_util is None else float(device_util),
            )
            for g in GPUS
        },
    )


def scan(entries: list[Entry], live: dict[str, int]) -> TrackSnapshot:
    """A scan that found ``live[id]`` processes in each vGPU (pids 1000 + ...)."""
    uses = {
        e.vgpu.id: VgpuUse(e.vgpu.id, False, {}, tuple(range(1000 + 10 * n, 1000 + 10 * n + k)), k)
        for n, e in enumerate(entries)
        if (k := live.get(e.vgpu.id, 0))
    }
    return TrackSnapshot(0.0, {}, uses, (), {}, (), (), True)


@st.composite
def runs(draw: st.DrawFn) -> list[list[tuple[str, int, int]]]:
    """Ticks with long runs of nothing new, and changes of every kind
    (each: what, which vGPU, a number) between them."""
    ticks: list[list[tuple[str, int, int]]] = []
    for _ in range(draw(st.integers(10, 60))):
        if draw(st.sampled_from([True, True, False])):
            ticks.append([])
            continue
        n = draw(st.integers(1, 3))
        ticks.append(
            [
                (
                    draw(st.sampled_from(CHANGES)),
                    draw(st.integers(0, len(VGPUS) - 1)),
                    draw(st.integers(0, 100)),
                )
                for _ in range(n)
            ]
        )
    return ticks


@pytest.mark.parametrize(
    ("vgpus", "most_share"),
    [(VGPUS, 99), (HARD_VGPUS, 50), (FULL_SOFT_VGPUS, 99)],
    ids=["mixed", "hard", "full-soft"],
)
@settings(max_examples=60, deadline=None)
@given(ticks=runs())
def test_quiet_ticks_give_what_computing_every_tick_gives(
    vgpus: list[tuple[int, str, int, int]],
    most_share: int,
    ticks: list[list[tuple[str, int, int]]],
) -> None:
    with registry(vgpus) as reg:
        steering = Steering(Atomics.load())
        state = ctl.ControllerState()
        entries = reg.all()
        track: TrackSnapshot | None = None
        sample: NvmlSample | None = None
        live: dict[str, int] = {}
        listed: tuple[int, ...] = ()
        now = 0
        for changes in ticks:
            now += TICK_NS
            fresh = False
            for what, which, value in changes:
                e = entries[which]
                if what == "launch":
                    e.usage._c.devices[0].gpu_time_ns += value * TICK_NS // 100
                    # Small launches (calibrated when alone) or large ones.
                    e.usage._c.devices[0].launches += value * (100 if value % 2 else 1)
                elif what == "held":
                    e.usage._c.devices[0].throttled_ns += value * TICK_NS // 100
                elif what == "scan":
                    live[e.vgpu.id] = value % 3
                    track = scan(entries, live)
                elif what in ("figures", "device", "sample", "listed"):
                    pid = 1000 + 10 * which
                    util = sample.gpus[GPUS[0].uuid].utilization_gpu if sample else None
                    figures = {pid: float(value)} if what == "figures" else {}
                    if what == "listed":  # nobody, the vGPU's first process, or it and a stranger
                        listed = ((), (pid,), (pid, STRANGER))[value % 3]
                    sample = nvml(value if what == "device" else util, figures, listed)
                    fresh = True
                elif what == "update":
                    share = 1 + value % most_share
                    update(reg, e.vgpu.id, UpdateRequest(share=share), GPUS, Rules())
                    entries = reg.all()
                else:  # a stalled loop
                    now += value * TICK_NS
            quotas = steering.tick(reg.all(), {}, track, sample, now)
            expected, state = reference(reg.all(), track, sample, fresh, now, state)
            assert quotas == expected
            assert steering.state == state
            for e in reg.all():
                for i, s in enumerate(e.vgpu.slices):
                    key = (e.vgpu.id, s.gpu_uuid)
                    assert e.control.read_throttle(i).quota_ppm == expected[key]
                    calibrated = state.slices[key].calibrated and expected[key] < PPM_FULL
                    flags = e.control._c.devices[i].flags
                    assert bool(flags & DEV_CALIBRATED) == calibrated
                    assert bool(flags & DEV_SOFT) == (e.vgpu.limits.mode == "soft")


# Soft vGPUs that leave spare time on both GPUs, and a hard one: where each
# uses what it is given, the controller reuses their GPUs (ctl.SteadyGpu)
# and steering, while only the counters move, does not even build the
# samples (ctl.steady_again).
SPARE_VGPUS = [(30, "hard", 1, 0), (20, "soft", 1, 0), (10, "soft", 3, 0), (40, "soft", 1, 1)]
BUSY_CHANGES = ["less", "held", "back", "scan", "sample", "figures", "listed", "update", "stall"]


@st.composite
def busy_runs(draw: st.DrawFn) -> list[list[tuple[str, int, int]]]:
    """Ticks on which every vGPU uses what it was given, in long runs, and
    changes of every kind between (each: what, which vGPU, a number)."""
    ticks: list[list[tuple[str, int, int]]] = []
    for _ in range(draw(st.integers(10, 60))):
        if draw(st.sampled_from([True, True, True, False])):
            ticks.append([])
            continue
        which = st.integers(0, len(SPARE_VGPUS) - 1)
        ticks.append(
            [
                (draw(st.sampled_from(BUSY_CHANGES)), draw(which), draw(st.integers(0, 100)))
                for _ in range(draw(st.integers(1, 2)))
            ]
        )
    return ticks


class BusyNode:
    """SPARE_VGPUS, each using the part of its quota ``part`` says from
    one tick to the next (the hook's counters), the scan finding processes
    in each, NVML listing none of them; and the controller called in full
    beside steering, as ``reference`` does."""

    def __init__(self, reg: Registry) -> None:
        self.reg = reg
        self.steering = Steering(Atomics.load())
        self.state = ctl.ControllerState()
        self.entries = reg.all()
        self.live = {e.vgpu.id: 1 for e in self.entries}
        self.track = scan(self.entries, self.live)
        self.listed: tuple[int, ...] = ()
        self.sample = nvml(None, {})
        self.part = {e.vgpu.id: 1.0 for e in self.entries}
        self.now = 0
        self.computed = 0  # ticks on which steering called the controller

    def change(self, what: str, which: int, value: int) -> bool:
        """One change; whether it is a new NVML sample."""
        e = self.entries[which]
        device = e.usage._c.devices[0]
        if what == "less":  # none of it (idle, once its processes are gone), some, most
            self.part[e.vgpu.id] = (0.0, 0.4, 0.97)[value % 3]
        elif what == "held":
            device.throttled_ns += value * TICK_NS // 100
        elif what == "back":  # a block made again, or a tenant writing its own words
            device.gpu_time_ns = value * TICK_NS // 100
        elif what == "scan":
            self.live[e.vgpu.id] = value % 3
            self.track = scan(self.entries, self.live)
        elif what in ("sample", "figures", "listed"):
            pid = 1000 + 10 * which
            if what == "listed":  # nobody, the vGPU's first process, or it and a stranger
                self.listed = ((), (pid,), (pid, STRANGER))[value % 3]
            figures = {pid: float(value)} if what == "figures" else {}
            self.sample = nvml(None, figures, self.listed)
            return True
        elif what == "update":
            update(self.reg, e.vgpu.id, UpdateRequest(share=1 + value % 60), GPUS, Rules())
            self.entries = self.reg.all()
        else:  # a stalled loop
            self.now += value * TICK_NS
        return False

    def tick(self, fresh: bool) -> None:
        """Each vGPU's use since the last tick, then a tick of steering
        against the controller called in full."""
        dt = TICK_NS
        self.now += dt
        for e in self.entries:
            quota = e.control.read_throttle(0).quota_ppm
            e.usage._c.devices[0].gpu_time_ns += round(quota / PPM_FULL * self.part[e.vgpu.id] * dt)
        with mock.patch.object(ctl, "compute_quotas", wraps=ctl.compute_quotas) as spy:
            quotas = self.steering.tick(self.entries, {}, self.track, self.sample, self.now)
        self.computed += spy.call_count
        # The control loop waits longer after a tick that computed nothing.
        assert self.steering.reused == (spy.call_count == 0)
        expected, self.state = reference(
            self.entries, self.track, self.sample, fresh, self.now, self.state
        )
        assert quotas == expected
        assert self.steering.state == self.state
        for e in self.entries:
            key = (e.vgpu.id, e.vgpu.slices[0].gpu_uuid)
            assert e.control.read_throttle(0).quota_ppm == expected[key]


@settings(max_examples=60, deadline=None)
@given(ticks=busy_runs())
def test_busy_steady_ticks_give_what_computing_every_tick_gives(
    ticks: list[list[tuple[str, int, int]]],
) -> None:
    with registry(SPARE_VGPUS) as reg:
        node = BusyNode(reg)
        for changes in ticks:
            fresh = False
            for what, which, value in changes:
                fresh = node.change(what, which, value) or fresh
            node.tick(fresh)


def test_busy_vgpus_using_what_they_are_given_are_computed_only_when_one_changes() -> None:
    """Every vGPU uses its quota from the second tick on: steering calls
    the controller while it learns (the first ticks have no rate yet) and
    then not at all while only the counters move, a new NVML sample with
    nothing for a vGPU included; a soft vGPU that uses less, a hold, or a
    figure for a vGPU is computed at that very tick."""

    def steady(node: BusyNode) -> int:
        """Ticks until the controller is not called for five in a row."""
        calm = 0
        for _ in range(100):
            before = node.computed
            node.tick(fresh=False)
            calm = calm + 1 if node.computed == before else 0
            if calm == 5:
                return node.computed
        raise AssertionError("never steady")

    with registry(SPARE_VGPUS) as reg:
        node = BusyNode(reg)
        learnt = steady(node)
        for n in range(20):
            node.tick(fresh=node.change("sample", 0, 0) if n % 2 else False)
        assert node.computed == learnt
        for what, which in [("less", 1), ("held", 0), ("figures", 2)]:
            node.tick(fresh=node.change(what, which, 40))  # "less": 0.4 of its quota
            assert node.computed == learnt + 1, what
            node.part[node.entries[1].vgpu.id] = 1.0  # back to using what it is given
            learnt = steady(node)
        # The vGPU alone on GPU 1 stops, then its processes go: with every
        # counter there still, that GPU is computed (and settles), as
        # computing every tick does (each tick checks it against that).
        node.part[node.entries[3].vgpu.id] = 0.0
        node.tick(fresh=False)
        node.change("scan", 3, 0)
        for _ in range(5):
            node.tick(fresh=False)
        assert GPUS[1].uuid in node.steering.state.settled


def test_a_vgpu_whose_counters_move_is_steered_at_the_next_tick() -> None:
    with registry([(30, "hard", 1, 0), (20, "soft", 1, 0)]) as reg:
        hard, soft = reg.all()
        steering = Steering(Atomics.load())
        now = 0
        for _ in range(20):  # idle for two seconds: every tick after the first is quiet
            now += TICK_NS
            steering.tick(reg.all(), {}, None, None, now)
        assert soft.control.read_throttle(0).quota_ppm == 200_000
        # The soft vGPU's process starts working: it takes the idle time...
        soft.usage._c.devices[0].gpu_time_ns += TICK_NS
        now += TICK_NS
        steering.tick(reg.all(), {}, None, None, now)
        assert soft.control.read_throttle(0).quota_ppm == PPM_FULL
        # ...and gives back the hard vGPU's share the tick its process starts.
        soft.usage._c.devices[0].gpu_time_ns += TICK_NS
        hard.usage._c.devices[0].throttled_ns += TICK_NS // 2
        now += TICK_NS
        steering.tick(reg.all(), {}, None, None, now)
        assert soft.control.read_throttle(0).quota_ppm == 700_000


@pytest.mark.parametrize("vgpus", [HARD_VGPUS, FULL_SOFT_VGPUS], ids=["hard", "full-soft"])
def test_busy_vgpus_given_their_shares_are_steered_only_when_that_may_change(
    vgpus: list[tuple[int, str, int, int]],
) -> None:
    """Hard vGPUs that share their GPUs, and soft ones that fill them, get
    their shares whatever they do: with their counters and NVML's figures
    moving every tick, the controller runs at the first tick and at each
    new scan (a vGPU's processes may have gone, leaving spare time) or new
    list of processes on a GPU (a vGPU may have come to be alone there, and
    be calibrated), and every block still gets its heartbeat."""
    with registry(vgpus) as reg:
        entries = reg.all()
        steering = Steering(Atomics.load())
        track = scan(entries, {e.vgpu.id: 1 for e in entries})
        pids = tuple(1000 + 10 * n for n in range(len(entries)))
        now = 0
        with mock.patch.object(ctl, "compute_quotas", wraps=ctl.compute_quotas) as computed:
            for n in range(30):
                now += TICK_NS
                for e in entries:
                    e.usage._c.devices[0].gpu_time_ns += TICK_NS // 4
                    e.usage._c.devices[0].launches += 1000
                    e.usage._c.devices[0].throttled_ns += TICK_NS // 10
                if n == 10:
                    track = scan(entries, {e.vgpu.id: 2 for e in entries})
                listed = pids if n < 20 else pids[:1]  # then the first vGPU is alone on GPU 0
                figures = {pid: float(n) for pid in pids}
                sample = nvml(n, figures, listed)
                quotas = steering.tick(reg.all(), {}, track, sample, now)
                assert [e.control.heartbeat_ns for e in reg.all()] == [now] * len(entries)
                if n < 20:
                    assert quotas == {
                        (e.vgpu.id, s.gpu_uuid): percent_to_ppm(e.vgpu.limits.share)
                        for e in entries
                        for s in e.vgpu.slices
                    }
        # The first tick, the new scan, the first vGPU alone (then GPU 0 is
        # computed in full at every tick: it is calibrated).
        assert computed.call_count == 2 + 10


def test_every_block_gets_its_heartbeat_at_every_tick() -> None:
    with registry(VGPUS) as reg:
        steering = Steering(Atomics.load())
        for now in range(TICK_NS, 30 * TICK_NS, TICK_NS):
            steering.tick(reg.all(), {}, None, None, now)
            assert [e.control.heartbeat_ns for e in reg.all()] == [now] * len(VGPUS)


def test_a_vgpu_alone_with_small_launches_is_calibrated_and_told_so() -> None:
    """A hard vGPU whose process is the only one NVML lists on its GPU, with
    launches of 10 us: NVML's device figure (40 % for a share of 30) lowers
    its quota and its control block says the quota is calibrated. A stranger
    on the GPU, or launches of milliseconds, undo both at the next figure."""
    with registry([(30, "hard", 1, 0)]) as reg:
        (e,) = reg.all()
        steering = Steering(Atomics.load())
        track = scan([e], {e.vgpu.id: 1})
        now = 0

        def run(ticks: int, listed: tuple[int, ...], launch_ns: int) -> int:
            nonlocal now
            for n in range(ticks):
                now += TICK_NS
                device = e.usage._c.devices[0]  # not kept: the block is unmapped at the end
                device.gpu_time_ns += 30_000_000
                device.launches += 30_000_000 // launch_ns
                device.throttled_ns += TICK_NS // 2  # held back: it wants more
                sample = nvml(40, {}, listed) if n % 2 else steering.last_sample
                del device
                steering.tick(reg.all(), {}, track, sample, now)
            return e.control.read_throttle(0).quota_ppm

        assert run(20, (1000,), 10_000) < 280_000
        assert e.control._c.devices[0].flags & DEV_CALIBRATED
        assert run(2, (1000, STRANGER), 10_000) == 300_000
        assert not e.control._c.devices[0].flags & DEV_CALIBRATED
        assert run(20, (1000,), 10_000) < 280_000  # alone again
        assert run(2, (1000,), 2_000_000) == 300_000
        assert not e.control._c.devices[0].flags & DEV_CALIBRATED


def test_an_adopted_standalone_process_alone_is_not_calibrated(tmp_path: Path) -> None:
    """A standalone process (CUDA_CORE_LIMIT 30) alone on its GPU with small
    launches, NVML reading 40: its steering stays at its own limit. Its
    steering may only lower that limit and its hook is not told, so a
    correction would apply one way only (docs/compute.md)."""
    path = tmp_path / "standalone.usage"
    UsageBlock.create(path).close()
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, ctypes.sizeof(abi.UsageC))
    os.close(fd)
    hook = abi.UsageC.from_buffer(mm)
    hook.device_count = 1
    hook.uuids[0].value = GPUS[0].uuid.encode()
    hook.devices[0].share_ppm = 300_000
    block = UsageBlock.open(path)
    key = "standalone-1"
    track = TrackSnapshot(0.0, {}, {key: VgpuUse(key, True, {}, (1000,), 1)}, (), {}, (), (), True)
    steering = Steering(Atomics.load())
    now = 0
    try:
        for n in range(20):
            now += TICK_NS
            hook.devices[0].gpu_time_ns += 30_000_000
            hook.devices[0].launches += 3_000  # 10 us a launch
            hook.devices[0].throttled_ns += TICK_NS // 2
            sample = nvml(40, {}, (1000,)) if n % 2 else steering.last_sample
            quotas = steering.tick([], {key: VgpuBlocks(block)}, track, sample, now)
        assert quotas == {(key, GPUS[0].uuid): 300_000}
        assert block.read_steer(0).quota_ppm == 300_000
        assert not steering.state.slices[(key, GPUS[0].uuid)].calibrated
    finally:
        del hook
        mm.close()
        block.close()
