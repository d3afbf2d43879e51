"""The compute controller: measured use in, per-vGPU quotas out.

A pure function: no clock, socket, GPU or file. The daemon loop calls it
about every 100 ms and writes each quota into the vGPU's control block
(``ControlBlock.write_throttle``) with a heartbeat::

    state = ControllerState()
    ...
    quotas, state = compute_quotas(snapshot, allocations, state)
    for (vgpu_id, uuid), quota_ppm in quotas.items():
        control[vgpu_id].write_throttle(dev_index(uuid), quota_ppm, WINDOW_NS)

Inputs:

- ``allocations``: every (vGPU, GPU) slice as configured (``Allocation``:
  share in ppm, hard or soft, weight). A quota comes out for each one.
- ``snapshot``: what the tick measured (``Snapshot``): a monotonic
  timestamp and, per GPU, the device utilization and per vGPU a
  ``SliceSample``: whether it has processes, the NVML per-process
  utilization summed over its processes (None when no new 200 ms sample
  arrived since the last call), and the hook's cumulative counters from the
  usage block (``gpu_time_ns``, ``throttled_ns`` of the device). The
  controller keeps the previous counters in its state and differentiates
  them itself, so the caller passes what it reads, as it reads it.
- ``state``: what the previous call returned (start with
  ``ControllerState()``). Frozen; a new one is returned each call.

The algorithm and its tuning are described in docs/compute.md. In short:

- A share of 100 % is never paced (``PPM_FULL``).
- Hard: quota = share x correction. The correction is an integral
  controller on the error between the share and the NVML-measured
  utilization, so that the truth (NVML), not the hook's own estimate, lands
  on the share. It integrates upward only for the part of the recent time
  the pacer held the vGPU back (anti-windup: a vGPU that uses less than
  its share by choice does not bank credit) and always integrates
  downward when NVML sees it above its share. Clamped to [0.5, 4] x share
  and to 100 %.
- Soft: share plus a part of the spare time. Each active vGPU claims its
  full share when it wants it (throttled, close to its share, or unknown)
  and otherwise what it uses plus room to grow; what nobody claims is
  divided by weight among active soft vGPUs (water-filling: a soft vGPU
  that does not use its part leaves it to the others). A vGPU that starts
  wanting its share is claimed for at the next tick, so soft vGPUs return
  to their shares within a few ticks plus one NVML sample period.
- A GPU where no vGPU is calibrated and no soft vGPU can be given spare
  time (it has none, or those with processes claim the whole GPU between
  them) is fixed: every quota is its share whatever was measured, and
  nothing is computed (``_fixed``; ``all_fixed`` tells the caller it may
  skip such ticks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from vgpud.units import PPM_FULL, ppm_to_fraction

NS_PER_S = 1_000_000_000

# The window the quotas apply to: 0 lets the hook use its default (see
# docs/compute.md for why the window belongs to the pacer).
WINDOW_NS = 0

# The most a hard vGPU with a share below 100 % is given (see _corrected).
HARD_MAX = 0.99


@dataclass(frozen=True)
class Tuning:
    """The controller's constants; docs/compute.md explains each choice."""

    # Gain of the correction, per second, in log space: each NVML figure
    # multiplies the correction by (target / util) ** (ki x its period).
    ki: float = 2.0
    # Bounds of the correction (hook-measured time per NVML-measured time),
    # and of what one figure may change it by.
    correction_min: float = 0.5
    correction_max: float = 4.0
    max_step_factor: float = 2.0
    # A vGPU whose launches waited this fraction of the tick is held back.
    throttled_min: float = 0.01
    # A vGPU using this fraction of its share or more may want all of it.
    near_share: float = 0.9
    # Device utilization (fraction) above which a vGPU below its share is
    # taken to be squeezed by others rather than idle by choice.
    saturated: float = 0.97
    # A vGPU that is not held back may grow to 2 x use + this before it has
    # to be held back; it claims that much.
    ramp: float = 0.1
    # How long an NVML figure stands in for the ticks that bring none.
    nvml_max_age_s: float = 0.5
    # Longest interval one integration step may cover (a stalled loop must
    # not turn one error into a jump).
    max_step_s: float = 0.5
    # Quotas are rounded to this many ppm so that noise does not rewrite
    # the control block every tick.
    quantum_ppm: int = 100
    # After a change of target, NVML figures of this long describe the time
    # before it (200 ms periods, reported late), not a bias; and the part
    # of the time a vGPU was held back is a mean over about this long.
    settle_s: float = 0.5
    # The hook's use and NVML's are compared over means of about this long
    # (the most a correction learnt alone may rise to; see _seen_use): the
    # two are not read over quite the same time, and bursts a few ticks
    # apart alias with NVML's periods (over 1 s a burst pattern let the
    # correction rise 22 % past the bias, over 2 s 10 %).
    seen_use_memory_s: float = 2.0
    # A target that moves by more than this is a change (not noise).
    target_change: float = 0.02
    # Per-process figures are learnt from only when their sum is within this
    # (absolute, and relative to the device's figure) of the device's.
    consistency: float = 0.1
    # Learn a correction from NVML's device figure while a vGPU is alone on
    # its GPU (every process NVML lists there is its own, so the device
    # figure is its use) and its launches are small: there the hook's
    # measure misses what NVML counts besides kernels (the front end's time
    # for each launch, 1-2 us on an H100) and its estimate of a launch-bound
    # batch errs by up to a fifth, while the device figure is the truth the
    # share is judged by. Not for large kernels: a paced 20 ms kernel
    # aliases with NVML's sample grid (an H200 read 13.9 for a share of 10
    # that the completed kernels show held at 10.1), and their spans are
    # exact. docs/compute.md, "Calibrated by NVML while alone".
    calibrate_alone: bool = True
    # The largest mean GPU time per launch (over the tick) of work that is
    # calibrated: an eager decode step's kernels take 5-20 us, a large GEMM
    # a millisecond or more.
    calibrate_max_launch_ns: int = 200_000
    # Learn a correction from NVML's per-process figures at all. Off: paced
    # processes on a GPU take turns (docs/compute.md), so the hook's measure
    # is its own work, while NVML's per-process figures are wrong exactly
    # when vGPUs share a GPU (driver 580 on an H200: one vGPU of 30/70 read
    # 0 %, and learning from them drove the quotas to 150/491 permille and
    # the work to 18.4/60.6 %; with the correction off, 30.2/67.9).
    learn_from_nvml: bool = False


