"""Soak: the daemon's memory, descriptors and CPU over minutes of churn.

    .venv/bin/python benchmarks/soak_daemon.py [--minutes 10] [--markdown FILE] [--plot FILE]

The real daemon on the simulated GPU (build/sim). Over and over: create a
vGPU, start 20 processes that map its usage block and hold a slot each
(``bench_daemon.give_slots``), let a scan see them, kill them, let the
reaper take their slots back, delete the vGPU; a list and an events read
each round. Every 5 s the daemon's RSS (VmRSS), open descriptors and CPU
time are sampled. A leak per vGPU or per process lifetime, or a cost that
grows with what the daemon has seen, shows as a slope: the report compares
the median of the first and the last minute (CPU: % of a core over each
5 s interval; the churn itself is most of it).
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

from bench_daemon import cpu_seconds, give_slots, start_daemon

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
    daemon, client, _ = start_daemon(work, 8, work)
    samples: list[tuple[float, int, int, float]] = []  # (s since start, RSS KiB, fds, CPU %)
    rounds = processes = 0
    start = time.monotonic()
    next_sample = start
    cpu_then, then = cpu_seconds(daemon.pid), start
    try:
        while time.monotonic() - start < a.minutes * 60:
            v = client.post("/v1/vgpus", {"memory": "64m", "share": 5, "mode": "soft"})
            sleepers = give_slots([v], PROCS_PER_ROUND, None)
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
                now, cpu = time.monotonic(), cpu_seconds(daemon.pid)
                busy = (cpu - cpu_then) / (now - then) * 100
                samples.append((now - start, rss_kib(daemon.pid), fds(daemon.pid), busy))
                cpu_then, then = cpu, now
                next_sample += SAMPLE_EVERY_S
    finally:
        daemon.terminate()
        daemon.wait(30)

    first = [s for s in samples if s[0] < 60]
    last = [s for s in samples if s[0] >= samples[-1][0] - 60]

    def med(rows: list[tuple[float, int, int, float]], i: int) -> float:
        return statistics.median(r[i] for r in rows)

    lines = [
        "# vgpud soak: memory, descriptors and CPU under churn",
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
        f"| daemon CPU (5 s intervals) | {med(first, 3):.1f} % | {med(last, 3):.1f} % | "
        f"{med(last, 3) - med(first, 3):+.1f} points |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if a.markdown is not None:
        a.markdown.write_text(text)
    if a.plot is not None:
        plot(samples, a.plot)
    return 0


def plot(samples: list[tuple[float, int, int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, cpu) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    minutes = [s[0] / 60 for s in samples]
    ax.plot(minutes, [s[1] / 1024 for s in samples], color="tab:blue", label="RSS (MiB)")
    ax.set_ylabel("RSS (MiB)", color="tab:blue")
    ax.set_ylim(bottom=0)
    other = ax.twinx()
    other.plot(minutes, [s[2] for s in samples], color="tab:orange", label="descriptors")
    other.set_ylabel("open descriptors", color="tab:orange")
    other.set_ylim(bottom=0)
    ax.set_title("vgpud under churn (simulated GPU): RSS, descriptors, CPU")
    cpu.plot(minutes, [s[3] for s in samples], color="tab:green")
    cpu.set_xlabel("minutes of churn")
    cpu.set_ylabel("daemon CPU (% of a core)")
    cpu.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
