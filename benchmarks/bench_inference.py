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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.plot_inference import plot  # noqa: E402
from tests.integration.compute_harness import (  # noqa: E402
    Burn,
    Sampler,
    device_series,
    windows,
)

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

    @classmethod
    def start(cls, name: str, env: dict[str, str]) -> Workload:
        cmd = [sys.executable, str(WORKLOAD), name]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        run = cls(proc)
        threading.Thread(target=run._read, daemon=True).start()
        return run

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            rec = json.loads(line)
            self.reports.append((rec["t"], rec["units"]))

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

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def hook_counters(usage: Path) -> tuple[int, int, int] | None:
    """(gpu_time_ns, launches, throttled_ns) of a standalone usage block's
    first device, or None where there is no block (a native run)."""
    if not usage.exists():
        return None
    from vgpud.vgpus.blocks import UsageBlock

    block = UsageBlock.open(usage)
    try:
        dev = block.devices()[0]
        return dev.gpu_time_ns, dev.launches, dev.throttled_ns
    finally:
        block.close()


def hooked_env(
    base: dict[str, str], share: int | None, usage: Path, arbiter: Path | None = None
) -> dict[str, str]:
    """The environment of one side of a case: `base` unchanged when it runs
    natively (share None), else the hook at a standalone share; `arbiter`,
    a directory of its own, keeps it out of the other side's turns."""
    if share is None:
        return base
    env = dict(base, LD_PRELOAD=str(HOOK), VGPU_USAGE=str(usage), LOGGER_LEVEL="2")
    env["CUDA_CORE_LIMIT"] = str(share)
    if arbiter is not None:
        arbiter.mkdir(mode=0o700, exist_ok=True)
        env["VGPU_ARBITER_DIR"] = str(arbiter)
    return env


def run_case(
    name: str,
    share: int | None,
    neighbour: int | None,
    seconds: float,
    sampler: Sampler,
    workdir: Path,
    neighbour_kernel_us: int = NEIGHBOUR_KERNEL_US,
    separate_turns: bool = False,
    neighbour_workload: tuple[str, float] | None = None,
) -> dict[str, Any]:
    """One case; `neighbour` is the GPU-bound tenant's share, None for no
    neighbour, 0 for a native (unhooked) one. The neighbour is vgpu-burn,
    or the inference_workload.py workload `neighbour_workload` names
    (with its native rate)."""
    base = dict(os.environ)
    base.pop("LD_PRELOAD", None)
    arbiter = workdir / "arbiter-workload" if separate_turns else None
    env = hooked_env(base, share, workdir / f"{name}-{share}.usage", arbiter)
    work = Workload.start(name, env)
    burn: Burn | None = None
    other: Workload | None = None
    try:
        first = work.wait_started()
        start = first + WARMUP_S
        if neighbour is not None:
            barbiter = workdir / "arbiter-neighbour" if separate_turns else None
            bshare = neighbour or None
            busage = workdir / f"neighbour-{name}-{share}.usage"
            benv = hooked_env(base, bshare, busage, barbiter)
            if neighbour_workload is not None:
                other = Workload.start(neighbour_workload[0], benv)
                other.wait_started()
            else:
                cmd = [str(BURN), "--seconds", str(seconds + WARMUP_S + 1), "--json"]
                cmd += ["--kernel-us", str(neighbour_kernel_us)]
                burn = Burn.start(cmd, benv, neighbour_kernel_us)
            start = time.time() + WARMUP_S
        end = start + seconds
        time.sleep(max(0.0, start - time.time()))
        usage = workdir / f"{name}-{share}.usage"
        busage = workdir / f"neighbour-{name}-{share}.usage"
        before, nbefore = hook_counters(usage), hook_counters(busage)
        time.sleep(max(0.0, end - time.time()))
        after, nafter = hook_counters(usage), hook_counters(busage)
        sampler.wait_past(end)
        rate = work.rate(start, end)
        if other is not None and neighbour_workload is not None:
            neighbour_work = other.rate(start, end) / neighbour_workload[1] * 100
    finally:
        work.stop()
        if other is not None:
            other.stop()
    case: dict[str, Any] = {"workload": name, "share": share, "neighbour": neighbour}
    if neighbour is not None:
        case["separate_turns"] = separate_turns
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
    if burn is not None:
        burn.finish(timeout=seconds + 60)
        case["neighbour_work"] = burn.work * 100
    if other is not None and neighbour_workload is not None:
        case["neighbour_workload"] = neighbour_workload[0]
        case["neighbour_work"] = neighbour_work
    return case


