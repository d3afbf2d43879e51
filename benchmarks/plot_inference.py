"""Plots of benchmarks/bench_inference.py's cases: compute shares for
inference-shaped work, as NVML saw them from outside.

  python benchmarks/plot_inference.py INFERENCE_JSON... --out PNG [--title T]

One row per workload. Left: NVML device busy against the share, for the
workload alone, with the range of its 1 s windows as a bar and the
target min(share, native busy) as a dashed line. Middle: its work against
its native rate. Right, where a file holds co-located cases: the
workload's work, the neighbour's work and the GPU's busy, as bars.

An input file is a bench run's inference.json (a list of cases) or an
object {"label": ..., "note": ..., "cases": [...]} (figures transcribed
from a report). Each file is one run: a case's native is the native case
(share and neighbour null) of the same workload and round in the same
file, so runs on machines of different speeds can share a figure.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Case = dict[str, Any]
TITLE = "Compute shares, inference-shaped work (NVML device busy, work vs native)"
# The co-located panel's bars: what each shows, and its colour.
BARS = (
    ("workload work", "tab:green"),
    ("neighbour work", "tab:purple"),
    ("GPU busy", "tab:grey"),
)


@dataclass(frozen=True)
class Point:
    """One case as plotted. `target` is min(share, native busy) and `work`
    the rate against the native rate; either is None where the case or its
    run lacks what it takes (a native case, a run with no native)."""

    run: str
    workload: str
    share: int | None
    neighbour: int | None
    busy: float
    windows: tuple[float, float] | None  # the lowest and highest 1 s window
    target: float | None
    work: float | None
    neighbour_work: float | None
    neighbour_name: str  # what ran beside it: vgpu-burn, or a bench workload

    @property
    def native(self) -> bool:
        return self.share is None and self.neighbour is None


def natives(cases: list[Case]) -> dict[tuple[str, int], Case]:
    """Each workload's native case in each round of the run (runs before
    bench_inference.py's --rounds had one round, 0)."""
    return {
        (c["workload"], c.get("round", 0)): c
        for c in cases
        if c["share"] is None and c["neighbour"] is None
    }


def native_of(ref: dict[tuple[str, int], Case], case: Case) -> Case | None:
    """The native a case is measured against: its workload's, of its round."""
    return ref.get((case["workload"], case.get("round", 0)))


def target(share: float, native_busy: float) -> float:
    """What a workload alone at `share` should keep the GPU busy: its share,
    or what it uses natively where that is less."""
    return min(share, native_busy)


def point(case: Case, native: Case | None, run: str) -> Point:
    share = case["share"]
    goal = None
    if share is not None and native is not None:
        goal = target(share, native["busy"])
    work = None
    if native is not None and case.get("rate") is not None and native.get("rate"):
        work = case["rate"] / native["rate"]
    win = case.get("busy_windows") or []
    return Point(
        run=run,
        workload=case["workload"],
        share=share,
        neighbour=case["neighbour"],
        busy=case["busy"],
        windows=(min(win), max(win)) if win else None,
        target=goal,
        work=work,
        neighbour_work=case.get("neighbour_work"),
        neighbour_name=case.get("neighbour_workload", "burn"),
    )


def points(cases: list[Case], run: str = "") -> list[Point]:
    """The cases of one run, each against that run's native."""
    ref = natives(cases)
    return [point(c, native_of(ref, c), run) for c in cases]


def load(path: Path) -> tuple[str, list[Case]]:
    """A run's label and cases: the file's own label, else its folder's name
    (a bench run's OUT)."""
    data = json.loads(path.read_text())
    if isinstance(data, list):
        return path.resolve().parent.name, data
    return str(data.get("label") or path.stem), data["cases"]


def workloads(pts: list[Point]) -> list[str]:
    """Workloads with a case to show beside their native, in first-seen order
    (a GEMM neighbour's native alone makes no row)."""
    return list(dict.fromkeys(p.workload for p in pts if not p.native))


