"""Every API route, in process (real app and blocks, fake GPUs): answers
that conform to openapi.json, and the right error for each kind of bad input."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import vgpud.surface.service as service_module
from tests.unit.apiclient import Api, running_api, validate
from tests.unit.fakes import GIB
from vgpud.config import Config
from vgpud.vgpus.blocks import ControlBlock
from vgpud.vgpus.state import StateStore

VG = "/v1/vgpus/{id}"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path) as a:
        yield a


def mode_of(path: Path) -> int:
    return path.stat().st_mode & 0o777


async def create(api: Api, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
    r = await api.client.post("/v1/vgpus", json=body)
    answer = await r.json()
    assert r.status == status, answer
    validate(answer, "/v1/vgpus", "post", status)
    return answer  # type: ignore[no-any-return]


async def test_health_and_devices(api: Api) -> None:
    r = await api.client.get("/v1/health")
    body = await r.json()
    validate(body, "/v1/health", "get", 200)
    assert (body["gpus"], body["vgpus"]) == (2, 0)
    vg = await create(api, {"gpus": [1], "memory": "1g"})
    r = await api.client.get("/v1/devices")
    devices = await r.json()
    validate(devices, "/v1/devices", "get", 200)
    assert [d["vgpus"] for d in devices] == [[], [vg["id"]]]
    assert [d["compute_capability"] for d in devices] == ["9.0", "9.0"]


async def test_create_makes_blocks_with_the_limits_and_answers_the_recipe(api: Api) -> None:
    vg = await create(
        api, {"name": "train", "memory": "8g", "share": 30, "weight": 5, "labels": {"team": "a"}}
    )
    control = Path(vg["host_env"]["VGPU_CONTROL"])
    assert control.parent == api.tmp / "run" / vg["id"]
    assert mode_of(control) == 0o644
    assert mode_of(Path(vg["host_env"]["VGPU_USAGE"])) == 0o600  # the caller's alone
    block = ControlBlock.open(control)
    dev = block.devices()[0]
    assert (dev.mem_limit, dev.share_ppm, dev.weight, dev.soft) == (8 * GIB, 300_000, 5, False)
    block.close()
    env = vg["recipe"]["env"]
    assert env["VGPU_CONTROL"] == "/run/vgpud/vgpu/control"
    assert env["CUDA_VISIBLE_DEVICES"] == vg["gpus"][0]["uuid"] == env["NVIDIA_VISIBLE_DEVICES"]
    mounts = {m["container_path"]: m for m in vg["recipe"]["mounts"]}
    assert mounts["/run/vgpud/vgpu/control"]["read_only"] is True
    assert mounts["/run/vgpud/vgpu/usage"]["read_only"] is False
    # Nothing shared with other vGPUs: the usage block is the one writable
    # mount, and no GPU-wide file is given (the turn comes in the control
    # block).
    assert [p for p, m in mounts.items() if not m["read_only"]] == ["/run/vgpud/vgpu/usage"]
    assert "VGPU_ARBITER_DIR" not in env and "VGPU_ARBITER_DIR" not in vg["host_env"]
    assert mounts["/usr/lib/vgpud/libvgpu.so"]["host_path"] == str(api.tmp / "libvgpu.so")
    assert vg["recipe"]["cdi_device"] == "vgpud.io/vgpu=train"


async def test_defaults_fill_what_a_request_leaves_out(api: Api) -> None:
    vg = await create(api, {})
    assert (vg["memory"], vg["share"], vg["mode"], vg["weight"]) == ("25%", 25, "hard", 100)
    assert vg["gpus"][0]["memory_limit"] == 20 * GIB  # 25 % of 80 GiB


async def test_get_by_id_or_name_and_filters(api: Api) -> None:
    a = await create(api, {"name": "a", "gpus": [0], "memory": "1g", "labels": {"k": "v"}})
    b = await create(api, {"gpus": [1], "memory": "1g", "owner": {"pod_uid": "p1"}})
    for key in (a["id"], "a"):
        r = await api.client.get(f"/v1/vgpus/{key}")
        body = await r.json()
        validate(body, VG, "get", 200)
        assert body["id"] == a["id"]

    async def ids(query: str) -> list[str]:
        r = await api.client.get(f"/v1/vgpus{query}")
        body = await r.json()
        validate(body, "/v1/vgpus", "get", 200)
        return [v["id"] for v in body]

    assert await ids("") == [a["id"], b["id"]]
    assert await ids("?gpu=1") == [b["id"]]
    assert await ids(f"?gpu={a['gpus'][0]['uuid']}") == [a["id"]]
    assert await ids("?label=k=v") == [a["id"]]
    assert await ids("?owner_pod=p1") == [b["id"]]
    r = await api.client.get("/v1/vgpus?label=novalue")
    assert r.status == 422


async def test_patch_applies_limits_to_the_control_block_at_once(api: Api) -> None:
    vg = await create(api, {"memory": "4g", "share": 20})
    r = await api.client.patch(
        f"/v1/vgpus/{vg['id']}", json={"memory": "2g", "share": 40, "mode": "soft"}
    )
    body = await r.json()
    assert r.status == 200, body
    validate(body, VG, "patch", 200)
    block = ControlBlock.open(Path(vg["host_env"]["VGPU_CONTROL"]))
    dev = block.devices()[0]
    assert (dev.mem_limit, dev.share_ppm, dev.soft) == (2 * GIB, 400_000, True)
    block.close()
    assert body["warnings"] == []


async def test_patch_below_current_use_is_allowed_and_said(api: Api) -> None:
    vg = await create(api, {"memory": "4g"})
    entry = api.service.registry.get(vg["id"])
    entry.usage._c.devices[0].used = 3 * GIB  # a process holds 3 GiB
    r = await api.client.patch(f"/v1/vgpus/{vg['id']}", json={"memory": "1g"})
    body = await r.json()
    assert r.status == 200
    assert len(body["warnings"]) == 1 and "below" in body["warnings"][0]


async def test_delete_refuses_while_in_use_unless_forced(api: Api) -> None:
    vg = await create(api, {"memory": "1g"})
    entry = api.service.registry.get(vg["id"])
    entry.usage._c.slots[0].state = 2  # ACTIVE: a process holds a slot
    r = await api.client.delete(f"/v1/vgpus/{vg['id']}")
    body = await r.json()
    assert r.status == 409 and body["error"] == "in_use" and "1 process" in body["detail"]
    validate(body, VG, "delete", 409)
    assert (api.tmp / "run" / vg["id"]).is_dir()
    r = await api.client.delete(f"/v1/vgpus/{vg['id']}?force=true")
    validate(await r.json(), VG, "delete", 200)
    assert not (api.tmp / "run" / vg["id"]).exists()
    assert StateStore(api.tmp / "state").load() == []
    r = await api.client.get(f"/v1/vgpus/{vg['id']}")
    assert r.status == 404


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"memory": "1g", "colour": "red"}, 422, "unknown field(s): colour"),
        ({"share": "30"}, 422, "share"),
        ({"share": True}, 422, "share"),
        ({"share": 0}, 422, "outside 1..100"),
        ({"share": 101}, 422, "outside 1..100"),
        ({"weight": 1001}, 422, "weight"),
        ({"mode": "medium"}, 422, "mode"),
        ({"memory": "lots"}, 422, "memory"),
        ({"memory": "0%"}, 422, "memory"),
        ({"memory": "150%"}, 422, "memory"),
        ({"memory": -5}, 422, "memory"),
        ({"gpus": []}, 422, "gpus"),
        ({"gpus": ["any", 0]}, 422, "stands alone"),
        ({"gpus": ["GPU-nope"]}, 422, "no GPU 'GPU-nope'"),
        ({"gpus": [0, 0]}, 422, "named twice"),
        ({"gpus": [0], "count": 2}, 422, "count"),
        ({"count": 3}, 409, "no room for 3 GPU(s)"),
        ({"memory": "81g"}, 409, "asked"),
        ({"oversubscribe": True}, 422, "oversubscription is disabled"),
        ({"exclusive": True, "memory": "1g"}, 422, "exclusive"),
        ({"name": "Bad Name"}, 422, "name"),
        ({"name": "vg-0123abcd"}, 422, "shaped like an id"),
        ({"labels": {"k": 1}}, 422, "labels"),
        ([1, 2], 422, "JSON object"),
    ],
)
async def test_bad_create_requests_get_a_clear_error_and_change_nothing(
    api: Api, body: Any, status: int, needle: str
) -> None:
    answer = await create(api, body, status)
    assert answer["error"] and needle in answer["detail"]
    assert api.service.registry.entries == {}
    assert not (api.tmp / "run").exists() or list((api.tmp / "run").iterdir()) == []


async def test_malformed_and_huge_bodies(api: Api) -> None:
    r = await api.client.post("/v1/vgpus", data=b"{not json")
    body = await r.json()
    assert r.status == 400 and body["error"] == "bad_request"
    validate(body, "/v1/vgpus", "post", 400)
    r = await api.client.post("/v1/vgpus", data=b" " * (1 << 20))
    body = await r.json()
    assert r.status == 413
    validate(body, "/v1/vgpus", "post", 413)
    r = await api.client.get("/v1/health")
    assert r.status == 200  # unharmed


async def test_unknown_routes_ids_and_methods_answer_json(api: Api) -> None:
    for method, path, status in [
        ("GET", "/v1/nothing", 404),
        ("GET", "/v1/vgpus/vg-00000000", 404),
        ("PATCH", "/v1/vgpus/ghost", 404),
        ("DELETE", "/v1/vgpus/ghost", 404),
        ("PUT", "/v1/vgpus", 405),
    ]:
        r = await api.client.request(method, path, json={"share": 1})
        body = await r.json()
        assert r.status == status, (method, path, body)
        assert set(body) == {"error", "detail"}


async def test_patch_errors(api: Api) -> None:
    vg = await create(api, {"memory": "1g", "share": 50})
    other = await create(api, {"gpus": [vg["gpus"][0]["index"]], "memory": "1g", "share": 40})
    url = f"/v1/vgpus/{vg['id']}"
    for body, status in [
        ({}, 422),
        ({"share": 61}, 409),  # 61 + 40 > 100
        ({"gpus": [1]}, 422),  # not changeable
        ({"memory": "100g"}, 409),
    ]:
        r = await api.client.patch(url, json=body)
        answer = await r.json()
        assert r.status == status, (body, answer)
        validate(answer, VG, "patch", status)
    assert api.service.registry.get(vg["id"]).vgpu.limits.share == 50
    assert other["share"] == 40


async def test_exclusive_takes_a_whole_gpu(api: Api) -> None:
    vg = await create(api, {"exclusive": True, "gpus": [0]})
    assert (vg["share"], vg["gpus"][0]["memory_limit"]) == (100, 80 * GIB)
    await create(api, {"gpus": [0], "memory": "1g"}, 409)
    r = await api.client.patch(f"/v1/vgpus/{vg['id']}", json={"share": 50})
    assert r.status == 422


async def test_events_replay_and_resume(api: Api) -> None:
    a = await create(api, {"memory": "1g"})
    await api.client.delete(f"/v1/vgpus/{a['id']}")
    r = await api.client.get("/v1/events?follow=false")
    assert r.headers["Content-Type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in (await r.text()).splitlines()]
    for event in lines:
        validate(event, "/v1/events", "get", 200, "application/x-ndjson")
    assert [e["type"] for e in lines] == ["vgpu.created", "vgpu.deleted"]
    r = await api.client.get(f"/v1/events?follow=false&since={lines[0]['seq']}")
    assert [json.loads(x)["type"] for x in (await r.text()).splitlines()] == ["vgpu.deleted"]
    r = await api.client.get("/v1/events?follow=false&format=sse")
    text = await r.text()
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert text.startswith(f"id: {lines[0]['seq']}\nevent: vgpu.created\ndata: {{")
    r = await api.client.get("/v1/events?since=-1")
    assert r.status == 422


async def test_events_follow_streams_new_events(api: Api) -> None:
    r = await api.client.get("/v1/events")
    await create(api, {"memory": "1g"})
    line = await r.content.readline()
    assert json.loads(line)["type"] == "vgpu.created"
    r.close()


async def test_a_follower_without_since_starts_from_now(api: Api) -> None:
    for _ in range(3):
        await create(api, {"memory": "64m"})
    r = await api.client.get("/v1/events")
    await api.client.delete(f"/v1/vgpus/{(await create(api, {'memory': '64m'}))['id']}")
    first = json.loads(await r.content.readline())
    assert first["type"] == "vgpu.created" and first["seq"] == 4  # not the 3 before it
    r.close()


async def test_a_follower_resuming_after_lost_events_is_told_so(tmp_path: Path) -> None:
    """With more events than the rings keep, ?since= from before them gets
    a notice in place of the newest lost event, saying how many after
    ``since`` it will not get, in both formats and as the document says;
    a follower given ?since= that notice's seq gets no second one."""
    config = Config(
        run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"), event_buffer=10
    )
    async with running_api(tmp_path, config) as api:
        created = await create(api, {"memory": "64m"})  # 1, in the ring of vGPU events
        for pid in range(12):  # 2..13: the ring of process events keeps 4..13
            api.service.events.publish("process.started", vgpu=created["id"], pid=pid)
        r = await api.client.get("/v1/events?follow=false&since=0")
        lines = [json.loads(line) for line in (await r.text()).splitlines()]
        for event in lines:
            validate(event, "/v1/events", "get", 200, "application/x-ndjson")
        assert [(e["seq"], e["type"]) for e in lines[:3]] == [
            (1, "vgpu.created"),
            (3, "events.lost"),
            (4, "process.started"),
        ]
        assert lines[1]["detail"] == {"lost": 2, "after": 0} and len(lines) == 12
        r = await api.client.get("/v1/events?follow=false&since=1&format=sse")
        assert (await r.text()).startswith('id: 3\nevent: events.lost\ndata: {"seq": 3, ')
        r = await api.client.get("/v1/events?since=3")
        assert json.loads(await r.content.readline())["seq"] == 4
        r.close()


