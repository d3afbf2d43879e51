"""benchmarks/plot_neighbour_windows.py: one line per run of the
neighbour's 1 s windows, and a clear error for a run without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.plot_neighbour_windows import main, series


def run(tmp_path: Path, name: str, windows: list[float] | None) -> Path:
    case = {"workload": "phases", "share": 30, "neighbour": 60, "neighbour_work": 60.0}
    if windows is not None:
        case["neighbour_work_windows"] = windows
    native = {"workload": "phases", "share": None, "neighbour": None}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps([native, case]))
    return path


def test_each_run_is_drawn(tmp_path: Path) -> None:
    before = run(tmp_path, "before", [70.0, 42.0, 44.0, 69.0])
    after = run(tmp_path, "after", [70.0, 66.0, 64.0, 69.0])
    assert series(before, "phases") == [[70.0, 42.0, 44.0, 69.0]]
    out = tmp_path / "windows.png"
    assert main(["--workload", "phases", "--out", str(out), f"2 s={before}", f"0.1 s={after}"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")


def test_a_run_without_windows_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = run(tmp_path, "old", None)
    with pytest.raises(SystemExit) as exit_:
        main(["--workload", "phases", "--out", str(tmp_path / "x.png"), f"A={old}"])
    assert exit_.value.code == 2
    assert "old.json: no co-located phases case" in capsys.readouterr().err
