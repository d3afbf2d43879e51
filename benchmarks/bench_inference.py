"""Compute shares for inference-shaped work, measured from outside.

Each case runs benchmarks/inference_workload.py (PyTorch, eager decode
shapes, a transformers decoder) natively and under the hook at a standalone
share (`CUDA_CORE_LIMIT`), optionally next to a GPU-bound neighbour
(vgpu-burn, 20 ms kernels, at its own share), while an unhooked sampler
reads NVML's device utilization. For each case it reports the work done
(units/s, and the fraction of the native rate), NVML's device busy (mean
and the worst 1 s window) and, next to a neighbour, the neighbour's work:
OUTDIR/inference.md and .json, and their plot OUTDIR/inference.png
(benchmarks/plot_inference.py).

The target: at share s a workload alone is busy min(s, native
busy) within 3 points, mean and every 1 s window.

  python benchmarks/bench_inference.py OUTDIR [--seconds S] [--workloads a,b]
                                       [--shares 30,60] [--coloc 30:60,n:n]
                                       [--neighbour-kernel-us 20000]
                                       [--separate-turns] [--neighbour NAME]
                                       [--daemon [--no-calibrate]] [--rounds N]

With --daemon each hooked side is a vGPU of a vgpud started for the run
(hard share, the recipe's environment, the real driver, or the simulator
where `--sim` is passed to it through VGPUD_SIM=1), so the daemon's
controller steers it: a vGPU alone on the GPU with small kernels is
calibrated by NVML's device figure unless --no-calibrate
(docs/compute.md, "Calibrated by NVML while alone"). Without it, sides
run standalone (`CUDA_CORE_LIMIT`) and no daemon is involved.

With --rounds N the whole plan runs N times, natives included, and each
case is judged against its own round's native; the report adds each
case's mean and range over the rounds. The lent VM's CPU moves a
launch-bound workload's native rate by up to a third within minutes, so
a comparison of builds wants alternated runs of several rounds.

In a --coloc pair, "n" runs that side natively (no hook). With
--separate-turns the two hooked sides get arbiter files of their own, so
they do not take turns: the GPU time-slices between them as between
unhooked processes, and each measures spans the other may share. The
neighbour is vgpu-burn (20 ms kernels that spin on the GPU's clock) or,
with --neighbour NAME, one of inference_workload.py's workloads (gemm: a
GPU-bound matmul loop; or a second inference tenant), whose work is
counted in its own units against its native rate: a spin kernel that the
GPU time-slices still ends on time, so vgpu-burn's work overstates what it
got next to a context that takes no turns with it.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.plot_inference import native_of, natives, plot  # noqa: E402
from tests.integration.compute_harness import (  # noqa: E402
    Burn,
    Sampler,
    Samples,
    device_series,
    windows,
)

if TYPE_CHECKING:
    from vgpud.vgpus.blocks import UsageBlock

HOOK = ROOT / "build" / "libvgpu.so"
BURN = ROOT / "build" / "vgpu-burn"
WORKLOAD = ROOT / "benchmarks" / "inference_workload.py"
WARMUP_S = 2.0  # after the first report: clocks, allocator and turns settle
NEIGHBOUR_KERNEL_US = 20000  # default: a GPU-bound tenant's kernels can be this long


@dataclass
class Workload:
    """One inference_workload.py run and the progress it reported."""

    proc: subprocess.Popen[str]
    reports: list[tuple[float, int]] = field(default_factory=list)
    # Its pauses and resumes (SIGUSR1): (state, time, units).
    marks: list[tuple[str, float, int]] = field(default_factory=list)

    @classmethod
    def start(cls, name: str, side: Side) -> Workload:
        return cls.launch([*side.prefix, sys.executable, str(WORKLOAD), name], side.env)

    @classmethod
    def launch(cls, cmd: list[str], env: dict[str, str]) -> Workload:
        """Any command that reports its progress as inference_workload.py does."""
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        run = cls(proc)
        threading.Thread(target=run._read, daemon=True).start()
        return run

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            rec = json.loads(line)
            self.reports.append((rec["t"], rec["units"]))
            if "state" in rec:
                self.marks.append((rec["state"], rec["t"], rec["units"]))

    def wait_started(self, timeout: float = 180.0) -> float:
        deadline = time.monotonic() + timeout
        while not self.reports:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"workload did not start (exit {self.proc.poll()})")
            time.sleep(0.05)
        return self.reports[0][0]

    def rate(self, start: float, end: float) -> float:
        inside = [r for r in self.reports if start <= r[0] <= end]
        if len(inside) < 2:
            raise RuntimeError("too few progress reports in the window")
        (t0, u0), (t1, u1) = inside[0], inside[-1]
        return (u1 - u0) / (t1 - t0)

    def window_rates(self, start: float, end: float, width: float = 1.0) -> list[float]:
        """Its rate over every `width`-second run of reports inside the
        window (sliding by one report): a tenant that loses its share for
        a second shows it here, not in the mean."""
        inside = [r for r in self.reports if start <= r[0] <= end]
        rates = []
        for i, (t0, u0) in enumerate(inside):
            later = next(((t, u) for t, u in inside[i + 1 :] if t - t0 >= width), None)
            if later is None:
                break
            rates.append((later[1] - u0) / (later[0] - t0))
        return rates

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def process_busy(samples: Samples, pids: list[int], start: float, end: float) -> dict[str, float]:
    """NVML's per-process figures for `pids` over [start, end): the mean of
    each process's samples stamped in it (a sample covers up to a second
    before its stamp on 580 drivers, so the first second is left out),
    summed over the processes, and how many samples came. Set beside the
    device figure and the work done, it says whether NVML's per-process
    figures can be trusted with several processes on the GPU
    (docs/compute.md, "The correction")."""
    total, count = 0.0, 0
    for pid in pids:
        utils = [u for ts, u in samples.procs.get(pid, []) if start + 1.0 <= ts < end + 0.2]
        if utils:
            total += sum(utils) / len(utils)
            count += len(utils)
    return {"mean": total, "samples": count}


def hook_counters(usage: Path | None) -> tuple[int, int, int] | None:
    """(gpu_time_ns, launches, throttled_ns) of a usage block's first
    device (a standalone one, or a one-GPU vGPU's), or None where there is
    no block (a native run)."""
    if usage is None or not usage.exists():
        return None
    from vgpud.vgpus.blocks import UsageBlock

    vgpu = usage.parent.name.startswith("vg-")
    block = UsageBlock.open(usage, device_count=1 if vgpu else None)
    try:
        return first_device_counters(block)
    finally:
        block.close()


def first_device_counters(block: UsageBlock) -> tuple[int, int, int]:
    """(gpu_time_ns, launches, throttled_ns) of an open usage block's first device."""
    dev = block.devices()[0]
    return dev.gpu_time_ns, dev.launches, dev.throttled_ns


@dataclass
class Side:
    """How one side of a case runs: its environment, its usage block (None:
    native), and what its command is run under (`prefix`)."""

    env: dict[str, str]
    usage: Path | None = None
    prefix: tuple[str, ...] = ()


def own_cgroup(name: str) -> Path | None:
    """A new cgroup v2 beside nothing else, under this process's own: the
    daemon charges a process that holds no slot of a vGPU to the vGPU whose
    slot holders share its cgroup (docs/tracking.md), so sides that shared
    one would be one tenant. None where none can be made (cgroup v1, not
    root): said once by the caller."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        own = next(line[3:] for line in lines if line.startswith("0::"))
        parent = Path("/sys/fs/cgroup") / own.lstrip("/")
        if not (parent / "cgroup.procs").is_file():  # not a cgroup v2 mounted there
            return None
        path = parent / name
        path.mkdir(exist_ok=True)
    except (OSError, StopIteration):
        return None
    # Made is not enough: moving a process there may still be refused (a
    # cgroup tree delegated to someone else). Tried once with a process
    # that exits at once, so that a side never fails to start for it.
    if subprocess.run([*in_cgroup(path), "true"], stderr=subprocess.DEVNULL).returncode != 0:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


def in_cgroup(path: Path) -> tuple[str, ...]:
    """A command prefix that moves the process into `path`, then execs."""
    return ("sh", "-c", 'echo $$ > "$0" && exec "$@"', str(path / "cgroup.procs"))


class Standalone:
    """Hooked sides at a standalone share (`CUDA_CORE_LIMIT`), no daemon."""

    def __init__(self, workdir: Path, separate_turns: bool) -> None:
        self.workdir = workdir
        self.separate_turns = separate_turns

    def side(self, base: dict[str, str], share: int | None, tag: str) -> Side:
        """One side of a case: `base` unchanged when it runs natively (share
        None), else the hook at a standalone share; with separate turns, an
        arbiter directory of its own keeps it out of the other side's
        turns."""
        if share is None:
            return Side(base)
        usage = self.workdir / f"{tag}.usage"
        env = dict(base, LD_PRELOAD=str(HOOK), VGPU_USAGE=str(usage), LOGGER_LEVEL="2")
        env["CUDA_CORE_LIMIT"] = str(share)
        if self.separate_turns:
            arbiter = self.workdir / f"arbiter-{tag}"
            arbiter.mkdir(mode=0o700, exist_ok=True)
            env["VGPU_ARBITER_DIR"] = str(arbiter)
        return Side(env, usage)

    def release(self) -> None:
        """Nothing to undo between cases."""


class Vgpus:
    """Hooked sides as vGPUs of a vgpud started for the run."""

    def __init__(self, workdir: Path, device: int, calibrate: bool) -> None:
        from vgpud.ctl.client import Client

        self.device = device
        self.run_dir = workdir / "run"
        sock = workdir / "vgpud.sock"
        config = workdir / "vgpud.toml"
        config.write_text(f"calibrate_alone = {str(calibrate).lower()}\n")
        env = dict(os.environ, VGPUD_CDI_DIR="", VGPUD_SOCKET_GROUP="", VGPUD_LOG_LEVEL="warning")
        env.pop("LD_PRELOAD", None)
        args = [
            sys.executable,
            "-m",
            "vgpud.daemon",
            "--config",
            str(config),
            "--socket",
            str(sock),
        ]
        args += ["--run-dir", str(self.run_dir), "--state-dir", str(workdir / "state")]
        self.log = open(workdir / "vgpud.log", "ab")  # noqa: SIM115 - the daemon keeps it
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=self.log, cwd=ROOT)
        self.client = Client(str(sock), timeout=30)
        deadline = time.monotonic() + 60
        while not sock.exists() or not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vgpud did not start: see {workdir / 'vgpud.log'}")
            time.sleep(0.1)
        self.made: list[str] = []
        # What the daemon gave each side: (time, quota ppm, calibrated), read
        # from its control block every 100 ms while the case runs.
        self.quotas: dict[str, list[tuple[float, int, bool]]] = {}
        # And what its hook counted by then: (gpu_time_ns, launches, throttled_ns).
        self.counters: dict[str, list[tuple[int, int, int] | None]] = {}
        self._watching = threading.Event()
        self.cgroups: list[Path] = []
        self._no_cgroup_said = False

    def _answers(self) -> bool:
        from vgpud.ctl.client import DaemonUnreachable

        try:
            return bool(self.client.get("/v1/health"))
        except DaemonUnreachable:
            return False

    def side(self, base: dict[str, str], share: int | None, tag: str) -> Side:
        """A native side's `base`, or a new vGPU (hard share, 30 % of the
        GPU's memory) and the recipe's environment on top of `base`; either
        in a cgroup of its own, so that the daemon does not take a native
        side for a process of the hooked side's vGPU."""
        cgroup = own_cgroup(f"bench-{tag}")
        if cgroup is not None:
            self.cgroups.append(cgroup)
        elif not self._no_cgroup_said:
            print("no cgroup of its own for each side: a native side may count as a vGPU's")
            self._no_cgroup_said = True
        prefix = () if cgroup is None else in_cgroup(cgroup)
        if share is None:
            return Side(base, None, prefix)
        body = {"name": tag, "gpus": [self.device], "memory": "30%", "share": share, "mode": "hard"}
        vgpu = self.client.post("/v1/vgpus", body)
        self.made.append(vgpu["id"])
        self._watching.set()
        series = self.quotas[tag] = []
        counted = self.counters[tag] = []
        control = self.run_dir / vgpu["id"] / "control"
        usage = self.run_dir / vgpu["id"] / "usage"
        threading.Thread(
            target=self._watch, args=(control, usage, series, counted), daemon=True
        ).start()
        env = {**base, **vgpu["host_env"], "LOGGER_LEVEL": "2"}
        return Side(env, self.run_dir / vgpu["id"] / "usage", prefix)

    def _watch(
        self,
        path: Path,
        usage: Path,
        series: list[tuple[float, int, bool]],
        counted: list[tuple[int, int, int] | None],
    ) -> None:
        from vgpud.vgpus.blocks import ControlBlock, UsageBlock

        control = ControlBlock.open(path)
        block = UsageBlock.open(usage, device_count=1)  # the daemon made both
        try:
            while self._watching.is_set():
                device = control.devices()[0]
                series.append((time.time(), device.throttle.quota_ppm, device.calibrated))
                counted.append(first_device_counters(block))
                time.sleep(0.1)
        finally:
            block.close()
            control.close()

    def release(self) -> None:
        """Delete the vGPUs of the last case (their processes are gone)."""
        self._watching.clear()
        time.sleep(0.2)  # the watchers' last look, before their blocks go
        for vid in self.made:
            self.client.delete(f"/v1/vgpus/{vid}?force=true")
        self.made.clear()
        for cgroup in self.cgroups:  # their processes have exited
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        self.cgroups.clear()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


Tenancy = Standalone | Vgpus


def run_case(
    name: str,
    share: int | None,
    neighbour: int | None,
    seconds: float,
    sampler: Sampler,
    tenancy: Tenancy,
    neighbour_kernel_us: int = NEIGHBOUR_KERNEL_US,
    neighbour_workload: tuple[str, float] | None = None,
) -> dict[str, Any]:
    """One case; `neighbour` is the GPU-bound tenant's share, None for no
    neighbour, 0 for a native (unhooked) one. The neighbour is vgpu-burn,
    or the inference_workload.py workload `neighbour_workload` names
    (with its native rate)."""
    base = dict(os.environ)
    base.pop("LD_PRELOAD", None)
    # A vGPU's name: lower case, so a native side (None) is "n".
    label = "n" if share is None else share
    own = tenancy.side(base, share, f"{name}-{label}")
    usage = own.usage
    busage: Path | None = None
    work = Workload.start(name, own)
    burn: Burn | None = None
    other: Workload | None = None
    try:
        first = work.wait_started()
        start = first + WARMUP_S
        if neighbour is not None:
            theirs = tenancy.side(base, neighbour or None, f"neighbour-{name}-{label}")
            busage = theirs.usage
            if neighbour_workload is not None:
                other = Workload.start(neighbour_workload[0], theirs)
                other.wait_started()
            else:
                cmd = [*theirs.prefix, str(BURN), "--seconds", str(seconds + WARMUP_S + 1)]
                cmd += ["--json", "--kernel-us", str(neighbour_kernel_us)]
                burn = Burn.start(cmd, theirs.env, neighbour_kernel_us)
            start = time.time() + WARMUP_S
        end = start + seconds
        time.sleep(max(0.0, start - time.time()))
        before, nbefore = hook_counters(usage), hook_counters(busage)
        time.sleep(max(0.0, end - time.time()))
        after, nafter = hook_counters(usage), hook_counters(busage)
        sampler.wait_past(end)
        rate = work.rate(start, end)
        if other is not None and neighbour_workload is not None:
            neighbour_work = other.rate(start, end) / neighbour_workload[1] * 100
            neighbour_windows = [
                r / neighbour_workload[1] * 100 for r in other.window_rates(start, end)
            ]
    finally:
        work.stop()
        if other is not None:
            other.stop()
    case: dict[str, Any] = {"workload": name, "share": share, "neighbour": neighbour}
    case["start"] = round(start, 3)  # CLOCK_REALTIME of the measured window's start
    if isinstance(tenancy, Vgpus):
        case["daemon"] = True
    elif neighbour is not None:
        case["separate_turns"] = tenancy.separate_turns
    if before is not None and after is not None:
        # The hook's own view: the GPU time it charged, its launches, its waits.
        gpu, launches, throttled = (a - b for a, b in zip(after, before, strict=True))
        case.update(hook_busy=gpu / 1e7 / seconds, hook_launches=launches / seconds)
        case.update(hook_throttled=throttled / 1e7 / seconds)
    if nbefore is not None and nafter is not None:
        # What the neighbour's hook charged itself, against its work done.
        case["neighbour_hook_busy"] = (nafter[0] - nbefore[0]) / 1e7 / seconds
    steps = device_series(sampler.samples, start, end)
    case.update(rate=rate, busy=sum(steps) / len(steps), busy_windows=windows(steps))
    case["busy_steps"] = [round(s, 1) for s in steps]  # NVML device %, 200 ms each
    # The same from nvmlDeviceGetUtilizationRates, which on an H200 sees only
    # part of each period (docs/compute.md, "NVML's device figure").
    rates = [u for t, u in sampler.samples.device if start <= t < end]
    case["busy_rate"] = sum(rates) / len(rates) if rates else None
    case["proc_busy"] = process_busy(sampler.samples, [work.proc.pid], start, end)
    if other is not None:
        case["neighbour_proc_busy"] = process_busy(sampler.samples, [other.proc.pid], start, end)
    if burn is not None:
        case["neighbour_proc_busy"] = process_busy(sampler.samples, burn.pids, start, end)
        burn.finish(timeout=seconds + 60)
        case["neighbour_work"] = burn.work * 100
    tenancy.release()
    if isinstance(tenancy, Vgpus):
        # The quota the daemon gave, from the workload's first report on
        # (times from the measured window's start; calibrated or not).
        tag = f"{name}-{share}"
        # strict=False: the watcher may have appended a quota but not yet its counters.
        quotas, counters = tenancy.quotas.get(tag, []), tenancy.counters.get(tag, [])
        watched = list(zip(quotas, counters, strict=False))
        case["quotas"] = [(round(t - start, 2), q, c) for (t, q, c), _ in watched if t >= first]
        # Its hook's counters at each of those reads (None: no block yet).
        case["hook_trace"] = [n for (t, _, _), n in watched if t >= first]
    if other is not None and neighbour_workload is not None:
        case["neighbour_workload"] = neighbour_workload[0]
        case["neighbour_work"] = neighbour_work
        case["neighbour_work_windows"] = neighbour_windows
    return case


def beside(case: dict[str, Any]) -> str:
    """What ran beside a case: nothing, a neighbour's share ("native" for
    none), and which neighbour."""
    text = str({None: "", 0: "native"}.get(case["neighbour"], case["neighbour"]))
    if "neighbour_workload" in case:
        text = f"{case['neighbour_workload']} {text}"
    if case.get("separate_turns"):
        text = f"{text}, no turns"
    return text


def row(case: dict[str, Any], native: dict[str, Any] | None, rounds: bool) -> str:
    """One table row: work vs native, NVML busy, its 1 s windows, the target
    (and, in a run of several rounds, the case's round first)."""
    vs = f"{case['rate'] / native['rate']:.2f}" if native else ""
    target = ""
    if case["share"] is not None and native is not None:
        target = f"{min(case['share'], native['busy']):.1f}"
    win = case["busy_windows"]
    span = f"{min(win):.1f} to {max(win):.1f}" if win else ""
    neighbour = f"{case['neighbour_work']:.1f}" if "neighbour_work" in case else ""
    if case.get("neighbour_work_windows"):  # older runs had none
        neighbour += f" (1 s: {min(case['neighbour_work_windows']):.1f} worst)"
    per_process = ""
    if "proc_busy" in case:  # runs before 2026-11-26 had none
        per_process = f"{case['proc_busy']['mean']:.1f}"
        if "neighbour_proc_busy" in case:
            per_process += f" / {case['neighbour_proc_busy']['mean']:.1f}"
    cells = [case.get("round", 0) + 1] if rounds else []
    cells += [case["workload"], case["share"] or "native", beside(case), vs]
    cells += [f"{case['busy']:.1f}", span, target, neighbour, per_process]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def spread(values: list[float], digits: int) -> str:
    """Rounds' figures as their mean and range."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    mean = sum(values) / len(values)
    return f"{mean:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def summary(cases: list[dict[str, Any]]) -> list[str]:
    """Each case over the rounds: the VM's pace moves a launch-bound
    workload's native rate by up to a third within minutes
    (docs/benchmarks/inference-coloc-h200.md), so one round says little."""
    ref = natives(cases)
    groups: dict[tuple[str, int | None, str], list[dict[str, Any]]] = {}
    for c in cases:
        if c["share"] is not None or c["neighbour"] is not None:
            groups.setdefault((c["workload"], c["share"], beside(c)), []).append(c)
    lines = [
        "| workload | share | neighbour | rounds | work vs native | NVML busy | neighbour work |",
        "| --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for (name, share, next_to), group in groups.items():
        works = [
            c["rate"] / native["rate"] for c in group if (native := native_of(ref, c)) is not None
        ]
        theirs = [c["neighbour_work"] for c in group if "neighbour_work" in c]
        cells = [name, share or "native", next_to, len(group)]
        cells += [spread(works, 2) if works else "", spread([c["busy"] for c in group], 1)]
        cells += [spread(theirs, 1) if theirs else ""]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def report(cases: list[dict[str, Any]], failed: list[str], out: Path) -> str:
    """The report so far, written to OUT (after every case: a run cut short
    keeps what it measured)."""
    ref = natives(cases)
    rounds = max((c.get("round", 0) for c in cases), default=0) > 0
    lines = [
        ("| round " if rounds else "")
        + "| workload | share | neighbour | work vs native | NVML busy (mean) | 1 s windows | "
        "target | neighbour work | NVML per process (it / neighbour) |",
        ("| ---: " if rounds else "")
        + "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    lines += [row(c, native_of(ref, c), rounds) for c in cases]
    if rounds:
        lines += ["", "Over the rounds (mean, range):", "", *summary(cases)]
    lines += ["", *(f"Failed: {f}" for f in failed)] if failed else []
    text = "\n".join(lines) + "\n"
    (out / "inference.md").write_text(text)
    (out / "inference.json").write_text(json.dumps(cases, indent=1))
    return text


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--workloads", default="chain,adds,chain-graph,hf-b1,hf-b8")
    p.add_argument("--shares", default="30,60")
    p.add_argument("--coloc", default="", help="SHARE:NEIGHBOUR pairs, e.g. 30:60,n:60 (n: native)")
    p.add_argument(
        "--separate-turns", action="store_true", help="co-located sides take no turns together"
    )
    p.add_argument(
        "--neighbour",
        default="burn",
        help="burn (vgpu-burn), or an inference_workload.py workload: gemm, hf-b1, ...",
    )
    p.add_argument("--neighbour-kernel-us", type=int, default=NEIGHBOUR_KERNEL_US)
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the whole plan this many times, natives included, each case against "
        "its own round's native",
    )
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--daemon", action="store_true", help="hooked sides are vGPUs of a vgpud")
    p.add_argument(
        "--no-calibrate", action="store_true", help="with --daemon: calibrate_alone = false"
    )
    return p.parse_args(argv)


def parse_pair(text: str) -> tuple[int | None, int]:
    """A --coloc pair: "30:60" -> (30, 60); "n" for a native side (the
    workload's share None, the neighbour's 0: the burn with no hook)."""
    share, neighbour = text.split(":")
    return (None if share == "n" else int(share)), (0 if neighbour == "n" else int(neighbour))


def run_plan(
    args: argparse.Namespace,
    shares: list[int],
    pairs: list[tuple[int | None, int]],
    sampler: Sampler,
    tenancy: Tenancy,
    cases: list[dict[str, Any]],
    failed: list[str],
) -> None:
    """Every case the arguments ask for, round by round, each printed,
    added to `cases` and saved as it ends; a workload that fails is added
    to `failed` and skipped for the rest of the run."""

    def done(case: dict[str, Any], round_: int) -> None:
        case["round"] = round_
        print(json.dumps(case), flush=True)
        cases.append(case)
        report(cases, failed, args.out)

    broken: set[str] = set()
    for round_ in range(args.rounds):
        neighbour_workload = None
        if args.neighbour != "burn" and pairs:
            alone = run_case(args.neighbour, None, None, args.seconds, sampler, tenancy)
            done(alone, round_)
            neighbour_workload = (args.neighbour, alone["rate"])
        for name in args.workloads.split(","):
            if name in broken:
                continue
            plan: list[tuple[int | None, int | None]] = [(None, None)]
            plan += [(s, None) for s in shares] + [(s, n) for s, n in pairs]
            for share, neighbour in plan:
                try:
                    case = run_case(
                        name,
                        share,
                        neighbour,
                        args.seconds,
                        sampler,
                        tenancy,
                        args.neighbour_kernel_us,
                        neighbour_workload,
                    )
                except RuntimeError as exc:
                    # A workload this node cannot run (a library version, a
                    # crash): said, and the rest of the plan goes on.
                    tenancy.release()
                    print(f"{name} at share {share}: {exc}; its other cases skipped", flush=True)
                    failed.append(f"{name} (share {share}): {exc}")
                    broken.add(name)
                    break
                done(case, round_)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(dict(os.environ), args.device)
    sampler.wait_ready()
    cases: list[dict[str, Any]] = []
    failed: list[str] = []
    shares = [int(s) for s in args.shares.split(",") if s]
    pairs = [parse_pair(p) for p in args.coloc.split(",") if p]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tenancy: Tenancy = (
                Vgpus(Path(tmp), args.device, not args.no_calibrate)
                if args.daemon
                else Standalone(Path(tmp), args.separate_turns)
            )
            try:
                run_plan(args, shares, pairs, sampler, tenancy, cases, failed)
            finally:
                if isinstance(tenancy, Vgpus):
                    tenancy.stop()
    finally:
        sampler.stop()
    print(report(cases, failed, args.out))
    if importlib.util.find_spec("matplotlib") is None:  # a dev dependency: not on every GPU node
        print(f"no matplotlib: plot with benchmarks/plot_inference.py {args.out}/inference.json")
    else:
        plot([(args.out.name, cases)], args.out / "inference.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
