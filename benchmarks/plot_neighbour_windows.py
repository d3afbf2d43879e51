"""The neighbour's work second by second beside one workload: each
co-located case's `neighbour_work_windows` (bench_inference.py: the
neighbour's rate over every 1 s run of its reports, against its native
rate) drawn over the measured window, one line per run and a colour per
build, and a reference (what the neighbour does with its whole share) as
a dashed line.

  python benchmarks/plot_neighbour_windows.py --workload phases --out PNG \\
      [--reference 71 --reference-label TEXT] LABEL=INFERENCE_JSON...

A label names the build a run is of; runs of one label share a colour.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.plot_inference import load  # noqa: E402

REPORT_EVERY_S = 0.25  # inference_workload.py's reports: a window starts at each


def series(path: Path, workload: str) -> list[list[float]]:
    """Each co-located case of `workload` in a run: its neighbour's 1 s windows."""
    _, cases = load(path)
    found = [
        c["neighbour_work_windows"]
        for c in cases
        if c["workload"] == workload
        and c["neighbour"] is not None
        and c.get("neighbour_work_windows")
    ]
    if not found:
        raise ValueError(f"{path}: no co-located {workload} case with the neighbour's 1 s windows")
    return found


def plot(
    runs: list[tuple[str, Path]], workload: str, out: Path, reference: tuple[float, str] | None
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    colours: dict[str, str] = {}
    for label, path in runs:
        colour = colours.setdefault(label, f"C{len(colours)}")
        for i, windows in enumerate(series(path, workload)):
            times = [n * REPORT_EVERY_S for n in range(len(windows))]
            ax.plot(times, windows, color=colour, label=label if i == 0 else None, alpha=0.8)
    # One legend entry per label, however many runs it has.
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))
    if reference is not None:
        ax.axhline(reference[0], color="grey", linestyle="--", linewidth=1)
        ax.text(0, reference[0] + 1, reference[1], color="grey", fontsize=8)
    ax.set_xlabel("start of the 1 s window (s into the measured window)")
    ax.set_ylabel("neighbour's work, % of its native")
    ax.set_ylim(0, 100)
    ax.set_title(f"The neighbour's work beside {workload}, 1 s windows")
    ax.legend(seen.values(), seen.keys(), fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def parse_run(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=INFERENCE_JSON")
    return label, Path(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=parse_run, nargs="+", metavar="LABEL=INFERENCE_JSON")
    p.add_argument("--workload", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reference", type=float, help="the neighbour's work with its whole share")
    p.add_argument("--reference-label", default="its whole share")
    args = p.parse_args(argv)
    try:
        reference = None if args.reference is None else (args.reference, args.reference_label)
        plot(args.runs, args.workload, args.out, reference)
    except (OSError, ValueError) as exc:
        p.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