DEFAULT_TUNING = Tuning()


@dataclass(frozen=True)
class Allocation:
    """One vGPU on one GPU, as configured."""

    vgpu_id: str
    gpu: str  # UUID
    share_ppm: int
    soft: bool = False
    weight: int = 1


class SliceSample(NamedTuple):
    """What one tick measured for a vGPU on a GPU.

    This and the other per-slice records (``SliceState``, ``_Reading``) are
    named tuples, not frozen dataclasses: every tick makes each anew for
    every busy vGPU, and a frozen dataclass costs 3.5 times as much to make
    (100 busy vGPUs: a tick of 1.3 ms in process with dataclasses, 0.85 ms
    with tuples)."""

    active: bool  # it has processes
    util: float | None = None  # NVML per-process %, summed; None: no new sample
    gpu_time_ns: int = 0  # the hook's cumulative GPU time (usage block)
    throttled_ns: int = 0  # the hook's cumulative pacer waits (usage block)
    launches: int = 0  # the hook's cumulative measured launches (usage block)
    # Every process NVML lists on the GPU is this vGPU's: ``util`` is then
    # the device's figure (see Tuning.calibrate_alone).
    alone: bool = False


@dataclass(frozen=True)
class GpuSample:
    util: float | None = None  # NVML device utilization %, None if unknown
    slices: Mapping[str, SliceSample] = field(default_factory=dict)  # by vGPU id


@dataclass(frozen=True)
class Snapshot:
    now_ns: int  # CLOCK_MONOTONIC of the measurement
    gpus: Mapping[str, GpuSample] = field(default_factory=dict)  # by UUID


class SliceState(NamedTuple):
    """What the controller remembers about one (vGPU, GPU)."""

    gpu_time_ns: int = 0
    throttled_ns: int = 0
    launches: int = 0
    counters_at_ns: int | None = None  # when the counters above were read
    correction: float = 1.0  # hook-measured time per NVML-measured time
    target: float = 1.0  # the last utilization aimed at (fraction, NVML's measure)
    nvml_util: float | None = None  # the last NVML figure (fraction)
    nvml_at_ns: int = 0
    gpu_time_at_figure_ns: int = 0  # the hook's gpu_time_ns when it came
    # The hook's use and NVML's, means over about Tuning.seen_use_memory_s
    # of figures (see _seen_use); None until two figures came.
    seen_use: tuple[float, float] | None = None
    active: bool = False
    learn_from_ns: int = 0  # NVML figures before this describe a former target
    # The part of the recent time the pacer held it back (a mean over about
    # Tuning.settle_s), now and when the last NVML figure came.
    held: float = 0.0
    held_at_figure: float = 0.0
    # Its quota is corrected by NVML's device figure (Tuning.calibrate_alone).
    calibrated: bool = False


Key = tuple[str, str]  # (vgpu_id, gpu uuid)
# What a GPU's quotas are computed from: its device utilization and each
# allocation with its sample (None: none given).
GpuInputs = tuple[float | None, tuple[tuple["Allocation", SliceSample | None], ...]]


@dataclass(frozen=True)
class SettledGpu:
    """A GPU whose last computation is a fixed point (see ``_settled``): the
    same inputs give the same quotas and states at any later time, so they
    are reused rather than computed again (most ticks, on an idle GPU)."""

    inputs: GpuInputs
    quotas: Mapping[Key, int]
    read_at_ns: int  # the last tick that read its counters, reused or not


@dataclass(frozen=True)
class SteadyGpu:
    """A busy GPU whose last computation changed nothing but its slices'
    counters, with every slice in a class where its use does not move its
    quota (``_flat``): while each stays there, the same quotas and states
    come out, and they are reused; only the counters move on, kept here
    (not in the slices' states) until a tick computes the GPU again."""

    allocations: tuple[Allocation, ...]
    quotas: Mapping[Key, int]
    sample: GpuSample  # the counters last read
    read_at_ns: int  # when


@dataclass(frozen=True)
class ControllerState:
    slices: Mapping[tuple[str, str], SliceState] = field(default_factory=dict)
    settled: Mapping[str, SettledGpu] = field(default_factory=dict)  # by GPU uuid
    steady: Mapping[str, SteadyGpu] = field(default_factory=dict)  # by GPU uuid
    # GPUs whose quotas were their shares whatever was measured (``_fixed``),
    # with those quotas, by GPU uuid.
    fixed: Mapping[str, Mapping[Key, int]] = field(default_factory=dict)


