"""benchmarks/plot_inference.py: the target and work it plots for each case
(against the native of the case's own run), and the figure it writes from
several runs' files."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.plot_inference import load, points, unique

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "plot_inference.py"


def case(
    workload: str, share: int | None, rate: float | None, busy: float, **more: Any
) -> dict[str, Any]:
    base = {"workload": workload, "share": share, "neighbour": None, "rate": rate, "busy": busy}
    return base | {"busy_windows": [busy - 1, busy + 2]} | more


def fast_run() -> list[dict[str, Any]]:
    """A run on a fast machine: chain natively 60 % busy at 100 units/s."""
    return [
        case("chain", None, 100.0, 60.0),
        # Its mean below its windows, as sliding windows allow.
        case("chain", 30, 40.0, 29.0, busy_windows=[29.5, 31.0]),
        case("chain", 90, 95.0, 58.0),
        case("chain", 30, 25.0, 88.0, neighbour=0, neighbour_work=70.0),
    ]


def slow_run() -> list[dict[str, Any]]:
    """Another run, slower: chain natively 80 % busy at 50 units/s; and a
    GEMM neighbour's native alone, which makes no row of its own."""
    return [
        case("gemm", None, 10.0, 100.0),
        case("chain", None, 50.0, 80.0),
        case("chain", 90, 45.0, 79.0),
        case("chain", 30, 20.0, 90.0, neighbour=60, neighbour_workload="gemm"),
    ]


def test_target_is_the_share_or_the_native_busy_whichever_is_lower() -> None:
    native, at30, at90, beside = points(fast_run(), "fast")
    assert native.target is None
    assert at30.target == 30
    assert at90.target == 60.0  # the native busy binds above it
    assert beside.target == 30
    assert (at30.busy, at30.windows) == (29.0, (29.5, 31.0))
    assert at90.windows == (57.0, 60.0)


def test_work_is_the_rate_against_the_native_rate_of_the_same_run() -> None:
    fast = {(p.share, p.neighbour): p for p in points(fast_run(), "fast")}
    slow = {(p.share, p.neighbour): p for p in points(slow_run(), "slow")}
    assert fast[(None, None)].work == 1.0
    assert fast[(30, None)].work == pytest.approx(0.4)
    assert fast[(90, None)].work == pytest.approx(0.95)
    assert fast[(30, 0)].work == pytest.approx(0.25)
    assert fast[(30, 0)].neighbour_work == 70.0
    # The slow run's own native (50 units/s, 80 % busy), not the fast one's.
    assert slow[(90, None)].work == pytest.approx(0.9)
    assert slow[(90, None)].target == 80.0
    assert slow[(30, 60)].work == pytest.approx(0.4)
    assert slow[(30, 60)].neighbour_name == "gemm"


def test_a_case_whose_run_has_no_native_gets_no_target_or_work() -> None:
    (lone,) = points([case("adds", 30, 5.0, 20.0)])
    assert (lone.target, lone.work) == (None, None)


def test_a_transcribed_case_with_no_rate_keeps_its_target_but_gets_no_work() -> None:
    native, at30 = points([case("chain", None, 1.0, 50.0), case("chain", 30, None, 30.0)])
    assert (at30.target, at30.work) == (30, None)
    assert native.work == 1.0


def test_a_bench_file_and_a_transcribed_file_load_as_runs(tmp_path: Path) -> None:
    bench = [tmp_path / machine / "out" / "inference.json" for machine in ("h100", "h200")]
    for path in bench:
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(fast_run()))
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"label": "from a report", "note": "by hand", "cases": slow_run()}))
    runs = [load(path) for path in [*bench, doc]]
    assert [label for label, _ in runs] == ["out", "out", "from a report"]
    assert runs[2][1] == slow_run()
    # Two OUT folders of one name stay two runs, each with its own native.
    assert [label for label, _ in unique(runs)] == ["out", "out (2)", "from a report"]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_script_draws_several_runs_into_one_png(tmp_path: Path) -> None:
    fast, slow = tmp_path / "fast.json", tmp_path / "slow.json"
    fast.write_text(json.dumps(fast_run()))
    slow.write_text(json.dumps({"label": "slow", "note": "test", "cases": slow_run()}))
    out = tmp_path / "inference.png"
    subprocess.run(
        [sys.executable, str(SCRIPT), str(fast), str(slow), "--out", str(out)], check=True
    )
    assert out.stat().st_size > 10_000
    # One row (chain: gemm has only its native), three panels (co-located cases
    # present), each 5 x 3 inches at 100 dpi.
    assert png_size(out) == (1500, 300)


def test_without_co_located_cases_the_figure_has_two_panels(tmp_path: Path) -> None:
    alone = tmp_path / "alone.json"
    alone.write_text(json.dumps([*fast_run()[:3], case("adds", None, 9.0, 40.0)]))
    out = tmp_path / "alone.png"
    subprocess.run([sys.executable, str(SCRIPT), str(alone), "--out", str(out)], check=True)
    assert png_size(out) == (1000, 300)  # adds has no case beside its native


def test_in_a_run_of_rounds_each_case_is_against_its_own_rounds_native() -> None:
    """bench_inference.py --rounds: the VM's pace moves between rounds, so a
    case's work is its rate against the native of its round."""
    cases = [
        case("adds", None, 100.0, 45.0, round=0),
        case("adds", 30, 60.0, 30.0, round=0),
        case("adds", None, 70.0, 32.0, round=1),
        case("adds", 30, 56.0, 29.0, round=1),
    ]
    _, first, _, second = points(cases)
    assert first.work == pytest.approx(0.6)
    assert second.work == pytest.approx(0.8)
    assert (first.target, second.target) == (30, 30)
