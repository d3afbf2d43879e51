"""What the GPU's time-slicing leaves a launch-bound tenant beside a
GPU-bound one, whatever a pacer does (docs/compute.md, "Still open":
co-location when the launch-bound share binds).

No hook anywhere. A launch-bound workload of inference_workload.py (T)
runs throughout; beside it, one after another, a GEMM tenant (G:
8192x8192 bf16 matmuls, each synchronised) that runs ON ms and sleeps
OFF ms, for several periods at one duty (default 60 %: the GEMM paced
at 60, with its idle time in blocks of 0.4 x the period), and one that
never sleeps. Any time-based pacer of G can at best lay out G's idle time
like one of these, so T's work beside them bounds what such a pacer can
give T. Reported per case: T's work against its rate alone (measured
before and after), G's work against its rate alone at full duty, and
NVML's device busy from an unhooked sampler.

  python benchmarks/timeslice_ceiling.py OUTFILE [--workloads chain,adds,hf-b1]
      [--periods 2.5,10,40,100] [--duty 0.6] [--seconds 6]
  python benchmarks/timeslice_ceiling.py --gemm ON_MS OFF_MS   (the G tenant)
  python benchmarks/timeslice_ceiling.py --plot OUTFILE PNG     (matplotlib)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_inference import Side, Workload  # noqa: E402
from tests.integration.compute_harness import Sampler, device_series  # noqa: E402

SETTLE_S = 1.5  # after G's first report: its clocks and T's pace settle


def gemm(on_ms: float, off_ms: float) -> int:
    """G: matmuls, each synchronised, for on_ms; then off_ms asleep (none
    when off_ms is 0). Reports as inference_workload.py does."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    units, last = 0, 0.0
    while True:
        until = time.monotonic() + on_ms / 1000
        while True:
            torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
            units += 1
            if time.monotonic() >= until:
                break
        if off_ms > 0:
            time.sleep(off_ms / 1000)
        now = time.time()
        if now - last >= 0.25:
            print(json.dumps({"t": now, "units": units, "unit": "matmul"}), flush=True)
            last = now


def window(seconds: float) -> tuple[float, float]:
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


def busy(sampler: Sampler, start: float, end: float) -> float:
    sampler.wait_past(end)
    series = device_series(sampler.samples, start, end)
    return sum(series) / len(series)


def beside(
    env: dict[str, str], on_ms: float, off_ms: float, seconds: float
) -> tuple[Workload, float, float]:
    """Start G, let it settle, and measure for `seconds`: (G, start, end)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--gemm", str(on_ms), str(off_ms)]
    g = Workload.launch(cmd, env)
    g.wait_started()
    time.sleep(SETTLE_S)
    start, end = window(seconds)
    return g, start, end


def campaign(args: argparse.Namespace) -> list[dict[str, Any]]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    sampler = Sampler(env, 0)
    sampler.wait_ready()
    rows: list[dict[str, Any]] = []
    try:
        g, start, end = beside(env, 1000.0, 0.0, args.seconds)
        g_native = g.rate(start, end)
        g.stop()
        rows.append(
            {"case": "gemm alone", "gemm_rate": g_native, "busy": busy(sampler, start, end)}
        )
        print(json.dumps(rows[-1]), flush=True)
        periods = [float(p) for p in args.periods.split(",")]
        for name in args.workloads.split(","):
            t = Workload.start(name, Side(env))
            try:
                t.wait_started()
                time.sleep(SETTLE_S)
                start, end = window(args.seconds)
                alone = [t.rate(start, end)]
                alone_busy = busy(sampler, start, end)
                cases: list[tuple[str, float, float]] = [("always on", 1000.0, 0.0)]
                cases += [(f"{p:g} ms", p * args.duty, p * (1 - args.duty)) for p in periods]
                results = []
                for label, on_ms, off_ms in cases:
                    g, start, end = beside(env, on_ms, off_ms, args.seconds)
                    results.append(
                        (
                            label,
                            t.rate(start, end),
                            g.rate(start, end),
                            busy(sampler, start, end),
                        )
                    )
                    g.stop()
                time.sleep(SETTLE_S)
                start, end = window(args.seconds)
                alone.append(t.rate(start, end))
            finally:
                t.stop()
            native = sum(alone) / 2
            rows.append({"workload": name, "case": "alone", "rate": alone, "busy": alone_busy})
            print(json.dumps(rows[-1]), flush=True)
            for label, t_rate, g_rate, dev_busy in results:
                rows.append(
                    {
                        "workload": name,
                        "case": label,
                        "duty": args.duty,
                        "work": t_rate / native,
                        "gemm_work": g_rate / g_native,
                        "busy": dev_busy,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    finally:
        sampler.stop()
    return rows


def plot(rows: list[dict[str, Any]], png: Path) -> None:
    """One panel per workload: T's and G's work against the length of G's
    idle blocks (0.4 x the period at 60 %), "always on" at the left."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["workload"] for r in rows if "work" in r))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), sharey=True)
    for ax, name in zip(list(axes) if len(names) > 1 else [axes], names, strict=True):
        cases = [r for r in rows if r.get("workload") == name and "work" in r]
        labels = [r["case"] for r in cases]
        at = range(len(cases))
        ax.plot(at, [r["work"] for r in cases], "o-", color="tab:green", label=f"{name} (T)")
        ax.plot(at, [r["gemm_work"] for r in cases], "s-", color="tab:purple", label="gemm (G)")
        ax.plot(at, [r["busy"] / 100 for r in cases], ":", color="tab:grey", label="GPU busy")
        ax.set_xticks(list(at), labels, rotation=30)
        ax.set_ylim(0, 1.1)
        ax.set_title(name)
        ax.set_xlabel("G's period at 60 % duty")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    axes_list = list(axes) if len(names) > 1 else [axes]
    axes_list[0].set_ylabel("work vs alone (busy: fraction)")
    fig.suptitle("Launch-bound T beside a GEMM G, no hook: what time-slicing leaves T")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, nargs="?")
    p.add_argument("--workloads", default="chain,adds,hf-b1")
    p.add_argument("--periods", default="2.5,10,40,100")
    p.add_argument("--duty", type=float, default=0.6)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--gemm", nargs=2, type=float, metavar=("ON_MS", "OFF_MS"))
    p.add_argument("--plot", type=Path, metavar="PNG", help="plot OUTFILE's rows")
    args = p.parse_args()
    if args.gemm is not None:
        return gemm(*args.gemm)
    if args.plot is not None and args.out is not None:
        lines = args.out.read_text().splitlines()
        plot([json.loads(line) for line in lines], args.plot)
        return 0
    if args.out is None:
        p.error("OUTFILE is needed")
    rows = campaign(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
