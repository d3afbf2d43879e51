"""Prometheus metrics, in a registry of our own (no globals).

The daemon's own loop timings and API request durations are histograms of
our own (Histogram below), written as prometheus_client writes its own.
GPU and vGPU figures are written from the
service's snapshot (snapshot.py: the figures the API answers from, worked
out once there), so the label sets of a deleted vGPU or a vanished GPU
disappear with it; nothing has to be removed by hand.

The exposition (text format 0.0.4, what prometheus_client's
generate_latest writes) is written here, once per snapshot: a vGPU's lines
once per change of its figures (the snapshot hands back the same object
while they are the same), a label set's text once, not once per sample and
scrape (prometheus_client validates and escapes every label of every
sample: about 6 microseconds a sample, and 100 vGPUs are 800 samples). A
histogram's series are written again only after they observed something:
at one scrape a snapshot, prometheus_client's collect() of every series
was most of the cost of a scrape's histograms.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.utils import floatToGoString

from vgpud.surface.snapshot import NodeSnapshot, VgpuFigures
from vgpud.units import ppm_to_fraction

if TYPE_CHECKING:
    from vgpud.surface.service import Service

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True, eq=False)  # one object per family: hashed by identity, fast
class Family:
    name: str  # as exposed (a counter's with its _total)
    kind: str  # gauge | counter
    doc: str

    def header(self) -> str:
        return f"# HELP {self.name} {_escape_doc(self.doc)}\n# TYPE {self.name} {self.kind}\n"


def _gauge(name: str, doc: str) -> Family:
    return Family(name, "gauge", doc)


def _counter(name: str, doc: str) -> Family:
    return Family(name + "_total", "counter", doc)


GPU_MEMORY_USED = _gauge("vgpud_gpu_memory_used_bytes", "GPU memory in use (NVML).")
GPU_MEMORY_TOTAL = _gauge("vgpud_gpu_memory_total_bytes", "GPU memory.")
GPU_UTILIZATION = _gauge("vgpud_gpu_utilization_percent", "GPU utilization (NVML).")
GPU_HEALTHY = _gauge("vgpud_gpu_healthy", "1 when the GPU is healthy.")
GPU_VGPUS = _gauge("vgpud_gpu_vgpus", "vGPUs placed on the GPU.")
GPU_OUTSIDE_VGPUS = _gauge(
    "vgpud_gpu_processes_outside_vgpus",
    "Processes on the GPU in no daemon-owned vGPU: they take no turns with the vGPUs, "
    "whose compute shares may then not hold.",
)
GPU_FAMILIES = (
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_UTILIZATION,
    GPU_HEALTHY,
    GPU_VGPUS,
    GPU_OUTSIDE_VGPUS,
)

VGPU_MEMORY_USED = _gauge("vgpud_vgpu_memory_used_bytes", "Memory the vGPU holds (hook-tracked).")
VGPU_MEMORY_LIMIT = _gauge("vgpud_vgpu_memory_limit_bytes", "The vGPU's memory limit.")
VGPU_UTILIZATION = _gauge(
    "vgpud_vgpu_utilization_percent", "GPU time the vGPU's processes use (NVML)."
)
VGPU_QUOTA = _gauge("vgpud_vgpu_quota_ratio", "Compute quota the controller gives now (0-1).")
VGPU_SHARE = _gauge("vgpud_vgpu_share_ratio", "Configured compute share (0-1).")
VGPU_THROTTLED = _counter("vgpud_vgpu_throttled_seconds", "Time launches waited in the pacer.")
VGPU_OOM = _counter("vgpud_vgpu_oom", "Allocations refused for the limit.")
VGPU_PROCESSES = _gauge("vgpud_vgpu_processes", "Processes using the vGPU.")
VGPU_GPU_PROCESSES = _gauge(
    "vgpud_vgpu_gpu_processes", "The vGPU's processes NVML lists on this GPU."
)
VGPU_FAMILIES = (
    VGPU_MEMORY_USED,
    VGPU_MEMORY_LIMIT,
    VGPU_UTILIZATION,
    VGPU_QUOTA,
    VGPU_SHARE,
    VGPU_THROTTLED,
    VGPU_OOM,
    VGPU_PROCESSES,
    VGPU_GPU_PROCESSES,
)

DRIFT_REPAIRS = _counter(
    "vgpud_usage_drift_repairs",
    "vGPU budgets found apart from their live slots' sum and set back to it "
    "(a process killed inside the hook's reservation window).",
)
DRIFT_BYTES = _counter("vgpud_usage_drift_bytes", "Bytes those repairs moved (either way).")

# A vGPU's samples, by family (a family may have none of it: no figure).
Samples = dict[Family, list[str]]


class Histogram:
    """Observations by label values in cumulative buckets, exposed as
    prometheus_client's generate_latest writes a histogram: its series'
    buckets, counts and sums, then their _created gauges. Observed on the
    event loop only (no lock)."""

    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self.bounds = (*buckets, math.inf)
        self._series: dict[tuple[str, ...], HistogramSeries] = {}

    def labels(self, *values: str) -> HistogramSeries:
        series = self._series.get(values)
        if series is None:
            labels = dict(zip(self.labelnames, values, strict=True))
            series = self._series[values] = HistogramSeries(self, labels)
        return series

    def text(self) -> str:
        head = Family(self.name, "histogram", self.doc).header()
        if not self._series:
            return head
        series = self._series.values()
        created = Family(self.name + "_created", "gauge", self.doc).header()
        lines = (*(s.text() for s in series), created, *(s.created_line for s in series))
        return head + "".join(lines)


class HistogramSeries:
    """One label set's counts; its text is kept until it observes again."""

    __slots__ = ("_bounds", "_labels", "_name", "_text", "counts", "created_line", "sum")

    def __init__(self, histogram: Histogram, labels: dict[str, str]) -> None:
        self._name, self._bounds = histogram.name, histogram.bounds
        self._labels = labels
        self.counts = [0] * len(self._bounds)  # by bucket, not cumulative
        self.sum = 0.0
        self.created_line = _line(self._name + "_created", _labels(**labels), time.time())
        self._text: str | None = None

    def observe(self, amount: float) -> None:
        """Counts ``amount`` in the first bucket whose bound is >= it."""
        self.sum += amount
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1
        self._text = None

    def text(self) -> str:
        if self._text is None:
            lines, total = [], 0
            for bound, count in zip(self._bounds, self.counts, strict=True):
                total += count
                le = _labels(**self._labels, le=floatToGoString(bound))  # type: ignore[no-untyped-call]
                lines.append(_line(self._name + "_bucket", le, total))
            plain = _labels(**self._labels)
            lines.append(_line(self._name + "_count", plain, total))
            lines.append(_line(self._name + "_sum", plain, self.sum))
            self._text = "".join(lines)
        return self._text


