"""What the hook costs launch-bound work whose share does not bind, measured
against the same work run natively at the same time.

A launch-bound workload's native pace moves with the lent VM's CPU by up
to a third within minutes, so a hooked run compared with a native run made
minutes before cannot tell the hook's cost from the drift. Here one
process per side (native, and the hook in each configuration asked for)
runs the same benchmarks/inference_workload.py workload; all keep their
contexts, and one at a time works for a turn (SIGUSR1 pauses and resumes a
workload between two units), the sides' order rotating from cycle to
cycle. Each hooked turn is judged against the native turn of its cycle.
An unhooked sampler reads NVML's device utilization meanwhile.

  python benchmarks/bench_hook_cost.py OUTDIR [--workloads chain,adds]
         [--sides native,100,90,90@build-b/libvgpu.so] [--turn-s 2]
         [--cycles 20] [--settle-s 0.5] [--device 0]

A side is `native`, or a standalone share (`CUDA_CORE_LIMIT`) for the hook,
optionally of another build of it (`SHARE@path/to/libvgpu.so`). At 100 the
hook measures and takes no pacing decisions; below it every batch is
paced. Each hooked side has an arbiter directory of its own: the sides
never wait for each other's turns. The first --settle-s of each turn is
not counted (the pacer's bucket and the clocks after a pause).

Report: OUTDIR/hook-cost.md and .json: for each workload and side, its
rate relative to the native turn of the same cycle (median, and the
middle 80 % of cycles), NVML's device busy, the part of its turns its
pacer held it back, and the part of its launches (over its whole run) that
its hook measured in gated batches and in sampled ones (the hook's tally,
VGPU_BATCH_STATS, docs/hook.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_inference import (  # noqa: E402
    Standalone,
    Workload,
    hook_counters,
)
from tests.integration.compute_harness import Sampler, device_util  # noqa: E402


@dataclass(frozen=True)
class SideSpec:
    """One way of running the workload: natively (share None) or hooked at
    a standalone share, with the default build's hook or `hook`."""

    label: str
    share: int | None
    hook: Path | None = None

    @classmethod
    def parse(cls, text: str) -> SideSpec:
        if text == "native":
            return cls(text, None)
        share, _, hook = text.partition("@")
        if not share.isdigit() or not 1 <= int(share) <= 100:
            raise ValueError(f"a side is native, SHARE or SHARE@HOOK (share 1-100): {text!r}")
        if hook and not Path(hook).is_file():
            raise ValueError(f"no hook at {hook}")
        return cls(text, int(share), Path(hook).resolve() if hook else None)


@dataclass
class Turn:
    """One side's turn: its measured window and what happened in it."""

    side: str
    cycle: int
    start: float
    end: float
    rate: float  # units/s
    busy: float | None = None  # NVML device utilization, %
    held: float | None = None  # the part of the window its pacer held it back


def toggle(run: Workload, state: str, timeout: float = 60.0) -> tuple[float, int]:
    """Pause or resume `run` (SIGUSR1) and wait for it to say so: the time
    and units of its mark."""
    seen = len(run.marks)
    run.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while len(run.marks) == seen:
        if run.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the workload did not mark {state} (exit {run.proc.poll()})")
        time.sleep(0.002)
    mark, t, units = run.marks[seen]
    if mark != state:
        raise RuntimeError(f"the workload marked {mark}, not {state}")
    return t, units


def take_turn(
    run: Workload, spec: SideSpec, usage: Path | None, cycle: int, turn_s: float, settle_s: float
) -> Turn:
    """Let `run` work for `turn_s`, then pause it: its rate over the turn
    after the first `settle_s`, from the first progress report then."""
    began, _ = toggle(run, "resumed")
    time.sleep(settle_s)
    before = hook_counters(usage)
    counted_from = time.time()
    time.sleep(max(0.0, turn_s - settle_s))
    end, units_end = toggle(run, "paused")
    after = hook_counters(usage)
    first = next((r for r in run.reports if r[0] >= began + settle_s), None)
    if first is None or first[0] >= end:
        raise RuntimeError(f"{spec.label}: no progress report in its turn; lengthen --turn-s")
    start, units_start = first
    held = None
    if before is not None and after is not None:
        held = (after[2] - before[2]) / 1e9 / (end - counted_from)
    return Turn(spec.label, cycle, start, end, (units_end - units_start) / (end - start), held=held)


def run_workload(
    name: str, specs: list[SideSpec], args: argparse.Namespace, sampler: Sampler, workdir: Path
) -> list[Turn]:
    base = dict(os.environ)
    base.pop("LD_PRELOAD", None)
    tenancy = Standalone(workdir / name, separate_turns=True)
    tenancy.workdir.mkdir()
    runs: dict[str, tuple[Workload, Path | None]] = {}
    turns: list[Turn] = []
    try:
        for i, spec in enumerate(specs):
            side = tenancy.side(base, spec.share, f"side{i}")
            if spec.hook is not None:
                side.env["LD_PRELOAD"] = str(spec.hook)
            if spec.share is not None:
                side.env["VGPU_BATCH_STATS"] = str(tally_path(workdir, name, spec))
            run = Workload.start(name, side)
            runs[spec.label] = (run, side.usage)
            run.wait_started()
            toggle(run, "paused")  # one at a time from now on
        for cycle in range(args.cycles):
            shift = cycle % len(specs)
            for spec in specs[shift:] + specs[:shift]:
                run, usage = runs[spec.label]
                turns.append(take_turn(run, spec, usage, cycle, args.turn_s, args.settle_s))
        sampler.wait_past(turns[-1].end)
        for turn in turns:
            turn.busy = device_util(sampler.samples, turn.start, turn.end)
    finally:
        for run, _ in runs.values():
            run.stop()
    return turns


