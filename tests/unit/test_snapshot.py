"""The node's snapshot: folded once per change of a source, never per
request, immutable, and the one place a figure that both the API and
/metrics show is worked out."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import vgpud.surface.service as service_module
from tests.unit.apiclient import Api, get_ok, running_api
from tests.unit.fakes import GIB
from tests.unit.test_api_standalone import counters
from vgpud.observe.cgroups import ContainerRef, Runtime
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.tracker import GpuUse, ProcessKind, TrackedProcess, TrackSnapshot, VgpuUse
from vgpud.surface.metrics import Metrics

SA = "sa-803-4242"


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(tmp_path) as a:
        yield a


async def create(api: Api, body: dict[str, Any]) -> str:
    r = await api.client.post("/v1/vgpus", json=body)
    assert r.status == 201, await r.text()
    return str((await r.json())["id"])


async def test_a_snapshot_cannot_be_changed(api: Api) -> None:
    vg = await create(api, {"name": "a", "memory": "1g"})
    snap = api.service.snapshot
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.version = 99  # type: ignore[misc]
    with pytest.raises(TypeError):
        snap.vgpus["vg-forged"] = snap.vgpus[vg]  # type: ignore[index]
    with pytest.raises(TypeError):
        snap.names["b"] = vg  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.vgpus[vg].figures = snap.vgpus[vg].figures  # type: ignore[misc]
    with pytest.raises(AttributeError):
        snap.vgpus[vg].figures.gpus[0].memory_used = GIB  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.gpus[0].healthy = False  # type: ignore[misc]
    assert isinstance(snap.gpus, tuple) and isinstance(snap.vgpus[vg].figures.gpus, tuple)


async def test_reads_never_fold_and_each_route_is_rendered_once_per_snapshot(api: Api) -> None:
    vg = await create(api, {"memory": "1g"})
    snap = api.service.snapshot
    routes = ["/v1/vgpus", f"/v1/vgpus/{vg}", "/v1/devices", "/v1/health", "/v1/processes"]
    first = [await (await api.client.get(path)).read() for path in routes * 2]
    metrics = Metrics(api.service)
    scrape = metrics.render()
    assert api.service.snapshot is snap  # no request folded a new one
    assert metrics.render() is scrape  # the same bytes, not rendered again
    assert first[: len(routes)] == first[len(routes) :]


async def test_a_change_through_the_api_is_in_the_very_next_answer(api: Api) -> None:
    metrics = Metrics(api.service)
    a = await create(api, {"name": "a", "memory": "1g"})
    listed = await get_ok(api, "/v1/vgpus")  # rendered: kept for its snapshot
    assert [v["id"] for v in listed] == [a]
    metrics.render()
    b = await create(api, {"name": "b", "memory": "2g"})
    assert [v["id"] for v in await get_ok(api, "/v1/vgpus")] == [a, b]
    assert (await get_ok(api, "/v1/vgpus/b"))["gpus"][0]["memory_limit"] == 2 * GIB
    assert set(series(metrics, "vgpud_vgpu_memory_limit_bytes")) == {a, b}
    assert (await api.client.patch("/v1/vgpus/b", json={"memory": "3g"})).status == 200
    assert [v["gpus"][0]["memory_limit"] for v in await get_ok(api, "/v1/vgpus")] == [GIB, 3 * GIB]
    assert series(metrics, "vgpud_vgpu_memory_limit_bytes")[b] == 3 * GIB
    assert (await api.client.delete(f"/v1/vgpus/{a}")).status == 200
    assert [v["id"] for v in await get_ok(api, "/v1/vgpus")] == [b]
    assert (await api.client.get("/v1/vgpus/a")).status == 404
    assert set(series(metrics, "vgpud_vgpu_memory_limit_bytes")) == {b}


async def test_the_quotas_a_tick_gave_are_shown_without_reading_them_back(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    vg = await create(api, {"memory": "1g", "share": 20})
    uuid = api.inventory.devices()[0].uuid
    monkeypatch.setattr(service_module, "RENDER_MAX_AGE", 0.0)
    await get_ok(api, "/v1/vgpus")  # read: the ticks keep it fresh
    api.service.ticked({(vg, uuid): 345_000})
    assert (await get_ok(api, f"/v1/vgpus/{vg}"))["gpus"][0]["quota_ppm"] == 345_000
    assert series(Metrics(api.service), "vgpud_vgpu_quota_ratio")[vg] == 0.345


async def test_metrics_and_the_api_show_the_same_figures(api: Api) -> None:
    """Every figure a vGPU's answer and its metric lines both show, per GPU,
    daemon-owned and standalone alike, from one snapshot."""
    uuids = [g.uuid for g in api.inventory.devices()]
    vg = await create(api, {"gpus": [0, 1], "memory": "4g", "share": 40})
    usage = api.service.registry.get(vg).usage
    for i, (used, oom, throttled) in enumerate(((GIB, 2, 3 * 10**9), (2 * GIB, 0, 0))):
        usage._c.devices[i].used = used
        usage._c.devices[i].oom_count = oom
        usage._c.devices[i].throttled_ns = throttled
    gpus = {
        uuid: GpuUse(uuid, 4 * GIB, GIB, GIB, None, n)
        for uuid, n in zip(uuids, (1, 2), strict=True)
    }
    standalone = GpuUse(
        uuids[1],
        8 * GIB,
        5 * GIB,
        5 * GIB,
        None,
        1,
        counters(used=5 * GIB, oom_count=4, share_ppm=300_000),
        500_000,
    )
    api.service.sample = NvmlSample(
        1.0,
        {
            uuids[0]: GpuSample(uuids[0], 0, 70, 30 * GIB, 80 * GIB, {}, {11: 25.0, 12: 30.0}),
            uuids[1]: GpuSample(uuids[1], 1, 10, 9 * GIB, 80 * GIB, {}, {12: 5.0, 21: 7.5}),
        },
    )
    api.service.track = TrackSnapshot(
        1.0,
        {},
        {
            vg: VgpuUse(vg, False, gpus, (11, 12), 2),
            SA: VgpuUse(SA, True, {uuids[1]: standalone}, (21,), 1),
        },
        (),
        {},
        (),
        (),
        True,
    )
    listed = {v["id"]: v for v in await get_ok(api, "/v1/vgpus")}
    assert set(listed) == {vg, SA}
    metrics = Metrics(api.service)
    shown = 0
    for vgpu_id, answer in listed.items():
        for g in answer["gpus"]:
            key = (vgpu_id, g["uuid"])
            pairs = (
                ("vgpud_vgpu_memory_used_bytes", g["memory_used"]),
                ("vgpud_vgpu_memory_limit_bytes", g["memory_limit"]),
                ("vgpud_vgpu_utilization_percent", g["utilization"]),
                ("vgpud_vgpu_quota_ratio", g["quota_ppm"] / 1e6),
                ("vgpud_vgpu_throttled_seconds_total", g["throttled_ns"] / 1e9),
                ("vgpud_vgpu_oom_total", g["oom_count"]),
                ("vgpud_vgpu_processes", answer["processes"]),
                ("vgpud_vgpu_gpu_processes", g["processes"]),
            )
            for name, value in pairs:
                assert by_vgpu_gpu(metrics, name)[key] == value, (name, key)
                shown += 1
            share = g.get("share", answer["share"])  # a standalone vGPU's is per GPU
            assert by_vgpu_gpu(metrics, "vgpud_vgpu_share_ratio")[key] == share / 100
    assert shown == 3 * 8
    # The figures are the sources', not merely equal to each other.
    assert [g["utilization"] for g in listed[vg]["gpus"]] == [55.0, 5.0]
    assert [g["processes"] for g in listed[vg]["gpus"]] == [1, 2]
    assert listed[SA]["gpus"][0]["utilization"] == 7.5
    assert listed[vg]["gpus"][0]["oom_count"] == 2
    for d in await get_ok(api, "/v1/devices"):
        gpu = {"uuid": d["uuid"], "gpu": str(d["index"])}
        for name, value in (
            ("vgpud_gpu_memory_used_bytes", d["memory_used"]),
            ("vgpud_gpu_utilization_percent", d["utilization"]),
            ("vgpud_gpu_vgpus", len(d["vgpus"])),
        ):
            assert value is not None and labelled(metrics, name, gpu) == value, name


def on_gpus(pid: int, kind: ProcessKind, *uuids: str) -> TrackedProcess:
    """A process the scan found holding memory on ``uuids``."""
    return TrackedProcess(
        pid=pid,
        ns_pid=pid,
        pidns=4026531836,
        start_time=100,
        comm="p",
        uid=1000,
        container=ContainerRef(Runtime.DOCKER, "/docker/abc", container_id="abc"),
        kind=kind,
        vgpu_id=None,
        slot=None,
        memory=dict.fromkeys(uuids, GIB),
    )


async def test_processes_outside_vgpus_are_shown_per_gpu(api: Api) -> None:
    """Processes on a GPU in no daemon-owned vGPU take no turns with the
    vGPUs there, whose compute shares may then not hold: each GPU shows how
    many the last scan found (standalone, hooked, unmanaged; not the
    vGPUs' own, nor exited ones whose memory NVML still lists), in
    /v1/devices and /metrics alike."""
    uuids = [g.uuid for g in api.inventory.devices()]

    async def shown() -> list[tuple[int, float]]:
        metrics = Metrics(api.service)
        return [
            (
                d["processes_outside_vgpus"],
                labelled(
                    metrics,
                    "vgpud_gpu_processes_outside_vgpus",
                    {"uuid": d["uuid"], "gpu": str(d["index"])},
                ),
            )
            for d in await get_ok(api, "/v1/devices")
        ]

    assert await shown() == [(0, 0.0), (0, 0.0)]  # no scan yet
    found = [
        on_gpus(11, ProcessKind.VGPU, uuids[0]),
        on_gpus(31, ProcessKind.UNMANAGED, uuids[0], uuids[1]),
        on_gpus(32, ProcessKind.HOOKED, uuids[0]),
        on_gpus(33, ProcessKind.STANDALONE, uuids[1]),
        on_gpus(34, ProcessKind.EXITED, uuids[0]),
    ]
    api.service.track = TrackSnapshot(1.0, {p.pid: p for p in found}, {}, (), {}, (), (), True)
    assert await shown() == [(2, 2.0), (2, 2.0)]
    api.service.track = TrackSnapshot(2.0, {11: found[0]}, {}, (), {}, (), (), True)
    assert await shown() == [(0, 0.0), (0, 0.0)]


def samples(metrics: Metrics) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    ]


def series(metrics: Metrics, name: str) -> dict[str, float]:
    """One metric's values by vGPU (one GPU each)."""
    return {labels["vgpu"]: value for n, labels, value in samples(metrics) if n == name}


def by_vgpu_gpu(metrics: Metrics, name: str) -> dict[tuple[str, str], float]:
    return {
        (labels["vgpu"], labels["uuid"]): value
        for n, labels, value in samples(metrics)
        if n == name
    }


def labelled(metrics: Metrics, name: str, labels: dict[str, str]) -> float:
    (value,) = [v for n, got, v in samples(metrics) if n == name and got == labels]
    return value


async def test_a_sample_that_came_between_two_folds_is_shown_by_the_next_tick(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fold for a change through the API keeps the other vGPUs' figures;
    a sample that came meanwhile is not lost to them."""
    uuid = api.inventory.devices()[0].uuid
    vg = await create(api, {"gpus": [0], "memory": "1g"})
    use = GpuUse(uuid, GIB, 0, 0, None, 1)
    api.service.track = TrackSnapshot(
        1.0, {}, {vg: VgpuUse(vg, False, {uuid: use}, (11,), 1)}, (), {}, (), (), True
    )

    def sample(util: float) -> NvmlSample:
        return NvmlSample(1.0, {uuid: GpuSample(uuid, 0, 50, GIB, 80 * GIB, {}, {11: util})})

    async def utilization() -> float | None:
        answer: float | None = (await get_ok(api, f"/v1/vgpus/{vg}"))["gpus"][0]["utilization"]
        return answer

    monkeypatch.setattr(service_module, "RENDER_MAX_AGE", 0.0)
    assert await utilization() is None  # no sample yet; and read: the ticks keep it fresh
    api.service.sample = sample(10.0)
    assert await utilization() == 10.0
    monkeypatch.setattr(service_module, "RENDER_MAX_AGE", 3600.0)
    api.service.sample = sample(40.0)  # not folded yet: the snapshot is young
    await create(api, {"gpus": [0], "memory": "1g"})  # folded: only the new vGPU read
    monkeypatch.setattr(service_module, "RENDER_MAX_AGE", 0.0)
    api.service.ticked()
    assert await utilization() == 40.0
    assert series(Metrics(api.service), "vgpud_vgpu_utilization_percent")[vg] == 40.0


async def test_the_ticks_keep_it_fresh_while_it_is_read_and_leave_it_to_the_scans_else(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    vg = await create(api, {"memory": "1g"})
    monkeypatch.setattr(service_module, "RENDER_MAX_AGE", 0.0)
    monkeypatch.setattr(service_module, "WATCHED_FOR", 3600.0)
    await get_ok(api, "/v1/vgpus")
    before = api.service.snapshot
    api.service.ticked()
    assert api.service.snapshot is not before  # read lately: a tick folds
    monkeypatch.setattr(service_module, "WATCHED_FOR", 0.0)
    before = api.service.snapshot
    api.service.registry.get(vg).usage._c.devices[0].used = GIB
    api.service.ticked()
    api.service.sample = NvmlSample(2.0, {})
    assert api.service.snapshot is before  # nobody reads: no fold
    api.service.track = None  # a scan folds, read or not
    assert (await get_ok(api, f"/v1/vgpus/{vg}"))["gpus"][0]["memory_used"] == GIB
    assert [v["gpus"][0]["memory_used"] for v in await get_ok(api, "/v1/vgpus")] == [GIB]
