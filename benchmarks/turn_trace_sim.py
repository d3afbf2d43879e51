"""Who holds the GPU turn, and for how long: two vGPUs through the broker
on the simulated GPU, each running vgpu-burn, the broker's grants traced.

The launch-bound co-location question of docs/compute.md ("Co-location
when the launch-bound share binds") off the GPU: a launch-bound vGPU beside
a GPU-bound one, each at its share, the work each did, NVML's device busy,
what the hooks charged and held back, and from the two control blocks'
`turn_grant` words (polled every 0.1 ms by this process, which also runs
the broker, as the daemon does) each vGPU's grants: how many, the part of
the time it held one, their median and longest. The hook is build/'s, so
a variant is compared by building it with other flags first, e.g.

    make -B lib tools CFLAGS="-O2 -g -DTURNLESS_MAX_USE_PPM=0u"   # turns always
    .venv/bin/python benchmarks/turn_trace_sim.py --shares 30,50

Defaults: A launches 50 us kernels with 20 us of CPU after each and a sync
every 2 (about half the device natively), B 2 ms kernels synchronised every
8. A is also run alone first, unhooked, for its native work. Simulator
figures only: the simulated device time-slices its contexts per kernel.
"""

from __future__ import annotations

import argparse
import itertools
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.conftest import BUILD, sim_environment  # noqa: E402
from tests.helpers.vgpus import BrokeredVgpus  # noqa: E402
from tests.integration.compute_harness import Burn, Sampler, device_util  # noqa: E402
from vgpud.vgpus.abi import ControlC, ControlDeviceC  # noqa: E402
from vgpud.vgpus.blocks import UsageBlock  # noqa: E402

SIM_GPU0 = "GPU-5117a000-0000-4000-8000-000000000000"  # the simulator's first GPU
WARMUP_S = 1.0
POLL_S = 0.0001
GRANT_AT = ControlC.devices.offset + ControlDeviceC.turn_grant.offset  # device 0's


class GrantTrace:
    """The moments each vGPU's grant word turned non-zero and back."""

    def __init__(self, controls: list[Path]) -> None:
        self._maps = []
        for path in controls:
            fd = os.open(path, os.O_RDONLY)
            try:
                self._maps.append(mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ))
            finally:
                os.close(fd)
        self.changes: list[tuple[float, tuple[bool, ...]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> GrantTrace:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        for m in self._maps:
            m.close()

    def _poll(self) -> None:
        last: tuple[bool, ...] | None = None
        while not self._stop.is_set():
            held = tuple(m[GRANT_AT : GRANT_AT + 4] != b"\0\0\0\0" for m in self._maps)
            if held != last:
                self.changes.append((time.monotonic(), held))
                last = held
            time.sleep(POLL_S)

    def report(self) -> list[str]:
        if len(self.changes) < 2:
            return ["no grant was seen"]
        start, end = self.changes[0][0], self.changes[-1][0]
        span = end - start
        lines = []
        for i in range(len(self._maps)):
            holds, since = [], None
            for t, held in self.changes:
                if held[i] and since is None:
                    since = t
                elif not held[i] and since is not None:
                    holds.append(t - since)
                    since = None
            if not holds:
                lines.append(f"vGPU {'AB'[i]}: no grant")
                continue
            lines.append(
                f"vGPU {'AB'[i]}: {len(holds)} grants, held {100 * sum(holds) / span:.1f} % of "
                f"{span:.1f} s, median {1000 * statistics.median(holds):.2f} ms, "
                f"longest {1000 * max(holds):.1f} ms"
            )
        nobody = sum(
            t2 - t1 for (t1, held), (t2, _) in itertools.pairwise(self.changes) if not any(held)
        )
        lines.append(f"no grant: {100 * nobody / span:.1f} % of the time")
        return lines


def burn(env: dict[str, str], work: list[str], seconds: float) -> Burn:
    cmd = [str(BUILD / "vgpu-burn"), "--json", "--seconds", str(seconds), *work]
    return Burn.start(cmd, env, kernel_us=int(work[work.index("--kernel-us") + 1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shares", default="30,50", help="A's share, B's share (%%)")
    p.add_argument("--work-a", default="--kernel-us 50 --gap-us 20 --sync 2")
    p.add_argument("--work-b", default="--kernel-us 2000 --sync 8")
    p.add_argument("--seconds", type=float, default=4.5)
    a = p.parse_args()
    shares = [int(s) for s in a.shares.split(",")]
    works = [a.work_a.split(), a.work_b.split()]
    with tempfile.TemporaryDirectory(prefix="turn-trace-") as tmp:
        tmp_path = Path(tmp)
        env = sim_environment(tmp_path / "sim")
        native = burn(env, works[0], a.seconds)
        native.finish(timeout=a.seconds + 60)
        vgpus = BrokeredVgpus(tmp_path)
        sampler = Sampler(env, device=0)
        try:
            tenants = [vgpus.make(n, {SIM_GPU0: s}) for n, s in zip("ab", shares, strict=True)]
            hooked = {**env, "LD_PRELOAD": str(BUILD / "libvgpu.so")}
            sampler.wait_ready()
            with GrantTrace([Path(t["VGPU_CONTROL"]) for t in tenants]) as trace:
                start = time.time()
                pairs = zip(tenants, works, strict=True)
                burns = [burn({**hooked, **t}, w, a.seconds) for t, w in pairs]
                for b in burns:
                    b.finish(timeout=a.seconds + 60)
            sampler.wait_past(start + a.seconds)
            busy = device_util(sampler.samples, start + WARMUP_S, start + a.seconds)
            charged = []
            for t in tenants:
                block = UsageBlock.open(Path(t["VGPU_USAGE"]), device_count=1)
                d = block.devices()[0]
                charged.append((d.gpu_time_ns / 1e7 / a.seconds, d.throttled_ns / 1e7 / a.seconds))
                block.close()
        finally:
            sampler.stop()
            vgpus.close()
    print(f"A alone, unhooked: {100 * native.work:.1f} % of the device")
    for name, share, b, (gpu, held) in zip("AB", shares, burns, charged, strict=True):
        print(
            f"{name} at {share}: work {100 * b.work:.1f} %, charged {gpu:.1f} %, "
            f"held back {held:.1f} % of the time"
        )
    print(f"device busy (NVML): {busy:.1f} %")
    print("\n".join(trace.report()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
