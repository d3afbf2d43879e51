"""Allocation/free overhead of the hook: median and p99 ns per alloc+free pair.

Runs build/vgpu-memprobe's ``bench`` command three ways - without the hook,
with the hook in pass-through (no limits configured) and with the hook
enforcing a limit (standalone, a private usage block) - several rounds,
interleaved so that machine noise spreads over all three, and prints one
JSON document: per path and mode the median over rounds of each round's
median and p99, and the median added by the hook.

    python benchmarks/bench_alloc.py --sim            # simulated GPU
    python benchmarks/bench_alloc.py                  # the real driver

Target (docs/DESIGN): at most 1 us median added per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
MODES = ("native", "hook_passthrough", "hook_limited")


def mode_env(base: dict[str, str], mode: str, workdir: Path) -> dict[str, str]:
    env = dict(base)
    if mode != "native":
        env["LD_PRELOAD"] = str(BUILD / "libvgpu.so")
    if mode == "hook_limited":
        env["CUDA_MEM_LIMIT"] = "1t"  # enforced and never reached
        env["VGPU_USAGE"] = str(workdir / "usage")
    return env


def bench_once(env: dict[str, str], path: str, size: str, pairs: int) -> dict[str, Any]:
    out = subprocess.run(
        [str(BUILD / "vgpu-memprobe"), f"bench:{path}:{size}:{pairs}"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    result: dict[str, Any] = [json.loads(line) for line in out.splitlines()][-1]
    if result.get("op") != "bench" or result["errors"]:
        raise SystemExit(f"bench failed: {out}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true", help="run on the simulated GPU (build/sim)")
    parser.add_argument("--pairs", type=int, default=20000, help="alloc+free pairs per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--paths", default="alloc,async,vmm", help="comma list of probe paths")
    parser.add_argument("--size", default="2m", help="bytes per allocation (k/m/g suffix)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-alloc-") as tmp:
        workdir = Path(tmp)
        base = dict(os.environ)
        for key in ("LD_PRELOAD", "CUDA_MEM_LIMIT", "VGPU_CONTROL", "VGPU_USAGE"):
            base.pop(key, None)
        if args.sim:
            base["LD_LIBRARY_PATH"] = str(BUILD / "sim")
            base["VGPU_SIM_STATE"] = str(workdir / "sim")
        rounds: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for path in args.paths.split(","):
            rounds[path] = {mode: [] for mode in MODES}
            for r in range(args.rounds):
                # Each round starts with the next mode: a driver that slows
                # (or warms) within a round weighs on every mode alike.
                for mode in MODES[r % len(MODES) :] + MODES[: r % len(MODES)]:
                    env = mode_env(base, mode, workdir)
                    rounds[path][mode].append(bench_once(env, path, args.size, args.pairs))

    report: dict[str, Any] = {
        "device": "simulated GPU (build/sim)" if args.sim else "real driver",
        "pairs_per_round": args.pairs,
        "rounds": args.rounds,
        "size": args.size,
        "paths": {},
    }
    for path, by_mode in rounds.items():
        entry: dict[str, Any] = {}
        for mode, results in by_mode.items():
            entry[mode] = {
                "median_ns": statistics.median(r["median_ns"] for r in results),
                "p99_ns": statistics.median(r["p99_ns"] for r in results),
            }
        for mode in ("hook_passthrough", "hook_limited"):
            entry[f"{mode}_added_median_ns"] = (
                entry[mode]["median_ns"] - entry["native"]["median_ns"]
            )
        report["paths"][path] = entry
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
