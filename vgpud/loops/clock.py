"""One clock for the daemon's periodic jobs: the control tick, the NVML
sample and the scan.

Each job runs at its own period, but on one grid: its runs fall on the
multiples of its period counted from the clock's start, so jobs whose
periods are multiples of one another (0.1, 0.2 and 1 s by default) fall
due at the same instants, and the event loop wakes once for all of them.
Why: on a shared VM a wake-up of the loop after a pause costs more than
the work it wakes for (its caches cold; docs/benchmarks/daemon.md), and
three loops each on its own timer woke it for each job apart.

A job runs at a fixed rate and never bursts to catch up after a stall:
after runs missed, it runs once at once, then on its grid again.
A period that changes (a reload, the controller's quiet period) takes
effect from the next run, on the new period's grid. A job that waits for
another thread (the scan) runs as a task of its own while the
clock goes on, and is not started again before its last run has ended.
Each run is timed (``timed``), but for a job that times itself; one that
fails is logged, and the job goes on.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

# A job due this soon after a wake-up runs at it: the grid's instants are
# sums of floats, and timers fire a little early or late.
JITTER_S = 0.002


@dataclass(frozen=True)
class Job:
    name: str
    period: Callable[[], float]  # asked after each run: it may change
    run: Callable[[], Awaitable[object]]
    waits: bool = False  # it waits for another thread: a task of its own
    timed: bool = True  # False: the job times itself (its work is elsewhere)


class Clock:
    def __init__(
        self,
        jobs: Sequence[Job],
        timed: Callable[[str, float], None],
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.jobs = tuple(jobs)
        self.timed = timed
        self.now = now
        self.sleep = sleep
        self._running: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Until cancelled; a cancel also cancels the jobs' own tasks."""
        origin = self.now()
        due = dict.fromkeys((j.name for j in self.jobs), origin)
        try:
            while True:
                woke = self.now()
                for job in self.jobs:
                    if due[job.name] > woke + JITTER_S:
                        continue
                    if job.waits:
                        self._start(job)
                    else:
                        await self._timed(job)
                    due[job.name] = _next(origin, due[job.name], job.period(), self.now())
                await self.sleep(max(0.0, min(due.values()) - self.now()))
        finally:
            running = [t for t in self._running.values() if not t.done()]
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def _start(self, job: Job) -> None:
        last = self._running.get(job.name)
        if last is not None and not last.done():
            return  # its last run goes on: this one is skipped
        self._running[job.name] = asyncio.get_running_loop().create_task(
            self._timed(job), name=f"vgpud-{job.name}"
        )

    async def _timed(self, job: Job) -> None:
        start = self.now()
        try:
            await job.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("loop iteration failed", loop=job.name)
        if job.timed:
            self.timed(job.name, self.now() - start)


def _next(origin: float, due: float, period: float, now: float) -> float:
    """The point of ``period``'s grid from ``origin`` after ``due``; after
    a stall that passed it, the last point passed (one run at once, then
    the grid again: no burst)."""
    after = max(due, now - period)
    return origin + (math.floor((after - origin) / period + 1e-9) + 1) * period
