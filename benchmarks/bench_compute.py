"""Compute isolation campaign: how closely vGPUs get their share of GPU time.

Starts vgpud (unprivileged, private socket and dirs), creates vGPUs through
its API and runs build/vgpu-burn in them with the hook, while a sampler
process reads NVML (device utilization, and per-process utilization in its
200 ms periods). Every burn also traces the work it completes (vgpu-burn
--trace: a stamped line per batch of kernels seen complete), which gives
each vGPU's GPU time per 200 ms step independently of NVML and of the hook
(compute_harness.work_series). The same command runs on a real GPU and on
the simulator::

    python benchmarks/bench_compute.py OUTDIR            # the GPU NVML finds
    python benchmarks/bench_compute.py OUTDIR --sim      # the simulated GPU
    python benchmarks/bench_compute.py OUTDIR --quick    # fewer cases, 5 s each

Writes OUTDIR/compute.json (every figure), OUTDIR/compute.md (the report),
OUTDIR/NAME.png (NVML timelines) and OUTDIR/NAME-work.png (the same by work).
What is measured, against its target (docs/compute.md), and by what:

- accuracy: shares 10..90 x workloads, one hard vGPU alone: mean |util -
  share| over the measured seconds (target <= 3) by NVML's device
  utilization; the worst 1 s window (target within +-7) both by NVML and by
  work (the trace's 200 ms steps); work: kernels completed x kernel time
  over the whole run.
- retention: work done at share s against s x the work of an unlimited
  vGPU (target >= 0.9).
- co-location: 30/70 and 20/30/50 hard vGPUs at once: each within +-3 by
  NVML's per-process figures summed per vGPU and by work; the worst 1 s
  window by both; the total work >= 95 % of one unlimited vGPU.
- soft: a soft vGPU alone (target >= 90 %), then a hard one starts: how long
  the soft one takes to come back to its share (target <= 1 s), and to have
  the device again when the hard one leaves. Both vGPUs run "bursts" (100 us
  kernels, a sync every 10: completions every millisecond, like inference).
  By work; NVML's figures are kept as *_nvml.
- settling: from the start of a vGPU's process (its CUDA start-up included),
  then after each live PATCH of the share (30 -> 70 -> 30): how long until
  the work is within +-5 of the share for good (target <= 1 s); NVML's
  figure kept as settle_s_nvml.

Why work judges the short windows: NVML's per-process utilization is
averaged over about a second on recent drivers (580) and wrong when several
processes share the GPU, so it cannot show a 1 s settle; the kernels a burn
saw complete are exact to its batch (<= 20 ms here).

NVML is read by tests/integration/compute_harness.py's sampler, the same
one the simulator integration tests use.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.compute_harness import (  # noqa: E402
    Burn,
    Sampler,
    device_series,
    device_util,
    series,
    settle_time,
    windows,
)
from tests.integration.daemon_harness import Daemon, base_env  # noqa: E402

BURN = ROOT / "build" / "vgpu-burn"
HOOK = ROOT / "build" / "libvgpu.so"
SIM_LIB_DIR = ROOT / "build" / "sim"
WARMUP_S = 1.5  # burn start-up and the controller's first ticks, not measured

# name -> vgpu-burn arguments; every workload wants the whole GPU.
WORKLOADS: dict[str, tuple[str, ...]] = {
    "big": ("--kernel-us", "20000"),  # large GEMM-like kernels
    "tiny": ("--kernel-us", "10", "--sync", "100"),  # ~10 us kernels
    "bursts": ("--kernel-us", "100", "--sync", "10"),  # 1 ms bursts, sync after each
    "graph": ("--kernel-us", "100", "--graph", "50"),  # 5 ms CUDA graphs
    "multiproc": ("--kernel-us", "1000", "--procs", "3"),  # 3 processes, one vGPU
}
KERNEL_US = {name: int(args[1]) for name, args in WORKLOADS.items()}


# --- the campaign ---------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.env = base_env()
        if args.sim:
            self.env["LD_LIBRARY_PATH"] = str(SIM_LIB_DIR)
            self.env["VGPU_SIM_STATE"] = str(workdir / "sim-state")
            for key in ("CUDA_VISIBLE_DEVICES", "LD_PRELOAD"):
                self.env.pop(key, None)
        self.workdir = workdir
        self.daemon = Daemon(workdir, self.env, sim=args.sim)
        self.sampler: Sampler | None = None
        self.made = 0
        self.burns = 0
        self.results: dict[str, Any] = {"cases": []}
        # name -> label -> 200 ms steps: NVML's figures, and the work traced.
        self.timelines: dict[str, dict[str, list[float]]] = {}
        self.work_timelines: dict[str, dict[str, list[float]]] = {}

    @contextlib.contextmanager
    def running(self) -> Iterator[Bench]:
        self.daemon.start()
        self.sampler = Sampler(self.env, self.args.device)
        try:
            self.sampler.wait_ready()
            yield self
        finally:
            self.sampler.stop()
            self.daemon.cleanup()

    def vgpu(self, share: int, mode: str = "hard", weight: int = 100) -> dict[str, Any]:
        if self.args.standalone:
            # The pacer alone: the seed's environment, one usage block each.
            self.made += 1
            usage = self.workdir / f"standalone-{self.made}.usage"
            limit = {"CUDA_CORE_LIMIT": str(share), "VGPU_USAGE": str(usage)}
            return {"id": None, "host_env": {"LD_PRELOAD": str(HOOK), **limit}}
        # Room for three processes' contexts (about 0.5 GiB each on an H200).
        body = {"gpus": [self.args.device], "memory": "2g", "share": share, "mode": mode}
        body["weight"] = weight
        answer: dict[str, Any] = self.daemon.client.request("POST", "/v1/vgpus", body)
        return answer

    def delete(self, vgpu: dict[str, Any]) -> None:
        if vgpu["id"] is not None:
            self.daemon.client.request("DELETE", f"/v1/vgpus/{vgpu['id']}?force=true")

    def burn(self, vgpu: dict[str, Any], workload: str, seconds: float) -> Burn:
        env = {**self.env, **vgpu["host_env"]}
        # The vGPU's recipe names its GPU by UUID; burn then sees it as device 0.
        cmd = [str(BURN), "--json", "--seconds", f"{seconds:.2f}", *WORKLOADS[workload]]
        self.burns += 1
        trace = self.workdir / f"burn-{self.burns}.trace"
        return Burn.start(cmd, env, KERNEL_US[workload], trace=trace)

    def run_together(
        self, specs: Sequence[tuple[dict[str, Any], str]], seconds: float
    ) -> tuple[list[Burn], float]:
        start = time.time()
        burns = [self.burn(v, w, seconds + WARMUP_S) for v, w in specs]
        for b in burns:
            b.finish(timeout=seconds + 120)
        return burns, start

    def measure(
        self, burn: Burn, share: float, start: float, seconds: float, alone: bool
    ) -> dict[str, Any]:
        """util: NVML's device utilization when the vGPU is alone on the GPU,
        else the sum of NVML's per-process figures of its processes (the
        only per-vGPU figure NVML has; see the report for how far to trust
        it); work: what its kernels occupied, from the work they completed
        (over the whole run; per 200 ms step from its trace in work_steps)."""
        assert self.sampler is not None
        lo, hi = start + WARMUP_S, start + WARMUP_S + seconds
        self.sampler.wait_past(hi)
        per_process = series(self.sampler.samples, burn.pids, lo, hi)
        steps = device_series(self.sampler.samples, lo, hi) if alone else per_process
        work_steps = burn.work_series(lo, hi)
        return {
            "util": round(mean(steps), 2),
            "error": round(abs(mean(steps) - share), 2),
            "worst_window": worst_window(steps, share),
            "worst_window_work": worst_window(work_steps, share),
            "process_util": round(mean(per_process), 2),
            "work": round(100 * burn.work, 2),
            "steps": steps,
            "work_steps": work_steps,
        }

    # -- cases --

    def accuracy(self, shares: Sequence[int], workloads: Sequence[str]) -> None:
        seconds = self.args.seconds
        baseline: dict[str, float] = {}
        for workload in workloads:
            v = self.vgpu(100)
            (b,), start = self.run_together([(v, workload)], seconds)
            self.delete(v)
            baseline[workload] = 100 * b.work
            self.log(f"unlimited {workload}: work {baseline[workload]:.1f}%")
            for share in shares:
                v = self.vgpu(share)
                (b,), start = self.run_together([(v, workload)], seconds)
                self.delete(v)
                m = self.measure(b, share, start, seconds, alone=True)
                m["retention"] = round(m["work"] / (share / 100 * baseline[workload]), 3)
                steps, work_steps = m.pop("steps"), m.pop("work_steps")
                case = {"kind": "accuracy", "workload": workload, "share": share, **m}
                self.results["cases"].append(case)
                self.timelines.setdefault(f"accuracy-{workload}", {})[str(share)] = steps
                self.work_timelines.setdefault(f"accuracy-{workload}", {})[str(share)] = work_steps
                self.log(
                    f"{workload:9} share {share:3}: util {m['util']:5.1f} err {m['error']:4.1f} "
                    f"worst 1 s {m['worst_window']:4.1f} (by work {m['worst_window_work']:4.1f}) "
                    f"work {m['work']:5.1f} retention {m['retention']:.2f}"
                )
        self.results["baseline_work"] = baseline

    def colocation(self, splits: Sequence[Sequence[int]], workload: str) -> None:
        assert self.sampler is not None
        seconds = self.args.seconds
        base = self.results.get("baseline_work", {}).get(workload)
        if base is None:
            v = self.vgpu(100)
            (b,), _ = self.run_together([(v, workload)], seconds)
            self.delete(v)
            base = 100 * b.work
        for split in splits:
            vgpus = [self.vgpu(s) for s in split]
            cpu_before, wall_before = self.daemon_cpu_s(), time.monotonic()
            burns, start = self.run_together([(v, workload) for v in vgpus], seconds)
            daemon_cpu = self.daemon_cpu_s() - cpu_before
            daemon_cpu_pct = 100 * daemon_cpu / (time.monotonic() - wall_before)
            for v in vgpus:
                self.delete(v)
            each = [
                self.measure(b, s, start, seconds, alone=False)
                for b, s in zip(burns, split, strict=True)
            ]
            lo = start + WARMUP_S
            device = device_util(self.sampler.samples, lo, lo + seconds)
            total = sum(m["work"] for m in each) / base
            name = "-".join(map(str, split))
            self.results["cases"].append(
                {
                    "kind": "colocation",
                    "split": list(split),
                    "workload": workload,
                    "vgpus": [
                        {k: v for k, v in m.items() if k not in ("steps", "work_steps")}
                        for m in each
                    ],
                    "total_throughput": round(total, 3),
                    "device_util": round(device, 2),
                    # The whole daemon (its turn broker handing the GPU between
                    # the paced vGPUs included), as % of one core.
                    "daemon_cpu_pct": round(daemon_cpu_pct, 2),
                }
            )
            self.timelines[f"colocation-{name}"] = {
                str(s): m["steps"] for s, m in zip(split, each, strict=True)
            }
            self.work_timelines[f"colocation-{name}"] = {
                str(s): m["work_steps"] for s, m in zip(split, each, strict=True)
            }
            errs = ", ".join(
                f"NVML {m['util']:.1f} (err {m['error']:.1f}, worst 1 s {m['worst_window']:.1f}) "
                f"work {m['work']:.1f} (worst 1 s {m['worst_window_work']:.1f})"
                for m in each
            )
            self.log(
                f"co-location {name}: {errs}; device {device:.1f}; total throughput {total:.3f}; "
                f"daemon CPU {daemon_cpu_pct:.2f} % of a core"
            )

    def soft_yield(self, workload: str) -> None:
        """A soft 30 alone, then a hard 70 arrives; then the hard one leaves.
        Judged by the soft one's work; NVML's figures kept beside."""
        assert self.sampler is not None
        alone = self.args.seconds / 2
        soft = self.vgpu(30, mode="soft")
        hard = self.vgpu(70)
        start = time.time()
        sb = self.burn(soft, workload, WARMUP_S + 2 * alone + 3)
        time.sleep(WARMUP_S + alone)  # the schedule itself, not a synchronisation
        arrive = time.time()
        hb = self.burn(hard, workload, alone)
        hb.finish(timeout=alone + 120)
        leave = time.time()
        sb.finish(timeout=alone + 120)
        for v in (soft, hard):
            self.delete(v)
        self.sampler.wait_past(leave + 2)
        s = self.sampler.samples

        def judged(steps: Callable[[float, float], list[float]]) -> dict[str, Any]:
            return {
                "alone_util": round(mean(steps(start + WARMUP_S, arrive)), 2),
                # The hard one's last 0.4 s not counted: it may be winding down.
                "yield_s": settle_time(steps(arrive, leave - 0.4), 30, 7),
                "regain_s": settle_time(steps(leave, leave + 2), 100, 10, above=True),
            }

        by_work = judged(sb.work_series)
        by_nvml = judged(lambda lo, hi: series(s, sb.pids, lo, hi))
        # How much of yield_s the hard process took to start computing at all.
        first = min((c.t for c in hb.completions()), default=None)
        hard_start = None if first is None else round(first - arrive, 3)
        case = {
            "kind": "soft",
            "workload": workload,
            **by_work,
            **{f"{k}_nvml": v for k, v in by_nvml.items()},
            "hard_start_s": hard_start,
        }
        self.results["cases"].append(case)
        self.timelines["soft"] = {
            "soft 30": series(s, sb.pids, start, leave + 2),
            "hard 70": series(s, hb.pids, start, leave + 2),
        }
        self.work_timelines["soft"] = {
            "soft 30": sb.work_series(start, leave + 2),
            "hard 70": hb.work_series(start, leave + 2),
        }
        self.log(
            f"soft alone {by_work['alone_util']:.1f}% by work ({by_nvml['alone_util']:.1f}% by "
            f"NVML); the hard one's first work after {hard_start} s; back to its share in "
            f"{by_work['yield_s']} s by work ({by_nvml['yield_s']} s by NVML); spare time again "
            f"in {by_work['regain_s']} s by work ({by_nvml['regain_s']} s by NVML)"
        )

    def settling(self, workload: str) -> None:
        """PATCH 30 -> 70 -> 30 while burning: time to within +-5 for good."""
        assert self.sampler is not None
        phase = max(3.0, self.args.seconds / 3)
        v = self.vgpu(30)
        start = time.time()
        b = self.burn(v, workload, WARMUP_S + 3 * phase + 1)
        time.sleep(WARMUP_S + phase)
        changes = []
        for share in (70, 30):
            at = time.time()
            self.daemon.client.request("PATCH", f"/v1/vgpus/{v['id']}", {"share": share})
            changes.append((share, at))
            time.sleep(phase)
        b.finish(timeout=phase + 120)
        self.delete(v)
        self.sampler.wait_past(changes[-1][1] + phase)
        s = self.sampler.samples
        # From the process's start to the first change, then change by change.
        spans = [(30, start, changes[0][1]), *((sh, at, at + phase) for sh, at in changes)]
        result = [
            {
                "share": share,
                "from": "start" if at == start else "change",
                "settle_s": settle_time(b.work_series(at, until), share, 5),
                "settle_s_nvml": settle_time(series(s, b.pids, at, until), share, 5),
            }
            for share, at, until in spans
        ]
        self.results["cases"].append(
            {"kind": "settling", "workload": workload, "changes": result, "work": 100 * b.work}
        )
        end = start + WARMUP_S + 3 * phase
        self.timelines["settling"] = {"util": series(s, b.pids, start, end)}
        self.work_timelines["settling"] = {"work": b.work_series(start, end)}
        self.log(
            "settling: "
            + ", ".join(
                f"{r['from']} to {r['share']}: {r['settle_s']} s by work "
                f"({r['settle_s_nvml']} s by NVML)"
                for r in result
            )
        )

    def daemon_cpu_s(self) -> float:
        """CPU seconds the daemon has used (0 when standalone: no daemon)."""
        if self.args.standalone or self.daemon.proc is None:
            return 0.0
        fields = Path(f"/proc/{self.daemon.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log(self, text: str) -> None:
        print(text, flush=True)


def mean(steps: Sequence[float]) -> float:
    return sum(steps) / len(steps) if steps else 0.0


def worst_window(steps: list[float], share: float) -> float:
    """The largest distance from share of a 1 s sliding mean of the steps."""
    return round(max((abs(w - share) for w in windows(steps)), default=0.0), 2)


# --- report --------------------------------------------------------------------


def machine(args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    code = (
        f"import pynvml as n; n.nvmlInit(); h=n.nvmlDeviceGetHandleByIndex({args.device});"
        "print(n.nvmlDeviceGetName(h)); print(n.nvmlSystemGetDriverVersion())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    lines = [*out.stdout.splitlines(), "?", "?"]
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": lines[0] if not args.sim else f"{lines[0]} (SIMULATED)",
        "driver": lines[1],
        "host": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "simulated": str(args.sim),
    }


def write_report(
    outdir: Path, results: dict[str, Any], timelines: dict[str, Any], work_timelines: dict[str, Any]
) -> None:
    everything = {**results, "timelines": timelines, "work_timelines": work_timelines}
    (outdir / "compute.json").write_text(json.dumps(everything, indent=1))
    m = results["machine"]
    lines = [
        "# Compute isolation benchmark" + (" — SIMULATED GPU" if m["simulated"] == "True" else ""),
        "",
        f"{m['date']}; GPU {m['gpu']}, driver {m['driver']}; {m['host']}; "
        f"Linux {m['kernel']}; Python {m['python']}.",
        f"Command: `{results['command']}`; {results['seconds']} s measured per case after "
        f"{WARMUP_S} s of warm-up. Limits set as: {results['mode']}.",
        "",
    ]
    if m["simulated"] == "True":
        lines += [
            "These are figures of the **simulated GPU** (libhook/sim): they show that the",
            "pacer and the controller do what they are designed to do against an exact",
            "engine, not what a real GPU gives. Real-GPU figures come from the same",
            "command on a GPU node.",
            "",
        ]
    acc = [c for c in results["cases"] if c["kind"] == "accuracy"]
    if acc:
        lines += [
            "## Accuracy: one hard vGPU alone",
            "",
            "util: NVML device utilization (the vGPU is alone on the GPU), mean over the "
            "measured seconds; err: |util - share| (target <= 3); worst 1 s: the worst "
            "sliding 1 s window's distance from the share (target <= 7), by NVML's device "
            "utilization and by work (the 200 ms steps of the burn's trace of completed "
            "kernels); per-process: NVML's per-process figures summed over the vGPU's "
            "processes; work: kernels completed x kernel time over the whole run; "
            "retention: work / (share x unlimited work) (target >= 0.9).",
            "",
            "| workload | share | util | err | worst 1 s | worst 1 s by work | per-process "
            "| work | retention |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for c in acc:
            lines.append(
                f"| {c['workload']} | {c['share']} | {c['util']:.1f} | {mark(c['error'], 3)} | "
                f"{mark(c['worst_window'], 7)} | {mark(c['worst_window_work'], 7)} | "
                f"{c['process_util']:.1f} | {c['work']:.1f} | "
                f"{mark(c['retention'], 0.9, higher=True)} |"
            )
        lines.append("")
        base = results.get("baseline_work", {})
        lines.append(
            "Unlimited work per workload: "
            + ", ".join(f"{k} {v:.1f} %" for k, v in base.items())
            + "."
        )
        lines.append("")
    for c in results["cases"]:
        if c["kind"] == "colocation":
            lines += [
                f"## Co-location {'/'.join(map(str, c['split']))} ({c['workload']} kernels)",
                "",
                "util: NVML per-process figures summed per vGPU; work: its kernels completed x "
                "kernel time over the whole run (independent of NVML); both against the share "
                "(target +-3). Worst 1 s: the worst sliding 1 s window's distance from the "
                "share (target <= 7), by NVML and by work (the 200 ms steps of the burns' "
                "traces of completed kernels).",
                "",
                "| share | util | err | worst 1 s | work | work err | worst 1 s by work |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            for s, v in zip(c["split"], c["vgpus"], strict=True):
                lines.append(
                    f"| {s} | {v['util']:.1f} | {mark(v['error'], 3)} | "
                    f"{mark(v['worst_window'], 7)} | {v['work']:.1f} | "
                    f"{mark(abs(v['work'] - s), 3)} | {mark(v['worst_window_work'], 7)} |"
                )
            lines += [
                "",
                f"NVML device utilization {c['device_util']:.1f} %. Total throughput: "
                f"{mark(c['total_throughput'], 0.95, higher=True)} of one unlimited vGPU "
                "(target >= 0.95). The daemon (its turn broker included) used "
                f"{c.get('daemon_cpu_pct', 0.0):.2f} % of a core meanwhile.",
                "",
            ]
        elif c["kind"] == "soft":
            lines += [
                f"## Soft share ({c['workload']} kernels)",
                "",
                "Judged by the soft vGPU's work (the 200 ms steps of its burn's trace of "
                "completed kernels); NVML's per-process figures in brackets. A soft vGPU of "
                f"share 30 alone: {mark(c['alone_util'], 90, higher=True)} % "
                f"[{c['alone_util_nvml']:.1f} %] (target >= 90). A hard vGPU of share 70 "
                "starts: the soft one is back within 7 points of its share after "
                f"{mark_s(c['yield_s'])} [{mark_s(c['yield_s_nvml'])}] (target <= 1 s), of "
                f"which the hard process took {c['hard_start_s']} s to complete its first "
                "kernels. The hard one leaves: the soft one has the device again (>= 90 %) "
                f"after {mark_s(c['regain_s'])} [{mark_s(c['regain_s_nvml'])}]. Both count "
                "from the hard process's start and end as the benchmark saw them.",
                "",
            ]
        elif c["kind"] == "settling":
            lines += [
                f"## Live change of the share ({c['workload']} kernels)",
                "",
                "A vGPU's process starts at share 30 (its CUDA start-up counts), then "
                "PATCHes of the share while it runs; time until its work (the 200 ms "
                "steps of its burn's trace of completed kernels) stays within 5 points of the "
                "share (target <= 1 s), NVML's per-process figure in brackets: "
                + ", ".join(
                    f"{'from the start' if r.get('from') == 'start' else 'to ' + str(r['share'])}"
                    f": {mark_s(r['settle_s'])} [{mark_s(r['settle_s_nvml'])}]"
                    for r in c["changes"]
                )
                + ".",
                "",
            ]
    lines += ["Plots: " + ", ".join(f"`{p.name}`" for p in sorted(outdir.glob("*.png"))), ""]
    (outdir / "compute.md").write_text("\n".join(lines))


def mark(value: float, target: float, higher: bool = False) -> str:
    ok = value >= target if higher else value <= target
    return f"{value:.2f}" if ok else f"**{value:.2f}** (miss)"


def mark_s(value: float | None) -> str:
    if value is None:
        return "**never**"
    return f"{value:.1f} s" if value <= 1.0 else f"**{value:.1f} s** (miss)"


def plot(
    outdir: Path, timelines: dict[str, dict[str, list[float]]], ylabel: str, suffix: str = ""
) -> None:
    """One OUTDIR/NAME{suffix}.png per timeline, a line per label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, lines in timelines.items():
        fig, ax = plt.subplots(figsize=(8, 3))
        for label, steps in lines.items():
            ax.plot([0.2 * i for i in range(len(steps))], steps, label=label, linewidth=1)
        ax.set_xlabel("seconds")
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, 105)
        ax.set_title(f"{name}{suffix}")
        ax.legend(fontsize="small", ncol=5)
        fig.tight_layout()
        fig.savefig(outdir / f"{name}{suffix}.png", dpi=90)
        plt.close(fig)


