"""Event-loop time of the read routes at 100 vGPUs, in process (no HTTP).

    .venv/bin/python benchmarks/bench_snapshot.py [--vgpus 100] [--rounds 200]

A real Service and registry (blocks in a temporary directory) on four fake
GPUs. Each round a control tick (the real steering) moves the daemon's
state on and the service is told (``ticked``, with the age limit set to 0
so that every tick counts; timed: with the snapshot it is where the blocks
are read), then the handler of ``GET /v1/vgpus`` or of ``/metrics`` (by
turns) is awaited directly with a mocked request, twice: the first answer
of the new state, then a second from the same state (what the other
clients of that state get). "Idle": no counter moved between rounds;
"busy": every vGPU's GPU time moved (a process ran in each), so every
vGPU's figures are new.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

import vgpud.surface.service as service_module
from tests.unit.apiclient import running_api
from vgpud import __version__
from vgpud.config import Config
from vgpud.loops.control import Steering
from vgpud.surface.api.app import list_vgpus, metrics_handler
from vgpud.vgpus.atomics import Atomics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


ROUTES: list[tuple[str, Handler, str]] = [
    ("GET /v1/vgpus", list_vgpus, "/v1/vgpus"),
    ("/metrics", metrics_handler, "/metrics"),
]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


async def timed(handler: Handler, app: web.Application, path: str) -> float:
    request = make_mocked_request("GET", path, app=app)
    start = time.perf_counter()
    await handler(request)
    return time.perf_counter() - start


async def measure(vgpus: int, rounds: int, busy: bool) -> dict[str, list[float]]:
    service_module.RENDER_MAX_AGE = 0.0  # every tick starts a new state
    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = Config(
            run_dir=str(work / "run"),
            state_dir=str(work / "state"),
            max_vgpus_per_gpu=-(-vgpus // 4),
        )
        async with running_api(work, config, ngpus=4) as api:
            for _ in range(vgpus):
                r = await api.client.post("/v1/vgpus", json={"memory": "256m", "share": 1})
                assert r.status == 201, await r.text()
            app: Any = api.client.server.app
            service, steering = api.service, Steering(Atomics.load())
            usages = [e.usage for e in service.registry.all()]
            # The service is handed the quotas the tick gave (the code before
            # the snapshot took none).
            hands_quotas = "quotas" in inspect.signature(service.ticked).parameters
            for n in range(rounds):
                if busy:
                    for usage in usages:
                        usage._c.devices[0].gpu_time_ns = n + 1
                quotas = steering.tick(service.registry.all(), {}, None, None, time.monotonic_ns())
                start = time.perf_counter()
                if hands_quotas:
                    service.ticked(quotas)
                else:
                    service.ticked()
                out.setdefault("tick", []).append(time.perf_counter() - start)
                name, handler, path = ROUTES[n % len(ROUTES)]  # one route per state
                out.setdefault(f"{name}, first", []).append(await timed(handler, app, path))
                out.setdefault(f"{name}, again", []).append(await timed(handler, app, path))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vgpus", type=int, default=100)
    p.add_argument("--rounds", type=int, default=200)
    a = p.parse_args()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"Python {platform.python_version()}, vgpud {__version__}, {a.vgpus} vGPUs, "
        f"{a.rounds} rounds"
    )
    print("| state | what | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- |")
    for busy in (False, True):
        times = asyncio.run(measure(a.vgpus, a.rounds, busy))
        for what, values in times.items():
            ms = [v * 1000 for v in values]
            state = "busy" if busy else "idle"
            print(f"| {state} | {what} | {percentile(ms, 50):.3f} | {percentile(ms, 99):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
