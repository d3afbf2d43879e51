"""The tests' and benchmarks' yardstick of device utilization: NVML's
device sample buffer as 200 ms steps (tests/integration/compute_harness.py)."""

from __future__ import annotations

import pytest

from tests.integration.compute_harness import Samples, device_series, device_util


def periods(first_end: float, gaps: list[float], values: list[float]) -> Samples:
    ends, t = [], first_end
    for gap in gaps:
        t += gap
        ends.append(t)
    return Samples(periods=list(zip(ends, values, strict=True)))


def test_jittered_periods_leave_no_step_empty_and_keep_the_mean() -> None:
    # An H200's periods end 193-204 ms apart: by their middles alone, some
    # 200 ms steps held none (read 0) and others two.
    gaps = [0.193, 0.204] * 20
    samples = periods(100.0, gaps, [30.0] * 40)
    steps = device_series(samples, 100.5, 107.5)
    assert len(steps) == 35
    assert steps == pytest.approx([30.0] * 35)


def test_each_period_counts_by_its_time_in_the_window() -> None:
    samples = periods(100.0, [0.2] * 4, [0.0, 100.0, 0.0, 100.0])  # ends 100.2 .. 100.8
    # [100.1, 100.5): half of the first period (0), all of the second (100),
    # half of the third (0).
    assert device_util(samples, 100.1, 100.5) == pytest.approx(50.0)
    assert device_series(samples, 100.3, 100.7) == pytest.approx([50.0, 50.0])
    with pytest.raises(AssertionError):
        device_util(samples, 200.0, 201.0)


def test_without_a_buffer_the_rates_read_are_averaged() -> None:
    samples = Samples(device=[(100.05, 20.0), (100.15, 40.0), (100.25, 90.0)])
    assert device_util(samples, 100.0, 100.2) == pytest.approx(30.0)
    assert device_series(samples, 100.0, 100.4) == pytest.approx([30.0, 90.0])