def draw_busy(ax: Any, pts: list[Point], colour: str, run: str) -> None:
    alone = [p for p in pts if p.share is not None and p.neighbour is None]
    label = f"{run} busy, bar: 1 s windows"
    ax.plot([p.share for p in alone], [p.busy for p in alone], "o", color=colour, label=label)
    # The windows' range as a bar of its own, not as an error around the
    # mean: sliding windows weigh a run's edges less, so the mean may lie
    # outside their range.
    for p in alone:
        if p.windows:
            ax.plot([p.share, p.share], p.windows, "_-", color=colour, markersize=8)
    for p in pts:
        if p.native:
            # Rises with the share up to the native busy, then flat.
            shares = [0, p.busy, 100]
            goals = [target(s, p.busy) for s in shares]
            ax.plot(shares, goals, "--", color=colour, alpha=0.6, label=f"{run} target")


def draw_work(ax: Any, pts: list[Point], colour: str, run: str) -> None:
    alone = [p for p in pts if p.share is not None and p.neighbour is None and p.work is not None]
    if alone:
        xs, ys = [p.share for p in alone], [p.work for p in alone]
        ax.plot(xs, ys, "o", color=colour, label=f"{run} work")


def side(share: int | None) -> str:
    """A side's share; None (a workload) or 0 (a neighbour) is native."""
    return str(share) if share else "native"


def draw_coloc(ax: Any, pts: list[Point], several_runs: bool) -> None:
    pairs = [p for p in pts if p.neighbour is not None]
    if not pairs:
        ax.set_axis_off()
        return
    width = 0.8 / len(BARS)
    for i, p in enumerate(pairs):
        heights = (
            p.work * 100 if p.work is not None else math.nan,
            p.neighbour_work if p.neighbour_work is not None else math.nan,
            p.busy,
        )
        for j, ((name, colour), h) in enumerate(zip(BARS, heights, strict=True)):
            ax.bar(i + (j - 1) * width, h, width, color=colour, label=name if i == 0 else None)
    labels = [f"{side(p.share)} by {p.neighbour_name} {side(p.neighbour)}" for p in pairs]
    if several_runs:
        labels = [f"{p.run}\n{label}" for p, label in zip(pairs, labels, strict=True)]
    ax.set_xticks(range(len(pairs)), labels, fontsize=7)
    ax.set(ylim=(0, 120), ylabel="% (work: of its native rate)")
    ax.set_xlabel("workload share by neighbour share")
    ax.legend(fontsize=6, ncol=len(BARS), loc="upper left")


def plot(runs: list[tuple[str, list[Case]]], path: Path, title: str = TITLE) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = unique(runs)
    pts = [p for run, cases in runs for p in points(cases, run)]
    names = workloads(pts)
    coloc = any(p.neighbour is not None for p in pts)
    cols = 3 if coloc else 2
    size = (5 * cols, 3 * len(names))
    fig, axes = plt.subplots(len(names), cols, figsize=size, squeeze=False, layout="constrained")
    labels = list(dict.fromkeys(run for run, _ in runs))
    for row, name in zip(axes, names, strict=True):
        mine = [p for p in pts if p.workload == name]
        for k, run in enumerate(labels):
            ofrun = [p for p in mine if p.run == run]
            if not ofrun:
                continue  # no legend entry for a run without this workload
            draw_busy(row[0], ofrun, f"C{k}", run)
            draw_work(row[1], ofrun, f"C{k}", run)
        row[0].set(xlim=(0, 100), ylim=(0, 105), ylabel=f"{name}\nNVML busy (%)")
        row[1].axhline(1.0, color="grey", linestyle=":", label="native")
        row[1].set(xlim=(0, 100), ylim=(0, None), ylabel="work vs native")
        row[0].legend(fontsize=6, loc="upper left")
        row[1].legend(fontsize=6, loc="lower right")
        for ax in row[:2]:
            ax.set_xlabel("share (%)")
        if coloc:
            draw_coloc(row[2], mine, len(labels) > 1)
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def unique(runs: list[tuple[str, list[Case]]]) -> list[tuple[str, list[Case]]]:
    """Runs whose labels clash (two OUT folders of one name) numbered apart,
    so that each keeps its own colour and target line."""
    seen: dict[str, int] = {}
    out: list[tuple[str, list[Case]]] = []
    for label, cases in runs:
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label} ({seen[label]})", cases))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", type=Path, nargs="+", help="inference.json files, one run each")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    p.add_argument("--title", default=TITLE)
    args = p.parse_args(argv)
    plot([load(path) for path in args.inputs], args.out, args.title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
