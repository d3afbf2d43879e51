"""benchmarks/bench_hook_cost.py: sides alternated one at a time, each
hooked turn judged against the native turn of its cycle."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUB_TORCH = ROOT / "tests" / "fixtures" / "stub_torch"


def test_sides_take_turns_and_are_judged_against_their_cycles_native(
    tmp_path: Path, sim_env: dict[str, str]
) -> None:
    # The stub's adds run at half speed under a share: the hooked sides
    # must read about 0.5 of native, whatever the machine's pace.
    env = dict(sim_env, PYTHONPATH=f"{STUB_TORCH}{os.pathsep}{ROOT}")
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_hook_cost.py"), str(out)]
    cmd += ["--workloads", "adds", "--sides", "native,100,50", "--cycles", "3"]
    cmd += ["--turn-s", "1", "--settle-s", "0.3"]
    subprocess.run(cmd, env=env, cwd=ROOT, check=True, timeout=120, stdout=subprocess.DEVNULL)
    record = json.loads((out / "hook-cost.json").read_text())
    rows = {r["side"]: r for r in record["rows"]}
    assert rows["100"]["vs_native"] == pytest.approx(0.5, abs=0.15)
    assert rows["50"]["vs_native"] == pytest.approx(0.5, abs=0.15)
    turns = record["turns"]
    assert len(turns) == 9
    # One side at a time: no two turns overlap, and each cycle holds each
    # side once, in rotated order.
    for first, second in itertools.pairwise(turns):
        assert first["end"] <= second["start"]
    orders = [[t["side"] for t in turns[i : i + 3]] for i in range(0, 9, 3)]
    assert orders == [["native", "100", "50"], ["100", "50", "native"], ["50", "native", "100"]]
    assert "| adds | 50 | 3 |" in (out / "hook-cost.md").read_text()


def test_a_side_must_be_native_or_a_share(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_hook_cost.py"), str(tmp_path)]
    for sides in ("native,101", "native,90@/no/such/hook.so", "90,60", "native,90,90"):
        done = subprocess.run([*cmd, "--sides", sides], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2, sides
        assert "--sides" in done.stderr or "side" in done.stderr


def test_the_plot_judges_each_workloads_turns_against_their_own_natives() -> None:
    from benchmarks.plot_hook_cost import ratios

    def turn(side: str, cycle: int, rate: float) -> dict[str, object]:
        return {"side": side, "cycle": cycle, "rate": rate}

    rows = [{"workload": w, "side": s} for w in ("chain", "adds") for s in ("native", "90")]
    chain = [turn("native", 0, 10.0), turn("90", 0, 8.0), turn("90", 1, 5.0), turn("native", 1, 5)]
    adds = [turn("native", 0, 100), turn("90", 0, 50), turn("90", 1, 30), turn("native", 1, 60)]
    turns = chain + adds  # as bench_hook_cost writes them: workload after workload
    record = {"args": {"cycles": 2}, "rows": rows, "turns": turns}
    assert ratios(record, "chain") == {"90": [0.8, 1.0]}
    assert ratios(record, "adds") == {"90": [0.5, 0.5]}


def test_the_hooks_tally_gives_the_part_of_launches_gated_and_sampled(tmp_path: Path) -> None:
    from benchmarks.bench_hook_cost import gated_part

    def kinds(**launches: int) -> dict[str, object]:
        names = ("gated", "shared", "sampled", "graph", "plain", "unmeasured")
        return {k: {"batches": 1, "launches": launches.get(k, 0)} for k in names}

    tally = tmp_path / "batches.jsonl"
    assert gated_part(tally) is None  # the side never wrote one
    lines = [
        {"pid": 1, **kinds(gated=30, shared=10, sampled=50, plain=10)},
        {"pid": 2, **kinds(gated=0, sampled=100)},
    ]
    tally.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert gated_part(tally) == pytest.approx((40 / 200, 150 / 200))
    tally.write_text(json.dumps({"pid": 3, **kinds()}) + "\n")
    assert gated_part(tally) is None  # nothing measured
