"""Prometheus metrics, in a registry of our own (no globals).

GPU and vGPU figures are produced at scrape time from the service's current
state by a collector, so the label sets of a deleted vGPU or a vanished GPU
disappear with it; nothing has to be removed by hand. The daemon's own loop
timings and API request durations are histograms.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vgpud.blocks import SLOT_ACTIVE
from vgpud.units import ppm_to_fraction

if TYPE_CHECKING:
    from vgpud.service import Service

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
GPU_LABELS = ["gpu", "uuid"]
VGPU_LABELS = ["vgpu", "name", "gpu", "uuid"]


class Metrics:
    def __init__(self, service: Service) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.loop_seconds = Histogram(
            "vgpud_loop_duration_seconds",
            "Time one iteration of a daemon loop took.",
            ["loop"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "vgpud_api_request_duration_seconds",
            "Time the API took to answer, by route and status.",
            ["method", "route", "status"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=self.registry,
        )
        self.registry.register(_StateCollector(service))
        self._service = service

    def render(self) -> bytes:
        """The exposition, generated once per state of the daemon (a scrape
        of 100 vGPUs costs milliseconds; many scrapers need not multiply it)."""
        return self._service.rendered("metrics", lambda: generate_latest(self.registry))


class _StateCollector(Collector):
    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        yield from self._gpus()
        yield from self._vgpus()
        yield from self._drift()

    def _drift(self) -> Iterator[Metric]:
        repairs = CounterMetricFamily(
            "vgpud_usage_drift_repairs",
            "vGPU budgets found apart from their live slots' sum and set back to it "
            "(a process killed inside the hook's reservation window).",
        )
        repairs.add_metric([], self.service.drift_repairs)
        moved = CounterMetricFamily(
            "vgpud_usage_drift_bytes", "Bytes those repairs moved (either way)."
        )
        moved.add_metric([], self.service.drift_bytes)
        yield from (repairs, moved)

    def _gpus(self) -> Iterator[Metric]:
        used = GaugeMetricFamily(
            "vgpud_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=GPU_LABELS
        )
        total = GaugeMetricFamily("vgpud_gpu_memory_total_bytes", "GPU memory.", labels=GPU_LABELS)
        util = GaugeMetricFamily(
            "vgpud_gpu_utilization_percent", "GPU utilization (NVML).", labels=GPU_LABELS
        )
        healthy = GaugeMetricFamily(
            "vgpud_gpu_healthy", "1 when the GPU is healthy.", labels=GPU_LABELS
        )
        count = GaugeMetricFamily("vgpud_gpu_vgpus", "vGPUs placed on the GPU.", labels=GPU_LABELS)
        for d in self.service.devices_json():
            labels = [str(d["index"]), d["uuid"]]
            total.add_metric(labels, d["memory_total"])
            healthy.add_metric(labels, 1.0 if d["healthy"] else 0.0)
            count.add_metric(labels, len(d["vgpus"]))
            if d["memory_used"] is not None:
                used.add_metric(labels, d["memory_used"])
            if d["utilization"] is not None:
                util.add_metric(labels, d["utilization"])
        yield from (used, total, util, healthy, count)

    def _vgpus(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=VGPU_LABELS)

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=VGPU_LABELS)

        used = gauge("vgpud_vgpu_memory_used_bytes", "Memory the vGPU holds (hook-tracked).")
        limit = gauge("vgpud_vgpu_memory_limit_bytes", "The vGPU's memory limit.")
        util = gauge("vgpud_vgpu_utilization_percent", "GPU time the vGPU's processes use (NVML).")
        quota = gauge("vgpud_vgpu_quota_ratio", "Compute quota the controller gives now (0-1).")
        share = gauge("vgpud_vgpu_share_ratio", "Configured compute share (0-1).")
        throttled = counter("vgpud_vgpu_throttled_seconds", "Time launches waited in the pacer.")
        ooms = counter("vgpud_vgpu_oom", "Allocations refused for the limit.")
        procs = gauge("vgpud_vgpu_processes", "Processes using the vGPU.")
        gpu_procs = gauge(
            "vgpud_vgpu_gpu_processes", "The vGPU's processes NVML lists on this GPU."
        )
        for entry in self.service.registry.all():
            v = entry.vgpu
            nprocs = sum(1 for s in entry.usage.slots() if s.state == SLOT_ACTIVE)
            for s, u, c in zip(
                v.slices, entry.usage.devices(), entry.control.devices(), strict=True
            ):
                labels = [v.id, v.name or "", str(s.gpu_index), s.gpu_uuid]
                used.add_metric(labels, u.used)
                limit.add_metric(labels, s.memory)
                quota.add_metric(labels, ppm_to_fraction(c.throttle.quota_ppm))
                share.add_metric(labels, ppm_to_fraction(c.share_ppm))
                throttled.add_metric(labels, u.throttled_ns / 1e9)
                ooms.add_metric(labels, u.oom_count)
                procs.add_metric(labels, nprocs)
                gpu_procs.add_metric(labels, self.service.vgpu_gpu_processes(v.id, s.gpu_uuid))
                figure = self.service.vgpu_utilization(v.id, s.gpu_uuid)
                if figure is not None:
                    util.add_metric(labels, figure)
        # Adopted standalone vGPUs (env-limited containers): their limits
        # are the environment's, their quota the steer area's.
        track = self.service.track
        index = {g.uuid: str(g.index) for g in self.service.devices()}
        # The tracker may unmap an adopted block while its scan thread runs:
        # those figures wait for the next scrape then.
        busy = self.service.blocks_lock.locked()
        standalone = track.standalone if track is not None and not busy else {}
        for vgpu_id, blocks in standalone.items():
            own = blocks.usage.standalone_limits()
            use = track.vgpus.get(vgpu_id) if track is not None else None
            for i, (uuid, u) in enumerate(zip(own.uuids, blocks.usage.devices(), strict=False)):
                labels = [vgpu_id, "", index.get(uuid, ""), uuid]
                used.add_metric(labels, u.used)
                if own.mem_limit[i]:  # 0: the environment set no limit here
                    limit.add_metric(labels, own.mem_limit[i])
                if own.share_ppm[i]:
                    share.add_metric(labels, ppm_to_fraction(own.share_ppm[i]))
                steered = blocks.usage.read_steer(i).quota_ppm  # 0: never steered
                if steered:
                    quota.add_metric(labels, ppm_to_fraction(steered))
                throttled.add_metric(labels, u.throttled_ns / 1e9)
                ooms.add_metric(labels, u.oom_count)
                procs.add_metric(labels, use.live_slots if use is not None else 0)
                gpu_procs.add_metric(labels, self.service.vgpu_gpu_processes(vgpu_id, uuid))
                figure = self.service.vgpu_utilization(vgpu_id, uuid)
                if figure is not None:
                    util.add_metric(labels, figure)
        yield from (used, limit, util, quota, share, throttled, ooms, procs, gpu_procs)