# --- entry -------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("outdir", type=Path, help="where compute.json, compute.md and plots go")
    p.add_argument("--sim", action="store_true", help="use the simulated GPU (build/sim)")
    p.add_argument("--device", type=int, default=0, help="GPU index (default 0)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per case")
    p.add_argument("--quick", action="store_true", help="shares 30/70, 3 workloads, 5 s")
    p.add_argument("--workloads", help=f"comma list of {', '.join(WORKLOADS)} (default: all)")
    p.add_argument(
        "--standalone",
        action="store_true",
        help="limit with CUDA_CORE_LIMIT (the pacer alone, no controller); "
        "accuracy and co-location only",
    )
    p.add_argument(
        "--cases",
        default="accuracy,colocation,soft,settling",
        help="comma list of accuracy, colocation, soft, settling",
    )
    args = p.parse_args(argv)
    unknown = set((args.workloads or "big").split(",")) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workload(s): {', '.join(sorted(unknown))}")
    if args.standalone and {"soft", "settling"} & set(args.cases.split(",")):
        args.cases = ",".join(c for c in args.cases.split(",") if c not in ("soft", "settling"))
    if args.seconds < 3:
        p.error("--seconds must be at least 3 (1 s windows need room)")
    if not BURN.is_file():
        p.error(f"{BURN} is missing: run `make` first")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.quick:
        args.seconds = min(args.seconds, 5.0)
    shares = [30, 70] if args.quick else [10, 30, 50, 70, 90]
    workloads = ["big", "tiny", "graph"] if args.quick else list(WORKLOADS)
    if args.workloads:
        workloads = args.workloads.split(",")
    cases = set(args.cases.split(","))
    args.outdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="vgpu-bench-"))
    bench = Bench(args, workdir)
    bench.results["command"] = " ".join(["python benchmarks/bench_compute.py", *argv])
    bench.results["seconds"] = args.seconds
    bench.results["mode"] = (
        "standalone (CUDA_CORE_LIMIT: the pacer alone)"
        if args.standalone
        else "vGPU (vgpud's controller steering the pacer)"
    )
    bench.results["machine"] = machine(args, bench.env)
    try:
        with bench.running():
            if "accuracy" in cases:
                bench.accuracy(shares, workloads)
            if "colocation" in cases:
                bench.colocation([(30, 70), (20, 30, 50)], "big")
            if "soft" in cases:
                bench.soft_yield("bursts")
            if "settling" in cases:
                bench.settling("bursts")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    plot(args.outdir, bench.timelines, "NVML utilization %")
    plot(args.outdir, bench.work_timelines, "work done, % of GPU time", suffix="-work")
    write_report(args.outdir, bench.results, bench.timelines, bench.work_timelines)
    print(f"report: {args.outdir / 'compute.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