def tally_path(workdir: Path, name: str, spec: SideSpec) -> Path:
    return workdir / name / f"batches-{spec.label.replace('/', '_')}.jsonl"


def gated_part(path: Path) -> tuple[float, float] | None:
    """The part of a hooked side's launches (its whole run) that went in
    gated batches (with the turn or shared) and in sampled ones, from the
    hook's tally (VGPU_BATCH_STATS, written as the side exits); None when
    it measured none."""
    if not path.is_file():
        return None
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    total = sum(v["launches"] for line in lines for v in line.values() if isinstance(v, dict))
    if total == 0:
        return None
    gated = sum(line[k]["launches"] for line in lines for k in ("gated", "shared"))
    return gated / total, sum(line["sampled"]["launches"] for line in lines) / total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def against_native(turns: Iterable[tuple[str, int, float]]) -> dict[str, list[float]]:
    """Per hooked side, each of its turns' rate over the native turn of its
    cycle, from one workload's turns as (side, cycle, rate)."""
    turns = list(turns)
    native = {cycle: rate for side, cycle, rate in turns if side == "native"}
    ratios: dict[str, list[float]] = {}
    for side, cycle, rate in turns:
        if side != "native" and native.get(cycle):
            ratios.setdefault(side, []).append(rate / native[cycle])
    return ratios


def summarise(
    name: str, turns: list[Turn], specs: list[SideSpec], workdir: Path
) -> list[dict[str, Any]]:
    """Per side: its rate relative to the native turn of each cycle, and
    how its launches were measured."""
    judged = against_native((t.side, t.cycle, t.rate) for t in turns)
    rows = []
    for spec in specs:
        mine = [t for t in turns if t.side == spec.label]
        ratios = judged.get(spec.label, [])
        helds = [t.held for t in mine if t.held is not None]
        parts = gated_part(tally_path(workdir, name, spec))
        rows.append(
            {
                "workload": name,
                "side": spec.label,
                "turns": len(mine),
                "rate": statistics.median(t.rate for t in mine),
                "vs_native": statistics.median(ratios) if ratios else None,
                "vs_native_p10": percentile(ratios, 0.1) if ratios else None,
                "vs_native_p90": percentile(ratios, 0.9) if ratios else None,
                "busy": statistics.mean(t.busy for t in mine if t.busy is not None),
                "held": statistics.mean(helds) if helds else None,
                "gated": None if parts is None else parts[0],
                "sampled": None if parts is None else parts[1],
            }
        )
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# Hook cost, alternated with native ({args.cycles} cycles, {args.turn_s} s turns, "
        f"first {args.settle_s} s of each not counted)",
        "",
        "| workload | side | turns | units/s (median) | vs native: median (p10-p90) "
        "| NVML busy % | held % | launches gated / sampled % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ratio = (
            "—"
            if r["vs_native"] is None or r["side"] == "native"
            else f"{r['vs_native']:.3f} ({r['vs_native_p10']:.3f}-{r['vs_native_p90']:.3f})"
        )
        held = "—" if r["held"] is None else f"{100 * r['held']:.1f}"
        measured = (
            "—" if r["gated"] is None else f"{100 * r['gated']:.0f} / {100 * r['sampled']:.0f}"
        )
        lines.append(
            f"| {r['workload']} | {r['side']} | {r['turns']} | {r['rate']:.1f} | {ratio} "
            f"| {r['busy']:.1f} | {held} | {measured} |"
        )
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--workloads", default="chain,adds")
    p.add_argument("--sides", default="native,100,90")
    p.add_argument("--turn-s", type=float, default=2.0)
    p.add_argument("--settle-s", type=float, default=0.5)
    p.add_argument("--cycles", type=int, default=20)
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args(argv)
    try:
        args.specs = [SideSpec.parse(s) for s in args.sides.split(",")]
    except ValueError as e:
        p.error(str(e))
    if [s.label for s in args.specs].count("native") != 1:
        p.error("--sides needs exactly one native side: the hooked ones are judged against it")
    if len({s.label for s in args.specs}) != len(args.specs):
        p.error("--sides names a side twice")
    if not 0 <= args.settle_s < args.turn_s:
        p.error("--settle-s must be under --turn-s")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(dict(os.environ), args.device)
    sampler.wait_ready()
    rows: list[dict[str, Any]] = []
    turns: list[Turn] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.workloads.split(","):
                mine = run_workload(name, args.specs, args, sampler, Path(tmp))
                turns += mine
                rows += summarise(name, mine, args.specs, Path(tmp))
                print(report(rows, args), flush=True)
    finally:
        sampler.stop()
    text = report(rows, args)
    (args.out / "hook-cost.md").write_text(text)
    record = {
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "specs")},
        "rows": rows,
        "turns": [vars(t) for t in turns],
    }
    (args.out / "hook-cost.json").write_text(json.dumps(record, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
