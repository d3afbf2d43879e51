"""Can one launch's own event pair be the charge of launch-bound work beside
a GPU-bound tenant? (docs/compute.md, "Still open": co-location when the
launch-bound share binds.)

A batch's event pair, beside another context, spans that context's time
slices; a pair around a single small kernel spans them only when a slice
boundary falls inside it. This probe runs the decode-shaped chain
(inference_workload.py's: 32 matvecs of 4096x4096 bf16 per token, read
back each token) with no hook, and times with event pairs, per token, one
kernel (a different one each token) and the whole token's 32 kernels, first
alone, then beside inference_workload.py gemm (8192x8192 matmuls) with no
hook either. It prints one JSON line per phase: the per-kernel pairs' median,
mean, mean of those under 3x the median, share of such outliers, and the
token spans' mean, each in microseconds, with the per-kernel figures scaled
to a token (x32) beside the token span.

  python benchmarks/kernel_pairs_probe.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

WORKLOAD = Path(__file__).resolve().parent / "inference_workload.py"
KERNELS = 32


def measure(seconds: float) -> dict[str, float]:
    weights = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    x = torch.randn(4096, 1, device="cuda", dtype=torch.bfloat16)
    kernel_us: list[float] = []
    token_us: list[float] = []
    tokens = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sampled = tokens % KERNELS
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        k0, k1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        y = x
        t0.record()
        for i in range(KERNELS):
            if i == sampled:
                k0.record()
            y = weights[i % 4] @ y
            if i == sampled:
                k1.record()
        t1.record()
        y[0, 0].item()  # the CPU reads each token back, as a decoder does
        kernel_us.append(k0.elapsed_time(k1) * 1000)
        token_us.append(t0.elapsed_time(t1) * 1000)
        tokens += 1
    median = statistics.median(kernel_us)
    usual = [k for k in kernel_us if k < 3 * median]
    return {
        "tokens_per_s": tokens / seconds,
        "kernel_median_us": median,
        "kernel_mean_us": statistics.fmean(kernel_us),
        "kernel_trimmed_mean_us": statistics.fmean(usual),
        "outliers": 1 - len(usual) / len(kernel_us),
        "token_from_kernels_us": statistics.fmean(usual) * KERNELS,
        "token_span_mean_us": statistics.fmean(token_us),
        "token_span_median_us": statistics.median(token_us),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8.0)
    args = p.parse_args()
    measure(1.0)  # warm-up: allocator, clocks
    print(json.dumps({"phase": "alone", **measure(args.seconds)}), flush=True)
    gemm = subprocess.Popen([sys.executable, str(WORKLOAD), "gemm"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(8.0)  # its CUDA start-up
        print(json.dumps({"phase": "beside gemm", **measure(args.seconds)}), flush=True)
    finally:
        gemm.terminate()
        gemm.wait(30)
    time.sleep(1.0)
    print(json.dumps({"phase": "alone again", **measure(args.seconds)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
