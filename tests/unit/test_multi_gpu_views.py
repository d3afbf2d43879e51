"""A vGPU over two GPUs is reported GPU by GPU: the API's `gpus` entries,
`vgpuctl show` and /metrics each give every GPU its own memory, counters and
processes, never the vGPU's total or another GPU's figure. Its recipe keeps
NCCL off NVLink multicast, which the hook refuses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.apiclient import Api, running_api, validate
from tests.unit.fakes import GIB
from vgpud.ctl.table import show
from vgpud.observe.tracker import GpuUse, TrackSnapshot, VgpuUse
from vgpud.surface.metrics import Metrics

VG = "/v1/vgpus/{id}"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path, ngpus=2) as a:
        yield a


async def two_gpu_vgpu(api: Api) -> dict[str, Any]:
    """A vGPU on both GPUs; GPU0 holds 1 GiB and refused once, GPU1 holds
    3 GiB; the last scan saw one of its processes on GPU0, two on GPU1."""
    r = await api.client.post("/v1/vgpus", json={"gpus": [0, 1], "memory": "4g", "share": 50})
    vg: dict[str, Any] = await r.json()
    assert r.status == 201, vg
    usage = api.service.registry.get(vg["id"]).usage
    usage._c.devices[0].used = GIB
    usage._c.devices[0].oom_count = 1
    usage._c.devices[1].used = 3 * GIB
    usage._c.devices[1].peak = 3 * GIB
    uuids = [g.uuid for g in api.inventory.devices()]
    gpus = {
        uuid: GpuUse(uuid, 4 * GIB, used, used, None, procs)
        for uuid, used, procs in ((uuids[0], GIB, 1), (uuids[1], 3 * GIB, 2))
    }
    api.service.track = TrackSnapshot(
        0.0, {}, {vg["id"]: VgpuUse(vg["id"], False, gpus, (11, 12), 2)}, (), {}, (), (), True
    )
    return vg


async def test_the_api_gives_each_gpu_its_own_figures(api: Api) -> None:
    vg = await two_gpu_vgpu(api)
    body = await (await api.client.get(f"/v1/vgpus/{vg['id']}")).json()
    validate(body, VG, "get", 200)
    got = [(g["index"], g["memory_used"], g["oom_count"], g["processes"]) for g in body["gpus"]]
    assert got == [(0, GIB, 1, 1), (1, 3 * GIB, 0, 2)]


async def test_vgpuctl_show_has_a_row_per_gpu(api: Api) -> None:
    vg = await two_gpu_vgpu(api)
    text = show(await (await api.client.get(f"/v1/vgpus/{vg['id']}")).json(), [])
    for g, used, peak, ooms, procs in (
        (api.inventory.devices()[0], "1.0GiB", "0B", "1", "1"),
        (api.inventory.devices()[1], "3.0GiB", "3.0GiB", "0", "2"),
    ):
        row = next(line for line in text.splitlines() if g.uuid in line).split()
        assert row[:5] == [str(g.index), g.uuid, used, peak, ooms], text
        assert row[-1] == procs, text


def series(metrics: Metrics, name: str) -> dict[str, float]:
    """One metric's values by GPU uuid."""
    return {
        s.labels["uuid"]: s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == name
    }


async def test_metrics_carry_each_gpu_separately(api: Api) -> None:
    await two_gpu_vgpu(api)
    metrics = Metrics(api.service)
    uuid0, uuid1 = (g.uuid for g in api.inventory.devices())
    assert series(metrics, "vgpud_vgpu_memory_used_bytes") == {uuid0: GIB, uuid1: 3 * GIB}
    assert series(metrics, "vgpud_vgpu_memory_limit_bytes") == {uuid0: 4 * GIB, uuid1: 4 * GIB}
    assert series(metrics, "vgpud_vgpu_oom_total") == {uuid0: 1, uuid1: 0}
    assert series(metrics, "vgpud_vgpu_gpu_processes") == {uuid0: 1, uuid1: 2}


async def test_the_recipe_keeps_nccl_off_nvlink_multicast(api: Api) -> None:
    """The hook refuses cuMulticastCreate in a vGPU: NCCL is told not to
    plan on NVLS, in the container's recipe and a plain process's env."""
    vg = await two_gpu_vgpu(api)
    assert vg["recipe"]["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert vg["host_env"]["NCCL_NVLS_ENABLE"] == "0"
