"""Adopted standalone vGPUs in /v1/vgpus: listed read-only from the last
scan's snapshot, beside the daemon's own; PATCH and DELETE refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.apiclient import Api, get_ok, running_api, validate
from tests.unit.fakes import GIB
from vgpud.ctl.table import show
from vgpud.observe.tracker import GpuUse, TrackSnapshot, VgpuUse
from vgpud.vgpus.blocks import UsageDevice

SA = "sa-803-4242"
VG = "/v1/vgpus/{id}"
READ_ONLY = "standalone vGPU: its limits come from the container's environment"


def counters(**kw: int) -> UsageDevice:
    fields: dict[str, Any] = dict.fromkeys(
        ("used", "peak", "oom_count", "gpu_time_ns", "launches", "throttled_ns"), 0
    )
    return UsageDevice(**{**fields, "mem_limit": 0, "share_ppm": 0, **kw})


def snapshot(uuid: str) -> TrackSnapshot:
    """A scan that adopted one standalone vGPU on ``uuid`` held by two processes."""
    use = GpuUse(
        uuid=uuid,
        limit=4 * GIB,
        hooked_used=GIB,
        nvml_used=GIB,
        sm_util=None,
        processes=2,
        counters=counters(used=GIB, peak=2 * GIB, oom_count=1, gpu_time_ns=5, share_ppm=300_000),
        steered_ppm=250_000,
    )
    return TrackSnapshot(
        monotonic=0.0,
        processes={},
        vgpus={SA: VgpuUse(SA, True, {uuid: use}, (101, 102), 2)},
        slots=(),
        standalone={},
        arrivals=(),
        exits=(),
        sees_all_pids=True,
    )


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path) as a:
        a.service.track = snapshot(a.inventory.devices()[0].uuid)
        yield a


async def test_listed_beside_the_daemons_own_with_the_environments_limits(api: Api) -> None:
    r = await api.client.post("/v1/vgpus", json={"gpus": [1], "memory": "1g"})
    managed = await r.json()
    listed = await get_ok(api, "/v1/vgpus")
    validate(listed, "/v1/vgpus", "get", 200)
    assert [(v["id"], v["kind"]) for v in listed] == [
        (managed["id"], "managed"),
        (SA, "standalone"),
    ]
    gpu0 = api.inventory.devices()[0].uuid
    assert listed[1] == {
        "id": SA,
        "kind": "standalone",
        "name": None,
        "share": 30.0,
        "mode": "hard",
        "gpus": [
            {
                "uuid": gpu0,
                "index": 0,
                "memory_limit": 4 * GIB,
                "memory_used": GIB,
                "memory_peak": 2 * GIB,
                "oom_count": 1,
                "gpu_time_ns": 5,
                "throttled_ns": 0,
                "quota_ppm": 250_000,
                "share": 30.0,
                "utilization": None,
                "processes": 2,
            }
        ],
        "processes": 2,
        "pids": [101, 102],
    }
    one = await get_ok(api, f"/v1/vgpus/{SA}")
    validate(one, VG, "get", 200)
    assert one == listed[1]


async def test_filters(api: Api) -> None:
    gpu0 = api.inventory.devices()[0].uuid
    for gpu in ("0", gpu0):
        assert [v["id"] for v in await get_ok(api, f"/v1/vgpus?gpu={gpu}")] == [SA]
    assert await get_ok(api, "/v1/vgpus?gpu=1") == []
    # It has neither labels nor an owner.
    assert await get_ok(api, "/v1/vgpus?label=team=a") == []
    assert await get_ok(api, "/v1/vgpus?owner_pod=p") == []


async def test_no_limit_in_the_environment_is_shown_as_such(api: Api) -> None:
    uuid = api.inventory.devices()[0].uuid
    unlimited = GpuUse(uuid, None, 0, 0, None, 1, counters(), 0)
    api.service.track = TrackSnapshot(
        0.0, {}, {SA: VgpuUse(SA, True, {uuid: unlimited}, (7,), 1)}, (), {}, (), (), True
    )
    body = await get_ok(api, f"/v1/vgpus/{SA}")
    validate(body, VG, "get", 200)
    assert (body["share"], body["gpus"][0]["memory_limit"], body["gpus"][0]["share"]) == (
        100,
        None,
        100,
    )


async def test_patch_and_delete_are_refused(api: Api) -> None:
    for method, body in (("patch", {"share": 10}), ("patch", {"bogus": 1}), ("delete", None)):
        r = await api.client.request(method, f"/v1/vgpus/{SA}", json=body)
        answer = await r.json()
        assert r.status == 409, answer
        validate(answer, VG, method, 409)
        assert answer == {"error": "conflict", "detail": READ_ONLY}
    assert (await get_ok(api, f"/v1/vgpus/{SA}"))["id"] == SA  # still there


async def test_gone_from_the_snapshot_is_not_found(api: Api) -> None:
    api.service.track = None
    assert await get_ok(api, "/v1/vgpus") == []
    for method in ("get", "patch", "delete"):
        r = await api.client.request(method, f"/v1/vgpus/{SA}", json={"share": 10})
        assert r.status == 404


async def test_vgpuctl_shows_it(api: Api) -> None:
    text = show(await get_ok(api, f"/v1/vgpus/{SA}"), await get_ok(api, "/v1/processes"))
    assert "standalone" in text and "read-only" in text
    assert "none found by the last scan" in text  # the scan saw its pids, not their processes
    row = next(line for line in text.splitlines() if line.startswith(SA)).split()
    assert row == [SA, "-", "0", "4.0GiB", "1.0GiB", "30%", "hard", "-", "25", "2"]