async def test_processes_metrics_and_openapi_routes(api: Api) -> None:
    r = await api.client.get("/v1/processes")
    body = await r.json()
    validate(body, "/v1/processes", "get", 200)
    r = await api.client.get("/metrics")
    assert r.status == 200 and "vgpud_gpu_memory_total_bytes" in await r.text()
    r = await api.client.get("/openapi.json")
    assert (await r.json())["openapi"].startswith("3.")


async def test_state_survives_and_is_readopted(tmp_path: Path) -> None:
    async with running_api(tmp_path) as first:
        vg = await create(first, {"name": "keep", "memory": "3g", "share": 10})
    control = Path(vg["host_env"]["VGPU_CONTROL"])
    inode = os.stat(control).st_ino
    async with running_api(tmp_path) as second:
        r = await second.client.get("/v1/vgpus/keep")
        body = await r.json()
        assert body["id"] == vg["id"] and body["gpus"][0]["memory_limit"] == 3 * GIB
    assert os.stat(control).st_ino == inode  # adopted, not recreated


async def test_a_read_is_rendered_once_per_state_and_a_change_is_seen_at_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    vg = await create(api, {"memory": "1g", "share": 20})
    builds: list[int] = []
    real = api.service.list_body

    def counting(*args: str | None) -> bytes:
        builds.append(1)
        return real(*args)

    monkeypatch.setattr(api.service, "list_body", counting)
    for _ in range(5):
        assert [v["share"] for v in await (await api.client.get("/v1/vgpus")).json()] == [20]
    assert len(builds) == 1  # 64 clients do not rebuild it 64 times
    await api.client.patch(f"/v1/vgpus/{vg['id']}", json={"share": 30})
    assert [v["share"] for v in await (await api.client.get("/v1/vgpus")).json()] == [30]
    api.service.ticked()  # a loop moved the figures on: they may be RENDER_MAX_AGE old
    await api.client.get("/v1/vgpus")
    assert len(builds) == 2
    monkeypatch.setattr(service_module, "RENDER_MAX_AGE", 0.0)  # ... and then they are read again
    api.service.ticked()
    await api.client.get("/v1/vgpus")
    assert len(builds) == 3
