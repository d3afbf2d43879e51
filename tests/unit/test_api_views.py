"""The read routes answer from one snapshot of the daemon per change of its
sources, with pieces serialised once (a vGPU's definition, its figures,
each tracked process, each vGPU's metric lines): whatever is reused, every
route shows a change through the API at once, a counter moved by a tick
once the snapshot is RENDER_MAX_AGE old, and nothing of a deleted vGPU."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import vgpud.surface.service as service_module
from tests.unit.apiclient import Api, get_ok, running_api, validate
from tests.unit.fakes import GIB
from vgpud.observe.cgroups import ContainerRef, Runtime
from vgpud.observe.tracker import ProcessKind, TrackedProcess, TrackSnapshot


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path) as a:
        yield a


async def metric(api: Api, name: str) -> dict[str, float]:
    """One family's samples on /metrics, by the vGPU they are of."""
    text = await (await api.client.get("/metrics")).text()
    return {
        s.labels["vgpu"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def shown(api: Api, vgpu_id: str, field: str) -> tuple[Any, Any]:
    """A GPU figure of a vGPU as the list and its own answer show it."""
    listed = {v["id"]: v for v in await get_ok(api, "/v1/vgpus")}[vgpu_id]
    own = await get_ok(api, f"/v1/vgpus/{vgpu_id}")
    return listed["gpus"][0][field], own["gpus"][0][field]


async def test_a_counter_moved_by_a_tick_is_shown_everywhere_once_the_snapshot_is_old(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    vg = await get_created(api, {"memory": "4g", "share": 20})
    assert await shown(api, vg, "memory_used") == (0, 0)
    assert (await metric(api, "vgpud_vgpu_memory_used_bytes"))[vg] == 0
    api.service.registry.get(vg).usage._c.devices[0].used = 3 * GIB  # a process took 3 GiB
    api.service.registry.get(vg).usage._c.devices[0].oom_count = 2
    monkeypatch.setattr(service_module, "RENDER_MAX_AGE", 0.0)  # the snapshot is old: ...
    api.service.ticked()  # ... a tick folds a new one
    assert await shown(api, vg, "memory_used") == (3 * GIB, 3 * GIB)
    assert await shown(api, vg, "oom_count") == (2, 2)
    assert (await metric(api, "vgpud_vgpu_memory_used_bytes"))[vg] == 3 * GIB
    assert (await metric(api, "vgpud_vgpu_oom_total"))[vg] == 2


async def test_one_vgpus_answer_shows_its_latest_counters_even_in_a_fresh_snapshot(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that hit the limit and exited: its peak and OOM must show in
    # the very next GET of its vGPU, not a view's age later.
    monkeypatch.setattr(service_module, "RENDER_MAX_AGE", 3600.0)
    vg = await get_created(api, {"memory": "4g", "share": 20})
    assert (await get_ok(api, f"/v1/vgpus/{vg}"))["gpus"][0]["memory_peak"] == 0
    api.service.registry.get(vg).usage._c.devices[0].peak = 3 * GIB
    api.service.registry.get(vg).usage._c.devices[0].oom_count = 1
    api.service.ticked()
    gpu = (await get_ok(api, f"/v1/vgpus/{vg}"))["gpus"][0]
    assert (gpu["memory_peak"], gpu["oom_count"]) == (3 * GIB, 1)


async def test_a_change_through_the_api_is_shown_everywhere_at_once(api: Api) -> None:
    vg = await get_created(api, {"name": "a", "memory": "4g", "share": 20})
    other = await get_created(api, {"name": "b", "memory": "1g", "share": 10})
    assert (await metric(api, "vgpud_vgpu_share_ratio"))[vg] == 0.2
    r = await api.client.patch(f"/v1/vgpus/{vg}", json={"share": 30, "memory": "2g"})
    assert r.status == 200
    listed = {v["id"]: v for v in await get_ok(api, "/v1/vgpus")}
    own = await get_ok(api, "/v1/vgpus/a")
    validate(own, "/v1/vgpus/{id}", "get", 200)
    assert (listed[vg]["share"], own["share"]) == (30, 30)
    assert await shown(api, vg, "memory_limit") == (2 * GIB, 2 * GIB)
    assert (await metric(api, "vgpud_vgpu_share_ratio"))[vg] == 0.3
    assert (await metric(api, "vgpud_vgpu_memory_limit_bytes"))[vg] == 2 * GIB
    assert listed[other]["share"] == 10  # the others' answers are what they were


async def test_a_deleted_vgpu_is_gone_from_every_route_and_a_new_one_of_its_name_is_new(
    api: Api,
) -> None:
    vg = await get_created(api, {"name": "a", "memory": "4g"})
    await get_ok(api, "/v1/vgpus/a")
    assert [v["id"] for v in await get_ok(api, "/v1/vgpus")] == [vg]
    assert set(await metric(api, "vgpud_vgpu_memory_limit_bytes")) == {vg}
    assert (await api.client.delete(f"/v1/vgpus/{vg}")).status == 200
    assert await get_ok(api, "/v1/vgpus") == []
    for path in (f"/v1/vgpus/{vg}", "/v1/vgpus/a"):
        assert (await api.client.get(path)).status == 404
    assert await metric(api, "vgpud_vgpu_memory_limit_bytes") == {}
    again = await get_created(api, {"name": "a", "memory": "2g"})
    own = await get_ok(api, "/v1/vgpus/a")
    assert (own["id"], own["gpus"][0]["memory_limit"]) == (again, 2 * GIB)


async def test_a_listed_vgpu_is_its_own_answer_byte_for_byte(api: Api) -> None:
    for body in ({"name": "a", "memory": "4g", "labels": {"team": "x"}}, {"memory": "1g"}):
        await get_created(api, body)
    listed = await (await api.client.get("/v1/vgpus")).read()
    own = [
        await (await api.client.get(f"/v1/vgpus/{v['id']}")).read()
        for v in await get_ok(api, "/v1/vgpus")
    ]
    assert listed == b"[" + b", ".join(own) + b"]"


def process(pid: int, comm: str, memory: int = 0) -> TrackedProcess:
    return TrackedProcess(
        pid=pid,
        ns_pid=1,
        pidns=4026531836,
        start_time=100,
        comm=comm,
        uid=1000,
        container=ContainerRef(Runtime.DOCKER, "/docker/abc", container_id="abc"),
        kind=ProcessKind.VGPU,
        vgpu_id="vg-00000001",
        slot=0,
        memory={"GPU-x": memory} if memory else {},
    )


def scan(*processes: TrackedProcess) -> TrackSnapshot:
    return TrackSnapshot(0.0, {p.pid: p for p in processes}, {}, (), {}, (), (), True)


async def test_processes_show_each_scan_whatever_was_serialised_before(api: Api) -> None:
    first, second = process(10, "train"), process(11, "serve")
    api.service.track = scan(first, second)
    body = await get_ok(api, "/v1/processes")
    validate(body, "/v1/processes", "get", 200)
    assert [(p["host_pid"], p["comm"], p["memory"]) for p in body] == [
        (10, "train", {}),
        (11, "serve", {}),
    ]
    # The same pid with new figures (a new object), one process gone, one new.
    api.service.track = scan(replace(first, memory={"GPU-x": GIB}), process(12, "eval"))
    body = await get_ok(api, "/v1/processes")
    assert [(p["host_pid"], p["comm"], p["memory"]) for p in body] == [
        (10, "train", {"GPU-x": GIB}),
        (12, "eval", {}),
    ]
    api.service.track = None
    assert await get_ok(api, "/v1/processes") == []


async def get_created(api: Api, body: dict[str, Any]) -> str:
    r = await api.client.post("/v1/vgpus", json=body)
    answer = await r.json()
    assert r.status == 201, answer
    validate(answer, "/v1/vgpus", "post", 201)
    return str(answer["id"])
