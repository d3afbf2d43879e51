"""Measuring compute isolation on a GPU or the simulator: an NVML sampler in
a child process, vgpu-burn runs, and the arithmetic on what NVML saw and on
the work the burns report.

Shared by the simulator integration tests (tests/integration/test_compute*.py)
and the benchmark (benchmarks/bench_compute.py), so both measure alike:

- ``Sampler(env, device)``: a child (``python -m tests.integration.compute_harness``)
  that prints, as JSON lines, each new period of NVML's device sample
  buffer (200 ms periods, nvmlDeviceGetSamples), NVML's device rate every
  100 ms (nvmlDeviceGetUtilizationRates), and every new per-process sample;
  ``.samples`` fills as they come; ``.wait_past(t)`` until it has read NVML
  after t; ``.stop()``. The device's utilization is judged by the periods
  where the driver keeps them: on an H200 the rate covers only part of
  each period, and a load paced in a cycle near it reads anything from 0
  to 100 % (docs/compute.md, "NVML's device figure").
- ``Burn.start(cmd, env, kernel_us, trace=None)``: a vgpu-burn run, with
  ``--trace FILE`` when a trace path is given; ``.finish(timeout)``,
  ``.pids``, ``.work`` (kernels completed x kernel time / wall time),
  ``.completions()`` (its trace), ``.work_series(start, end)`` (its trace
  as 200 ms steps).
- ``series(samples, pids, start, end)``: utilization of a set of processes per
  200 ms step; ``device_series`` the same of the device's utilization;
  ``device_util(samples, start, end)``; ``windows(steps)``: 1 s
  sliding means; ``settle_time(steps, target, tol)``.
- ``work_series(trace, pids, start, end, kernel_us)``: the GPU time that
  kernels recorded in a vgpu-burn trace occupied, per 200 ms step. NVML's
  per-process figure is averaged over about a second on recent drivers and
  wrong when processes share the GPU; the work the kernels completed is
  neither, so it is what short windows are judged by.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_PERIOD_S = 0.1
PERIOD_S = 0.2  # NVML's sample period (device buffer and per-process samples)
LOOKBACK_S = 1.0  # how far back process samples are asked for (see sample_main)


def sample_main(device: int) -> int:
    """Print NVML figures as JSON lines until killed: {"t", "dev"} every
    SAMPLE_PERIOD_S and {"t", "pid", "ts", "util"} per new process sample.

    Process samples are asked for from a second back and deduplicated per
    process: a driver keeps about one sample per process, stamped when that
    process's period ended, so asking only for samples newer than the newest
    one seen would drop other processes' samples stamped a little earlier.
    """
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(device)
    seen: dict[int, int] = {}  # pid -> timestamp of its newest sample printed
    out = sys.stdout
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    newest_period_us: int | None = int(time.time() * 1e6)  # None: no sample buffer
    while True:
        now = time.time()
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        out.write(json.dumps({"t": now, "dev": util}) + "\n")
        if newest_period_us is not None:
            try:
                _, periods = pynvml.nvmlDeviceGetSamples(
                    handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, newest_period_us
                )
            except pynvml.NVMLError_NotFound:
                periods = []  # none ended since
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
                periods, newest_period_us = [], None
            for p in sorted(periods, key=lambda p: p.timeStamp):
                if newest_period_us is not None and p.timeStamp > newest_period_us:
                    newest_period_us = p.timeStamp
                    line = {"t": now, "period": p.timeStamp / 1e6, "busy": p.sampleValue.uiVal}
                    out.write(json.dumps(line) + "\n")
        since = max(0, int((now - LOOKBACK_S) * 1e6))
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since)
        except pynvml.NVMLError:
            samples = []  # none in the last LOOKBACK_S
        for s in sorted(samples, key=lambda s: s.timeStamp):
            if s.timeStamp <= seen.get(s.pid, 0):
                continue
            seen[s.pid] = s.timeStamp
            line = {"t": now, "pid": s.pid, "ts": s.timeStamp / 1e6, "util": s.smUtil}
            out.write(json.dumps(line) + "\n")
        out.flush()
        time.sleep(SAMPLE_PERIOD_S)


@dataclass
class Samples:
    device: list[tuple[float, float]] = field(default_factory=list)  # rate: (read at, %)
    periods: list[tuple[float, float]] = field(default_factory=list)  # buffer: (period end, %)
    procs: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # pid -> (end, %)


class Sampler:
    """The sampler child and what it has printed so far."""

    def __init__(self, env: dict[str, str], device: int) -> None:
        cmd = [sys.executable, "-m", "tests.integration.compute_harness", "--device", str(device)]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.samples = Samples()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            rec = json.loads(line)
            if "dev" in rec:
                self.samples.device.append((rec["t"], float(rec["dev"])))
            elif "period" in rec:
                self.samples.periods.append((rec["period"], float(rec["busy"])))
            else:
                self.samples.procs.setdefault(rec["pid"], []).append((rec["ts"], rec["util"]))

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.samples.device:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the NVML sampler did not start")
            time.sleep(0.05)

    def wait_past(self, t: float, timeout: float = 5.0) -> None:
        """Until the sampler has read NVML after time t (the figures of a
        period arrive up to one sampling period after it ends)."""
        deadline = time.monotonic() + timeout
        while (
            not self.samples.device
            or self.samples.device[-1][0] < t + 2 * SAMPLE_PERIOD_S
            or (self.samples.periods and self.samples.periods[-1][0] < t)
        ):
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)

    def stop(self) -> Samples:
        self.proc.terminate()
        self.proc.wait(10)
        self._reader.join(10)
        return self.samples


# --- analysis: NVML per-process samples as 200 ms steps -------------------------


def whole_steps(start: float, end: float, step: float) -> int:
    """How many whole steps fit in [start, end) (at least one): a partial
    last step would reach past `end`, into what comes next (the next live
    change of a share, the end of a run)."""
    return max(1, math.floor((end - start) / step + 1e-6))


def series(samples: Samples, pids: Sequence[int], start: float, end: float) -> list[float]:
    """Utilization (%) of a set of processes per 200 ms step in [start, end):
    each process's samples cover the 200 ms before their timestamp."""
    steps = whole_steps(start, end, 0.2)
    total = [0.0] * steps
    for pid in pids:
        for ts, util in samples.procs.get(pid, []):
            i = math.floor((ts - 0.1 - start) / 0.2)  # the middle of the period it covers
            if 0 <= i < steps:
                total[i] += util
    return total


