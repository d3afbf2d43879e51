"""Soak: the daemon's memory and descriptors over minutes of churn.

    .venv/bin/python benchmarks/soak_daemon.py [--minutes 10] [--markdown FILE] [--plot FILE]

The real daemon on the simulated GPU (build/sim). Over and over: create a
vGPU, start 20 processes that map its usage block and hold a slot each
(``bench_daemon.give_slots``), let a scan see them, kill them, let the
reaper take their slots back, delete the vGPU; a list and an events read
each round. Every 5 s the daemon's RSS (VmRSS) and open descriptors are
sampled. A leak per vGPU or per process lifetime shows as a slope: the
report compares the median of the first and the last minute.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_daemon import give_slots, start_daemon

from vgpud import __version__

PROCS_PER_ROUND = 20
SAMPLE_EVERY_S = 5.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--markdown", type=Path)
    p.add_argument("--plot", type=Path)
    a = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vgs", dir="/tmp"))
    daemon, client, _ = start_daemon(work, 8)
    samples: list[tuple[float, int, int]] = []  # (s since start, RSS KiB, fds)
    rounds = processes = 0
    start = time.monotonic()
    next_sample = start
    try:
        while time.monotonic() - start < a.minutes * 60:
            v = client.post("/v1/vgpus", {"memory": "64m", "share": 5, "mode": "soft"})
            sleepers = give_slots([v], PROCS_PER_ROUND)
            deadline = time.monotonic() + 10
            while client.get(f"/v1/vgpus/{v['id']}")["processes"] < PROCS_PER_ROUND:
                if time.monotonic() > deadline:
                    raise SystemExit("the slots were never seen")
                time.sleep(0.1)
            sleepers.close()
            deadline = time.monotonic() + 10
            while client.get(f"/v1/vgpus/{v['id']}")["processes"] > 0:
                if time.monotonic() > deadline:
                    raise SystemExit("the slots were never reclaimed")
                time.sleep(0.1)
            client.delete(f"/v1/vgpus/{v['id']}")
            client.get("/v1/vgpus")
            client.raw("GET", "/v1/events?follow=false")
            rounds += 1
            processes += PROCS_PER_ROUND
            if time.monotonic() >= next_sample:
                samples.append((time.monotonic() - start, rss_kib(daemon.pid), fds(daemon.pid)))
                next_sample += SAMPLE_EVERY_S
    finally:
        daemon.terminate()
        daemon.wait(30)

    first = [s for s in samples if s[0] < 60]
    last = [s for s in samples if s[0] >= samples[-1][0] - 60]

    def med(rows: list[tuple[float, int, int]], i: int) -> float:
        return statistics.median(r[i] for r in rows)

    lines = [
        "# vgpud soak: memory and descriptors under churn",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {os.cpu_count()} CPUs "
        f"({platform.machine()}), Linux {platform.release()}, Python "
        f"{platform.python_version()}, vgpud {__version__}. GPU: SIMULATED (build/sim). "
        f"Command: `.venv/bin/python benchmarks/soak_daemon.py --minutes {a.minutes:g}`.",
        "",
        f"{rounds} rounds in {samples[-1][0] / 60:.1f} min: {rounds} vGPUs created and deleted, "
        f"{processes} processes started with a slot each, seen, killed and reaped.",
        "",
        "| | first minute (median) | last minute (median) | change |",
        "| --- | --- | --- | --- |",
        f"| RSS | {med(first, 1) / 1024:.1f} MiB | {med(last, 1) / 1024:.1f} MiB | "
        f"{(med(last, 1) - med(first, 1)) / 1024:+.1f} MiB |",
        f"| open descriptors | {med(first, 2):.0f} | {med(last, 2):.0f} | "
        f"{med(last, 2) - med(first, 2):+.0f} |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if a.markdown is not None:
        a.markdown.write_text(text)
    if a.plot is not None:
        plot(samples, a.plot)
    return 0


def plot(samples: list[tuple[float, int, int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    minutes = [s[0] / 60 for s in samples]
    ax.plot(minutes, [s[1] / 1024 for s in samples], color="tab:blue", label="RSS (MiB)")
    ax.set_xlabel("minutes of churn")
    ax.set_ylabel("RSS (MiB)", color="tab:blue")
    ax.set_ylim(bottom=0)
    other = ax.twinx()
    other.plot(minutes, [s[2] for s in samples], color="tab:orange", label="descriptors")
    other.set_ylabel("open descriptors", color="tab:orange")
    other.set_ylim(bottom=0)
    ax.set_title("vgpud under churn (simulated GPU): RSS and descriptors")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
