"""Issue 10, item 10: malformed input to the API, as a hostile client sends it.

Every answer must be a 4xx with the documented error shape
{"error": code, "detail": text}, nothing may change, and the daemon must go
on answering. Before the fix, a 20,000-deep body and ``?since=`` with more
than 4300 digits answered 500, "0.0000001%" made an 85-byte vGPU and
"123m" written in Arabic-Indic digits was taken as 123 MiB.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.apiclient import Api, running_api
from vgpud.units import MIN_VGPU_MEMORY

DEEP = 20_000


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path) as a:
        yield a


async def refused(api: Api, method: str, path: str, status: int | None = None, **kw: Any) -> str:
    """Send one request; it must be refused with a 4xx (``status`` if given)
    and the error shape. Returns the error code."""
    r = await api.client.request(method, path, **kw)
    body = await r.json()
    assert 400 <= r.status < 500, (r.status, body)
    if status is not None:
        assert r.status == status, body
    assert set(body) == {"error", "detail"} and body["detail"], body
    assert isinstance(body["error"], str) and isinstance(body["detail"], str)
    return str(body["error"])


async def vgpu_count(api: Api) -> int:
    r = await api.client.get("/v1/vgpus")
    assert r.status == 200
    return len(await r.json())


async def a_vgpu(api: Api) -> dict[str, Any]:
    r = await api.client.post("/v1/vgpus", json={"name": "victim", "memory": "1g", "share": 20})
    assert r.status == 201
    return await r.json()  # type: ignore[no-any-return]


# --- bodies -----------------------------------------------------------------


RAW_BODIES = {
    "20,000-deep array": "[" * DEEP + "]" * DEEP,
    "10,000-deep object (what fits in 64 KiB)": '{"a":' * (DEEP // 2) + "1" + "}" * (DEEP // 2),
    "deep labels": '{"labels": ' + '{"a": ' * 12 + '"x"' + "}" * 12 + "}",
    "NaN": '{"share": NaN}',
    "Infinity": '{"share": Infinity}',
    "-Infinity": '{"memory": -Infinity}',
    "an int of 5000 digits": '{"memory": ' + "9" * 5000 + "}",
    "a key twice": '{"memory": "1g", "memory": "70g"}',
    "not UTF-8": b'{"name": "\xff\xfe"}',
    "truncated": '{"memory": "1g"',
}


@pytest.mark.parametrize("raw", RAW_BODIES.values(), ids=RAW_BODIES.keys())
async def test_a_malformed_create_body_is_a_400_and_makes_nothing(api: Api, raw: str) -> None:
    headers = {"Content-Type": "application/json"}
    assert await refused(api, "POST", "/v1/vgpus", 400, data=raw, headers=headers) == "bad_request"
    assert await vgpu_count(api) == 0


@pytest.mark.parametrize("raw", RAW_BODIES.values(), ids=RAW_BODIES.keys())
async def test_a_malformed_update_body_is_a_400_and_changes_nothing(api: Api, raw: str) -> None:
    vg = await a_vgpu(api)
    headers = {"Content-Type": "application/json"}
    await refused(api, "PATCH", f"/v1/vgpus/{vg['id']}", 400, data=raw, headers=headers)
    r = await api.client.get(f"/v1/vgpus/{vg['id']}")
    now = await r.json()
    assert (now["memory"], now["share"]) == (vg["memory"], vg["share"])


VALUES = {
    # memory: sizes that are no vGPU
    "a tiny percentage": {"memory": "0.0000001%"},
    "8 bytes": {"memory": 8},
    "one byte under the minimum": {"memory": MIN_VGPU_MEMORY - 1},
    "zero": {"memory": "0g"},
    "2^62 bytes": {"memory": 2**62},
    "2^64 + 1 bytes (wraps in a u64)": {"memory": 2**64 + 1},
    "a 5000-digit size": {"memory": "9" * 5000},
    "Arabic-Indic digits": {"memory": "\u0661\u0662\u0663m"},
    "full-width digits": {"memory": "\uff18g"},
    "superscript digits": {"memory": "\u00b2g"},
    "Arabic-Indic percentage": {"memory": "\u0665\u0660%"},
    "a percentage with 40 decimals": {"memory": "1." + "1" * 40 + "%"},
    "1e400 (float infinity)": {"memory": 1e400},
    # numbers where integers belong
    "a float share": {"share": 30.0},
    "negative zero share": {"share": -0.0},
    "integer negative zero share": {"share": -0},
    "a huge share": {"share": 10**300},
    "a float weight": {"weight": 1.5},
    "a float count": {"count": 1.0},
    "a huge GPU index": {"gpus": [10**30]},
    # strings beyond their caps
    "a 10,000-character name": {"name": "a" * 10_000},
    "a 10,000-character label": {"labels": {"k": "v" * 10_000}},
    "a 10,000-character GPU": {"gpus": ["G" * 10_000]},
}


@pytest.mark.parametrize("body", VALUES.values(), ids=VALUES.keys())
async def test_a_value_out_of_its_domain_is_refused_and_makes_nothing(
    api: Api, body: dict[str, Any]
) -> None:
    await refused(api, "POST", "/v1/vgpus", json=body)
    assert await vgpu_count(api) == 0


UPDATES = {k: v for k, v in VALUES.items() if set(v) <= {"memory", "share", "weight"}}


@pytest.mark.parametrize("body", UPDATES.values(), ids=UPDATES.keys())
async def test_a_value_out_of_its_domain_changes_no_vgpu(api: Api, body: dict[str, Any]) -> None:
    vg = await a_vgpu(api)
    await refused(api, "PATCH", f"/v1/vgpus/{vg['id']}", json=body)
    r = await api.client.get(f"/v1/vgpus/{vg['id']}")
    now = await r.json()
    assert [g["memory_limit"] for g in now["gpus"]] == [g["memory_limit"] for g in vg["gpus"]]


async def test_a_body_over_the_size_cap_is_a_413(api: Api) -> None:
    big = '{"name": "' + "a" * (api.service.config.max_request_bytes + 1) + '"}'
    headers = {"Content-Type": "application/json"}
    code = await refused(api, "POST", "/v1/vgpus", 413, data=big, headers=headers)
    assert code == "payload_too_large"


async def test_the_smallest_vgpu_is_made(api: Api) -> None:
    r = await api.client.post("/v1/vgpus", json={"memory": MIN_VGPU_MEMORY})
    assert r.status == 201, await r.json()


# --- query strings ------------------------------------------------------------


QUERIES = {
    "since with 5000 digits": "/v1/events?follow=false&since=" + "9" * 5000,
    "since above 2^63": f"/v1/events?follow=false&since={2**63}",
    "since negative": "/v1/events?follow=false&since=-1",
    "since negative zero": "/v1/events?follow=false&since=-0",
    "since a float": "/v1/events?follow=false&since=1.5",
    "since NaN": "/v1/events?follow=false&since=NaN",
    "since in Arabic-Indic digits": "/v1/events?follow=false&since=\u0661\u0662\u0663",
    "since superscript": "/v1/events?follow=false&since=\u00b2",
    "since empty": "/v1/events?follow=false&since=",
    "follow not a bool": "/v1/events?follow=" + "x" * 5000,
    "an unknown format": "/v1/events?follow=false&format=" + "x" * 5000,
    "a label without =": "/v1/vgpus?label=" + "k" * 5000,
}


@pytest.mark.parametrize("path", QUERIES.values(), ids=QUERIES.keys())
async def test_a_malformed_query_is_a_422(api: Api, path: str) -> None:
    assert await refused(api, "GET", path, 422) == "invalid"


async def test_force_must_be_a_bool_on_delete(api: Api) -> None:
    vg = await a_vgpu(api)
    await refused(api, "DELETE", f"/v1/vgpus/{vg['id']}?force=" + "9" * 5000, 422)
    assert await vgpu_count(api) == 1


async def test_a_huge_id_is_a_404(api: Api) -> None:
    for method in ("GET", "PATCH", "DELETE"):
        await refused(api, method, "/v1/vgpus/" + "x" * 4000, 404, json={"share": 5})


async def test_the_api_answers_normally_after_every_attack(api: Api) -> None:
    for raw in RAW_BODIES.values():
        await api.client.post("/v1/vgpus", data=raw, headers={"Content-Type": "application/json"})
    for path in QUERIES.values():
        await api.client.get(path)
    r = await api.client.get("/v1/health")
    assert r.status == 200 and (await r.json())["status"] == "ok"
    assert (await a_vgpu(api))["memory"] == 1 << 30
