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
from functools import partial

from vgpud import controller as ctl
from vgpud.blocks import PPM_FULL
from vgpud.nvml import NvmlSample
from vgpud.registry import Entry
from vgpud.tracker import TrackSnapshot, VgpuBlocks


class Steering:
    def __init__(self, tuning: ctl.Tuning = ctl.DEFAULT_TUNING) -> None:
        self.tuning = tuning
        self.state = ctl.ControllerState()
        self.last_sample: NvmlSample | None = None

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
        for e in entries:
            soft = e.vgpu.limits.mode == "soft"
            share_ppm = e.vgpu.limits.share * (PPM_FULL // 100)
            pacing = e.usage.pacing_counters()
            for i, (s, pace) in enumerate(zip(e.vgpu.slices, pacing, strict=True)):
                key = (e.vgpu.id, s.gpu_uuid)
                allocations.append(
                    ctl.Allocation(e.vgpu.id, s.gpu_uuid, share_ppm, soft, e.vgpu.limits.weight)
                )
                counters[key] = pace
                writers[key] = partial(e.control.write_throttle, i, window_ns=ctl.WINDOW_NS)
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
            writers[key](quota)
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
        for a in allocations:
            use = track.vgpus.get(a.vgpu_id) if track is not None else None
            util = None
            if fresh is not None and use is not None and a.gpu in fresh.gpus:
                per_pid = fresh.gpus[a.gpu].process_util
                seen = [per_pid[pid] for pid in use.pids if pid in per_pid]
                util = sum(seen) if seen else None
            gpu_time, throttled = counters[(a.vgpu_id, a.gpu)]
            gpus.setdefault(a.gpu, {})[a.vgpu_id] = ctl.SliceSample(
                active=use is not None and use.live_slots > 0,
                util=util,
                gpu_time_ns=gpu_time,
                throttled_ns=throttled,
            )
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
