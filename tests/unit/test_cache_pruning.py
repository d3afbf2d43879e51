"""What the daemon remembers per vGPU and per process goes with them.

The scan, the control tick, the API's answers and /metrics each keep what
they worked out last, by vGPU id or by pid, so as not to work it out again.
A vGPU deleted and processes that exited must leave nothing behind there,
or the daemon grows with every vGPU and process it has ever seen. Here
vGPUs come and go, each with real processes that hold slots and then die;
afterwards no cache of those objects has a key that names a gone vGPU or
pid (a vGPU's serialised answer is kept on its snapshot's objects, and goes
with them).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.fixtures.hook import FakeHook, MappedSleepers
from tests.unit.apiclient import running_api
from vgpud.loops.control import Steering
from vgpud.loops.scan import Watch
from vgpud.observe.tracker import Tracker
from vgpud.surface.metrics import Metrics
from vgpud.vgpus.atomics import Atomics

ROUNDS = 24  # more than the bound of the answers' caches with nothing live
PROCESSES = 3
MIB = 1 << 20


def names(key: object, gone: set[object]) -> bool:
    """Whether a cache key is, or holds, a gone vGPU id or pid."""
    if isinstance(key, tuple):
        return any(names(k, gone) for k in key)
    return isinstance(key, str | int) and key in gone


def caches(obj: object) -> Iterator[tuple[str, Any]]:
    """The dicts and sets an object keeps, as (name, container)."""
    for name, value in vars(obj).items():
        if isinstance(value, dict | set | frozenset):
            yield name, value


def identity(pid: int) -> dict[str, int]:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {"pid": pid, "pidns": os.stat(f"/proc/{pid}/ns/pid").st_ino, "start_time": int(stat[19])}


async def test_a_deleted_vgpu_and_exited_processes_leave_nothing_behind(tmp_path: Path) -> None:
    async with running_api(tmp_path) as api:
        service = api.service
        tracker = Tracker()
        watch = Watch(service, service.events, tracker)
        steering = Steering(Atomics.load())
        metrics = Metrics(service)

        async def tick_and_read(vgpu_id: str | None) -> None:
            await watch.scan()
            track = service.track
            standalone = track.standalone if track is not None else {}
            steering.tick(service.registry.all(), standalone, track, None, time.monotonic_ns())
            service.ticked()
            for path in ["/v1/vgpus", "/v1/processes"] + (
                [f"/v1/vgpus/{vgpu_id}"] if vgpu_id else []
            ):
                assert (await api.client.get(path)).status == 200
            metrics.render()

        gone: set[object] = set()
        try:
            for _ in range(ROUNDS):
                answer = await api.client.post("/v1/vgpus", json={"memory": "64m", "share": 5})
                vgpu_id = (await answer.json())["id"]
                usage = service.registry.get(vgpu_id).paths.usage
                sleepers = MappedSleepers([(usage, PROCESSES)])
                hook = FakeHook(usage)
                for slot, pid in enumerate(sleepers.pids):
                    hook.claim(slot, **identity(pid), used={0: MIB})
                del hook
                await tick_and_read(vgpu_id)
                assert len(service.track.processes) == PROCESSES  # type: ignore[union-attr]
                for pid in sleepers.pids:
                    os.kill(pid, signal.SIGKILL)
                sleepers.close()
                deadline = time.monotonic() + 10
                while service.process_count(service.registry.get(vgpu_id)):  # the exits, the reaper
                    assert time.monotonic() < deadline, "the exits were never seen"
                    await asyncio.sleep(0.02)
                    await tick_and_read(vgpu_id)
                await service.delete(vgpu_id, force=False)
                await tick_and_read(None)
                gone |= {vgpu_id, *sleepers.pids}

            for owner in (
                tracker,
                vars(tracker)["_evidence"],
                vars(tracker)["_exits"],
                service,
                watch,
                steering,
                steering.state,
                metrics,
            ):
                for name, cache in caches(owner):
                    left = [key for key in cache if names(key, gone)]
                    assert not left, f"{type(owner).__name__}.{name} keeps {len(left)}: {left[:3]}"
        finally:
            tracker.close()
