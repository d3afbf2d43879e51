"""The scan's news from a vGPU's counters (an OOM; throttling starting and
stopping) is published once each, also between scans in which no counter
moved (those read the counters and find them the same objects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fixtures.hook import FakeHook
from tests.unit.apiclient import running_api
from vgpud.loops.scan import Watch
from vgpud.observe.tracker import Tracker


async def test_oom_and_throttling_news_follow_the_counters_across_quiet_scans(
    tmp_path: Path,
) -> None:
    async with running_api(tmp_path) as api:
        service = api.service
        tracker = Tracker()
        watch = Watch(service, service.events, tracker)
        seen = service.events.last_seq

        async def news() -> list[tuple[str, Any]]:
            nonlocal seen
            await watch.scan()
            events = service.events.since(seen)
            seen = service.events.last_seq
            return [(e.type, e.detail.get("refused", e.detail.get("throttled"))) for e in events]

        try:
            answer = await api.client.post("/v1/vgpus", json={"memory": "64m", "share": 5})
            usage = service.registry.get((await answer.json())["id"]).paths.usage
            hook = FakeHook(usage)
            device = hook.block.devices[0]
            assert [n for n in await news() if n[0] != "vgpu.created"] == []
            assert await news() == []  # quiet: nothing moved
            device.oom_count += 2
            assert await news() == [("oom", 2)]
            assert await news() == []
            device.throttled_ns += 1000  # a process waits in the pacer
            assert await news() == [("throttled", True)]
            device.throttled_ns += 1000  # still waiting: no news
            assert await news() == []
            assert await news() == [("throttled", False)]  # no more waiting since
            assert await news() == []
            device.gpu_time_ns += 5  # a counter moves, not the waiting one
            assert await news() == []
            device.throttled_ns += 1
            assert await news() == [("throttled", True)]
            device.gpu_time_ns += 5
            assert await news() == [("throttled", False)]
            del device
            hook.close()
        finally:
            tracker.close()
