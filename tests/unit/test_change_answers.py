"""A change through the API is answered before the node's snapshot is
folded again (Service.changed): its answer must still be what the next
reads show, and a read that comes before that fold must still see it."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.apiclient import Api, get_ok, running_api
from vgpud.surface import snapshot
from vgpud.surface.api import schemas
from vgpud.surface.metrics import Metrics
from vgpud.vgpus.model import Credentials
from vgpud.vgpus.registry import Entry


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path) as a:
        yield a


async def test_the_answer_to_a_change_is_what_the_next_reads_show(api: Api) -> None:
    await api.client.post("/v1/vgpus", json={"name": "older", "memory": "1g"})
    r = await api.client.post("/v1/vgpus", json={"name": "new", "memory": "2g", "share": 30})
    assert r.status == 201
    created = await r.json()
    assert await get_ok(api, f"/v1/vgpus/{created['id']}") == created
    assert [v for v in await get_ok(api, "/v1/vgpus") if v["id"] == created["id"]] == [created]

    r = await api.client.patch("/v1/vgpus/new", json={"memory": "3g", "weight": 7})
    assert r.status == 200
    updated = await r.json()
    assert updated.pop("warnings") == []
    assert updated["gpus"][0]["memory_limit"] == 3 << 30 and updated["weight"] == 7
    assert await get_ok(api, "/v1/vgpus/new") == updated


async def test_a_read_in_the_same_loop_round_as_a_change_sees_it(api: Api) -> None:
    """No await between the change and the reads: the snapshot's fold of
    the change has not run yet, and every read must fold it first."""
    service, metrics = api.service, Metrics(api.service)
    me = Credentials(os.geteuid(), os.getegid())
    kept = await service.create(schemas.parse_create({"memory": "1g"}), me)
    metrics.render()  # the node with ``kept`` alone, rendered

    made = await service.create(schemas.parse_create({"memory": "2g"}), me)
    new = made.vgpu.id
    listed: list[dict[str, Any]] = json.loads(service.list_body(None, None, None))
    assert [v["id"] for v in listed] == [kept.vgpu.id, new]
    assert json.loads(service.find_body(new)) == json.loads(service.vgpu_body(made))
    assert f'vgpu="{new}"' in metrics.render().decode()
    assert service.health_json()["vgpus"] == 2

    await service.delete(new, force=False)
    assert [v["id"] for v in json.loads(service.list_body(None, None, None))] == [kept.vgpu.id]
    assert f'vgpu="{new}"' not in metrics.render().decode()


async def test_the_fold_after_a_change_takes_its_answers_definition(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer's definition is made once: the fold that takes the change
    in reuses it, for a create and for an update."""
    made: list[str] = []
    of = snapshot.Definition.of.__func__  # type: ignore[attr-defined]

    def counted(cls: type[snapshot.Definition], entry: Entry, env: Any) -> snapshot.Definition:
        made.append(entry.vgpu.id)
        return of(cls, entry, env)  # type: ignore[no-any-return]

    monkeypatch.setattr(snapshot.Definition, "of", classmethod(counted))
    r = await api.client.post("/v1/vgpus", json={"name": "once", "memory": "1g"})
    vid = (await r.json())["id"]
    assert (await get_ok(api, "/v1/vgpus/once"))["id"] == vid
    await api.client.patch("/v1/vgpus/once", json={"memory": "2g"})
    assert (await get_ok(api, "/v1/vgpus/once"))["gpus"][0]["memory_limit"] == 2 << 30
    assert made == [vid, vid]
