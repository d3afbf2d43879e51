"""The control tick: measurements in, quotas and heartbeats out.

Builds the controller's snapshot (vgpud/controller.py, a pure function)
from what the daemon knows, then writes each quota into its control block's
throttle table (daemon-owned vGPUs) or the steering area of an adopted
standalone usage block, and a heartbeat into each. The hook keeps the last
quota if the heartbeat stops (fail static).

Inputs per (vGPU, GPU): whether it has processes (the last scan), NVML's
per-process utilization summed over its processes (only when a new NVML
sample arrived since the previous tick), and the hook's cumulative GPU time
and pacer waits (the usage block).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial

from vgpud import controller as ctl
from vgpud.blocks import ControlBlock, UsageBlock
from vgpud.model import Vgpu
from vgpud.nvml import NvmlSample
from vgpud.registry import Entry
from vgpud.tracker import TrackSnapshot, VgpuBlocks
from vgpud.units import PPM_FULL, percent_to_ppm


@dataclass(frozen=True)
class _Owned:
    """A daemon-owned vGPU's part of the tick, built once per definition
    (the registry replaces ``vgpu`` on an update, ``usage`` on a repair)."""

    vgpu: Vgpu
    usage: UsageBlock
    control: ControlBlock
    allocations: tuple[ctl.Allocation, ...]  # by usage-block device index
    writers: tuple[Callable[[int], object], ...]

    @staticmethod
    def of(e: Entry) -> _Owned:
        v = e.vgpu
        share_ppm = percent_to_ppm(v.limits.share)
        soft = v.limits.mode == "soft"
        return _Owned(
            v,
            e.usage,
            e.control,
            tuple(
                ctl.Allocation(v.id, s.gpu_uuid, share_ppm, soft, v.limits.weight) for s in v.slices
            ),
            tuple(
                partial(e.control.write_throttle, i, window_ns=ctl.WINDOW_NS)
                for i in range(len(v.slices))
            ),
        )

    def current(self, e: Entry) -> bool:
        return self.vgpu is e.vgpu and self.usage is e.usage and self.control is e.control


class Steering:
    def __init__(self, tuning: ctl.Tuning = ctl.DEFAULT_TUNING) -> None:
        self.tuning = tuning
        self.state = ctl.ControllerState()
        self.last_sample: NvmlSample | None = None
        self._owned: dict[str, _Owned] = {}
        # Last tick's samples: an unchanged one is passed again as the same
        # object, which the controller's comparison of inputs passes at once.
        self._samples: dict[ctl.Key, ctl.SliceSample] = {}
        self._given: dict[ctl.Key, int] = {}
        self._writers: dict[ctl.Key, Callable[[int], object]] = {}

    def tick(
        self,
        entries: Iterable[Entry],
        standalone: Mapping[str, VgpuBlocks],
        track: TrackSnapshot | None,
        sample: NvmlSample | None,
        now_ns: int,
    ) -> dict[ctl.Key, int]:
        """One controller step; returns the quotas given (ppm)."""
        fresh = sample if sample is not None and sample is not self.last_sample else None
        self.last_sample = sample
        entries = list(entries)
        allocations: list[ctl.Allocation] = []
        counters: dict[ctl.Key, tuple[int, int]] = {}
        writers: dict[ctl.Key, Callable[[int], object]] = {}
        owned = {}
        for e in entries:
            plan = self._owned.get(e.vgpu.id)
            if plan is None or not plan.current(e):
                plan = _Owned.of(e)
            owned[e.vgpu.id] = plan
            pacing = e.usage.pacing_counters()
            for a, write, pace in zip(plan.allocations, plan.writers, pacing, strict=True):
                key = (a.vgpu_id, a.gpu)
                allocations.append(a)
                counters[key] = pace
                writers[key] = write
        self._owned = owned
        for vgpu_id, blocks in standalone.items():
            limits = blocks.usage.standalone_limits()
            devices = blocks.usage.devices()
            for i, (uuid, share_ppm) in enumerate(zip(limits.uuids, limits.share_ppm, strict=True)):
                if uuid and 0 < share_ppm < PPM_FULL:  # only a compute limit is steered
                    key = (vgpu_id, uuid)
                    allocations.append(ctl.Allocation(vgpu_id, uuid, share_ppm))
                    counters[key] = (devices[i].gpu_time_ns, devices[i].throttled_ns)
                    writers[key] = partial(blocks.usage.write_steer, i, window_ns=ctl.WINDOW_NS)

        snapshot = self._snapshot(allocations, counters, track, sample, fresh, now_ns)
        quotas, self.state = ctl.compute_quotas(snapshot, allocations, self.state, self.tuning)
        for key, quota in quotas.items():
            if self._given.get(key) != quota or writers[key] is not self._writers.get(key):
                writers[key](quota)
        # What was written where: a quota given again to the same block is
        # not written again (most ticks, most vGPUs).
        self._given, self._writers = quotas, writers
        for e in entries:
            e.control.heartbeat(now_ns)
        for blocks in standalone.values():
            blocks.usage.steer_heartbeat(now_ns)
        return quotas

    def _snapshot(
        self,
        allocations: list[ctl.Allocation],
        counters: Mapping[ctl.Key, tuple[int, int]],
        track: TrackSnapshot | None,
        latest: NvmlSample | None,
        fresh: NvmlSample | None,
        now_ns: int,
    ) -> ctl.Snapshot:
        gpus: dict[str, dict[str, ctl.SliceSample]] = {}
        samples: dict[ctl.Key, ctl.SliceSample] = {}
        for a in allocations:
            key = (a.vgpu_id, a.gpu)
            use = track.vgpus.get(a.vgpu_id) if track is not None else None
            util = None
            if fresh is not None and use is not None and a.gpu in fresh.gpus:
                per_pid = fresh.gpus[a.gpu].process_util
                seen = [per_pid[pid] for pid in use.pids if pid in per_pid]
                util = sum(seen) if seen else None
            gpu_time, throttled = counters[key]
            active = use is not None and use.live_slots > 0
            s = self._samples.get(key)
            if s is None or (s.active, s.util, s.gpu_time_ns, s.throttled_ns) != (
                active,
                util,
                gpu_time,
                throttled,
            ):
                s = ctl.SliceSample(active, util, gpu_time, throttled)
            samples[key] = s
            gpus.setdefault(a.gpu, {})[a.vgpu_id] = s
        self._samples = samples
        device_util: dict[str, float | None] = {}
        if latest is not None:
            device_util = {
                uuid: None if g.utilization_gpu is None else float(g.utilization_gpu)
                for uuid, g in latest.gpus.items()
            }
        return ctl.Snapshot(
            now_ns=now_ns,
            gpus={
                uuid: ctl.GpuSample(device_util.get(uuid), slices) for uuid, slices in gpus.items()
            },
        )
