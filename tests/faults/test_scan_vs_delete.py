"""A vGPU deleted while a scan runs: the scan finishes, reaping included.

The scan's thread reads every vGPU's blocks and the loop goes on using them
after the thread (events, reaper, backstop). A delete in between once closed
the blocks under it ("operation forbidden on released memoryview"), so that
scan skipped reaping and a killed process's bytes came back late.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path

from tests.fixtures.hook import FakeHook
from tests.integration.daemon_harness import Daemon
from tests.unit.apiclient import running_api
from vgpud.loops.scan import Watch
from vgpud.observe.nvml import NvmlSample
from vgpud.observe.tracker import Tracker, TrackSnapshot, VgpuView
from vgpud.surface import events as ev

MIB = 1 << 20


class HeldTracker(Tracker):
    """A tracker whose scan waits, mid-read, until the test lets it go."""

    def __init__(self, proc_root: Path) -> None:
        super().__init__(proc_root, sees_all_pids=True)
        self.entered = threading.Event()
        self.go = threading.Event()

    def scan(self, vgpus: Mapping[str, VgpuView], nvml: NvmlSample | None) -> TrackSnapshot:
        self.entered.set()
        self.go.wait()
        return super().scan(vgpus, nvml)


async def test_a_delete_during_a_scan_leaves_the_scan_whole(tmp_path: Path) -> None:
    async with running_api(tmp_path) as api:
        service = api.service
        doomed = (await (await api.client.post("/v1/vgpus", json={"memory": "1g"})).json())["id"]
        kept = (await (await api.client.post("/v1/vgpus", json={"memory": "1g"})).json())["id"]
        # A process of the kept vGPU was killed holding 5 MiB.
        hook = FakeHook(service.registry.get(kept).paths.usage)
        hook.claim(0, pid=77, pidns=4026531836, start_time=1, used={0: 5 * MIB})
        (tmp_path / "proc").mkdir()  # an empty /proc: every slot holder is dead
        tracker = HeldTracker(tmp_path / "proc")
        watch = Watch(service, service.events, tracker)
        scanning = asyncio.create_task(watch.scan())
        await asyncio.to_thread(tracker.entered.wait)
        deleting = asyncio.create_task(service.delete(doomed, force=True))
        await asyncio.sleep(0)  # let the delete reach the point where it waits, if it does
        tracker.go.set()
        await asyncio.gather(scanning, deleting)
        assert doomed not in service.registry.entries
        reclaimed = [e for e in service.events.since(0) if e.type == ev.SLOT_RECLAIMED]
        assert [(e.vgpu, e.detail["freed"]) for e in reclaimed] == [(kept, [5 * MIB])]
        assert service.registry.get(kept).usage.devices()[0].used == 0
        del hook
        tracker.close()


def test_create_delete_churn_under_fast_scans_breaks_no_scan(
    tmp_path: Path, sim_env: dict[str, str]
) -> None:
    """The real daemon scanning 20 times a second while vGPUs come and go:
    every scan completes (a failed one logs "loop iteration failed")."""
    daemon = Daemon(tmp_path, sim_env, config="scan_interval = 0.05\n").start()
    try:
        for _ in range(150):
            vgpu = daemon.client.post("/v1/vgpus", {"memory": "2m", "share": 1})
            daemon.client.delete(f"/v1/vgpus/{vgpu['id']}")
        assert daemon.stop() == 0
        assert "loop iteration failed" not in daemon.log()
    finally:
        daemon.cleanup()
