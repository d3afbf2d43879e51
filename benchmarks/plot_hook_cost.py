"""What the hook costs, call by call: for each workload, every hooked
turn's rate against the native turn of its cycle (bench_hook_cost.py's
JSON), one box per side and call, the calls side by side.

  python benchmarks/plot_hook_cost.py --out PNG LABEL=HOOK_COST_JSON...

A label names the call (a VM); a side's boxes share a colour.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_hook_cost import against_native  # noqa: E402


def ratios(record: dict[str, Any], workload: str) -> dict[str, list[float]]:
    """Per hooked side: each of its turns' rate over its cycle's native
    turn. A record's turns run workload after workload, each its cycles."""
    sides = [r["side"] for r in record["rows"] if r["workload"] == workload]
    names = list(dict.fromkeys(r["workload"] for r in record["rows"]))
    per_workload = len(sides) * record["args"]["cycles"]
    start = names.index(workload) * per_workload
    turns = record["turns"][start : start + per_workload]
    return against_native((t["side"], t["cycle"], t["rate"]) for t in turns)


def side_name(side: str) -> str:
    share, _, hook = side.partition("@")
    if share == "100" and not hook:
        return "share 100: hooked, not paced"
    return f"share {share}, {Path(hook).parent.name if hook else 'as built'}"


def plot(runs: list[tuple[str, dict[str, Any]]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    workloads = list(dict.fromkeys(r["workload"] for _, rec in runs for r in rec["rows"]))
    height = 3.6 * len(workloads) + 1.2  # and the legend under them
    fig, axes = plt.subplots(len(workloads), 1, figsize=(11, height), squeeze=False)
    colours: dict[str, str] = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, workload in zip(axes[:, 0], workloads, strict=True):
        data, positions, tints, ticks = [], [], [], []
        x = 0.0
        for label, record in runs:
            if not any(r["workload"] == workload for r in record["rows"]):
                continue
            per_side = ratios(record, workload)
            first = x
            for side, values in per_side.items():
                name = side_name(side)
                colours.setdefault(name, palette[len(colours) % len(palette)])
                data.append(values)
                positions.append(x)
                tints.append(colours[name])
                x += 1
            ticks.append(((first + x - 1) / 2, label))
            x += 1  # a gap between calls
        boxes = ax.boxplot(data, positions=positions, widths=0.7, patch_artist=True)
        for patch, tint in zip(boxes["boxes"], tints, strict=True):
            patch.set_facecolor(tint)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xticks([t for t, _ in ticks], [name for _, name in ticks])
        ax.set_ylabel("rate / native turn")
        ax.set_title(f"{workload}: each turn against the native turn of its cycle")
    handles = [Patch(color=c) for c in colours.values()]
    fig.legend(handles, list(colours), loc="lower center", ncol=2, fontsize="small")
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("runs", nargs="+", help="LABEL=HOOK_COST_JSON")
    args = p.parse_args(argv)
    runs = []
    for spec in args.runs:
        label, sep, path = spec.partition("=")
        if not sep:
            p.error(f"a run is LABEL=HOOK_COST_JSON: {spec!r}")
        runs.append((label, json.loads(Path(path).read_text())))
    plot(runs, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
