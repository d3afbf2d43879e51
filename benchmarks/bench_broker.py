"""What the daemon's turn broker (libhook/atomics/vgpu_broker.c) costs the
daemon: CPU of a process that runs only the broker's thread, over vGPUs'
blocks made as the daemon makes them.

    .venv/bin/python benchmarks/bench_broker.py [--vgpus 100] [--gpus 4]
        [--seconds 10] [--hold-ms 5]

Two figures: idle (every vGPU entered, none asking: the broker beats and
looks every 50 ms), and contended (two tenants on GPU 0 take the GPU in
turn through the real protocol — ask, sleep on the grant, echo it, hold it
--hold-ms, give it back — so the broker answers a hand-off every hold).
The tenants' own CPU (their threads' time) is taken out. No GPU needed.
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vgpud.vgpus.abi import TURN_WANT, ControlC, ControlDeviceC, TurnC, UsageC, UsageDeviceC
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.blocks import ControlBlock, DeviceSlice, TurnBroker, UsageBlock

SYS_FUTEX, FUTEX_WAIT, FUTEX_WAKE = 202, 0, 1
libc = ctypes.CDLL(None, use_errno=True)


class Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def tenant(
    control: ControlBlock,
    usage: UsageBlock,
    hold_s: float,
    stop: threading.Event,
    spent: list[float],
    handoffs: list[int],
) -> None:
    """A vGPU's hook, reduced to its turn: ask, wait, work, give back."""
    grant = ctypes.c_uint32.from_address(
        ctypes.addressof(control._c) + ControlC.devices.offset + ControlDeviceC.turn_grant.offset
    )
    request_addr = (
        ctypes.addressof(usage._c)
        + UsageC.devices.offset
        + UsageDeviceC.turn.offset
        + TurnC.request.offset
    )
    request = ctypes.c_uint32.from_address(request_addr)
    slice_ = Timespec(0, 5_000_000)
    n = 0
    while not stop.is_set():
        request.value = TURN_WANT
        libc.syscall(SYS_FUTEX, ctypes.c_void_p(request_addr), FUTEX_WAKE, 0x7FFFFFFF, None)
        while not stop.is_set():
            g = grant.value
            if g > TURN_WANT:
                request.value = g
                if grant.value == g:
                    break
                continue
            libc.syscall(SYS_FUTEX, ctypes.byref(grant), FUTEX_WAIT, g, ctypes.byref(slice_))
        time.sleep(hold_s)
        request.value = 0
        libc.syscall(SYS_FUTEX, ctypes.c_void_p(request_addr), FUTEX_WAKE, 0x7FFFFFFF, None)
        n += 1
    spent.append(time.thread_time())
    handoffs.append(n)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--vgpus", type=int, default=100)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--hold-ms", type=float, default=5)
    a = p.parse_args()
    atomics = Atomics.load()
    broker = TurnBroker(atomics)
    tmp = Path(tempfile.mkdtemp(prefix="bench-broker-"))
    blocks = []
    for i in range(a.vgpus):
        slices = [DeviceSlice(f"GPU-bench-{i % a.gpus}", 1 << 30, 300_000)]
        c = ControlBlock.create(tmp / f"control-{i}", f"v{i}", slices, 0, atomics=atomics)
        u = UsageBlock.create(tmp / f"usage-{i}", device_count=1, atomics=atomics)
        blocks.append((c, u, broker.add(c, u, 0)))
    try:
        start, t0 = cpu_seconds(), time.monotonic()
        time.sleep(a.seconds)
        idle = (cpu_seconds() - start) / (time.monotonic() - t0) * 100
        print(f"idle: {a.vgpus} vGPUs on {a.gpus} GPUs: {idle:.2f} % of a core")

        stop = threading.Event()
        spent: list[float] = []
        handoffs: list[int] = []
        on_gpu0 = [b for i, b in enumerate(blocks) if i % a.gpus == 0][:2]
        threads = [
            threading.Thread(target=tenant, args=(c, u, a.hold_ms / 1000, stop, spent, handoffs))
            for c, u, _ in on_gpu0
        ]
        start, t0 = cpu_seconds(), time.monotonic()
        for t in threads:
            t.start()
        time.sleep(a.seconds)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        busy = (cpu_seconds() - start - sum(spent)) / elapsed * 100
        rate = sum(handoffs) / elapsed
        print(f"contended: two tenants on one GPU, {rate:.0f} turns/s: {busy:.2f} % of a core")
    finally:
        for c, u, handle in blocks:
            broker.remove(handle)
            c.close()
            u.close()
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
