"""What NVML's two device utilization figures see of a known load.

Runs busy/idle patterns on GPU 0 with PyTorch (back-to-back bf16 matmuls
for ON ms, idle for OFF ms), then isolated 20 ms bursts 0.5-1 s apart, and
meanwhile, in a child, polls nvmlDeviceGetUtilizationRates every 5 ms and
reads the device's sample buffer (nvmlDeviceGetSamples, GPU utilization:
one sample per driver period). Prints, per pattern, the busy time the
loop ran (CUDA events around each burst), the mean of each figure, and for
each isolated burst the rate's peak and the buffer's samples; writes the
raw figures to OUT.json. docs/benchmarks/nvml-device-figure-h200.md has
the H200's answer.

  python benchmarks/nvml_device_figure.py OUT.json
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from typing import Any

# (name, ms on, ms off); off None: isolated bursts 0.5-1 s apart.
PATTERNS: list[tuple[str, float, float | None]] = [
    ("10/10", 10, 10),
    ("100/100", 100, 100),
    ("30/70", 30, 70),
    ("60/40", 60, 40),
    ("20/180", 20, 180),
    ("bursts of 20", 20, None),
]
POLL_S = 0.005


def poll(seconds: float) -> None:
    """The child: the rate every POLL_S for `seconds`, then the buffer."""
    import pynvml as n

    n.nvmlInit()
    handle = n.nvmlDeviceGetHandleByIndex(0)
    end = time.time() + seconds
    rates = []
    while time.time() < end:
        rates.append((time.time(), n.nvmlDeviceGetUtilizationRates(handle).gpu))
        time.sleep(POLL_S)
    _, buffer = n.nvmlDeviceGetSamples(handle, n.NVML_GPU_UTILIZATION_SAMPLES, 0)
    samples = [(s.timeStamp / 1e6, s.sampleValue.uiVal) for s in buffer]
    print(json.dumps({"rates": rates, "samples": samples}))


def main(out: str) -> None:
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = a.clone()
    for _ in range(50):
        a @ b
    torch.cuda.synchronize()

    def burst(seconds: float) -> float:
        """Matmuls for `seconds`; the GPU time their events span."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        until = time.time() + seconds
        while time.time() < until:
            for _ in range(5):
                a @ b
            torch.cuda.synchronize()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000

    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name()}
    for name, on_ms, off_ms in PATTERNS:
        seconds = 4.0 if off_ms is not None else 6.0
        child = subprocess.Popen(
            [sys.executable, __file__, "--poll", str(seconds + 1.2)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.6)
        t0, busy, bursts = time.time(), 0.0, []
        while time.time() < t0 + seconds:
            began = time.time()
            busy += burst(on_ms / 1000)
            bursts.append((began, time.time()))
            time.sleep(off_ms / 1000 if off_ms is not None else 0.5 + random.random() / 2)
        t1 = time.time()
        figures = json.loads(child.communicate()[0])
        rates = [u for t, u in figures["rates"] if t0 + 0.3 <= t < t1]
        periods = [u for t, u in figures["samples"] if t0 + 0.5 <= t <= t1]
        row = {
            "ran": 100 * busy / (t1 - t0),
            "rate": sum(rates) / len(rates),
            "buffer": sum(periods) / max(1, len(periods)),
        }
        print(name, {k: round(v, 1) for k, v in row.items()}, flush=True)
        if off_ms is None:
            for began, ended in bursts:
                peak = max(
                    (u for t, u in figures["rates"] if began <= t < ended + 0.5), default=None
                )
                seen = [u for t, u in figures["samples"] if began < t <= ended + 0.45]
                print(f"  a burst: rate's peak {peak}, buffer {seen}")
        results[name] = {**row, "bursts": bursts, **figures}
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--poll":
        poll(float(sys.argv[2]))
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit(__doc__)
