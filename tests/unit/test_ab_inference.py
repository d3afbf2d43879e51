"""benchmarks/ab_inference.py: two hook builds compared over alternated
runs, each case against its own run's native."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.ab_inference import load, order, parse, summary


def case(workload: str, share: int | None, rate: float, busy: float, **more: Any) -> dict[str, Any]:
    base = {"workload": workload, "share": share, "neighbour": None, "rate": rate, "busy": busy}
    return base | more


def write_run(folder: Path, name: str, native_rate: float, rate: float, theirs: float) -> None:
    beside_gemm = {"neighbour": 60, "neighbour_workload": "gemm", "neighbour_work": theirs}
    cases = [
        case("adds", None, native_rate, 40.0),
        case("adds", 30, rate, 95.0, **beside_gemm),
    ]
    (folder / name).mkdir(parents=True)
    (folder / name / "inference.json").write_text(json.dumps(cases))


def test_the_builds_alternate() -> None:
    assert order(4, b_first=False) == ["A", "B", "A", "B"]
    assert order(3, b_first=True) == ["B", "A", "B"]


def test_each_build_is_summed_up_against_its_own_runs_natives(tmp_path: Path) -> None:
    # The native rate moves between runs: A did half its native, then 0.6 of
    # a slower one; B 0.7 and 0.8.
    write_run(tmp_path / "call1", "1A", 100.0, 50.0, 70.0)
    write_run(tmp_path / "call1", "2B", 100.0, 70.0, 71.0)
    write_run(tmp_path / "call2", "1A", 50.0, 30.0, 62.0)
    write_run(tmp_path / "call2", "2B", 50.0, 40.0, 71.0)
    text = summary(load([tmp_path / "call1", tmp_path / "call2"]))
    assert "Runs: 2 of A, 2 of B." in text
    assert "| adds | 30 | gemm 60 | A | 2 | 0.55 (0.50-0.60) | 66.0 (62.0-70.0) | 95.0" in text
    assert "| adds | 30 | gemm 60 | B | 2 | 0.75 (0.70-0.80) | 71.0 (71.0-71.0) |" in text
    # Natives are the yardstick, not rows.
    assert "native" not in text.split("\n", 3)[3]


def test_a_run_needs_the_bench_arguments_and_a_build_b() -> None:
    with pytest.raises(SystemExit):
        parse(["out", "--patch", "x.patch"])
    with pytest.raises(SystemExit):
        parse(["out", "--", "--daemon"])
    args = parse(["out", "--cflags-b", "-O2 -DX=1", "--", "--daemon", "--seconds", "5"])
    assert args.bench == ["--daemon", "--seconds", "5"]
    assert parse(["--summary", "a", "b"]).out == [Path("a"), Path("b")]


STOPPED_RUN = """
import sys
from pathlib import Path
from benchmarks.ab_inference import patched, run_bench, stop_on_sigterm
root = Path(sys.argv[1])
stop_on_sigterm()
with patched(root / "b.patch", root):
    run_bench(["sh", "-c", "sleep 60 & echo $! > " + str(root / "pid") + "; wait"])
"""


@pytest.mark.skipif(
    shutil.which("patch") is None,
    reason="no patch(1): tests/e2e/install_deps.sh installs it as root with apt-get",
)
def test_a_run_stopped_by_sigterm_takes_its_patch_out_and_its_workloads_with_it(
    tmp_path: Path,
) -> None:
    # A `timeout` around the script once left build B's patch in the tree,
    # and a run's workloads on the GPU, for what ran after it.
    (tmp_path / "f").write_text("a\n")
    (tmp_path / "b.patch").write_text("--- x/f\n+++ y/f\n@@ -1 +1 @@\n-a\n+b\n")
    root = Path(__file__).resolve().parents[2]
    script = subprocess.Popen([sys.executable, "-c", STOPPED_RUN, str(tmp_path)], cwd=root)
    pid_file = tmp_path / "pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert script.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    assert (tmp_path / "f").read_text() == "b\n"
    workload = int(pid_file.read_text())
    script.send_signal(signal.SIGTERM)
    assert script.wait(timeout=30) == 128 + signal.SIGTERM
    assert (tmp_path / "f").read_text() == "a\n"
    deadline = time.monotonic() + 10
    while running(workload) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(workload)


def running(pid: int) -> bool:
    """Alive, not a zombie waiting for whoever reaps orphans."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