class _Reading(NamedTuple):
    """One slice's measurements for this tick, as fractions of the device."""

    alloc: Allocation
    share: float
    active: bool
    use: float | None  # best figure of its utilization
    fresh_nvml: float | None  # NVML figure that arrived this tick
    nvml_dt_s: float  # time since the previous NVML figure
    now_ns: int
    throttled: float  # fraction of the tick its launches waited
    # The part of the time the last NVML figure describes that the pacer
    # held it back (see _bias_part).
    held_part: float
    alone: bool  # every process NVML lists on its GPU is its own
    calibrated: bool  # its correction is learnt and applied (see _calibrated)
    state: SliceState


def compute_quotas(
    snapshot: Snapshot,
    allocations: Sequence[Allocation],
    state: ControllerState,
    tuning: Tuning = DEFAULT_TUNING,
) -> tuple[dict[Key, int], ControllerState]:
    """Quota (ppm) per (vGPU id, GPU UUID) for every allocation, and the new state."""
    by_gpu: dict[str, list[Allocation]] = {}
    for alloc in allocations:
        _check(alloc)
        by_gpu.setdefault(alloc.gpu, []).append(alloc)

    now = snapshot.now_ns
    quotas: dict[Key, int] = {}
    new_states: dict[Key, SliceState] = {}
    settled: dict[str, SettledGpu] = {}
    steady: dict[str, SteadyGpu] = {}
    fixed: dict[str, Mapping[Key, int]] = {}
    for gpu, allocs in by_gpu.items():
        sample = snapshot.gpus.get(gpu, GpuSample())
        gpu_quotas: dict[Key, int] = {}
        memo = state.settled.get(gpu)
        was_steady = state.steady.get(gpu)
        is_fixed = _fixed(allocs, sample, tuning)
        if (
            not is_fixed
            and was_steady is not None
            and _still_steady(was_steady, allocs, sample, now, state, tuning)
        ):
            quotas.update(was_steady.quotas)
            new_states.update((key, state.slices[key]) for key in was_steady.quotas)
            steady[gpu] = replace(was_steady, sample=sample, read_at_ns=now)
            continue
        if not is_fixed:  # a fixed GPU's inputs are not compared: nothing is computed
            inputs: GpuInputs = (
                sample.util,
                tuple((a, sample.slices.get(a.vgpu_id)) for a in allocs),
            )
            if memo is not None and memo.inputs == inputs:
                quotas.update(memo.quotas)
                new_states.update((key, state.slices[key]) for key in memo.quotas)
                settled[gpu] = replace(memo, read_at_ns=now)
                continue
        before = state if memo is None else _read_at(state, memo)
        if was_steady is not None:
            before = _counters_of(before, was_steady)
        if is_fixed:
            for a in allocs:
                key = (a.vgpu_id, gpu)
                gpu_quotas[key] = _to_ppm(_quota_of(ppm_to_fraction(a.share_ppm), 1.0), tuning)
                new_states[key] = _at_rest(before.slices.get(key), a, now, tuning)
            quotas.update(gpu_quotas)
            fixed[gpu] = gpu_quotas
            continue
        readings = [_read(a, sample, now, before, tuning) for a in allocs]
        fractions = _divide_gpu(readings, sample.util, tuning)
        for reading in readings:
            key = (reading.alloc.vgpu_id, gpu)
            quota, new_state = fractions[key]
            gpu_quotas[key] = _to_ppm(quota, tuning)
            new_states[key] = new_state
        quotas.update(gpu_quotas)
        if _settled(readings, before, new_states):
            settled[gpu] = SettledGpu(inputs, gpu_quotas, now)
        elif _steady(readings, before, new_states, tuning):
            steady[gpu] = SteadyGpu(tuple(allocs), gpu_quotas, sample, now)
    return quotas, ControllerState(slices=new_states, settled=settled, steady=steady, fixed=fixed)


def all_settled(state: ControllerState, allocations: Sequence[Allocation]) -> bool:
    """Whether the call that returned ``state`` settled or fixed every GPU
    of ``allocations`` (the allocations it was given)."""
    return len(state.settled) + len(state.fixed) == len({a.gpu for a in allocations})


def all_fixed(state: ControllerState, allocations: Sequence[Allocation]) -> bool:
    """Whether the call that returned ``state`` fixed every GPU of
    ``allocations``: for as long as the allocations stay and no vGPU is
    alone on its GPU, every quota is its share, whatever the counters and
    NVML's figures say."""
    return len(state.fixed) == len({a.gpu for a in allocations})


def unchanged(state: ControllerState, now_ns: int) -> tuple[dict[Key, int], ControllerState]:
    """What ``compute_quotas`` returns at ``now_ns`` for the same snapshot
    (but for its time) and allocations as the call that returned ``state``,
    when that call settled or fixed every GPU (``all_settled``): each GPU's
    quotas reused, only a settled one's read time moved on. For a caller
    that knows its inputs did not change (or, where every GPU is fixed,
    that no vGPU came to be alone): it skips building them
    (tests/unit/test_steering_quiet.py checks the two agree)."""
    quotas: dict[Key, int] = {}
    for memo in state.settled.values():
        quotas.update(memo.quotas)
    for fixed in state.fixed.values():
        quotas.update(fixed)
    settled = {gpu: replace(memo, read_at_ns=now_ns) for gpu, memo in state.settled.items()}
    return quotas, ControllerState(slices=state.slices, settled=settled, fixed=state.fixed)