class Metrics:
    def __init__(self, service: Service) -> None:
        self.loop_seconds = Histogram(
            "vgpud_loop_duration_seconds",
            "Time one iteration of a daemon loop took.",
            ["loop"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
        )
        self.request_seconds = Histogram(
            "vgpud_api_request_duration_seconds",
            "Time the API took to answer, by route and status.",
            ["method", "route", "status"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
        )
        self.save_seconds = Histogram(
            "vgpud_state_save_duration_seconds",
            "Time one save of the state file took to write and flush: the disk's share "
            "of the answer to a create, update or delete.",
            [],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
        )
        self._service = service
        # A vGPU's lines, kept while the snapshot hands back the same object for it.
        self._lines: dict[str, tuple[object, Samples]] = {}
        self._rendered: tuple[NodeSnapshot | None, bytes] = (None, b"")

    def render(self) -> bytes:
        """The exposition, generated once per snapshot of the daemon (many
        scrapers need not multiply it)."""
        snap = self._service.shown()
        if self._rendered[0] is not snap:
            histograms = (self.loop_seconds, self.request_seconds, self.save_seconds)
            text = "".join(h.text() for h in histograms) + self._state(snap)
            self._rendered = (snap, text.encode())
        return self._rendered[1]

    def _state(self, snap: NodeSnapshot) -> str:
        out: list[str] = []
        gpu_lines: Samples = {f: [] for f in GPU_FAMILIES}
        for g in snap.gpus:
            add = _adder(gpu_lines, _labels(gpu=str(g.index), uuid=g.uuid))
            add(GPU_MEMORY_USED, g.memory_used)
            add(GPU_MEMORY_TOTAL, g.memory_total)
            add(GPU_UTILIZATION, g.utilization)
            add(GPU_HEALTHY, 1.0 if g.healthy else 0.0)
            add(GPU_VGPUS, len(g.vgpus))
            add(GPU_OUTSIDE_VGPUS, g.processes_outside_vgpus)
        out.extend(_families(GPU_FAMILIES, [gpu_lines]))
        known, lines = self._lines, {}
        for vgpu_id, managed in snap.vgpus.items():
            hit = known.get(vgpu_id)
            if hit is None or hit[0] is not managed:
                hit = (managed, _vgpu_lines(vgpu_id, managed.vgpu.name, managed.figures, False))
            lines[vgpu_id] = hit
        for vgpu_id, standalone in snap.standalone.items():
            hit = known.get(vgpu_id)
            if hit is None or hit[0] is not standalone:
                hit = (standalone, _vgpu_lines(vgpu_id, None, standalone.figures, True))
            lines[vgpu_id] = hit
        self._lines = lines
        out.extend(_families(VGPU_FAMILIES, [hit[1] for hit in lines.values()]))
        drift: Samples = {DRIFT_REPAIRS: [], DRIFT_BYTES: []}
        add = _adder(drift, "")
        add(DRIFT_REPAIRS, snap.drift_repairs)
        add(DRIFT_BYTES, snap.drift_bytes)
        out.extend(_families((DRIFT_REPAIRS, DRIFT_BYTES), [drift]))
        return "".join(out)


def _vgpu_lines(vgpu_id: str, name: str | None, figures: VgpuFigures, standalone: bool) -> Samples:
    """A vGPU's samples, a series per GPU. A standalone vGPU's limit, share
    and quota may be unset (0: its environment set none, never steered):
    those have no sample."""
    lines: Samples = {f: [] for f in VGPU_FAMILIES}
    for g in figures.gpus:
        index = "" if g.gpu_index is None else str(g.gpu_index)
        add = _adder(lines, _labels(vgpu=vgpu_id, name=name or "", gpu=index, uuid=g.uuid))
        add(VGPU_MEMORY_USED, g.memory_used)
        add(VGPU_MEMORY_LIMIT, (g.memory_limit or None) if standalone else g.memory_limit)
        add(VGPU_UTILIZATION, g.utilization)
        add(VGPU_QUOTA, _ratio(g.quota_ppm, standalone))
        add(VGPU_SHARE, _ratio(g.share_ppm, standalone))
        add(VGPU_THROTTLED, g.throttled_ns / 1e9)
        add(VGPU_OOM, g.oom_count)
        add(VGPU_PROCESSES, figures.processes)
        add(VGPU_GPU_PROCESSES, g.processes)
    return lines


def _ratio(ppm: int, standalone: bool) -> float | None:
    return None if standalone and not ppm else ppm_to_fraction(ppm)


def _families(families: Sequence[Family], parts: Iterable[Samples]) -> Iterator[str]:
    """Each family's header, then its samples from every part in order."""
    parts = list(parts)
    for family in families:
        yield family.header()
        for part in parts:
            yield from part.get(family, ())


def _adder(into: Samples, labels: str) -> Callable[[Family, float | None], None]:
    """Adds one sample of ``labels`` to a family's lines; no figure, no sample."""

    def add(family: Family, value: float | None) -> None:
        if value is not None:
            into[family].append(_line(family.name, labels, value))

    return add


def _line(name: str, labels: str, value: float) -> str:
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return f"{name}{labels} {text}\n"


def _labels(**labels: str) -> str:
    """The label set as the text format writes it, names in sorted order."""
    return "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(labels.items())) + "}"


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_doc(doc: str) -> str:
    return doc.replace("\\", r"\\").replace("\n", r"\n")
