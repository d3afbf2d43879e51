"""Metrics follow the vGPUs that exist; the control tick writes quotas and
heartbeats into the control blocks (a live share change within one tick)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.apiclient import running_api
from vgpud.loops.control import Steering
from vgpud.surface.metrics import Metrics
from vgpud.units import PPM_FULL
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.model import UpdateRequest


def samples(metrics: Metrics) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append(s.labels)
    return out


async def test_vgpu_label_sets_go_with_the_vgpu(tmp_path: Path) -> None:
    async with running_api(tmp_path) as api:
        metrics = Metrics(api.service)
        a = (await (await api.client.post("/v1/vgpus", json={"memory": "1g", "share": 20})).json())[
            "id"
        ]
        b = (await (await api.client.post("/v1/vgpus", json={"memory": "1g"})).json())["id"]
        limit = samples(metrics)["vgpud_vgpu_memory_limit_bytes"]
        assert {s["vgpu"] for s in limit} == {a, b}
        assert len(samples(metrics)["vgpud_gpu_memory_total_bytes"]) == 2
        await api.client.delete(f"/v1/vgpus/{a}")
        after = samples(metrics)
        for name in (
            "vgpud_vgpu_memory_limit_bytes",
            "vgpud_vgpu_quota_ratio",
            "vgpud_vgpu_oom_total",
        ):
            assert {s["vgpu"] for s in after[name]} == {b}, name


async def test_loop_and_request_histograms_are_exported(tmp_path: Path) -> None:
    async with running_api(tmp_path) as api:
        metrics = Metrics(api.service)
        metrics.loop_seconds.labels("scan").observe(0.01)
        metrics.request_seconds.labels("GET", "/v1/health", "200").observe(0.001)
        names = samples(metrics)
        assert "vgpud_loop_duration_seconds_count" in names
        assert "vgpud_api_request_duration_seconds_bucket" in names


async def test_the_histograms_read_as_prometheus_client_writes_them(tmp_path: Path) -> None:
    async with running_api(tmp_path) as api:
        metrics = Metrics(api.service)
        metrics.loop_seconds.labels("scan").observe(0.01)
        metrics.loop_seconds.labels("control").observe(2.0)  # above every bucket
        # A method and route as a client may send them: quoted, escaped, odd.
        metrics.request_seconds.labels('GE"T', "/v1/a\\b\nc", "404").observe(0.003)
        metrics.request_seconds.labels("GET", "/v1/health", "200").observe(0.0001)

        def families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
            return {
                f.name: [(s.name, s.labels, s.value) for s in f.samples]
                for f in text_string_to_metric_families(text)
            }

        ours = families(metrics.render().decode())
        reference = families(generate_latest(metrics.registry).decode())
        assert {name: ours[name] for name in reference} == reference
        assert any(
            s[1].get("method") == 'GE"T' for s in reference["vgpud_api_request_duration_seconds"]
        )


async def test_a_share_change_reaches_the_throttle_table_at_the_next_tick(tmp_path: Path) -> None:
    async with running_api(tmp_path) as api:
        answer = await (
            await api.client.post("/v1/vgpus", json={"memory": "1g", "share": 30})
        ).json()
        entry = api.service.registry.get(answer["id"])
        steering = Steering(Atomics.load())
        steering.tick([entry], {}, None, None, now_ns=1_000_000_000)
        assert entry.control.read_throttle(0).quota_ppm == 300_000
        assert entry.control.heartbeat_ns == 1_000_000_000
        await api.service.update(answer["id"], UpdateRequest(share=70))
        steering.tick([entry], {}, None, None, now_ns=1_100_000_000)
        assert entry.control.read_throttle(0).quota_ppm == 700_000
        await api.service.update(answer["id"], UpdateRequest(share=100))
        steering.tick([entry], {}, None, None, now_ns=1_200_000_000)
        assert entry.control.read_throttle(0).quota_ppm == PPM_FULL
        assert entry.control.heartbeat_ns == 1_200_000_000