def _fixed(allocs: Sequence[Allocation], sample: GpuSample, tuning: Tuning) -> bool:
    """Whether every quota on the GPU is its share, whatever was measured:
    none is calibrated (no learning from per-process figures, and no vGPU
    alone on the GPU, or no calibration alone), and no soft vGPU can be
    given spare time: there is no soft vGPU, or those the scan found
    processes in claim the whole GPU between them (an active soft vGPU
    claims all of its share, whatever it uses: _claim). A busy node
    (hard shares are the default; soft ones that fill their GPUs) then
    costs no more than an idle one: on the simulator's node of 100 busy
    vGPUs a full tick took ~8 us a vGPU (docs/benchmarks/daemon.md)."""
    if tuning.learn_from_nvml:
        return False
    soft = False
    claimed_ppm = 0
    for a in allocs:
        s = sample.slices.get(a.vgpu_id)
        if s is not None and s.alone and tuning.calibrate_alone:
            return False
        if a.soft:
            soft = True
            if s is not None and s.active:
                claimed_ppm += a.share_ppm
    return not soft or claimed_ppm >= PPM_FULL


def _at_rest(prev: SliceState | None, alloc: Allocation, now_ns: int, tuning: Tuning) -> SliceState:
    """A fixed slice's state: what it learnt (its correction, kept for the
    next time it is alone), aiming at its share as the full computation
    would, and nothing it measured. Its counters are left as last read:
    the first tick that steers it again takes their rates over the whole
    time between (a mean, as true as any), and whether its launches are
    small from them. Its NVML figures and the means made of them are
    dropped, not left to stand for that time: a figure of then against the
    hook's measure since would be no bias."""
    if prev is None:
        return _first_state(alloc)
    target = ppm_to_fraction(alloc.share_ppm)  # at most 1: _check
    learn_from = _learn_from(prev, target, now_ns, tuning)
    if (
        prev.nvml_util,
        prev.seen_use,
        prev.held,
        prev.held_at_figure,
        prev.calibrated,
        prev.target,
        prev.learn_from_ns,
    ) == (None, None, 0.0, 0.0, False, target, learn_from):
        return prev  # most ticks: at rest already
    return prev._replace(
        nvml_util=None,
        seen_use=None,
        held=0.0,
        held_at_figure=0.0,
        calibrated=False,
        target=target,
        learn_from_ns=learn_from,
    )


def _first_state(alloc: Allocation) -> SliceState:
    """A slice's state before its first tick: aiming at its share."""
    return SliceState(target=ppm_to_fraction(alloc.share_ppm))


def _read_at(state: ControllerState, memo: SettledGpu) -> ControllerState:
    """The state as if the ticks that reused ``memo`` had been computed: they
    changed nothing but when the GPU's counters were last read."""
    slices = dict(state.slices)
    for key in memo.quotas:
        slices[key] = slices[key]._replace(counters_at_ns=memo.read_at_ns)
    return ControllerState(slices=slices)


def _settled(
    readings: Sequence[_Reading],
    before: ControllerState,
    after: Mapping[Key, SliceState],
) -> bool:
    """Whether computing this GPU again with the same inputs, at any later
    time, gives the same quotas and states (tests/unit/test_controller_memo.py
    checks this against computing every tick).

    Time enters a reading through its use: a counter rate (unchanged
    counters: zero whatever the interval) or an NVML figure that stands in
    until it is too old (then the rate does). A use of zero stays zero. The
    rest is state: when each slice's state comes out as it went in (but for
    when its counters were read; a fresh NVML figure always changes it), the
    next tick starts where this one did."""
    for r in readings:
        key = (r.alloc.vgpu_id, r.alloc.gpu)
        prev = before.slices.get(key)
        if (
            prev is None
            or r.use != 0.0
            or after[key] != prev._replace(counters_at_ns=after[key].counters_at_ns)
        ):
            return False
    return True


# SliceState's fields from here on are not counters: a steady GPU's
# computation leaves them as they were.
_STATE_FROM = SliceState._fields.index("correction")


def _steady(
    readings: Sequence[_Reading],
    before: ControllerState,
    after: Mapping[Key, SliceState],
    tuning: Tuning,
) -> bool:
    """Whether this GPU's computation changed nothing but counters (a new
    NVML figure, or a held mean that decays, is a change), with every
    slice ``_flat``: while each stays flat by its counters, the next ticks
    give the same (``_still_steady``; tests/unit/test_controller_memo.py
    checks this against computing every tick). A figure that stands in for
    a use (``_read``) was flat too, and so is the use after it."""
    for r in readings:
        prev = before.slices.get((r.alloc.vgpu_id, r.alloc.gpu))
        state = after[(r.alloc.vgpu_id, r.alloc.gpu)]
        if (
            prev is None
            or state[_STATE_FROM:] != prev[_STATE_FROM:]
            or not _flat(r.alloc, r.active, r.use, r.throttled, r.alone, state, tuning)
        ):
            return False
    return True