def device_series(samples: Samples, start: float, end: float) -> list[float]:
    """NVML device utilization (%) per 200 ms step in [start, end): the
    buffer's periods weighted by how much of the step each covers (periods
    end 193-204 ms apart on an H200, so a step may hold none or two whole);
    without a buffer, the mean of the rates read in each step. 0 for a step
    with none."""
    steps = whole_steps(start, end, 0.2)
    bounds = [(start + 0.2 * i, start + 0.2 * (i + 1)) for i in range(steps)]
    return [_device_mean(samples, a, b) or 0.0 for a, b in bounds]


def device_util(samples: Samples, start: float, end: float) -> float:
    """Mean NVML device utilization (%) in [start, end): of the buffer's
    periods, each weighted by its time in it (else of the rates read in it)."""
    mean = _device_mean(samples, start, end)
    if mean is None:
        raise AssertionError(f"no NVML device sample between {start} and {end}")
    return mean


def _device_mean(samples: Samples, start: float, end: float) -> float | None:
    """The device's mean utilization over [start, end), None if unknown."""
    if not samples.periods:
        part = [u for t, u in samples.device if start <= t < end]
        return sum(part) / len(part) if part else None
    covered = busy = 0.0
    began = samples.periods[0][0] - PERIOD_S
    for stop, util in samples.periods:
        # A period runs from the previous one's end (the first: a period back).
        overlap = min(stop, end) - max(began, start)
        if overlap > 0:
            covered += overlap
            busy += overlap * util
        began = stop
    return busy / covered if covered > 0 else None


# --- analysis: the work vgpu-burn --trace recorded, as 200 ms steps -----------


@dataclass(frozen=True)
class Completion:
    """One line of a vgpu-burn trace: `kernels` completed, seen at `t`."""

    t: float  # CLOCK_REALTIME, comparable with time.time()
    pid: int
    kernels: int


def parse_trace(lines: Iterable[str]) -> list[Completion]:
    """The completions in vgpu-burn trace lines "<t> <pid> <kernels>"."""
    return [_completion(number, line) for number, line in enumerate(lines, 1)]


def _completion(number: int, line: str) -> Completion:
    fields = line.split()
    with contextlib.suppress(ValueError):
        if len(fields) == 3:
            c = Completion(float(fields[0]), int(fields[1]), int(fields[2]))
            if math.isfinite(c.t) and c.kernels >= 0:
                return c
    raise ValueError(f"trace line {number}: {line.strip()!r} is not '<t> <pid> <kernels>'")


