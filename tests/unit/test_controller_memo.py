"""Reusing a settled GPU's quotas changes nothing: the controller fed long
runs of unchanged inputs gives, tick for tick, what it gives when every
tick is computed in full; and a steady GPU is in fact reused. So does
reusing a busy GPU's quotas while its vGPUs' uses stay where they do not
move them (``SteadyGpu``)."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from vgpud.policy import controller
from vgpud.policy.controller import (
    Allocation,
    ControllerState,
    GpuSample,
    SliceSample,
    SliceState,
    Snapshot,
    compute_quotas,
)
from vgpud.units import PPM_FULL

TICK_NS = 100_000_000
NOT_COUNTERS = SliceState._fields.index("correction")
ALLOCATIONS = [
    Allocation("h", "GPU-0", 300_000),
    Allocation("s1", "GPU-0", 200_000, soft=True, weight=1),
    Allocation("s2", "GPU-0", 100_000, soft=True, weight=3),
    Allocation("x", "GPU-1", 500_000, soft=True),
]
CHANGES = ["same", "same", "launch", "held", "nvml", "idle"]


def snapshot(
    draw: st.DrawFn,
    now: int,
    device: dict[str, float | None],
    samples: dict[str, SliceSample],
) -> Snapshot:
    """The tick's snapshot of ALLOCATIONS' samples; now and then GPU-0's
    device figure changes (kept in ``device``)."""
    if draw(st.integers(0, 9)) == 0:
        device["GPU-0"] = draw(st.one_of(st.none(), st.floats(0, 100)))
    gpus = {
        uuid: GpuSample(
            device[uuid], {a.vgpu_id: samples[a.vgpu_id] for a in ALLOCATIONS if a.gpu == uuid}
        )
        for uuid in device
    }
    return Snapshot(now_ns=now, gpus=gpus)


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[int, Snapshot]]:
    """Ticks where inputs mostly repeat, with changes of every kind between."""
    now = 0
    counters = {a.vgpu_id: [0, 0] for a in ALLOCATIONS}
    samples = {a.vgpu_id: SliceSample(active=True) for a in ALLOCATIONS}
    device: dict[str, float | None] = {"GPU-0": None, "GPU-1": None}
    ticks = []
    for _ in range(draw(st.integers(10, 80))):
        # A stalled loop or a sample period now and then: time matters too.
        now += draw(st.sampled_from([TICK_NS] * 6 + [2 * TICK_NS, 7 * TICK_NS]))
        quiet = draw(st.sampled_from([True, True, False]))  # long runs of nothing new
        for a in ALLOCATIONS:
            change = "same" if quiet else draw(st.sampled_from(CHANGES))
            c = counters[a.vgpu_id]
            if change == "launch":
                c[0] += draw(st.integers(1, TICK_NS))
            elif change == "held":
                c[1] += draw(st.integers(1, TICK_NS))
            util = draw(st.floats(0, 100)) if change == "nvml" else None
            active = samples[a.vgpu_id].active != (change == "idle")
            samples[a.vgpu_id] = SliceSample(active, util, c[0], c[1])
        ticks.append((now, snapshot(draw, now, device, samples)))
    return ticks


def same_as_computing_every_tick(
    ticks: list[tuple[int, Snapshot]], allocations: list[Allocation] = ALLOCATIONS
) -> ControllerState:
    reusing, full = ControllerState(), ControllerState()
    for now, snapshot in ticks:
        got, reusing = compute_quotas(snapshot, allocations, reusing)
        want, full = compute_quotas(snapshot, allocations, full)
        assert got == want, f"at {now / 1e9:.1f} s"
        # And what each slice remembers, but for its counters (a reused
        # GPU's are read again when it is computed).
        for key, state in full.slices.items():
            assert reusing.slices[key][NOT_COUNTERS:] == state[NOT_COUNTERS:], key
        full = ControllerState(slices=full.slices)  # never settled: always computed
    return reusing


@settings(max_examples=150, deadline=None)
@given(runs())
def test_reused_quotas_are_the_ones_a_full_computation_gives(
    ticks: list[tuple[int, Snapshot]],
) -> None:
    same_as_computing_every_tick(ticks)


# Uses (fractions of the GPU) a vGPU keeps for a while: idle, under its
# share, about its share and target, and all of the GPU.
USES = [0.0, 0.1, 0.3, 0.4, 0.5, 0.97]
# "back": the counters go back (a block made again, or a tenant that
# writes its own usage words).
BUSY_CHANGES = ["use", "held", "nvml", "idle", "alone", "back", "same"]


@st.composite
def steady_runs(draw: st.DrawFn) -> list[tuple[int, Snapshot]]:
    """Ticks where each vGPU keeps using the GPU at one rate for a while (its
    counters move every tick), with every kind of change between: another
    rate, a hold, an NVML figure, processes gone or back, counters that go
    back, alone on its GPU or not (with small launches, alone, a vGPU is
    calibrated)."""
    now = 0
    counters = {a.vgpu_id: [0, 0, 0] for a in ALLOCATIONS}
    uses = {a.vgpu_id: draw(st.sampled_from(USES)) for a in ALLOCATIONS}
    launch_ns = {a.vgpu_id: draw(st.sampled_from([10_000, 2_000_000])) for a in ALLOCATIONS}
    active = {a.vgpu_id: True for a in ALLOCATIONS}
    alone = {a.vgpu_id: False for a in ALLOCATIONS}
    device: dict[str, float | None] = {"GPU-0": None, "GPU-1": None}
    ticks = []
    for _ in range(draw(st.integers(10, 80))):
        dt = draw(st.sampled_from([TICK_NS] * 6 + [2 * TICK_NS, 7 * TICK_NS]))
        now += dt
        steady = draw(st.sampled_from([True, True, True, True, False]))
        slices = {}
        for a in ALLOCATIONS:
            change = "same" if steady else draw(st.sampled_from(BUSY_CHANGES))
            c = counters[a.vgpu_id]
            if change == "use":
                uses[a.vgpu_id] = draw(st.sampled_from(USES))
            elif change == "held":
                c[1] += draw(st.integers(1, dt))
            elif change == "idle":
                active[a.vgpu_id] = not active[a.vgpu_id]
            elif change == "alone":
                alone[a.vgpu_id] = not alone[a.vgpu_id]
            elif change == "back":
                c[:] = [draw(st.integers(0, v)) for v in c]
            used = round(uses[a.vgpu_id] * dt) if active[a.vgpu_id] else 0
            c[0] += used
            c[2] += -(-used // launch_ns[a.vgpu_id])
            util = draw(st.floats(0, 100)) if change == "nvml" else None
            slices[a.vgpu_id] = SliceSample(
                active[a.vgpu_id], util, c[0], c[1], c[2], alone[a.vgpu_id]
            )
        ticks.append((now, snapshot(draw, now, device, slices)))
    return ticks


@settings(max_examples=200, deadline=None)
@given(steady_runs())
def test_a_busy_gpu_reused_while_steady_gives_what_a_full_computation_gives(
    ticks: list[tuple[int, Snapshot]],
) -> None:
    same_as_computing_every_tick(ticks)


def test_a_busy_gpu_is_reused_while_its_uses_stay_and_computed_when_one_moves() -> None:
    """GPU-0's three vGPUs use about their targets (the hard one its share,
    the soft ones their share and spare): their quotas stay, so the GPU is
    computed once and reused while the counters move; the soft one at 0.3
    falling to 0.1 is computed at once, as computing every tick does."""
    allocations = [a for a in ALLOCATIONS if a.gpu == "GPU-0"]
    counters = {"h": 0, "s1": 0, "s2": 0}
    held = {"h": 0, "s1": 0, "s2": 0}

    def tick(
        n: int, uses: dict[str, float], waited: str | None = None, figure: float | None = None
    ) -> tuple[int, Snapshot]:
        for k, use in uses.items():
            counters[k] += round(use * TICK_NS)
        if waited is not None:
            held[waited] += TICK_NS // 2
        slices = {
            k: SliceSample(True, figure if k == "h" else None, counters[k], held[k], n)
            for k in counters
        }
        return n * TICK_NS, Snapshot(n * TICK_NS, {"GPU-0": GpuSample(80.0, slices)})

    at_target = {"h": 0.3, "s1": 0.3, "s2": 0.4}
    ticks = [tick(n, at_target) for n in range(1, 8)]
    state = same_as_computing_every_tick(ticks, allocations)
    assert "GPU-0" in state.steady and "GPU-0" not in state.settled
    kept = state.slices[("s1", "GPU-0")]
    quotas, state = compute_quotas(tick(8, at_target)[1], allocations, state)
    assert state.slices[("s1", "GPU-0")] is kept  # reused, not computed
    assert quotas == state.steady["GPU-0"].quotas
    counters.update(h=0, s1=0, s2=0)
    moved = [tick(n, at_target) for n in range(1, 9)]
    moved += [tick(9, {**at_target, "s1": 0.1}), tick(10, {**at_target, "s1": 0.1})]
    state = same_as_computing_every_tick(moved, allocations)
    assert "GPU-0" not in state.steady  # s1 now uses less than it is given
    # The hard one idle with its processes: what it does not use is spare.
    counters.update(h=0, s1=0, s2=0)
    idle = [tick(n, at_target) for n in range(1, 9)]
    idle += [tick(n, {**at_target, "h": 0.0}) for n in range(9, 12)]
    same_as_computing_every_tick(idle, allocations)
    # Held back for a tick: its held mean decays over the next ones, which
    # are computed (a state that moves is no steady one). An NVML figure of
    # the hard one's: it stands in for its use for 0.5 s.
    counters.update(h=0, s1=0, s2=0)
    waits = [tick(n, at_target) for n in range(1, 9)]
    waits += [tick(9, at_target, waited="h")] + [tick(n, at_target) for n in range(10, 30)]
    waits += [tick(30, at_target, figure=5.0)] + [tick(n, at_target) for n in range(31, 40)]
    same_as_computing_every_tick(waits, allocations)


def test_a_recent_nvml_figure_is_not_settled_until_it_is_too_old() -> None:
    """A soft vGPU seen busy by NVML keeps the spare time while the figure
    stands in (0.5 s), then gives it back: quiet ticks are not all alike."""
    allocations = [Allocation("h", "G", 300_000), Allocation("s", "G", 200_000, soft=True)]

    def tick(n: int, util: float | None) -> tuple[int, Snapshot]:
        slices = {"h": SliceSample(True), "s": SliceSample(True, util)}
        return n * TICK_NS, Snapshot(n * TICK_NS, {"G": GpuSample(40.0, slices)})

    ticks = [tick(1, None), tick(2, None), tick(3, 40.0)] + [tick(n, None) for n in range(4, 15)]
    state = same_as_computing_every_tick(ticks, allocations)
    assert "G" in state.settled  # quiet long enough after the figure aged


def test_a_steady_gpu_is_reused_and_a_change_is_computed() -> None:
    state = ControllerState()
    steady = GpuSample(None, {"s": SliceSample(True, None, 10, 0)})
    allocations = [Allocation("s", "GPU-0", 300_000, soft=True)]
    for tick in range(3):
        _, state = compute_quotas(
            Snapshot((tick + 1) * TICK_NS, {"GPU-0": steady}), allocations, state
        )
    assert "GPU-0" in state.settled
    kept = state.slices[("s", "GPU-0")]
    quotas, state = compute_quotas(Snapshot(4 * TICK_NS, {"GPU-0": steady}), allocations, state)
    assert quotas == {("s", "GPU-0"): 300_000}
    assert state.slices[("s", "GPU-0")] is kept  # not computed again
    share_change = [replace(allocations[0], share_ppm=PPM_FULL)]
    quotas, state = compute_quotas(Snapshot(5 * TICK_NS, {"GPU-0": steady}), share_change, state)
    assert quotas == {("s", "GPU-0"): PPM_FULL}


# --- a GPU where every quota is its share: fixed ------------------------------

HARD = [
    Allocation("a", "GPU-0", 300_000),
    Allocation("b", "GPU-0", 600_000),
    Allocation("c", "GPU-1", PPM_FULL),
]
# Soft vGPUs whose shares fill their GPU while all of them have processes
# (GPU-2 beside a hard one, GPU-3 over 100 %), and a GPU whose soft vGPU
# can take spare time whenever it is active (GPU-4).
FIXABLE = [
    *HARD,
    Allocation("s1", "GPU-2", 600_000, soft=True),
    Allocation("s2", "GPU-2", 400_000, soft=True, weight=3),
    Allocation("h", "GPU-2", 200_000),
    Allocation("t1", "GPU-3", 700_000, soft=True, weight=2),
    Allocation("t2", "GPU-3", 500_000, soft=True),
    Allocation("u", "GPU-4", 500_000, soft=True),
    Allocation("v", "GPU-4", 200_000),
]


@st.composite
def busy_runs(draw: st.DrawFn) -> list[Snapshot]:
    """Busy ticks of the FIXABLE vGPUs: counters that move, held back or
    not, NVML figures, processes that come and go (as the scan sees them),
    and now and then a vGPU alone on its GPU with small launches
    (calibrated) or large ones."""
    now = 0
    counters = {a.vgpu_id: [0, 0, 0] for a in FIXABLE}
    ticks = []
    for _ in range(draw(st.integers(10, 60))):
        now += draw(st.sampled_from([TICK_NS] * 6 + [2 * TICK_NS, 7 * TICK_NS]))
        slices: dict[str, dict[str, SliceSample]] = {}
        alone = draw(st.sampled_from([None, None, None, *(a.vgpu_id for a in FIXABLE)]))
        for a in FIXABLE:
            c = counters[a.vgpu_id]
            busy = draw(st.integers(0, TICK_NS))
            c[0] += busy
            c[1] += draw(st.sampled_from([0, 0, TICK_NS // 2]))
            c[2] += busy // draw(st.sampled_from([10_000, 2_000_000]))
            util = draw(st.one_of(st.none(), st.floats(0, 100)))
            active = draw(st.sampled_from([True, True, True, False]))
            slices.setdefault(a.gpu, {})[a.vgpu_id] = SliceSample(
                active, util, c[0], c[1], c[2], alone=alone == a.vgpu_id
            )
        util = draw(st.one_of(st.none(), st.floats(0, 100)))
        ticks.append(Snapshot(now, {gpu: GpuSample(util, s) for gpu, s in slices.items()}))
    return ticks


def every_quota_is_its_share(gpu: str, sample: GpuSample) -> bool:
    """What the shortcut is documented to take: no vGPU alone, and no soft
    vGPU that spare time could go to."""
    allocs = [a for a in FIXABLE if a.gpu == gpu]
    if any(s.alone for s in sample.slices.values()):
        return False
    claimed = sum(a.share_ppm for a in allocs if a.soft and sample.slices[a.vgpu_id].active)
    return not any(a.soft for a in allocs) or claimed >= PPM_FULL


@settings(max_examples=100, deadline=None)
@given(busy_runs())
def test_a_fixed_gpu_gives_what_computing_it_in_full_gives(ticks: list[Snapshot]) -> None:
    """Hard vGPUs none of which is alone, and soft ones whose active shares
    fill the GPU, are given their shares whatever their counters and NVML's
    figures say: the shortcut (``_fixed``) gives, tick for tick, the quotas
    and calibration the full computation gives wherever it is taken; a
    vGPU alone on its GPU, or spare time a soft vGPU may take, is computed
    in full."""
    fixed_state, full_state = ControllerState(), ControllerState()
    for snapshot in ticks:
        got, fixed_state = compute_quotas(snapshot, FIXABLE, fixed_state)
        with mock.patch.object(controller, "_fixed", return_value=False):
            want, full_state = compute_quotas(snapshot, FIXABLE, full_state)
        for gpu, sample in snapshot.gpus.items():
            if not every_quota_is_its_share(gpu, sample):
                assert gpu not in fixed_state.fixed
                continue
            assert gpu in fixed_state.fixed
            for a in (a for a in FIXABLE if a.gpu == gpu):
                key = (a.vgpu_id, gpu)
                assert (
                    got[key] == want[key] == (a.share_ppm if a.share_ppm < PPM_FULL else PPM_FULL)
                )
                assert not fixed_state.slices[key].calibrated
                assert not full_state.slices[key].calibrated
                assert fixed_state.slices[key].target == full_state.slices[key].target


def test_a_fixed_gpu_keeps_its_states_and_drops_its_figures() -> None:
    """While fixed, a slice's state is not computed again tick by tick
    (its counters stay as last read); NVML's figures and the means made of
    them are dropped on the way in, and its learnt correction is kept."""
    learnt = SliceState(
        gpu_time_ns=5,
        counters_at_ns=TICK_NS,
        correction=1.2,
        target=0.3,
        nvml_util=0.4,
        seen_use=(0.5, 0.4),
        held=0.5,
        held_at_figure=0.5,
        calibrated=True,
    )
    state = ControllerState(slices={("a", "GPU-0"): learnt})
    busy = GpuSample(50.0, {"a": SliceSample(True, 50.0, 10**9, 10**8, 10**5)})
    _, state = compute_quotas(Snapshot(2 * TICK_NS, {"GPU-0": busy}), HARD[:1], state)
    rest = state.slices[("a", "GPU-0")]
    assert rest == learnt._replace(
        nvml_util=None, seen_use=None, held=0.0, held_at_figure=0.0, calibrated=False
    )
    busier = GpuSample(70.0, {"a": SliceSample(True, 70.0, 2 * 10**9, 10**8, 2 * 10**5)})
    quotas, state = compute_quotas(Snapshot(3 * TICK_NS, {"GPU-0": busier}), HARD[:1], state)
    assert quotas == {("a", "GPU-0"): 300_000}
    assert state.slices[("a", "GPU-0")] is rest
    # A new share is aimed at as the full computation aims at it: NVML's
    # figures of the next Tuning.settle_s describe the time before.
    doubled = [replace(HARD[0], share_ppm=600_000)]
    quotas, state = compute_quotas(Snapshot(4 * TICK_NS, {"GPU-0": busier}), doubled, state)
    assert quotas == {("a", "GPU-0"): 600_000}
    settle_ns = round(controller.DEFAULT_TUNING.settle_s * 1e9)
    assert state.slices[("a", "GPU-0")] == rest._replace(
        target=0.6, learn_from_ns=4 * TICK_NS + settle_ns
    )