def _flat(
    alloc: Allocation,
    active: bool,
    use: float | None,
    throttled: float,
    alone: bool,
    state: SliceState,
    tuning: Tuning,
) -> bool:
    """Whether a slice's reading is one whose use does not move any quota
    of its GPU, nor its state but for counters: not held back (its held
    mean stays 0), not calibrating (alone, its calibration may turn), and
    inactive, or using enough of what it has that it claims all of it
    (``_claim``; a soft vGPU, all of the spare time it can get:
    ``_extra_cap``)."""
    if throttled > tuning.throttled_min or state.calibrated != tuning.learn_from_nvml:
        return False
    if tuning.calibrate_alone and alone and not tuning.learn_from_nvml:
        return False
    if not active:
        return use == 0.0
    if use is None:
        return False
    if alloc.soft:
        return _uses_its_target(use, state.target, tuning)
    return _near_share(use, ppm_to_fraction(alloc.share_ppm), tuning)


def _still_steady(
    memo: SteadyGpu,
    allocs: Sequence[Allocation],
    sample: GpuSample,
    now_ns: int,
    state: ControllerState,
    tuning: Tuning,
) -> bool:
    """Whether the GPU's allocations are the memo's and each slice's
    reading now, from the counters last read, is flat as the states it
    keeps say (``_read`` and ``_flat``), with no NVML figure come, and some
    vGPU used it: a GPU whose counters all stood still is computed, so
    that it may settle (``_settled``), which costs a tick less."""
    if tuple(allocs) != memo.allocations:
        return False
    dt_s = (now_ns - memo.read_at_ns) / NS_PER_S
    used = False
    for a in allocs:
        new, old = sample.slices.get(a.vgpu_id), memo.sample.slices.get(a.vgpu_id)
        if new is None or old is None or new.util is not None:
            return False
        use = _flat_again(
            a,
            state.slices[(a.vgpu_id, a.gpu)],
            new.active,
            new.alone,
            (new.gpu_time_ns, old.gpu_time_ns, new.throttled_ns, old.throttled_ns),
            dt_s,
            tuning,
        )
        if use is None:
            return False
        used = used or bool(use)
    return used


def _flat_again(
    a: Allocation,
    s: SliceState,
    seen_active: bool,
    alone: bool,
    counters: tuple[int, int, int, int],
    dt_s: float,
    tuning: Tuning,
) -> float | None:
    """A slice's use since its counters were last read, if its reading
    from them (``counters``: GPU time now and then, pacer waits now and
    then) is flat as the state it keeps says (``_read`` and ``_flat``);
    None where it is not."""
    use = _rate(counters[0], counters[1], dt_s)
    throttled = _rate(counters[2], counters[3], dt_s)
    if use is None or throttled is None:
        return None
    active = seen_active or bool(use) or throttled > 0
    if active != s.active or not _flat(a, active, use, throttled, alone, s, tuning):
        return None
    return use


class SteadyRow(NamedTuple):
    """A slice of a steady GPU, as a caller that reuses it from the raw
    counters holds it (``steady_rows``, ``steady_again``): what its last
    sample said but its counters, where those are, and its state (which
    reuses keep)."""

    alloc: Allocation
    active: bool  # SliceSample.active
    alone: bool  # SliceSample.alone
    at: int  # its GPU time's index in the counter words; its pacer waits follow
    state: SliceState


def steady_rows(
    state: ControllerState, snapshot: Snapshot, at: Mapping[Key, int]
) -> tuple[tuple[SteadyRow, ...], ...]:
    """The slices of each steady GPU of ``state``, the one ``compute_quotas``
    returned for ``snapshot``, with the index of each one's counters in
    the caller's words (``at``), in ``state.steady``'s order."""
    return tuple(
        tuple(
            SteadyRow(a, s.active, s.alone, at[key], state.slices[key])
            for a in memo.allocations
            for key, s in (((a.vgpu_id, gpu), snapshot.gpus[gpu].slices[a.vgpu_id]),)
        )
        for gpu, memo in state.steady.items()
    )


def all_steady(state: ControllerState, allocations: Sequence[Allocation]) -> bool:
    """Whether the call that returned ``state`` found every GPU of
    ``allocations`` steady (``SteadyGpu``)."""
    return len(state.steady) == len({a.gpu for a in allocations})


def steady_again(
    gpus: Sequence[Sequence[SteadyRow]],
    words: Sequence[int],
    last: Sequence[int],
    dt_s: float,
    tuning: Tuning = DEFAULT_TUNING,
) -> bool:
    """Whether ``compute_quotas`` would reuse every GPU once more (each
    ``_still_steady``), where the state it last returned had every GPU
    steady (``all_steady``; ``gpus``: its ``steady_rows``) and the new
    samples differ from the last only by the counters: ``words`` now,
    ``last`` ``dt_s`` before. For a caller that knows nothing else changed
    (the same allocations, scan and NVML lists, no NVML figure for any
    slice): it skips building the samples. It then gives the same quotas
    and states; the memos' counters are ``words`` (``steady_at``)."""
    for rows in gpus:
        used = False
        for r in rows:
            i = r.at
            counters = (words[i], last[i], words[i + 1], last[i + 1])
            use = _flat_again(r.alloc, r.state, r.active, r.alone, counters, dt_s, tuning)
            if use is None:
                return False
            used = used or bool(use)
        if not used:
            return False
    return True


def steady_at(
    state: ControllerState, samples: Mapping[str, GpuSample], read_at_ns: int
) -> ControllerState:
    """``state`` (every GPU steady) after reuses that ``steady_again`` let
    a caller skip, the last at ``read_at_ns`` with ``samples`` (by GPU)."""
    steady = {
        gpu: replace(memo, sample=samples[gpu], read_at_ns=read_at_ns)
        for gpu, memo in state.steady.items()
    }
    return replace(state, steady=steady)