def work_series(
    trace: Path | Iterable[str],
    pids: Collection[int] | None,
    start: float,
    end: float,
    kernel_us: float,
    step: float = 0.2,
) -> list[float]:
    """GPU time (% of each step) that the kernels of a vgpu-burn trace (a
    file, or its lines) occupied per step in [start, end); pids None: every
    process in the trace.

    A batch of n kernels seen complete at t ran back to back just before:
    its n x kernel_us of GPU time is spread evenly over [t - n x kernel_us,
    t] and each step gets the part that overlaps it.
    """
    lines = trace.read_text().splitlines() if isinstance(trace, Path) else trace
    steps = whole_steps(start, end, step)
    busy = [0.0] * steps  # seconds per step
    for c in parse_trace(lines):
        if pids is not None and c.pid not in pids:
            continue
        # Relative to start first: epoch seconds keep only ~0.2 us of
        # precision, too little to subtract kernel times from one by one.
        hi = c.t - start
        lo = hi - c.kernels * kernel_us / 1e6
        for i in range(max(0, math.floor(lo / step)), min(steps, math.floor(hi / step) + 1)):
            busy[i] += max(0.0, min(hi, (i + 1) * step) - max(lo, i * step))
    return [100 * s / step for s in busy]


def windows(values: list[float], per_window: int = 5) -> list[float]:
    """Means of every run of `per_window` consecutive steps (1 s sliding)."""
    return [
        sum(values[i : i + per_window]) / per_window for i in range(0, len(values) - per_window + 1)
    ]


# vgpu-burn shaped like eager inference: 50 us kernels, each after 250 us
# of CPU (a sixth of the simulated device natively on an idle box).
LAUNCH_BOUND = ("--kernel-us", "50", "--gap-us", "250", "--sync", "50")


@dataclass
class Burn:
    """A vgpu-burn run and its JSON answer."""

    proc: subprocess.Popen[str]
    kernel_us: int
    trace: Path | None = None
    records: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        cmd: Sequence[str],
        env: dict[str, str],
        kernel_us: int,
        trace: Path | None = None,
        pass_fds: Sequence[int] = (),
    ) -> Burn:
        """Run cmd (a vgpu-burn command line); with a trace path, it also
        appends its completions there (--trace). ``pass_fds`` stay open in
        it (--lockstep's pipes)."""
        args = [*cmd, "--trace", str(trace)] if trace is not None else list(cmd)
        proc = subprocess.Popen(
            args,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=pass_fds,
        )
        return cls(proc, kernel_us, trace)

    def finish(self, timeout: float) -> None:
        out, err = self.proc.communicate(timeout=timeout)
        for line in out.splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                self.records.append(json.loads(line))
        if self.proc.returncode != 0:
            raise RuntimeError(f"vgpu-burn failed ({self.proc.returncode}): {err.strip()}")

    @property
    def pids(self) -> list[int]:
        """The processes that ran kernels (known once it finished; until then
        the one started, which is the one working unless --procs > 1)."""
        return [r["pid"] for r in self.records if "pid" in r] or [self.proc.pid]

    @property
    def work(self) -> float:
        """Fraction of the device the kernels it completed occupied (the
        burn's own "work": kernels x kernel time / wall time)."""
        summary = next(r for r in self.records if r.get("summary"))
        return float(summary["work"])

    def completions(self) -> list[Completion]:
        """What its trace recorded so far."""
        return parse_trace(self._trace_lines())

    def work_series(self, start: float, end: float) -> list[float]:
        """Its work per 200 ms step in [start, end), from its own trace."""
        return work_series(self._trace_lines(), None, start, end, self.kernel_us)

    def _trace_lines(self) -> list[str]:
        if self.trace is None:
            raise ValueError("this burn was started without a trace")
        return self.trace.read_text().splitlines()


def settle_time(steps: list[float], target: float, tol: float, above: bool = False) -> float | None:
    """Seconds until the 200 ms steps stay within tol of target (or above
    target - tol) to the end; None if they never do."""
    ok = [(u >= target - tol) if above else abs(u - target) <= tol for u in steps]
    for i in range(len(ok)):
        if all(ok[i:]) and ok[i:]:
            return round(0.2 * (i + 1), 1)  # the step ends 200 ms after it starts
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description="print NVML utilization as JSON lines")
    parser.add_argument("--device", type=int, default=0)
    return sample_main(parser.parse_args().device)


if __name__ == "__main__":
    sys.exit(main())
