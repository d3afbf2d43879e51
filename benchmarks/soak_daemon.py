"""Soak: the daemon's memory, descriptors and CPU over minutes of churn.

    .venv/bin/python benchmarks/soak_daemon.py [--minutes 10] [--fill]
        [--markdown FILE] [--plot FILE] [--csv FILE]

The real daemon on the simulated GPU (build/sim). Over and over: create a
vGPU, start 20 processes that map its usage block and hold a slot each
(``bench_daemon.give_slots``), let a scan see them, kill them, let the
reaper take their slots back, delete the vGPU; a list and an events read
each round. Every 5 s the daemon's RSS (VmRSS), open descriptors and CPU
time are sampled, with how full the event log's two rings are (counted in
that round's events read). A leak per vGPU or per process lifetime, or a
cost that grows with what the daemon has seen, shows as a slope: the report
compares the median of the first and the last minute (CPU: % of a core over
each 5 s interval; the churn itself is most of it) and fits RSS a line.

The event log keeps up to ``event_buffer`` events in each of two rings
(vgpud/surface/events.py). A round adds about 20 to the ring of process
and slot events (a ``slot.reclaimed`` per process; ``process.started`` and
``process.exited`` only for the few a scan finds alive before they are
killed) and 2 to the other (``vgpu.created``, ``vgpu.deleted``): at the
default 10,000 the first ring fills after ~500 rounds (~17 minutes on 2
CPUs) and the second after ~5,000 (hours), and until then RSS rises by
the events kept (about 0.8 KiB of RSS each). ``--fill`` fills both rings
before the measured window starts (vGPUs created and deleted with no
processes for the main ring, then rounds of 8 vGPUs with 25 processes
each for the other), so that what the window shows is what grows besides
the event log.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_daemon import cpu_seconds, give_slots, start_daemon

from vgpud import __version__
from vgpud.config import load_config
from vgpud.ctl.client import Client
from vgpud.surface.events import CHURN, EVENTS_LOST

PROCS_PER_ROUND = 20
SAMPLE_EVERY_S = 5.0
FILL_VGPUS, FILL_PROCS = 8, 200  # a round of the churn ring's fill: 8 vGPUs, 25 processes each
VGPU = {"memory": "64m", "share": 5, "mode": "soft"}

# (s since the window began, RSS KiB, fds, CPU %, events in the main ring, in the churn ring)
Sample = tuple[float, int, int, float, int, int]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def ring_fill(ndjson: bytes) -> tuple[int, int]:
    """The events in each ring (main, churn), counted in a whole-log read
    (``GET /v1/events?follow=false``, one JSON object a line, as
    ``json.dumps`` writes them); an ``events.lost`` notice is in neither."""
    churn = sum(ndjson.count(f'"type": "{t}"'.encode()) for t in CHURN)
    lost = ndjson.count(f'"type": "{EVENTS_LOST}"'.encode())
    return ndjson.count(b"\n") - churn - lost, churn


def read_fill(client: Client) -> tuple[int, int]:
    status, body = client.raw("GET", "/v1/events?follow=false")
    if status != 200:
        raise SystemExit(f"GET /v1/events: {status}")
    return ring_fill(body)


def churn_round(client: Client, vgpus: int, procs: int) -> None:
    """``vgpus`` vGPUs and ``procs`` processes spread over them, each
    holding a slot: seen by a scan, killed, their slots reaped; the vGPUs
    deleted."""
    made = [client.post("/v1/vgpus", VGPU) for _ in range(vgpus)]
    want = [len(range(n, procs, vgpus)) for n in range(vgpus)]  # as give_slots spreads them
    sleepers = give_slots(made, procs, None)
    try:
        _wait(client, made, lambda n, seen: seen >= want[n], "seen")
    finally:
        sleepers.close()
    _wait(client, made, lambda _n, seen: seen == 0, "reclaimed")
    for v in made:
        client.delete(f"/v1/vgpus/{v['id']}")


def _wait(
    client: Client, vgpus: list[dict[str, Any]], done: Callable[[int, int], bool], what: str
) -> None:
    deadline = time.monotonic() + 10
    for n, v in enumerate(vgpus):
        while not done(n, client.get(f"/v1/vgpus/{v['id']}")["processes"]):
            if time.monotonic() > deadline:
                raise SystemExit(f"the slots were never {what}")
            time.sleep(0.1)


def fill(client: Client, capacity: int) -> tuple[int, int, float]:
    """Both rings filled: vGPUs created and deleted (two main-ring events
    each) until the main ring holds ``capacity``, then rounds of
    FILL_VGPUS vGPUs and FILL_PROCS processes until the churn ring does.
    Returns the vGPUs and processes it took and the seconds."""
    start = time.monotonic()
    vgpus = processes = 0
    main, churn = read_fill(client)
    while main < capacity:
        for _ in range((capacity - main + 1) // 2):
            v = client.post("/v1/vgpus", VGPU)
            client.delete(f"/v1/vgpus/{v['id']}")
            vgpus += 1
        main, churn = read_fill(client)
    while churn < capacity:
        churn_round(client, FILL_VGPUS, FILL_PROCS)
        vgpus += FILL_VGPUS
        processes += FILL_PROCS
        main, churn = read_fill(client)
    print(
        f"rings filled ({main} + {churn} events) in {time.monotonic() - start:.0f} s: "
        f"{vgpus} vGPUs, {processes} processes",
        flush=True,
    )
    return vgpus, processes, time.monotonic() - start


def slope(rows: list[Sample], i: int) -> float:
    """Least squares: column ``i`` per minute."""
    return statistics.linear_regression([r[0] / 60 for r in rows], [r[i] for r in rows]).slope


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10, help="the measured window")
    p.add_argument(
        "--fill", action="store_true", help="fill the event log's rings before the window"
    )
    p.add_argument("--markdown", type=Path)
    p.add_argument("--plot", type=Path)
    p.add_argument("--csv", type=Path, help="the samples, one a line")
    a = p.parse_args()

    capacity = load_config(None).event_buffer  # as the daemon reads it (VGPUD_EVENT_BUFFER)
    work = Path(tempfile.mkdtemp(prefix="vgs", dir="/tmp"))
    daemon, client, _ = start_daemon(work, max(8, FILL_VGPUS), work)
    samples: list[Sample] = []
    rounds = processes = 0
    filled: tuple[int, int, float] | None = None
    try:
        if a.fill:
            filled = fill(client, capacity)
        start = time.monotonic()
        next_sample = start
        cpu_then, then = cpu_seconds(daemon.pid), start
        while time.monotonic() - start < a.minutes * 60:
            churn_round(client, 1, PROCS_PER_ROUND)
            client.get("/v1/vgpus")
            main, churn = read_fill(client)
            rounds += 1
            processes += PROCS_PER_ROUND
            if time.monotonic() >= next_sample:
                now, cpu = time.monotonic(), cpu_seconds(daemon.pid)
                busy = (cpu - cpu_then) / (now - then) * 100
                rss, fd = rss_kib(daemon.pid), fds(daemon.pid)
                samples.append((now - start, rss, fd, busy, main, churn))
                cpu_then, then = cpu, now
                next_sample += SAMPLE_EVERY_S
    finally:
        daemon.terminate()
        daemon.wait(30)

    text = report(a, capacity, filled, samples, rounds, processes)
    print(text)
    if a.markdown is not None:
        a.markdown.write_text(text)
    if a.plot is not None:
        plot(samples, capacity, a.plot)
    if a.csv is not None:
        with a.csv.open("w") as f:
            f.write("s,rss_kib,fds,cpu_percent,main_ring,churn_ring\n")
            f.writelines(f"{t:.1f},{r},{d},{c:.2f},{m},{n}\n" for t, r, d, c, m, n in samples)
    return 0


def report(
    a: argparse.Namespace,
    capacity: int,
    filled: tuple[int, int, float] | None,
    samples: list[Sample],
    rounds: int,
    processes: int,
) -> str:
    first = [s for s in samples if s[0] < 60]
    last = [s for s in samples if s[0] >= samples[-1][0] - 60]
    half = [s for s in samples if s[0] >= samples[-1][0] / 2]

    def med(rows: list[Sample], i: int) -> float:
        return statistics.median(r[i] for r in rows)

    env = "VGPUD_EVENT_BUFFER" in os.environ
    command = (f"VGPUD_EVENT_BUFFER={capacity} " if env else "") + (
        f".venv/bin/python benchmarks/soak_daemon.py --minutes {a.minutes:g}"
        + (" --fill" if a.fill else "")
    )
    before = (
        "the rings empty at the start"
        if filled is None
        else f"the rings filled first ({filled[0]} vGPUs and {filled[1]} processes, "
        f"{filled[2] / 60:.1f} min; not in the window)"
    )
    rss = [s[1] / 1024 for s in samples]
    fd = [s[2] for s in samples]
    lines = [
        "# vgpud soak: memory, descriptors and CPU under churn",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {os.cpu_count()} CPUs "
        f"({platform.machine()}), Linux {platform.release()}, Python "
        f"{platform.python_version()}, vgpud {__version__}. GPU: SIMULATED (build/sim). "
        f"Command: `{command}`.",
        "",
        f"Event buffer {capacity} a ring; {before}. Measured: {rounds} rounds in "
        f"{samples[-1][0] / 60:.1f} min: {rounds} vGPUs created and deleted, "
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
        f"| events in the main ring | {med(first, 4):.0f} | {med(last, 4):.0f} | "
        f"{med(last, 4) - med(first, 4):+.0f} |",
        f"| events in the churn ring | {med(first, 5):.0f} | {med(last, 5):.0f} | "
        f"{med(last, 5) - med(first, 5):+.0f} |",
        "",
        f"RSS, least squares: {slope(samples, 1):+.1f} KiB/min over the window, "
        f"{slope(half, 1):+.1f} KiB/min over its second half; RSS {min(rss):.1f} to "
        f"{max(rss):.1f} MiB, descriptors {min(fd)} to {max(fd)} over the window.",
        "",
    ]
    return "\n".join(lines)


def plot(samples: list[Sample], capacity: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, rings, cpu) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    minutes = [s[0] / 60 for s in samples]
    rss = [s[1] / 1024 for s in samples]
    ax.plot(minutes, rss, color="tab:blue", label="RSS (MiB)")
    ax.set_ylabel("RSS (MiB)", color="tab:blue")
    # A 10 MiB span at least, about the window's RSS: a slope of a few
    # hundred KiB shows, and is not made to look like more than it is.
    mid = (min(rss) + max(rss)) / 2
    half = max(5.0, (max(rss) - min(rss)) / 2 + 1)
    ax.set_ylim(mid - half, mid + half)
    other = ax.twinx()
    other.plot(minutes, [s[2] for s in samples], color="tab:orange", label="descriptors")
    other.set_ylabel("open descriptors", color="tab:orange")
    other.set_ylim(bottom=0)
    ax.set_title("vgpud under churn (simulated GPU): RSS, descriptors, event log, CPU")
    rings.plot(minutes, [s[4] for s in samples], color="tab:purple", label="main ring")
    rings.plot(minutes, [s[5] for s in samples], color="tab:red", label="churn ring")
    rings.axhline(capacity, color="grey", linestyle=":", label=f"capacity ({capacity})")
    rings.set_ylabel("events kept")
    rings.set_ylim(0, capacity * 1.1)
    rings.legend(loc="lower right", fontsize="small")
    cpu.plot(minutes, [s[3] for s in samples], color="tab:green")
    cpu.set_xlabel("minutes of churn (the measured window)")
    cpu.set_ylabel("daemon CPU (% of a core)")
    cpu.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