def _counters_of(state: ControllerState, memo: SteadyGpu) -> ControllerState:
    """The state as if the ticks that reused ``memo`` had been computed:
    they changed nothing but the counters, last read into the memo."""
    slices = dict(state.slices)
    for key in memo.quotas:
        # As _read takes a slice with no sample.
        c = memo.sample.slices.get(key[0]) or SliceSample(active=False)
        slices[key] = slices[key]._replace(
            gpu_time_ns=c.gpu_time_ns,
            throttled_ns=c.throttled_ns,
            launches=c.launches,
            counters_at_ns=memo.read_at_ns,
        )
    return replace(state, slices=slices)


def _check(alloc: Allocation) -> None:
    if not 0 < alloc.share_ppm <= PPM_FULL:
        raise ValueError(
            f"{alloc.vgpu_id} on {alloc.gpu}: share_ppm {alloc.share_ppm} not in 1..{PPM_FULL}"
        )
    if alloc.weight < 1:
        raise ValueError(f"{alloc.vgpu_id} on {alloc.gpu}: weight {alloc.weight} < 1")


def _rate(new: int, old: int, dt_s: float | None) -> float | None:
    """Counter increase per second; None when it cannot be known (first read,
    counters reset because the block was recreated)."""
    if dt_s is None or dt_s <= 0 or new < old:
        return None
    return (new - old) / NS_PER_S / dt_s


def _read(
    alloc: Allocation, gpu: GpuSample, now_ns: int, state: ControllerState, tuning: Tuning
) -> _Reading:
    key = (alloc.vgpu_id, alloc.gpu)
    # Defaults made only when missing: dict.get(key, default) would make
    # them for every slice of every tick.
    prev = state.slices.get(key)
    if prev is None:
        prev = _first_state(alloc)
    sample = gpu.slices.get(alloc.vgpu_id)
    if sample is None:
        sample = SliceSample(active=False)

    dt_s = None if prev.counters_at_ns is None else (now_ns - prev.counters_at_ns) / NS_PER_S
    hook_use = _rate(sample.gpu_time_ns, prev.gpu_time_ns, dt_s)
    throttled = _rate(sample.throttled_ns, prev.throttled_ns, dt_s) or 0.0
    # Processes the last scan has not seen yet already show in the hook's
    # counters: they are active from their first paced launch.
    active = sample.active or bool(hook_use) or throttled > 0
    settle_ns = round(tuning.settle_s * NS_PER_S)
    held = _held_mean(prev.held, throttled > tuning.throttled_min, dt_s, tuning)

    calibrated = _calibrated(prev, sample, tuning)
    learn_from = prev.learn_from_ns
    if calibrated != prev.calibrated:
        # NVML's figures of the last periods describe the time before.
        learn_from = max(learn_from, now_ns + settle_ns)

    fresh = None if sample.util is None else max(0.0, sample.util) / 100.0
    nvml_dt_s = (now_ns - prev.nvml_at_ns) / NS_PER_S if prev.nvml_util is not None else 0.0
    use: float | None
    nvml: float | None
    if fresh is not None:
        use = nvml = fresh
        nvml_at = now_ns
        held_at_figure = held
        gpu_time_at_figure = sample.gpu_time_ns
        seen_use = _seen_use(prev, fresh, sample.gpu_time_ns, nvml_dt_s, tuning)
    else:
        held_at_figure = prev.held_at_figure
        gpu_time_at_figure = prev.gpu_time_at_figure_ns
        seen_use = prev.seen_use
        recent = prev.nvml_util is not None and nvml_dt_s <= tuning.nvml_max_age_s
        use = prev.nvml_util if recent else hook_use
        nvml, nvml_at = prev.nvml_util, prev.nvml_at_ns

    # Every field but two is new: made whole rather than by _replace().
    new_state = SliceState(
        gpu_time_ns=sample.gpu_time_ns,
        throttled_ns=sample.throttled_ns,
        launches=sample.launches,
        counters_at_ns=now_ns,
        correction=prev.correction,
        target=prev.target,
        nvml_util=nvml,
        nvml_at_ns=nvml_at,
        gpu_time_at_figure_ns=gpu_time_at_figure,
        seen_use=seen_use,
        active=active,
        learn_from_ns=learn_from,
        held=held,
        held_at_figure=held_at_figure,
        calibrated=calibrated,
    )
    return _Reading(
        alloc=alloc,
        share=ppm_to_fraction(alloc.share_ppm),
        active=active,
        use=use,
        fresh_nvml=fresh,
        nvml_dt_s=nvml_dt_s,
        now_ns=now_ns,
        throttled=throttled,
        # The NVML figure describes the last period or two, reported late:
        # held back now and at the figure before, or its figure may be of
        # the time before a hold began (a start-up, a burst after idling).
        held_part=min(held, prev.held_at_figure),
        alone=sample.alone,
        calibrated=calibrated,
        state=new_state,
    )


def _seen_use(
    prev: SliceState, fresh: float, gpu_time_ns: int, nvml_dt_s: float, tuning: Tuning
) -> tuple[float, float] | None:
    """The hook's use and NVML's since the last figure, each folded into
    a mean over about Tuning.seen_use_memory_s: the two are not read over
    quite the same time (a burst may fall in one's period and not the
    other's), and one period alone may be far off. Unchanged by counters
    that went back."""
    hook = _rate(gpu_time_ns, prev.gpu_time_at_figure_ns, nvml_dt_s)
    if prev.nvml_util is None or hook is None:
        return prev.seen_use
    if prev.seen_use is None:
        return hook, fresh
    forget = 1.0 - math.exp(-nvml_dt_s / tuning.seen_use_memory_s)
    hook_mean, nvml_mean = prev.seen_use
    return hook_mean + (hook - hook_mean) * forget, nvml_mean + (fresh - nvml_mean) * forget


