"""benchmarks/bench_inference.py's report: with --rounds, each case against
its own round's native and a summary over the rounds; written to OUT after
every case, so a run cut short keeps what it measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_inference import Workload, report


def case(workload: str, share: int | None, rate: float, busy: float, **more: Any) -> dict[str, Any]:
    base = {"workload": workload, "share": share, "neighbour": None, "rate": rate, "busy": busy}
    return base | {"busy_windows": [busy - 1, busy + 1]} | more


def test_one_round_reports_as_before(tmp_path: Path) -> None:
    text = report([case("adds", None, 100.0, 45.0), case("adds", 30, 60.0, 30.0)], [], tmp_path)
    assert text.splitlines()[0].startswith("| workload |")
    assert "| adds | 30 |  | 0.60 | 30.0 |" in text
    assert "Over the rounds" not in text


def test_rounds_are_judged_against_their_own_native_and_summed_up(tmp_path: Path) -> None:
    gemm = {"neighbour": 60, "neighbour_workload": "gemm"}
    cases = [
        case("hf-b1", None, 80.0, 21.0, round=0),
        case("hf-b1", 30, 48.0, 80.0, round=0, neighbour_work=70.0, **gemm),
        case("hf-b1", None, 60.0, 20.0, round=1),
        case("hf-b1", 30, 48.0, 90.0, round=1, neighbour_work=66.0, **gemm),
    ]
    text = report(cases, ["chain (share 30): crashed"], tmp_path)
    lines = text.splitlines()
    assert lines[0].startswith("| round | workload |")
    # Round 1's case against round 1's native (0.60), round 2's against its own (0.80).
    assert "| 1 | hf-b1 | 30 | gemm 60 | 0.60 |" in text
    assert "| 2 | hf-b1 | 30 | gemm 60 | 0.80 |" in text
    summary = lines[lines.index("Over the rounds (mean, range):") + 2 :]
    assert (
        "| hf-b1 | 30 | gemm 60 | 2 | 0.70 (0.60-0.80) | 85.0 (80.0-90.0) | 68.0 (66.0-70.0) |"
        in summary
    )
    assert "Failed: chain (share 30): crashed" in text
    assert json.loads((tmp_path / "inference.json").read_text()) == cases
    assert (tmp_path / "inference.md").read_text() == text


def test_a_neighbour_that_loses_its_share_for_a_second_shows_in_its_worst_window() -> None:
    # A neighbour reporting every 0.25 s: 100 units a second, except one
    # second at 40. Its mean barely moves; its worst 1 s window does.
    reports, units, t = [], 0, 0.0
    for step in range(40):
        units += 10 if 16 <= step < 20 else 25
        t += 0.25
        reports.append((t, units))
    run = Workload(proc=None, reports=reports)  # type: ignore[arg-type]
    rates = run.window_rates(0.0, 10.0)
    assert min(rates) == pytest.approx(40.0)
    assert max(rates) == pytest.approx(100.0)
    assert run.rate(0.0, 10.0) > 90.0


def test_the_neighbours_worst_window_is_in_its_row(tmp_path: Path) -> None:
    beside = {"neighbour": 60, "neighbour_workload": "gemm", "neighbour_work": 70.2}
    cases = [
        case("phases", None, 10.0, 60.0),
        case("phases", 30, 5.0, 80.0, neighbour_work_windows=[71.0, 52.5, 70.0], **beside),
    ]
    assert "| 70.2 (1 s: 52.5 worst) |" in report(cases, [], tmp_path)
