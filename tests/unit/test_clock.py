"""The daemon's one clock (vgpud/loops/clock.py): every job at its own
period, on one grid, so that jobs whose periods are multiples of one
another share the event loop's wake-ups; no burst after a stall; a job
that waits for a thread is never run twice at once; a failing job goes
on. Driven by a fake clock: a sleep moves it forward."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from vgpud.loops.clock import Clock, Job


class FakeTime:
    def __init__(self, until: float) -> None:
        self.t = 0.0
        self.until = until
        self.wakes: list[float] = []
        self.ended = asyncio.Event()  # the clock sleeps past ``until``

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        for _ in range(3):  # the jobs' own tasks run while the clock sleeps
            await asyncio.sleep(0)
        if self.t + seconds > self.until + 1e-9:
            self.ended.set()
            await asyncio.Event().wait()  # the test cancels the clock
        self.t += seconds
        self.wakes.append(round(self.t, 6))


def job(
    name: str,
    period: float | Callable[[], float],
    runs: dict[str, list[float]],
    t: FakeTime,
    waits: bool = False,
    timed: bool = True,
) -> Job:
    async def run() -> None:
        runs.setdefault(name, []).append(round(t.t, 6))

    return Job(name, period if callable(period) else lambda: period, run, waits, timed)


async def run_clock(clock: Clock, t: FakeTime) -> None:
    task = asyncio.get_running_loop().create_task(clock.run())
    await asyncio.wait_for(t.ended.wait(), timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=10)  # its jobs' tasks cancelled too


def grid(period: float, until: float) -> list[float]:
    return [round(k * period, 6) for k in range(int(until / period + 1e-9) + 1)]


async def test_the_jobs_share_the_wake_ups_of_the_fastest() -> None:
    t = FakeTime(until=2.0)
    runs: dict[str, list[float]] = {}
    timed: list[str] = []
    clock = Clock(
        [
            job("control", 0.1, runs, t),
            job("sample", 0.2, runs, t, timed=False),  # it times itself
            job("scan", 1.0, runs, t, waits=True),
        ],
        lambda name, seconds: timed.append(name),
        t.now,
        t.sleep,
    )
    await run_clock(clock, t)
    assert runs["control"] == grid(0.1, 2.0)
    assert runs["sample"] == grid(0.2, 2.0)
    assert runs["scan"] == grid(1.0, 2.0)
    # The loop woke for the control ticks only.
    assert t.wakes == grid(0.1, 2.0)[1:]
    assert sorted(timed) == sorted(n for n, r in runs.items() if n != "sample" for _ in r)


async def test_a_longer_period_stays_on_the_grid_of_the_others() -> None:
    """The controller's quiet period (0.2 s after a tick that computed
    nothing) lands on the sample's instants, which it then shares."""
    t = FakeTime(until=2.0)
    runs: dict[str, list[float]] = {}

    def control_period() -> float:
        return 0.1 if t.t < 0.35 or t.t > 1.45 else 0.2

    clock = Clock(
        [job("control", control_period, runs, t), job("sample", 0.2, runs, t, waits=True)],
        lambda name, seconds: None,
        t.now,
        t.sleep,
    )
    await run_clock(clock, t)
    assert runs["control"] == [
        0.0,
        0.1,
        0.2,
        0.3,
        0.4,
        0.6,
        0.8,
        1.0,
        1.2,
        1.4,
        1.6,
        1.7,
        1.8,
        1.9,
        2.0,
    ]
    assert runs["sample"] == grid(0.2, 2.0)
    assert t.wakes == runs["control"][1:]


async def test_a_stall_is_not_made_up_in_a_burst() -> None:
    t = FakeTime(until=1.0)
    runs: dict[str, list[float]] = {}

    async def stalls() -> None:
        runs.setdefault("control", []).append(round(t.t, 6))
        if len(runs["control"]) == 3:
            t.t += 0.35  # a tick that held the loop for three and a half periods

    clock = Clock([Job("control", lambda: 0.1, stalls)], lambda n, s: None, t.now, t.sleep)
    await run_clock(clock, t)
    # One run at once after the stall, then the grid again.
    assert runs["control"] == [0.0, 0.1, 0.2, 0.55, 0.6, 0.7, 0.8, 0.9, 1.0]


async def test_a_job_that_waits_is_not_started_again_before_it_ends() -> None:
    t = FakeTime(until=1.0)
    started: list[float] = []
    release = asyncio.Event()

    async def slow() -> None:
        started.append(round(t.t, 6))
        if len(started) == 1:
            await release.wait()  # its thread, still at work

    runs: dict[str, list[float]] = {}

    async def control() -> None:
        runs.setdefault("control", []).append(round(t.t, 6))
        if t.t >= 0.45:
            release.set()

    clock = Clock(
        [Job("control", lambda: 0.1, control), Job("scan", lambda: 0.2, slow, waits=True)],
        lambda n, s: None,
        t.now,
        t.sleep,
    )
    await run_clock(clock, t)
    # Held from 0 to 0.5: the runs due at 0.2 and 0.4 were skipped.
    assert started == [0.0, 0.6, 0.8, 1.0]
    assert runs["control"] == grid(0.1, 1.0)


async def test_a_failing_job_goes_on_and_is_timed() -> None:
    t = FakeTime(until=0.5)
    calls: list[float] = []
    timed: list[str] = []

    async def fails() -> None:
        calls.append(t.t)
        raise RuntimeError("one bad scan")

    clock = Clock(
        [Job("control", lambda: 0.1, fails), Job("scan", lambda: 0.1, fails, waits=True)],
        lambda name, seconds: timed.append(name),
        t.now,
        t.sleep,
    )
    await run_clock(clock, t)
    assert len(calls) == 12  # six instants, two jobs
    assert timed.count("control") == 6 and timed.count("scan") == 6


async def test_cancelling_the_clock_cancels_the_jobs_it_started() -> None:
    t = FakeTime(until=0.05)
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    clock = Clock(
        [Job("scan", lambda: 1.0, forever, waits=True)], lambda n, s: None, t.now, t.sleep
    )
    await run_clock(clock, t)
    assert cancelled.is_set()