def _seen_bias(r: _Reading) -> float:
    """The hook's GPU time per NVML's, as far as the figures show: the
    most a correction may be learnt up to (0 when they show nothing).
    Above it, the vGPU using all of its quota would be seen over its
    target."""
    if r.state.seen_use is None:
        return 0.0
    hook_mean, nvml_mean = r.state.seen_use
    return hook_mean / nvml_mean if nvml_mean >= 0.01 else 0.0


def _held_mean(before: float, held: bool, dt_s: float | None, tuning: Tuning) -> float:
    """The part of the recent time the pacer held the vGPU back: a mean
    that forgets with a time constant of Tuning.settle_s. Below 1 % it is
    none, so that an idle vGPU's state comes to rest (``_settled``)."""
    if dt_s is None or dt_s <= 0:
        return before
    forget = 1.0 - math.exp(-dt_s / tuning.settle_s)
    mean = before + ((1.0 if held else 0.0) - before) * forget
    return mean if mean >= 0.01 else 0.0


def _calibrated(prev: SliceState, sample: SliceSample, tuning: Tuning) -> bool:
    """Whether the slice's quota is corrected by NVML: always when learning
    from per-process figures is on; else while the vGPU is alone on the GPU
    and its launches are small (Tuning.calibrate_alone). A tick that
    measured no launch leaves it as it was."""
    if tuning.learn_from_nvml:
        return True
    if not (tuning.calibrate_alone and sample.alone):
        return False
    launches = sample.launches - prev.launches
    gpu_time = sample.gpu_time_ns - prev.gpu_time_ns
    if prev.counters_at_ns is None or launches <= 0 or gpu_time < 0:
        return prev.calibrated
    return gpu_time <= launches * tuning.calibrate_max_launch_ns


def _wants_share(r: _Reading, device_util: float | None, tuning: Tuning) -> bool:
    """Whether an active vGPU may want all of its share right now."""
    if r.use is None or r.throttled > tuning.throttled_min:
        return True
    if _near_share(r.use, r.share, tuning):
        return True
    # Below its share on a full device: squeezed by the others, not idle.
    return device_util is not None and device_util >= tuning.saturated


def _claim(r: _Reading, device_util: float | None, tuning: Tuning) -> float:
    """The part of the device this vGPU keeps from soft vGPUs' spare time."""
    if not r.active:
        return 0.0
    if r.alloc.soft or _wants_share(r, device_util, tuning):
        return r.share
    assert r.use is not None  # _wants_share is True when it is None
    return min(r.share, 2.0 * r.use + tuning.ramp)


def _corrected(r: _Reading, target: float, tuning: Tuning) -> tuple[float, SliceState]:
    """The quota (in the hook's measure) that gets `target` in NVML's.

    The hook measures its GPU time with events; NVML measures what ran. They
    differ (time slicing with other contexts makes a batch's events span
    the others' slices), so the quota is target x correction, and the
    correction is learnt from NVML: multiplied by (target / util) ** gain at
    each figure, in log space so that a factor of 3 is learnt as fast as
    one of 1.1. Anti-windup: a shortfall is learnt upward only for the
    part of the time the pacer held the vGPU back (the rest is its own
    choice; _bias_part), and alone on its GPU no higher than the hook's
    measure per NVML's (_seen_bias: above it, the vGPU using all of its
    quota would be seen over the target); an excess always, downward.
    Held in bursts, as a launch-bound process near its share is, a vGPU
    still learns upward: required to be held through half a second, it
    never did, and one NVML period over the share cut its quota for good
    (docs/compute.md, "Windows").
    """
    if target >= 1.0:
        return _quota_of(target, 1.0), r.state if r.state.target == 1.0 else r.state._replace(
            target=1.0
        )
    learn_from = r.state.learn_from_ns
    if target != r.state.target:  # most ticks aim where the last one did
        learn_from = _learn_from(r.state, target, r.now_ns, tuning)
    correction = r.state.correction
    u = r.fresh_nvml
    learning = r.calibrated and r.active and r.now_ns >= learn_from
    part = 1.0 if u is not None and u > target else _bias_part(r)
    if learning and u is not None and part > 0:
        exponent = tuning.ki * min(r.nvml_dt_s, tuning.max_step_s) * part
        ratio = target / u if u > 0 else tuning.max_step_factor
        factor = min(max(ratio**exponent, 1 / tuning.max_step_factor), tuning.max_step_factor)
        learnt = correction * factor
        if factor > 1 and r.alone:
            learnt = min(learnt, max(correction, _seen_bias(r)))
        correction = min(max(learnt, tuning.correction_min), tuning.correction_max)
    # A correction learnt while calibrated is kept, unused, for the next
    # time: the same work alone again has the same bias.
    quota = _quota_of(target, correction if r.calibrated else 1.0)
    s = r.state
    if (correction, target, learn_from) == (s.correction, s.target, s.learn_from_ns):
        return quota, s  # most ticks: nothing to copy
    return quota, s._replace(correction=correction, target=target, learn_from_ns=learn_from)


