"""Daemon cost: CPU with 100 vGPUs and 1000 tracked processes at the default
periods, and API latency at 200 requests/s.

    .venv/bin/python benchmarks/bench_daemon.py [--vgpus 100] [--procs 1000]
        [--nvml-listed] [--cpu-seconds 30] [--rate 200] [--api-seconds 15]
        [--busy USE] [--mode soft|hard] [--markdown FILE]

What is real and what is simulated: the daemon is the real vgpud (default
config periods: control 0.1 s, NVML sample 0.2 s, scan 1 s) on the
simulated GPU (build/sim, 4 devices). The processes are real: 1000 sleeping
processes, each mapping one vGPU's usage block (as the hook does: the host's
proof that the slot is its own) and given an ACTIVE slot there with its real
identity (PID namespace, pid, start time), written the way the hook writes
it, so the tracker maps, publishes host pids and checks liveness for each of
them every scan. They make no CUDA calls, so NVML lists none of them and the
per-process utilization path is idle; with --nvml-listed each also holds a
context and 1 MiB on its vGPU's GPU through the simulator's libcuda, so
that NVML lists every one of them (with its memory; they run no kernels,
so no utilization figure). With --busy the benchmark itself moves every
vGPU's usage counters (GPU time and launches) as the hooks of running
processes would, so that the controller sees new inputs at every tick;
without it a node of sleepers takes the controller's quiet path. The vGPUs
are soft at 5 % (125 % of each GPU), or with --mode hard hard at 4 %, or
at --share. Where every quota is its share (hard vGPUs that share their
GPUs, soft ones with processes whose shares fill them) the controller
fixes the GPU and ticks skip it while no vGPU comes to be alone and the
scan finds the same processes; soft shares that leave part of a GPU free
(--share 3: 75 %) have that spare time divided at every tick. The API
load is GETs of a vGPU (by id), /v1/health and /v1/devices, a new
unix-socket connection per request (what vgpuctl does), paced open-loop
at the given rate from another process; the latency is measured by that
client. The client shares the machine's cores
with the daemon: its own CPU and the daemon's request histogram (how many
answers took at most 1 ms / 5 ms inside the daemon) are reported too, so
that the client's part of the figure can be told apart.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing import Process, Queue
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.hook import MappedSleepers
from vgpud import __version__
from vgpud.ctl.client import Client, DaemonUnreachable
from vgpud.vgpus.abi import SLOT_ACTIVE, UsageC, UsageDeviceC

ROOT = Path(__file__).resolve().parents[1]
SIM_DEVICES = 4
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def thread_cpu(pid: int) -> dict[int, tuple[str, float, int]]:
    """Each thread of ``pid``: its name (comm), utime + stime (s) and how
    many times it has slept and woken (voluntary context switches) so far."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:
            continue  # ended meanwhile
        comm = stat.split("(", 1)[1].rsplit(")", 1)[0]
        fields = stat.rsplit(")", 1)[1].split()
        woke = next(
            int(line.split()[1])
            for line in status.splitlines()
            if line.startswith("voluntary_ctxt_switches")
        )
        out[int(task.name)] = (comm, (int(fields[11]) + int(fields[12])) / CLK_TCK, woke)
    return out


