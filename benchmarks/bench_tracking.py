"""Cost of one scan of the host: Tracker.scan + reaper + backstop decisions.

Starts N real sleeping processes and V vGPUs whose usage blocks hold a slot
for each process (identities read from /proc, as the hook writes them; each
process maps its vGPU's usage block, as a hooked process does),
then times scans in steady state (CPU time of this process). NVML is a
fixed sample listing every process, as on a busy GPU node.

    .venv/bin/python benchmarks/bench_tracking.py [--procs 1000] [--vgpus 100]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.hook import GPU_UUIDS, FakeVgpu, MappedSleepers
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.procfs import ProcFS
from vgpud.observe.tracker import Tracker
from vgpud.policy.backstop import BackstopPolicy, BackstopState, decide
from vgpud.policy.reaper import ReaperState, plan


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--procs", type=int, default=1000)
    parser.add_argument("--vgpus", type=int, default=100)
    parser.add_argument("--scans", type=int, default=20)
    args = parser.parse_args()
    fs = ProcFS()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    vgpus = [FakeVgpu(tmp / f"v{i}", f"v{i}", (8 << 30,)) for i in range(args.vgpus)]
    # Each process maps its vGPU's usage block, as the hook does: the host's
    # proof that its slot is its own (docs/tracking.md, "Evidence").
    per_vgpu = [len(range(i, args.procs, args.vgpus)) for i in range(args.vgpus)]
    sleepers = MappedSleepers([(v.usage.path, n) for v, n in zip(vgpus, per_vgpu, strict=True)])
    try:
        at = 0
        for v, n in zip(vgpus, per_vgpu, strict=True):
            for index, pid in enumerate(sleepers.pids[at : at + n]):
                process = fs.process(pid)
                assert process is not None
                v.hook.claim(
                    index,
                    pid=process.ns_pid,
                    pidns=process.pidns,
                    start_time=process.start_time,
                    used={0: 1 << 20},
                )
            at += n
        views = {f"v{i}": v.blocks for i, v in enumerate(vgpus)}
        pids = dict.fromkeys(sleepers.pids, 1 << 20)
        gpu = GpuSample(GPU_UUIDS[0], 0, 50, sum(pids.values()), 80 << 30, pids, {})
        sample = NvmlSample(monotonic=0.0, gpus={GPU_UUIDS[0]: gpu})
        tracker = Tracker()
        t0 = time.process_time()
        snap = tracker.scan(views, sample)
        first = time.process_time() - t0
        assert len(snap.processes) >= args.procs, len(snap.processes)
        reaper, backstop = ReaperState(), BackstopState()
        policy = BackstopPolicy()
        scan_t, decide_t = 0.0, 0.0
        for _ in range(args.scans):
            t0 = time.process_time()
            snap = tracker.scan(views, sample)
            t1 = time.process_time()
            _, _, reaper = plan(snap, reaper)
            _, _, backstop = decide(snap, policy, backstop)
            t2 = time.process_time()
            scan_t += t1 - t0
            decide_t += t2 - t1
        host_procs = len(fs.pids())
        per_scan = (scan_t + decide_t) / args.scans
        print(f"machine: {platform.machine()}, Python {platform.python_version()}")
        print(f"host processes: {host_procs}, tracked: {len(snap.processes)}, vGPUs: {args.vgpus}")
        print(f"first scan (cold caches): {first * 1000:.1f} ms CPU")
        print(f"steady scan: {scan_t / args.scans * 1000:.1f} ms CPU")
        print(f"reaper + backstop decisions: {decide_t / args.scans * 1000:.1f} ms CPU")
        print(f"at one scan per second: {per_scan * 100:.2f} % of a core")
    finally:
        sleepers.close()
        for v in vgpus:
            v.close()


if __name__ == "__main__":
    main()