def _learn_from(s: SliceState, target: float, now_ns: int, tuning: Tuning) -> int:
    """From when NVML's figures are learnt from once the slice aims at
    ``target``: a new aim (below the whole device) makes the figures of
    the next Tuning.settle_s describe the time before it."""
    if target < 1.0 and abs(target - s.target) > tuning.target_change:
        return max(s.learn_from_ns, now_ns + round(tuning.settle_s * NS_PER_S))
    return s.learn_from_ns


def _quota_of(target: float, correction: float) -> float:
    """The quota (fraction) for a target in NVML's measure: the whole
    device unpaced; below it, never more than HARD_MAX, for a quota that
    rounds to 100 % would stop pacing, overshoot, and swing back."""
    return 1.0 if target >= 1.0 else min(HARD_MAX, target * correction)


# The part of the time held back after Tuning.settle_s of unbroken hold.
HELD_THROUGH = 1.0 - math.exp(-1.0)


def _bias_part(r: _Reading) -> float:
    """How much of a shortfall under the target is a bias to learn from.

    Alone on its GPU, the part of the time the pacer held the vGPU back:
    the rest of the shortfall is its own choice. Beside other vGPUs, all of
    it once held back through about Tuning.settle_s, else none: there one
    vGPU's holds change what the others' hooks measure, and learning from
    holds in bursts made their loops swing against each other (a soft vGPU
    at 30 beside a hard 70 on a time-sliced plant: 0.19-0.45 a tick,
    tests/unit/test_controller.py)."""
    if r.alone:
        return r.held_part
    return 1.0 if r.held_part >= HELD_THROUGH else 0.0


def _consistent(readings: list[_Reading], device_util: float | None, tuning: Tuning) -> bool:
    """Whether this tick's per-process figures add up to the device's.

    Only then are they learnt from. They do on the simulator; a real driver
    under time slicing was seen to leave out most processes' samples (an
    H200: one process per period), and an unmanaged process on the GPU
    makes the vGPUs' sum fall short; in both cases a correction learnt from
    them would be wrong, and the correction holds instead."""
    fresh = [r.fresh_nvml for r in readings if r.fresh_nvml is not None]
    if not fresh or device_util is None:
        return False
    return abs(sum(fresh) - device_util) <= max(
        tuning.consistency, tuning.consistency * device_util
    )


def _divide_gpu(
    readings: list[_Reading], device_util_pct: float | None, tuning: Tuning
) -> dict[Key, tuple[float, SliceState]]:
    device_util = None if device_util_pct is None else device_util_pct / 100.0
    if not _consistent(readings, device_util, tuning):
        readings = [r if r.fresh_nvml is None else r._replace(fresh_nvml=None) for r in readings]
    out: dict[Key, tuple[float, SliceState]] = {}
    for r in readings:
        if not r.alloc.soft:
            out[(r.alloc.vgpu_id, r.alloc.gpu)] = _corrected(r, r.share, tuning)

    spare = max(0.0, 1.0 - sum(_claim(r, device_util, tuning) for r in readings))
    soft = [r for r in readings if r.alloc.soft]
    extras = _water_fill(spare, [r for r in soft if r.active], tuning)
    for r in soft:
        key = (r.alloc.vgpu_id, r.alloc.gpu)
        out[key] = _corrected(r, min(1.0, r.share + extras.get(key, 0.0)), tuning)
    return out


def _extra_cap(r: _Reading, tuning: Tuning) -> float:
    """How much spare time a soft vGPU can use beyond its share now: all of it
    when it uses what it was given (or is held back), else room to grow."""
    if r.use is None or r.throttled > tuning.throttled_min:
        return 1.0
    if _uses_its_target(r.use, r.state.target, tuning):
        return 1.0
    return max(0.0, 2.0 * r.use + tuning.ramp - r.share)


def _near_share(use: float, share: float, tuning: Tuning) -> bool:
    """A vGPU using this much of its share may want all of it (``_claim``)."""
    return use >= tuning.near_share * share


def _uses_its_target(use: float, target: float, tuning: Tuning) -> bool:
    """A soft vGPU using this much of what it was given can use all of the
    spare time (``_extra_cap``)."""
    return use >= target - tuning.ramp / 2


def _water_fill(spare: float, soft: list[_Reading], tuning: Tuning) -> dict[Key, float]:
    """Divide `spare` by weight; what a capped vGPU cannot use goes to the rest."""
    extras: dict[Key, float] = {}
    open_ = list(soft)
    while open_ and spare > 1e-9:
        total_weight = sum(r.alloc.weight for r in open_)
        capped = [
            r for r in open_ if _extra_cap(r, tuning) <= spare * r.alloc.weight / total_weight
        ]
        if not capped:
            for r in open_:
                extras[(r.alloc.vgpu_id, r.alloc.gpu)] = spare * r.alloc.weight / total_weight
            break
        for r in capped:
            cap = _extra_cap(r, tuning)
            extras[(r.alloc.vgpu_id, r.alloc.gpu)] = cap
            spare -= cap
            open_.remove(r)
    return extras


def _to_ppm(quota: float, tuning: Tuning) -> int:
    ppm = round(quota * PPM_FULL / tuning.quantum_ppm) * tuning.quantum_ppm
    # Within a quantum of the whole device is the whole device: no pacing.
    if ppm >= PPM_FULL - tuning.quantum_ppm:
        return PPM_FULL
    return max(tuning.quantum_ppm, ppm)
