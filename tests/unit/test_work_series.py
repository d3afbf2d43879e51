"""work_series: the GPU time recorded in a vgpu-burn trace, per 200 ms step.

The benchmark judges yield, settling and 1 s windows by these steps, so a
batch's time must land in the steps it ran in, all of it and only once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.compute_harness import (
    Completion,
    parse_trace,
    whole_steps,
    work_series,
)

T0 = 1_700_000_000.0  # a realtime stamp, as vgpu-burn writes them


def line(t: float, pid: int, kernels: int) -> str:
    return f"{T0 + t:.6f} {pid} {kernels}"


def approx(steps: list[float]) -> object:
    """Equal to within a thousandth of a point: stamps are microseconds."""
    return pytest.approx(steps, rel=0, abs=1e-3)


def test_batches_inside_a_step_add_up_exactly() -> None:
    # 10 x 1 ms and 20 x 1 ms in the first step, 40 x 1 ms in the third.
    trace = [line(0.05, 7, 10), line(0.15, 7, 20), line(0.55, 7, 40)]
    steps = work_series(trace, None, T0, T0 + 0.8, kernel_us=1000)
    assert steps == approx([15.0, 0.0, 20.0, 0.0])


def test_back_to_back_batches_fill_every_step() -> None:
    # 1 ms batches without a gap for 1 s: the device was busy all along.
    trace = [line(0.001 * (i + 1), 7, 1) for i in range(1000)]
    steps = work_series(trace, None, T0, T0 + 1.0, kernel_us=1000)
    assert steps == approx([100.0] * 5)


def test_a_batch_straddling_a_boundary_is_split_by_overlap() -> None:
    # 100 ms of kernels that ended 50 ms into the second step: half each.
    steps = work_series([line(0.25, 7, 5)], None, T0, T0 + 0.4, kernel_us=20000)
    assert steps == approx([25.0, 25.0])


def test_a_batch_longer_than_a_step_covers_every_step_it_spans() -> None:
    # 500 ms ending at 0.6 s: [0.1, 0.6] -> half of step 0, all of 1 and 2.
    steps = work_series([line(0.6, 7, 1)], None, T0, T0 + 0.8, kernel_us=500_000)
    assert steps == approx([50.0, 100.0, 100.0, 0.0])


def test_time_outside_the_window_is_not_counted() -> None:
    trace = [
        line(0.05, 7, 10),  # [-0.05, 0.05]: half before the window
        line(0.45, 7, 10),  # [0.35, 0.45]: half after it
        line(-0.5, 7, 10),  # wholly before
        line(1.0, 7, 10),  # wholly after
    ]
    steps = work_series(trace, None, T0, T0 + 0.4, kernel_us=10000)
    assert steps == approx([25.0, 25.0])


def test_pids_filter_keeps_only_those_processes() -> None:
    trace = [line(0.1, 7, 10), line(0.1, 8, 20), line(0.1, 9, 40)]
    assert work_series(trace, [8], T0, T0 + 0.2, kernel_us=1000) == approx([10.0])
    assert work_series(trace, {7, 9}, T0, T0 + 0.2, kernel_us=1000) == approx([25.0])
    assert work_series(trace, None, T0, T0 + 0.2, kernel_us=1000) == approx([35.0])
    assert work_series(trace, [], T0, T0 + 0.2, kernel_us=1000) == [0.0]


def test_empty_trace_is_idle_steps() -> None:
    assert work_series([], None, T0, T0 + 1.0, kernel_us=1000) == [0.0] * 5


def test_a_trace_file_reads_like_its_lines(tmp_path: Path) -> None:
    trace = [line(0.05, 7, 10), line(0.25, 8, 5)]  # [-0.15, 0.05] and [0.15, 0.25]
    path = tmp_path / "burn.trace"
    path.write_text("".join(f"{text}\n" for text in trace))
    from_file = work_series(path, None, T0, T0 + 0.4, kernel_us=20000)
    assert from_file == work_series(trace, None, T0, T0 + 0.4, kernel_us=20000)
    assert from_file == approx([25.0 + 25.0, 25.0])


def test_other_step_lengths() -> None:
    steps = work_series([line(0.25, 7, 5)], None, T0, T0 + 0.4, kernel_us=20000, step=0.1)
    assert steps == approx([0.0, 50.0, 50.0, 0.0])


def test_parse_trace_reads_what_vgpu_burn_writes() -> None:
    assert parse_trace(["1795248578.228440 30475 3"]) == [Completion(1795248578.228440, 30475, 3)]


@pytest.mark.parametrize(
    "bad",
    ["", "1.0 7", "1.0 7 3 extra", "soon 7 3", "1.0 seven 3", "1.0 7 -3", "nan 7 3", "1.0 7 2.5"],
)
def test_a_malformed_line_is_an_error_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=r"trace line 2: .* is not '<t> <pid> <kernels>'"):
        parse_trace([line(0.1, 7, 1), bad])


def test_only_whole_steps_are_counted() -> None:
    # A live change 3.33 s after the last: 16 steps of 200 ms fit before it,
    # a 17th would reach into what the change did.
    assert whole_steps(100.0, 103.33, 0.2) == 16
    assert whole_steps(100.0, 103.2, 0.2) == 16
    assert whole_steps(100.0, 100.05, 0.2) == 1
    lines = ["103.30 7 1000"]  # 1000 x 1 us finishing just before the change
    assert len(work_series(lines, None, 100.0, 103.33, kernel_us=1)) == 16