def per_thread(
    pid: int, before: dict[int, tuple[str, float, int]], seconds: float
) -> list[tuple[str, float, float]]:
    """Each thread's share of a core since ``before`` and its wake-ups a
    second (its name, the main thread's "event loop"), largest share first.
    On a shared VM a wake-up after a pause costs more than most of what it
    wakes for (docs/benchmarks/daemon.md): the wake-ups are the steadier
    figure of the two."""
    out = []
    for tid, (comm, cpu, woke) in thread_cpu(pid).items():
        _, cpu0, woke0 = before.get(tid, (comm, 0.0, 0))
        name = "event loop" if tid == pid else f"{comm} ({tid})"
        out.append((name, (cpu - cpu0) / seconds * 100, (woke - woke0) / seconds))
    return sorted(out, key=lambda t: -t[1])


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def start_daemon(
    work: Path, vgpus: int, run_parent: Path
) -> tuple[subprocess.Popen[bytes], Client, dict[str, str]]:
    """vgpud on the simulated GPU: its socket, log and state dir in ``work``;
    its run dir (the blocks) and the simulated GPU's state file in
    ``run_parent``. A node keeps its run dir on a tmpfs (/run/vgpud), its
    state dir on disk (/var/lib/vgpud), and has no simulator: bench_api,
    which times writes, passes a tmpfs here, so that a save costs what a
    node's does and no other file's writeback shares the disk with it; the
    CPU benchmarks pass ``work``, as their recorded runs had it."""
    env = dict(os.environ)
    env.update(
        {
            "LD_LIBRARY_PATH": str(ROOT / "build" / "sim"),
            "VGPU_SIM_STATE": str(run_parent / "sim"),
            "VGPU_SIM_DEVICES": str(SIM_DEVICES),
            # An 80 GiB GPU, as an H100: room for 250 contexts (--nvml-listed).
            "VGPU_SIM_MEMORY": "80g",
            "VGPUD_CDI_DIR": "",
            "VGPUD_SOCKET_GROUP": "",
            "VGPUD_LOG_LEVEL": "warning",
            "VGPUD_MAX_VGPUS_PER_GPU": str(-(-vgpus // SIM_DEVICES)),
        }
    )
    sock = str(work / "s")
    args = [sys.executable, "-m", "vgpud.daemon", "--sim", "--socket", sock]
    args += ["--run-dir", str(run_parent / "run"), "--state-dir", str(work / "state")]
    log = open(work / "vgpud.log", "wb")  # noqa: SIM115 - the daemon keeps it
    daemon = subprocess.Popen(args, env=env, stdout=log, stderr=log)
    client = Client(sock)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.get("/v1/health")
            break
        except DaemonUnreachable:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"vgpud did not start; see {work / 'vgpud.log'}") from None
            time.sleep(0.05)
    return daemon, client, env


def make_vgpus(
    client: Client, n: int, mode: str, share: int | None = None
) -> list[dict[str, object]]:
    """``n`` vGPUs spread over the GPUs at ``share``; by default soft at 5 %
    (soft shares are not admitted against each other: 100 fit on 4 GPUs,
    125 % of each), or hard, each GPU's shares summing to at most 100 % (4 %
    for 100 vGPUs)."""
    if share is None:
        share = 5 if mode == "soft" else max(1, 100 // -(-n // SIM_DEVICES))
    out = []
    for i in range(n):
        body = {"gpus": [i % SIM_DEVICES], "memory": "64m", "share": share, "mode": mode}
        out.append(client.post("/v1/vgpus", body))
    return out


def usage_path(vgpu: dict[str, object]) -> str:
    return str(vgpu["host_env"]["VGPU_USAGE"])  # type: ignore[index]


def map_usage(path: str) -> mmap.mmap:
    """A vGPU's usage block, mapped read-write as its hooks map it."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, ctypes.sizeof(UsageC))
    finally:
        os.close(fd)


def give_slots(
    vgpus: list[dict[str, object]], procs: int, gpu_env: dict[str, str] | None
) -> MappedSleepers:
    """Start ``procs`` sleeping processes spread over the vGPUs, each mapping
    its vGPU's usage block (the host's proof that a slot is its own), and
    write an ACTIVE slot per process, as the hook would at its first CUDA call.
    With ``gpu_env`` (the simulator's), each also holds memory on its vGPU's
    GPU, so that NVML lists it."""
    pidns = os.stat("/proc/self/ns/pid").st_ino
    paths = [usage_path(v) for v in vgpus]
    counts = [len(range(n, procs, len(vgpus))) for n in range(len(vgpus))]
    gpus = None if gpu_env is None else [n % SIM_DEVICES for n in range(len(vgpus))]  # make_vgpus
    sleepers = MappedSleepers(
        [(Path(p), c) for p, c in zip(paths, counts, strict=True)], gpus, gpu_env
    )
    at = 0
    for path, count in zip(paths, counts, strict=True):
        mm = map_usage(path)
        block = UsageC.from_buffer(mm)
        for i, pid in enumerate(sleepers.pids[at : at + count]):
            slot = block.slots[i]
            slot.pid, slot.pidns, slot.start_time = pid, pidns, start_time(pid)
            slot.dev[0].used = 1 << 20
            block.devices[0].used += 1 << 20
            slot.state = SLOT_ACTIVE
            del slot  # no ctypes view may outlive the mapping
        at += count
        del block
        mm.close()
    return sleepers


class Counters:
    """Every vGPU's usage counters moved as the hooks of running processes
    move them (``--busy``): each ``period`` every vGPU's device 0 gains
    GPU time at ``use`` of the elapsed time, in launches of 20 us, so that
    every control tick reads new figures for every vGPU (the controller's
    whole path, not the quiet one that an idle node's ticks take)."""

    def __init__(self, vgpus: list[dict[str, object]], use: float, period: float = 0.02) -> None:
        self._maps = [map_usage(usage_path(v)) for v in vgpus]
        self._use, self._period = use, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # gpu_time_ns and launches, side by side in device 0's entry.
        at = UsageC.devices.offset + UsageDeviceC.gpu_time_ns.offset
        assert UsageDeviceC.launches.offset == UsageDeviceC.gpu_time_ns.offset + 8
        last = time.monotonic_ns()
        while not self._stop.wait(self._period):
            now = time.monotonic_ns()
            ns = int((now - last) * self._use)
            last = now
            for mm in self._maps:
                gpu_time, launches = struct.unpack_from("=QQ", mm, at)
                struct.pack_into("=QQ", mm, at, gpu_time + ns, launches + ns // 20_000)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for mm in self._maps:
            mm.close()


def wait_tracked(client: Client, procs: int, listed: bool) -> tuple[int, int]:
    """How many processes the daemon tracks once it has seen them all (first
    sight reads status, ns and maps once each), or after a minute; and how
    many of them NVML lists (with memory), waited for when ``listed``."""

    def count() -> tuple[int, int]:
        seen = client.get("/v1/processes")
        return len(seen), sum(1 for p in seen if any(p["memory"].values()))

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        tracked, on_nvml = count()
        if tracked >= procs and (on_nvml >= procs or not listed):
            break
        time.sleep(0.5)
    return count()


def load(sock: str, paths: list[str], rate: float, seconds: float, out: Queue) -> None:  # type: ignore[type-arg]
    client = Client(sock)
    latencies = []
    errors = 0
    start = time.perf_counter()
    cpu_start = time.process_time()
    n = int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        t0 = time.perf_counter()
        try:
            status, _ = client.raw("GET", paths[i % len(paths)])
            errors += status != 200
        except OSError:
            errors += 1
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    out.put((latencies, errors, elapsed, (time.process_time() - cpu_start) / elapsed * 100))


def loop_costs(client: Client) -> dict[str, tuple[float, float]]:
    """Mean duration (ms) and rate (per s) of each daemon loop, from /metrics."""
    text = client.raw("GET", "/metrics")[1].decode()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for kind, into in (("_sum", sums), ("_count", counts)):
            prefix = f'vgpud_loop_duration_seconds{kind}{{loop="'
            if line.startswith(prefix):
                name = line[len(prefix) :].split('"')[0]
                into[name] = float(line.rsplit(" ", 1)[1])
    return {k: (sums[k] / counts[k] * 1000, counts[k]) for k in sums if counts.get(k)}


def served_within(client: Client, routes: list[str], bounds: tuple[float, ...]) -> list[float]:
    """Share (%) of the GETs on ``routes`` the daemon answered within each
    bound (s), from its own request histogram: the server's side of the
    latency, without the client's."""
    text = client.raw("GET", "/metrics")[1].decode()
    counts = dict.fromkeys(bounds, 0.0)
    total = 0.0
    for line in text.splitlines():
        if not line.startswith("vgpud_api_request_duration_seconds_bucket{"):
            continue
        labels, value = line.rsplit(" ", 1)
        if 'method="GET"' not in labels or not any(f'route="{r}"' in labels for r in routes):
            continue
        le = labels.split('le="')[1].split('"')[0]
        if le == "+Inf":
            total += float(value)
        elif float(le) in counts:
            counts[float(le)] += float(value)
    return [counts[b] / total * 100 if total else 0.0 for b in bounds]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vgpus", type=int, default=100)
    p.add_argument("--procs", type=int, default=1000)
    p.add_argument("--nvml-listed", action="store_true", help="processes NVML lists")
    p.add_argument("--cpu-seconds", type=float, default=30)
    p.add_argument("--rate", type=float, default=200)
    p.add_argument("--api-seconds", type=float, default=15)
    p.add_argument(
        "--busy",
        type=float,
        default=0.0,
        metavar="USE",
        help="every vGPU's counters move as if its processes used this part of its GPU (0-1)",
    )
    p.add_argument(
        "--mode", choices=["soft", "hard"], default="soft", help="the vGPUs' compute mode"
    )
    p.add_argument(
        "--share",
        type=int,
        help="the vGPUs' share (%%; default 5 soft, each GPU's 100 %% divided hard); soft "
        "shares that leave part of a GPU free have spare time divided among them every tick",
    )
    p.add_argument("--markdown", type=Path, help="also write the results here")
    a = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vgb", dir="/tmp"))
    daemon, client, env = start_daemon(work, a.vgpus, work)
    sleepers: MappedSleepers | None = None
    counters: Counters | None = None
    try:
        idle_before = cpu_seconds(daemon.pid)
        time.sleep(5)
        idle = (cpu_seconds(daemon.pid) - idle_before) / 5 * 100
        vgpus = make_vgpus(client, a.vgpus, a.mode, a.share)
        sleepers = give_slots(vgpus, a.procs, env if a.nvml_listed else None)
        tracked, listed = wait_tracked(client, a.procs, a.nvml_listed)
        if a.busy:
            counters = Counters(vgpus, a.busy)
        time.sleep(2)
        before, threads, t0 = cpu_seconds(daemon.pid), thread_cpu(daemon.pid), time.monotonic()
        time.sleep(a.cpu_seconds)
        window = time.monotonic() - t0
        busy = (cpu_seconds(daemon.pid) - before) / window * 100
        threads_busy = per_thread(daemon.pid, threads, window)
        loops = loop_costs(client)

        paths = [
            f"/v1/vgpus/{vgpus[0]['id']}",
            "/v1/health",
            "/v1/devices",
            f"/v1/vgpus/{vgpus[-1]['id']}",
        ]
        results: Queue = Queue()  # type: ignore[type-arg]
        loader = Process(
            target=load, args=(client.socket_path, paths, a.rate, a.api_seconds, results)
        )
        before, t0 = cpu_seconds(daemon.pid), time.monotonic()
        loader.start()
        latencies, errors, elapsed, client_cpu = results.get(timeout=a.api_seconds * 4 + 60)
        loader.join()
        busy_api = (cpu_seconds(daemon.pid) - before) / (time.monotonic() - t0) * 100
        served = served_within(
            client, ["/v1/vgpus/{id}", "/v1/health", "/v1/devices"], (0.001, 0.005)
        )
    finally:
        if counters is not None:
            counters.close()
        if sleepers is not None:
            sleepers.close()
        daemon.terminate()
        daemon.wait(30)

    ms = [x * 1000 for x in latencies]
    lines = [
        "# vgpud daemon benchmark",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()}: "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
        f"Linux {platform.release()}, Python {platform.python_version()}, vgpud {__version__}.",
        "GPU: SIMULATED (build/sim, 4 devices). Command: "
        f"`.venv/bin/python benchmarks/bench_daemon.py --vgpus {a.vgpus} --procs {a.procs}"
        f"{' --nvml-listed' if a.nvml_listed else ''}{f' --busy {a.busy}' if a.busy else ''}"
        f" --mode {a.mode}{f' --share {a.share}' if a.share is not None else ''}`.",
        "",
        "Simulated: the GPU. Real: the daemon with its default periods, "
        f"{a.procs} sleeping processes each holding an ACTIVE slot (real pid, PID namespace and "
        "start time) in one of the vGPUs' usage blocks, so every scan maps and checks each of "
        + (
            f"them; each holds 1 MiB of its vGPU's GPU and NVML lists {listed} of them. "
            if a.nvml_listed
            else "them; they make no CUDA calls (NVML lists none). "
        )
        + (
            f"Every vGPU's counters move as if its processes used {a.busy:.0%} of its GPU. "
            if a.busy
            else ""
        )
        + "See the script's docstring.",
        "",
        "| measure | result | target |",
        "| --- | --- | --- |",
        f"| daemon CPU, idle, no vGPU | {idle:.2f} % of a core | |",
        f"| daemon CPU, {a.vgpus} vGPUs, {tracked} tracked processes"
        f"{f' ({listed} NVML-listed)' if a.nvml_listed else ''}, {a.cpu_seconds:.0f} s | "
        f"{busy:.2f} % of a core | < 2 % |",
        *(
            f"| … thread {name} (utime + stime, same window; wake-ups) "
            f"| {share:.2f} % ({woke:.1f}/s) | |"
            for name, share, woke in threads_busy
            if share > 0
        ),
        f"| API at {a.rate:.0f} req/s for {a.api_seconds:.0f} s "
        f"({len(ms)} requests, {errors} errors) | "
        f"p50 {statistics.median(ms):.2f} ms, p99 {percentile(ms, 99):.2f} ms, "
        f"max {max(ms):.2f} ms | p99 < 5 ms |",
        f"| daemon CPU during the API load | {busy_api:.1f} % of a core | |",
        f"| load client's own CPU (same machine) | {client_cpu:.1f} % of a core | |",
        f"| answered by the daemon within 1 ms / 5 ms (its own histogram, whole run) | "
        f"{served[0]:.2f} % / {served[1]:.2f} % | |",
        *(
            f"| mean time of one `{name}` loop iteration (whole run) | {mean:.2f} ms | |"
            for name, (mean, _) in sorted(loops.items())
        ),
        f"| achieved request rate | {len(ms) / elapsed:.1f} req/s | |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        a.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
