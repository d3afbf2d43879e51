"""Metrics follow the vGPUs that exist; the control tick writes quotas and
heartbeats into the control blocks (a live share change within one tick)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import Histogram as ClientHistogram
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.apiclient import running_api
from vgpud.loops.control import Steering
from vgpud.surface.metrics import Histogram, Metrics
from vgpud.units import PPM_FULL
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.model import UpdateRequest

if TYPE_CHECKING:
    from vgpud.surface.service import Service

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


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


async def test_each_save_of_the_state_file_is_timed(tmp_path: Path) -> None:
    """The disk's share of the writes' answers: one observation per save,
    whatever the change."""
    async with running_api(tmp_path) as api:
        metrics = Metrics(api.service)
        api.service.registry.on_saved = metrics.save_seconds.labels().observe  # as the daemon does
        made = await (await api.client.post("/v1/vgpus", json={"memory": "1g"})).json()
        await api.client.patch(f"/v1/vgpus/{made['id']}", json={"share": 30})
        await api.client.delete(f"/v1/vgpus/{made['id']}")
        family = histogram_families(metrics.render().decode())["vgpud_state_save_duration_seconds"]
        counts = [v for name, _, v in family if name.endswith("_count")]
        sums = [v for name, _, v in family if name.endswith("_sum")]
        assert counts == [3]
        assert sums[0] > 0


def histogram_families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """Each histogram family's samples (not the _created gauges: times)."""
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
        if f.type == "histogram"
    }


async def test_the_histograms_read_as_prometheus_client_writes_them(tmp_path: Path) -> None:
    async with running_api(tmp_path) as api:
        metrics = Metrics(api.service)
        reference = CollectorRegistry()
        label_sets: dict[Histogram, list[tuple[str, ...]]] = {
            metrics.loop_seconds: [("scan",), ("control",)],
            # A method and route as a client may send them: quoted, escaped, odd.
            metrics.request_seconds: [('GE"T', "/v1/a\\b\nc", "404"), ("GET", "/v1/health", "200")],
            metrics.save_seconds: [()],  # no labels
        }
        for ours, sets in label_sets.items():
            theirs = ClientHistogram(
                ours.name, ours.doc, ours.labelnames, buckets=ours.bounds, registry=reference
            )
            for values in sets:
                # Above every bucket, on a bound, inside one, below the first.
                for amount in (2.0, 0.005, 0.003, 0.0001):
                    ours.labels(*values).observe(amount)
                    (theirs.labels(*values) if values else theirs).observe(amount)
        mine = histogram_families(metrics.render().decode())
        assert mine == histogram_families(generate_latest(reference).decode())
        assert any(s[1].get("method") == 'GE"T' for s in mine["vgpud_api_request_duration_seconds"])
        created = samples(metrics)["vgpud_api_request_duration_seconds_created"]
        assert {s["status"] for s in created} == {"404", "200"}


async def test_a_series_observed_after_a_scrape_shows_at_the_next(tmp_path: Path) -> None:
    """A series' text is kept between scrapes: an observation must still show."""
    async with running_api(tmp_path) as api:
        metrics = Metrics(api.service)
        series = metrics.request_seconds.labels("GET", "/v1/health", "200")
        series.observe(0.001)

        def count() -> float:
            families = histogram_families(metrics.render().decode())
            (value,) = [
                v
                for name, labels, v in families["vgpud_api_request_duration_seconds"]
                if name.endswith("_count") and labels["route"] == "/v1/health"
            ]
            return value

        assert count() == 1
        series.observe(0.002)
        api.service.refresh()  # a new snapshot: the exposition is written again
        assert count() == 2


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


def test_the_histograms_text_is_byte_for_byte_what_it_was(monkeypatch: Any) -> None:
    """The same observations give the exposition that main at 1ada55a
    (prometheus_client's collect(), written by us) gave, byte for byte."""
    monkeypatch.setattr(time, "time", lambda: 1764031234.567891)  # the series' _created
    metrics = Metrics(cast("Service", None))  # the histograms need no service
    for method, route, status, amount in (
        ("GET", "/v1/vgpus", "200", 0.0004),
        ("GET", "/v1/vgpus", "200", 0.0031),
        ("POST", "/v1/vgpus", "201", 0.004),
        ('GE"T', "/v1/a\\b\nc", "404", 0.003),
        ("GET", "/v1/health", "200", 0.7),
        ("GET", "/v1/vgpus", "200", 0.001),
    ):
        metrics.request_seconds.labels(method, route, status).observe(amount)
    for loop, amount in (("scan", 0.01), ("control", 2.0), ("control", 0.0005)):
        metrics.loop_seconds.labels(loop).observe(amount)
    text = metrics.loop_seconds.text() + metrics.request_seconds.text()
    assert text == (FIXTURES / "histograms-1ada55a.prom").read_text()


async def test_methods_a_client_makes_up_share_one_series(tmp_path: Path) -> None:
    """HTTP allows any token as a method (aiohttp's pure-Python parser takes
    any; its C parser some thirty, WebDAV's among them): a series each
    would grow the daemon's memory and every scrape with what clients send."""
    async with running_api(tmp_path) as api:
        for method in ("PROPFIND", "MKCOL", "LOCK", "UNLOCK", "COPY", "MOVE", "SEARCH", "PURGE"):
            r = await api.client.request(method, "/v1/vgpus")
            assert r.status == 405, method
        r = await api.client.get("/metrics")
        families = histogram_families(await r.text())
        methods = {
            labels["method"]
            for name, labels, _ in families["vgpud_api_request_duration_seconds"]
            if name.endswith("_count")
        }
        assert methods == {"other"}