def row(case: dict[str, Any], native: dict[str, Any] | None) -> str:
    """One table row: work vs native, NVML busy, its 1 s windows, the target."""
    vs = f"{case['rate'] / native['rate']:.2f}" if native else ""
    target = ""
    if case["share"] is not None and native is not None:
        target = f"{min(case['share'], native['busy']):.1f}"
    win = case["busy_windows"]
    span = f"{min(win):.1f} to {max(win):.1f}" if win else ""
    neighbour = f"{case['neighbour_work']:.1f}" if "neighbour_work" in case else ""
    beside = {None: "", 0: "native"}.get(case["neighbour"], case["neighbour"])
    if "neighbour_workload" in case:
        beside = f"{case['neighbour_workload']} {beside}"
    if case.get("separate_turns"):
        beside = f"{beside}, no turns"
    cells = [case["workload"], case["share"] or "native", beside, vs]
    cells += [f"{case['busy']:.1f}", span, target, neighbour]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def report(cases: list[dict[str, Any]], out: Path) -> str:
    native = {c["workload"]: c for c in cases if c["share"] is None and c["neighbour"] is None}
    lines = [
        "| workload | share | neighbour | work vs native | NVML busy (mean) | 1 s windows | "
        "target | neighbour work |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    lines += [row(c, native.get(c["workload"])) for c in cases]
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
    p.add_argument("--device", type=int, default=0)
    return p.parse_args(argv)


def parse_pair(text: str) -> tuple[int | None, int]:
    """A --coloc pair: "30:60" -> (30, 60); "n" for a native side (the
    workload's share None, the neighbour's 0: the burn with no hook)."""
    share, neighbour = text.split(":")
    return (None if share == "n" else int(share)), (0 if neighbour == "n" else int(neighbour))


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(dict(os.environ), args.device)
    sampler.wait_ready()
    cases: list[dict[str, Any]] = []
    shares = [int(s) for s in args.shares.split(",") if s]
    pairs = [parse_pair(p) for p in args.coloc.split(",") if p]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            neighbour_workload = None
            if args.neighbour != "burn" and pairs:
                alone = run_case(args.neighbour, None, None, args.seconds, sampler, Path(tmp))
                print(json.dumps(alone), flush=True)
                cases.append(alone)
                neighbour_workload = (args.neighbour, alone["rate"])
            for name in args.workloads.split(","):
                plan: list[tuple[int | None, int | None]] = [(None, None)]
                plan += [(s, None) for s in shares] + [(s, n) for s, n in pairs]
                for share, neighbour in plan:
                    case = run_case(
                        name,
                        share,
                        neighbour,
                        args.seconds,
                        sampler,
                        Path(tmp),
                        args.neighbour_kernel_us,
                        args.separate_turns,
                        neighbour_workload,
                    )
                    print(json.dumps(case), flush=True)
                    cases.append(case)
    finally:
        sampler.stop()
    print(report(cases, args.out))
    if importlib.util.find_spec("matplotlib") is None:  # a dev dependency: not on every GPU node
        print(f"no matplotlib: plot with benchmarks/plot_inference.py {args.out}/inference.json")
    else:
        plot([(args.out.name, cases)], args.out / "inference.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
