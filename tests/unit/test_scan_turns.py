"""A scan's work on the event loop comes in two turns of the loop: the
node's snapshot folded from the tracker's view (while someone reads it),
then the scan's news, reaping and backstop. A request that arrives while
the fold runs is answered between the two (at 100 vGPUs and 1000
processes the two are ~1.5 and ~1 ms: one stretch of both put paced API
calls over 5 ms). Nobody reading, the scan does not fold: the first read
does, and shows the scan."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.apiclient import running_api
from tests.unit.test_api_views import process, scan
from vgpud.loops.scan import Watch
from vgpud.observe.tracker import Tracker
from vgpud.surface import service as service_module
from vgpud.surface.snapshot import NodeSnapshot


async def test_work_queued_during_the_fold_runs_before_the_rest_of_the_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_api(tmp_path) as api:
        service = api.service
        await api.client.post("/v1/vgpus", json={"memory": "64m", "share": 5})
        await api.client.get("/v1/vgpus")  # read: the scan folds at once
        tracker = Tracker()
        watch = Watch(service, service.events, tracker)
        order: list[str] = []
        fold = service.refresh

        def refresh_then_a_request_arrives() -> None:
            fold()
            asyncio.get_running_loop().call_soon(order.append, "request")

        news = watch._counter_events

        def scan_goes_on(entry: object) -> None:
            order.append("scan")
            news(entry)  # type: ignore[arg-type]

        monkeypatch.setattr(service, "refresh", refresh_then_a_request_arrives)
        monkeypatch.setattr(watch, "_counter_events", scan_goes_on)
        try:
            await watch.scan()
        finally:
            tracker.close()
        assert order[:2] == ["request", "scan"]


async def test_a_scan_nobody_reads_is_folded_by_the_first_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_api(tmp_path) as api:
        service = api.service
        monkeypatch.setattr(service_module, "WATCHED_FOR", 0.0)  # no read is recent
        folds: list[bool] = []
        fold = service._folded

        def counted(previous: NodeSnapshot | None, *, reread: bool) -> NodeSnapshot:
            folds.append(reread)
            return fold(previous, reread=reread)

        monkeypatch.setattr(service, "_folded", counted)
        service.track = scan(process(42, "serve"))
        assert folds == []  # nobody reads: the scan is not folded
        body = await (await api.client.get("/v1/processes")).json()
        assert folds == [True]  # the first read folds it, the blocks read again
        assert [p["host_pid"] for p in body] == [42]
        await api.client.get("/v1/processes")
        assert folds == [True]  # once
