"""All-reduce bus bandwidth across two GPUs, natively and inside a vGPU
spanning both: two torch.distributed ranks with the NCCL backend
(tests/gpu/nccl_ranks.py), NCCL_NVLS_ENABLE=0 throughout.

    python benchmarks/bench_multi_gpu.py OUTDIR [--rounds 5] [--iters 50]

Configurations, each run once per round in turn so that drift hits all
alike: native (no hook), a vGPU with no compute limit, a vGPU at shares
30/60 (GPU0/GPU1). Reports, per message size, the median over rounds of
rank 0's bus bandwidth (nccl-tests' definition: algbw x 2(n-1)/n) and the
ratio to native. Target: the vGPU with no compute limit at >= 95 %
of native for large messages. Needs a node with two GPUs.

Writes OUTDIR/multigpu.json and OUTDIR/multigpu.md (with the date, GPUs,
driver, torch and NCCL versions) for docs/benchmarks/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.gpu.nccl_ranks import FULL, run_ranks, vgpu  # noqa: E402

SIZES = [1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
CONFIGS: dict[str, tuple[int, int] | None] = {
    "native": None,
    "vgpu-no-limit": (FULL, FULL),
    "vgpu-30-60": (30, 60),
}
MEMORY = 40 << 30  # per GPU, for the vGPU configurations


def one_run(shares: tuple[int, int] | None, iters: int) -> dict[int, float]:
    """Rank 0's bus bandwidth (bytes/s) by message size."""
    args = ["allreduce", ",".join(map(str, SIZES)), str(iters)]
    if shares is None:
        answers = run_ranks(args)
    else:
        with tempfile.TemporaryDirectory() as tmp, vgpu(Path(tmp), shares, MEMORY) as env:
            answers = run_ranks(args, env)
    if not all(a["allreduce_ok"] and a["allgather_ok"] for a in answers):
        raise SystemExit(f"wrong collective results: {answers}")
    return {row["bytes"]: row["busbw"] for row in answers[0]["bandwidth"]}


def environment() -> dict[str, str]:
    code = (
        "import torch, pynvml as n; n.nvmlInit();"
        "print(n.nvmlSystemGetDriverVersion(), '|', torch.__version__, '|',"
        " '.'.join(map(str, torch.cuda.nccl.version())), '|',"
        " ', '.join(n.nvmlDeviceGetName(n.nvmlDeviceGetHandleByIndex(i))"
        " for i in range(n.nvmlDeviceGetCount())))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    driver, torch_version, nccl, gpus = (part.strip() for part in out.stdout.split("|"))
    return {"driver": driver, "torch": torch_version, "nccl": nccl, "gpus": gpus}


def report(results: dict[str, dict[int, list[float]]], env: dict[str, str], rounds: int) -> str:
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# All-reduce bus bandwidth, two GPUs, native vs vGPU",
        "",
        f"{date}; GPUs: {env['gpus']}; driver {env['driver']}; torch {env['torch']};"
        f" NCCL {env['nccl']}; NCCL_NVLS_ENABLE=0; median of {rounds} rounds"
        " (benchmarks/bench_multi_gpu.py).",
        "",
        "| size | " + " | ".join(f"{c} GB/s" for c in CONFIGS) + " | no limit / native |",
        "| --- | " + " | ".join("---" for _ in CONFIGS) + " | --- |",
    ]
    for size in SIZES:
        med = {c: statistics.median(results[c][size]) for c in CONFIGS}
        cells = " | ".join(f"{med[c] / 1e9:.1f}" for c in CONFIGS)
        ratio = med["vgpu-no-limit"] / med["native"]
        lines.append(f"| {size >> 20} MiB | {cells} | {100 * ratio:.1f} % |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    a = parser.parse_args()
    a.outdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, list[float]]] = {c: {s: [] for s in SIZES} for c in CONFIGS}
    for n in range(a.rounds):
        for name, shares in CONFIGS.items():
            for size, bw in one_run(shares, a.iters).items():
                results[name][size].append(bw)
            print(f"round {n + 1}/{a.rounds} {name} done", flush=True)
    env = environment()
    raw: dict[str, Any] = {"environment": env, "sizes": SIZES, "busbw": results}
    (a.outdir / "multigpu.json").write_text(json.dumps(raw, indent=2) + "\n")
    (a.outdir / "multigpu.md").write_text(report(results, env, a.rounds))
    print((a.outdir / "multigpu.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
