"""Reusing a settled GPU's quotas changes nothing: the controller fed long
runs of unchanged inputs gives, tick for tick, what it gives when every
tick is computed in full; and a steady GPU is in fact reused."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from vgpud.policy.controller import (
    PPM_FULL,
    Allocation,
    ControllerState,
    GpuSample,
    SliceSample,
    Snapshot,
    compute_quotas,
)

TICK_NS = 100_000_000
ALLOCATIONS = [
    Allocation("h", "GPU-0", 300_000),
    Allocation("s1", "GPU-0", 200_000, soft=True, weight=1),
    Allocation("s2", "GPU-0", 100_000, soft=True, weight=3),
    Allocation("x", "GPU-1", 500_000, soft=True),
]
CHANGES = ["same", "same", "launch", "held", "nvml", "idle"]


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[int, Snapshot]]:
    """Ticks where inputs mostly repeat, with changes of every kind between."""
    now = 0
    counters = {a.vgpu_id: [0, 0] for a in ALLOCATIONS}
    samples = {a.vgpu_id: SliceSample(active=True) for a in ALLOCATIONS}
    device = {"GPU-0": None, "GPU-1": None}
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
        if draw(st.integers(0, 9)) == 0:
            device["GPU-0"] = draw(st.one_of(st.none(), st.floats(0, 100)))
        gpus = {
            uuid: GpuSample(
                device[uuid], {a.vgpu_id: samples[a.vgpu_id] for a in ALLOCATIONS if a.gpu == uuid}
            )
            for uuid in device
        }
        ticks.append((now, Snapshot(now_ns=now, gpus=gpus)))
    return ticks


def same_as_computing_every_tick(
    ticks: list[tuple[int, Snapshot]], allocations: list[Allocation] = ALLOCATIONS
) -> ControllerState:
    reusing, full = ControllerState(), ControllerState()
    for now, snapshot in ticks:
        got, reusing = compute_quotas(snapshot, allocations, reusing)
        want, full = compute_quotas(snapshot, allocations, full)
        assert got == want, f"at {now / 1e9:.1f} s"
        full = ControllerState(slices=full.slices)  # never settled: always computed
    return reusing


@settings(max_examples=150, deadline=None)
@given(runs())
def test_reused_quotas_are_the_ones_a_full_computation_gives(
    ticks: list[tuple[int, Snapshot]],
) -> None:
    same_as_computing_every_tick(ticks)


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
    steady = GpuSample(None, {"h": SliceSample(True, None, 10, 0)})
    allocations = [Allocation("h", "GPU-0", 300_000)]
    for tick in range(3):
        _, state = compute_quotas(
            Snapshot((tick + 1) * TICK_NS, {"GPU-0": steady}), allocations, state
        )
    assert "GPU-0" in state.settled
    kept = state.slices[("h", "GPU-0")]
    quotas, state = compute_quotas(Snapshot(4 * TICK_NS, {"GPU-0": steady}), allocations, state)
    assert quotas == {("h", "GPU-0"): 300_000}
    assert state.slices[("h", "GPU-0")] is kept  # not computed again
    share_change = [replace(allocations[0], share_ppm=PPM_FULL)]
    quotas, state = compute_quotas(Snapshot(5 * TICK_NS, {"GPU-0": steady}), share_change, state)
    assert quotas == {("h", "GPU-0"): PPM_FULL}
