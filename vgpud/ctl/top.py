"""vgpuctl top: a live per-vGPU table, refreshed every second; q quits."""

from __future__ import annotations

import select
import sys
import termios
import time
import tty
from collections.abc import Callable
from typing import Any, TextIO

from vgpud.ctl.client import Client
from vgpud.ctl.table import VGPU_HEADERS, render, vgpu_rows
from vgpud.units import format_bytes

CLEAR = "\x1b[H\x1b[2J"


def frame(client: Client) -> str:
    devices: list[dict[str, Any]] = client.get("/v1/devices")
    vgpus: list[dict[str, Any]] = client.get("/v1/vgpus")
    gpu_rows = [
        [
            d["index"],
            d["name"],
            format_bytes(d["memory_used"]) if d["memory_used"] is not None else None,
            format_bytes(d["memory_total"]),
            None if d["utilization"] is None else f"{d['utilization']:.0f}",
            "ok" if d["healthy"] else "UNHEALTHY",
            len(d["vgpus"]),
        ]
        for d in devices
    ]
    stamp = time.strftime("%H:%M:%S")
    return "\n".join(
        [
            f"vgpud top - {stamp} - {len(vgpus)} vGPU(s) on {len(devices)} GPU(s)",
            "",
            render(("GPU", "NAME", "USED", "TOTAL", "UTIL%", "HEALTH", "VGPUS"), gpu_rows),
            "",
            render(VGPU_HEADERS, vgpu_rows(vgpus)),
        ]
    )


def run_top(client: Client, interval: float, once: bool, out: TextIO = sys.stdout) -> int:
    if once or not sys.stdin.isatty():
        out.write(frame(client) + "\n")
        return 0
    return _live(lambda: frame(client), interval, out)


def _live(make_frame: Callable[[], str], interval: float, out: TextIO) -> int:
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)  # read q without Enter; restored whatever happens
    try:
        while True:
            out.write(CLEAR + make_frame() + "\n\n(q to quit)\n")
            out.flush()
            ready, _, _ = select.select([sys.stdin], [], [], interval)
            if ready and sys.stdin.read(1) in ("q", "Q"):
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
