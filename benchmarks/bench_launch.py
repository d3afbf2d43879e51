"""Launch overhead of the hook: empty-kernel launch rate and the time of one
cuLaunchKernel call, natively and through the hook in each of its modes.

    python benchmarks/bench_launch.py OUTDIR          # the GPU the driver finds
    python benchmarks/bench_launch.py OUTDIR --sim    # the simulated GPU

Builds benchmarks/bench_launch.c with gcc into build/bench/, then runs it in
rounds, each configuration once per round in turn (so that drift of a busy
machine hits all alike), and reports the median over rounds. Targets
(docs/compute.md): an unlimited vGPU launches at >= 97 % of the native rate; the
pacer adds <= 200 ns per launch (median) when it paces.

Writes OUTDIR/launch.json and OUTDIR/launch.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vgpud.units import PPM_FULL  # noqa: E402
from vgpud.vgpus.blocks import ControlBlock, DeviceSlice, UsageBlock  # noqa: E402

BUILD = ROOT / "build"
SOURCE = ROOT / "benchmarks" / "bench_launch.c"
BINARY = BUILD / "bench" / "bench_launch"
HOOK = BUILD / "libvgpu.so"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE"]


def build() -> None:
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    if BINARY.exists() and BINARY.stat().st_mtime > SOURCE.stat().st_mtime:
        return
    cmd = ["gcc", *CFLAGS, f"-I{ROOT / 'libhook' / 'include'}", "-o", str(BINARY), str(SOURCE)]
    subprocess.run([*cmd, "-ldl"], check=True)


def first_uuid(env: dict[str, str]) -> str:
    code = (
        "import pynvml as n; n.nvmlInit();"
        "print(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(0)))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    uuid = out.stdout.strip()
    if not uuid.startswith("GPU-"):
        raise SystemExit(f"cannot read the GPU's UUID through NVML: {out.stderr.strip()}")
    return uuid


def configurations(base: dict[str, str], workdir: Path) -> dict[str, dict[str, str]]:
    """name -> environment of each way to run the program. Every hooked
    configuration has an arbiter directory of its own (standalone processes
    take turns through it; a vGPU checks its control block's pacing stamp at
    every launch), so that the paced one's stamp cannot make the others take
    turns."""
    control, usage = workdir / "control", workdir / "usage"
    ControlBlock.create(control, "bench", [DeviceSlice(first_uuid(base), 1 << 40, PPM_FULL)], 0)
    UsageBlock.create(usage, device_count=1).close()

    def hook(name: str, **env: str) -> dict[str, str]:
        arbiters = workdir / f"arbiters-{name}"
        arbiters.mkdir()
        return {**base, "LD_PRELOAD": str(HOOK), "VGPU_ARBITER_DIR": str(arbiters), **env}

    return {
        "native": base,
        "hook, no limits (pass-through)": hook("none"),
        "hook, vGPU share 100": hook("vgpu", VGPU_CONTROL=str(control), VGPU_USAGE=str(usage)),
        "hook, CUDA_CORE_LIMIT=100": hook(
            "100", CUDA_CORE_LIMIT="100", VGPU_USAGE=str(workdir / "standalone-100")
        ),
        "hook, paced (CUDA_CORE_LIMIT=99)": hook(
            "99", CUDA_CORE_LIMIT="99", VGPU_USAGE=str(workdir / "standalone-99")
        ),
    }


def run_once(env: dict[str, str], launches: int, sync_every: int) -> dict[str, Any]:
    out = subprocess.run(
        [str(BINARY), str(launches), str(sync_every)], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"bench_launch failed: {out.stderr.strip()}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def report(outdir: Path, results: dict[str, Any]) -> None:
    (outdir / "launch.json").write_text(json.dumps(results, indent=1))
    m = results["machine"]
    native = results["summary"]["native"]
    lines = [
        "# Launch overhead" + (" — SIMULATED GPU" if results["simulated"] else ""),
        "",
        f"{m['date']}; {m['gpu']}; {m['host']}; Linux {m['kernel']}.",
        f"Command: `{results['command']}`: {results['launches']} empty-kernel launches on one "
        f"stream, a sync every {results['sync_every']}, {results['rounds']} rounds; medians "
        "over rounds.",
        "",
    ]
    if results["simulated"]:
        lines += [
            "On the **simulated GPU** a launch is a call into the simulator (no PCIe, no",
            "GPU queue), so the native figures are much faster than a real driver's and the",
            "hook's share of the time looks larger than it would on a GPU.",
            "",
        ]
    lines += [
        "| configuration | launches/s | vs native | median call (ns) | added (ns) "
        "| p99 call (ns) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, s in results["summary"].items():
        lines.append(
            f"| {name} | {s['rate']:.0f} | {100 * s['rate'] / native['rate']:.1f} % | "
            f"{s['median_ns']:.0f} | {s['median_ns'] - native['median_ns']:+.0f} | "
            f"{s['p99_ns']:.0f} |"
        )
    lines += [
        "",
        "Targets: an unlimited vGPU (share 100) at >= 97 % of the native rate; the pacer's "
        "cost per launch (added median, paced row) <= 200 ns.",
        "",
    ]
    (outdir / "launch.md").write_text("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("outdir", type=Path)
    p.add_argument("--sim", action="store_true", help="use the simulated GPU (build/sim)")
    p.add_argument("--launches", type=int, default=200_000)
    p.add_argument("--sync-every", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    if not HOOK.is_file():
        p.error(f"{HOOK} is missing: run `make` first")
    build()
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("VGPU_")}
    base = {k: v for k, v in base.items() if not k.startswith("CUDA_CORE")}
    workdir = Path(tempfile.mkdtemp(prefix="vgpu-bench-launch-"))
    if args.sim:
        base["LD_LIBRARY_PATH"] = str(BUILD / "sim")
        base["VGPU_SIM_STATE"] = str(workdir / "sim-state")
        base["VGPU_SIM_KERNEL_NS"] = "1000"  # an empty kernel's time on a GPU, roughly
    configs = configurations(base, workdir)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for r in range(args.rounds):
        for name, env in configs.items():
            runs[name].append(run_once(env, args.launches, args.sync_every))
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    summary = {
        name: {
            key: statistics.median(run[key] for run in rs)
            for key in ("rate", "median_ns", "p99_ns")
        }
        for name, rs in runs.items()
    }
    for name, s in summary.items():
        print(f"{name:34} {s['rate']:10.0f}/s  median {s['median_ns']:6.0f} ns")
    args.outdir.mkdir(parents=True, exist_ok=True)
    gpu = "simulated GPU" if args.sim else f"GPU {first_uuid(base)}"
    report(
        args.outdir,
        {
            "command": " ".join(["python benchmarks/bench_launch.py", *(argv or sys.argv[1:])]),
            "simulated": args.sim,
            "launches": args.launches,
            "sync_every": args.sync_every,
            "rounds": args.rounds,
            "machine": {
                "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "gpu": gpu,
                "host": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
                "kernel": platform.release(),
            },
            "summary": summary,
            "runs": runs,
            "finished": time.time(),
        },
    )
    print(f"report: {args.outdir / 'launch.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
