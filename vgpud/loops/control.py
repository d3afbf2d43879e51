"""The control tick: measurements in, quotas and heartbeats out.

Builds the controller's snapshot (vgpud/policy/controller.py, a pure function)
from what the daemon knows, then writes each quota into its control block's
throttle table (daemon-owned vGPUs) or the steering area of an adopted
standalone usage block, and a heartbeat into each. The hook keeps the last
quota if the heartbeat stops (fail static).

Inputs per (vGPU, GPU): whether it has processes (the last scan), NVML's
per-process utilization summed over its processes (only when a new NVML
sample arrived since the previous tick) or, while every process NVML lists
on the GPU is the vGPU's own, the device's utilization; and the hook's
cumulative GPU time, pacer waits and launches (the usage block). Where the
controller calibrates a daemon-owned vGPU's quota by NVML, the device entry
says so (``ControlBlock.set_calibrated``): its hook may then estimate
batches it would otherwise gate (docs/compute.md).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import structlog

from vgpud.log import tenant_said
from vgpud.observe.nvml import NvmlSample
from vgpud.observe.tracker import TrackSnapshot, VgpuBlocks
from vgpud.policy import controller as ctl
from vgpud.units import PPM_FULL, percent_to_ppm
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.blocks import ControlBlock, UsageBlock
from vgpud.vgpus.model import Vgpu
from vgpud.vgpus.registry import Entry

# The control period after a tick that gave the last quotas again without
# computing them (nothing new, or a steady run): the controller only
# watches then, and a change it would answer is seen a little later. Each
# tick is a wake-up of the event loop, which on a shared VM costs more than
# the tick itself (caches cold after the pause: docs/benchmarks/daemon.md).
# Twice the default period: half the wake-ups, every heartbeat far inside
# the hook's 2 s, and at most 0.1 s more before a change is answered (a
# soft vGPU yielded in 0.4-0.6 s of its 1 s on an H200; a limit change
# has a second).
QUIET_PERIOD_S = 0.2

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class _Owned:
    """A daemon-owned vGPU's part of the tick, built once per definition
    (the registry replaces ``vgpu`` on an update, ``usage`` on a repair)."""

    vgpu: Vgpu
    usage: UsageBlock
    control: ControlBlock
    allocations: tuple[ctl.Allocation, ...]  # by usage-block device index
    writers: tuple[Callable[[int], object], ...]
    calibrators: tuple[Callable[[bool], object], ...]

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
            tuple(partial(e.control.set_calibrated, i) for i in range(len(v.slices))),
        )

    def current(self, e: Entry) -> bool:
        return self.vgpu is e.vgpu and self.usage is e.usage and self.control is e.control


class _Steered(NamedTuple):
    """One GPU of an adopted standalone block that the tick steers."""

    allocation: ctl.Allocation
    counters: tuple[int, int, int]  # gpu_time_ns, throttled_ns, launches
    writer: Callable[[int], object]


def _standalone_slices(vgpu_id: str, usage: UsageBlock) -> tuple[list[_Steered], list[str]]:
    """What an adopted standalone block asks to be steered: each GPU its
    hook gave a compute limit (only a limit is steered, never lifted), and
    the UUIDs it names more than once. One allocation per GPU: an honest
    hook names a GPU once, and every entry would be one more claim on the
    GPU's spare time for the controller (a tenant listing one GPU 16 times
    took a soft vGPU's idle time away from it), so entries after the first
    for a UUID are ignored.
    """
    limits = usage.standalone_limits()
    devices = usage.devices()
    out = []
    seen: set[str] = set()
    again: list[str] = []
    for i, (uuid, share_ppm) in enumerate(zip(limits.uuids, limits.share_ppm, strict=True)):
        if not uuid:  # an entry its hook gave no GPU
            continue
        if uuid in seen:
            again.append(uuid)
            continue
        seen.add(uuid)
        if 0 < share_ppm < PPM_FULL:
            d = devices[i]
            out.append(
                _Steered(
                    ctl.Allocation(vgpu_id, uuid, share_ppm),
                    (d.gpu_time_ns, d.throttled_ns, d.launches),
                    partial(usage.write_steer, i, window_ns=ctl.WINDOW_NS),
                )
            )
    return out, again


class _Plans:
    """Every daemon-owned vGPU's part of the tick, for one set of entries,
    with the addresses of their pacing counters and heartbeats: each tick
    reads the counters of every vGPU in one call and stores every heartbeat
    in another. The addresses are used only while ``current`` says each
    entry still has the blocks they were taken from (the registry unmaps a
    block only after it has left its entry)."""

    def __init__(self, atomics: Atomics, owned: Sequence[_Owned]) -> None:
        self.atomics = atomics
        self.owned = tuple(owned)
        self.allocations = tuple(a for o in owned for a in o.allocations)
        self.keys = tuple((a.vgpu_id, a.gpu) for a in self.allocations)
        self.writers = tuple(w for o in owned for w in o.writers)
        self.calibrators = dict(
            zip(self.keys, (c for o in owned for c in o.calibrators), strict=True)
        )
        loads = [addr for o in owned for addr in o.usage.pacing_addresses()]
        beats = [o.control.heartbeat_address() for o in owned]
        self._loads = (ctypes.c_void_p * len(loads))(*loads)
        self._counters = (ctypes.c_uint64 * len(loads))()
        self._beats = (ctypes.c_void_p * len(beats))(*beats)

    def current(self, entries: Sequence[Entry]) -> bool:
        return len(entries) == len(self.owned) and all(map(_Owned.current, self.owned, entries))

    def counters(self) -> bytes:
        """(gpu_time_ns, throttled_ns, launches) of each allocation, in
        ``keys`` order, as native 64-bit words."""
        self.atomics.load_u64_each(self._loads, len(self._loads), self._counters)
        return bytes(self._counters)

    def heartbeat(self, now_ns: int) -> None:
        self.atomics.store_u64_each(self._beats, len(self._beats), now_ns)


# Per GPU of an NVML sample: its UUID, its utilization and the processes
# NVML lists there.
_GpuFigures = tuple[tuple[str, float | None, frozenset[int]], ...]
# What a tick's quotas follow from, when no standalone block is steered and
# no NVML figure falls to a vGPU: the plans, the scan, the counters and the
# devices' figures. Where the controller fixed every GPU (ctl.all_fixed),
# only the plans, the scan and the processes NVML lists on each GPU (who is
# alone): the counters and figures are None.
_Quiet = tuple[_Plans, TrackSnapshot | None, bytes | None, _GpuFigures]
# What a steady run's ticks share but the counters: the plans, the scan and
# the devices' figures.
_RunKey = tuple[_Plans, TrackSnapshot | None, _GpuFigures]


class _SteadyRun:
    """Ticks on which every GPU was steady (the controller reused each
    one, ctl.SteadyGpu) and nothing but the counters moved: steering asks
    ctl.steady_again, from the counter words alone, whether the controller
    would reuse them all once more, and does not build its samples or call
    it (on a node of busy soft vGPUs that leave spare time, most ticks).
    The controller's state is then ``base`` but for the steady memos'
    counters, the words last read: made only when asked (``state``)."""

    def __init__(
        self,
        key: _RunKey,
        snapshot: ctl.Snapshot,
        keys: Sequence[ctl.Key],
        base: ctl.ControllerState,
        words: memoryview,
    ) -> None:
        self.key = key
        self.base = base
        self.uuids = tuple(base.steady)
        self.util = {uuid: snapshot.gpus[uuid].util for uuid in self.uuids}
        self.gpus = ctl.steady_rows(base, snapshot, {k: 3 * i for i, k in enumerate(keys)})
        self.words = words
        self.read_at_ns = snapshot.now_ns
        self.moved = False  # whether a tick reused it since ``base``

    def again(self, words: memoryview, now_ns: int, tuning: ctl.Tuning) -> bool:
        """One more tick of the run, if the controller would reuse every GPU."""
        dt_s = (now_ns - self.read_at_ns) / ctl.NS_PER_S
        if not ctl.steady_again(self.gpus, words, self.words, dt_s, tuning):
            return False
        self.words, self.read_at_ns, self.moved = words, now_ns, True
        return True

    def state(self) -> ctl.ControllerState:
        if not self.moved:
            return self.base
        w = self.words
        samples = {
            uuid: ctl.GpuSample(
                self.util[uuid],
                {
                    r.alloc.vgpu_id: ctl.SliceSample(
                        r.active, None, w[r.at], w[r.at + 1], w[r.at + 2], r.alone
                    )
                    for r in rows
                },
            )
            for uuid, rows in zip(self.uuids, self.gpus, strict=True)
        }
        return ctl.steady_at(self.base, samples, self.read_at_ns)


class Steering:
    def __init__(self, atomics: Atomics, tuning: ctl.Tuning = ctl.DEFAULT_TUNING) -> None:
        self.atomics = atomics
        self.tuning = tuning
        self._state = ctl.ControllerState()
        # While every GPU stays steady and only the counters move.
        self._run: _SteadyRun | None = None
        self.last_sample: NvmlSample | None = None
        self._plans = _Plans(atomics, ())
        # Last tick's samples: an unchanged one is passed again as the same
        # object, which the controller's comparison of inputs passes at once.
        self._samples: dict[ctl.Key, ctl.SliceSample] = {}
        self._given: dict[ctl.Key, int] = {}
        self._writers: dict[ctl.Key, Callable[[int], object]] = {}
        # The last tick's inputs when it settled or fixed every GPU: a tick
        # with the same inputs gives the same quotas (ctl.unchanged).
        self._quiet: _Quiet | None = None
        # Whether the last tick fixed every GPU (ctl.all_fixed).
        self._fixed = False
        # Whether the last tick gave the last quotas again without computing
        # them: the control loop may then wait longer (QUIET_PERIOD_S).
        self.reused = False
        self._gpu_figures: tuple[NvmlSample | None, _GpuFigures] = (None, ())
        self._calibrated: dict[ctl.Key, bool] = {}
        self._calibrators: Mapping[ctl.Key, Callable[[bool], object]] = {}
        # Which vGPU the last scan counted each pid for (worked out once per scan).
        self._track_owners: tuple[TrackSnapshot | None, dict[int, str]] = (None, {})
        # (block, trouble) said once per standalone block.
        self._standalone_said: set[tuple[str, str]] = set()

    @property
    def state(self) -> ctl.ControllerState:
        """The controller's state, as computing every tick in full leaves it."""
        return self._state if self._run is None else self._run.state()

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
        plans = self._plans_of(list(entries))
        counters = plans.counters()
        words = memoryview(counters).cast("Q")
        run = self._run
        if run is not None:
            if (
                not standalone
                and run.key == (plans, track, self._figures(sample))
                and not self._figures_for_vgpus(fresh, track)
                and run.again(words, now_ns, self.tuning)
            ):
                # Only the counters moved, and every GPU stays steady: the
                # quotas given last, which are the steady GPUs' own.
                plans.heartbeat(now_ns)
                self.reused = True
                return self._given
            self._state, self._run = run.state(), None
        elif (
            not standalone
            and (self._fixed or not self._figures_for_vgpus(fresh, track))
            and self._quiet_key(plans, track, counters, sample, self._fixed) == self._quiet
        ):
            # Nothing new: what the controller would give again (most ticks
            # of a node whose vGPUs are idle or steady, or all hard).
            quotas, self._state = ctl.unchanged(self._state, now_ns)
            plans.heartbeat(now_ns)
            self.reused = True
            return quotas

        self.reused = False
        allocations = list(plans.allocations)
        pacing = {
            key: (words[3 * i], words[3 * i + 1], words[3 * i + 2])
            for i, key in enumerate(plans.keys)
        }
        writers = dict(zip(plans.keys, plans.writers, strict=True))
        steered = []
        if self._standalone_said:  # forget blocks no longer adopted
            self._standalone_said = {k for k in self._standalone_said if k[0] in standalone}
        for vgpu_id, blocks in standalone.items():
            slices = self._standalone(vgpu_id, blocks.usage)
            if slices is None:
                continue
            steered.append(blocks.usage)
            for s in slices:
                key = (vgpu_id, s.allocation.gpu)
                allocations.append(s.allocation)
                pacing[key] = s.counters
                writers[key] = s.writer

        snapshot = self._snapshot(
            allocations, len(plans.allocations), pacing, track, sample, fresh, now_ns
        )
        quotas, self._state = ctl.compute_quotas(snapshot, allocations, self._state, self.tuning)
        for key, quota in quotas.items():
            if self._given.get(key) != quota or writers[key] is not self._writers.get(key):
                writers[key](quota)
        # What was written where: a quota given again to the same block is
        # not written again (most ticks, most vGPUs).
        self._given, self._writers = quotas, writers
        self._mark_calibrated(plans, quotas)
        self._fixed = ctl.all_fixed(self._state, allocations)
        # (A GPU given a new NVML figure is never settled: the figure is
        # state. A fixed one does not read it.)
        settled = not standalone and ctl.all_settled(self._state, allocations)
        self._quiet = (
            self._quiet_key(plans, track, counters, sample, self._fixed) if settled else None
        )
        if not standalone and self._state.steady and ctl.all_steady(self._state, allocations):
            steady_key = (plans, track, self._figures(sample))
            self._run = _SteadyRun(steady_key, snapshot, plans.keys, self._state, words)
        plans.heartbeat(now_ns)
        for usage in steered:
            usage.steer_heartbeat(now_ns)
        return quotas

    def _standalone(self, vgpu_id: str, usage: UsageBlock) -> list[_Steered] | None:
        """An adopted standalone block's part of the tick, or None when it
        cannot be read. Its words are its tenant's, whatever they hold: a
        block that fails here is left out of this tick alone (no quota, no
        heartbeat: its hooks keep their last quota) and the rest of the node
        is steered; a failure here once stopped every vGPU's quotas and
        heartbeats until the watchdog killed the daemon. Said once per block,
        as are UUIDs it names twice."""
        try:
            slices, again = _standalone_slices(vgpu_id, usage)
        except Exception as exc:
            self._say_once(
                vgpu_id, "standalone block left out of the control tick", usage, error=repr(exc)
            )
            return None
        if again:
            self._say_once(
                vgpu_id,
                "standalone block names a GPU more than once: steered by its first entry",
                usage,
                uuids=sorted(set(again)),
            )
        return slices

    def _say_once(self, vgpu_id: str, event: str, usage: UsageBlock, **fields: object) -> None:
        """Once per block, and bounded per block's user (``usage.tenant``):
        a user's processes may each come with a new block."""
        if (vgpu_id, event) not in self._standalone_said:
            self._standalone_said.add((vgpu_id, event))
            tenant_said(
                log,
                "warning",
                event,
                tenant=usage.tenant,
                kind="",
                vgpu=vgpu_id,
                path=str(usage.path),
                **fields,
            )

    def _mark_calibrated(self, plans: _Plans, quotas: Mapping[ctl.Key, int]) -> None:
        """Tell each daemon-owned vGPU's hook where its quota is calibrated
        by NVML and paced (the hook may then estimate batches rather than
        gate them); written where it changed, or to a block not written yet.
        Standalone processes are not told: their steering may only lower
        their own limit, so a bias upward cannot be corrected there."""
        slices, marked, known = self._state.slices, self._calibrated, self._calibrators
        marks: dict[ctl.Key, bool] = {}
        for key, calibrate in plans.calibrators.items():
            marks[key] = on = slices[key].calibrated and quotas[key] < PPM_FULL
            if marked.get(key) != on or calibrate is not known.get(key):
                calibrate(on)
        self._calibrated, self._calibrators = marks, plans.calibrators

    def _plans_of(self, entries: list[Entry]) -> _Plans:
        """This tick's plans: last tick's while every entry is as it was."""
        if self._plans.current(entries):
            return self._plans
        known = {o.vgpu.id: o for o in self._plans.owned}
        owned = []
        for e in entries:
            plan = known.get(e.vgpu.id)
            owned.append(plan if plan is not None and plan.current(e) else _Owned.of(e))
        self._plans = _Plans(self.atomics, owned)
        return self._plans

    def _quiet_key(
        self,
        plans: _Plans,
        track: TrackSnapshot | None,
        counters: bytes,
        sample: NvmlSample | None,
        fixed: bool,
    ) -> _Quiet:
        """What the quotas follow from (``_Quiet``)."""
        figures = self._figures(sample)
        if not fixed:
            return (plans, track, counters, figures)
        return (plans, track, None, tuple((uuid, None, pids) for uuid, _, pids in figures))

    def _figures(self, sample: NvmlSample | None) -> _GpuFigures:
        """Each GPU's utilization and listed processes in ``sample`` (worked
        out once per sample)."""
        known, figures = self._gpu_figures
        if sample is not known:
            figures = (
                ()
                if sample is None
                else tuple(
                    (
                        uuid,
                        None if g.utilization_gpu is None else float(g.utilization_gpu),
                        frozenset(g.processes),
                    )
                    for uuid, g in sample.gpus.items()
                )
            )
            self._gpu_figures = (sample, figures)
        return figures

    def _figures_for_vgpus(self, fresh: NvmlSample | None, track: TrackSnapshot | None) -> bool:
        """Whether a new NVML sample has a figure for a vGPU (the sample
        then changes that vGPU's input): a utilization figure of a process
        the last scan counted for a vGPU, or the device figure of a GPU on
        which NVML lists one vGPU's processes alone (the figure is then
        that vGPU's own: _alone)."""
        if fresh is None or track is None:
            return False
        known, owners = self._track_owners
        if track is not known:
            owners = {pid: vid for vid, use in track.vgpus.items() for pid in use.pids}
            self._track_owners = (track, owners)
        for g in fresh.gpus.values():
            if any(pid in owners for pid in g.process_util):
                return True
            if g.utilization_new is None:
                continue  # no period ended: nothing new for a vGPU alone
            listed = iter(g.processes)
            first = owners.get(next(listed, -1))
            # Stops at the first process of another vGPU, or of none.
            if first is not None and all(owners.get(pid) == first for pid in listed):
                return True
        return False

    def _snapshot(
        self,
        allocations: list[ctl.Allocation],
        owned: int,
        counters: Mapping[ctl.Key, tuple[int, ...]],
        track: TrackSnapshot | None,
        latest: NvmlSample | None,
        fresh: NvmlSample | None,
        now_ns: int,
    ) -> ctl.Snapshot:
        gpus: dict[str, dict[str, ctl.SliceSample]] = {}
        samples: dict[ctl.Key, ctl.SliceSample] = {}
        figures = self._figures(latest)
        device_util = {uuid: util for uuid, util, _ in figures}
        listed = {uuid: pids for uuid, _, pids in figures}
        for i, a in enumerate(allocations):
            key = (a.vgpu_id, a.gpu)
            use = track.vgpus.get(a.vgpu_id) if track is not None else None
            # Only a daemon-owned vGPU (the first `owned` allocations) is
            # calibrated: a standalone process's steering may only lower its
            # own limit, and its hook is not told.
            alone = i < owned and use is not None and _alone(listed.get(a.gpu), use.pids)
            util = None
            if fresh is not None and use is not None and a.gpu in fresh.gpus:
                gpu = fresh.gpus[a.gpu]
                if alone:
                    # Its processes are all there is: the device figure is
                    # theirs, and unlike the per-process samples it has
                    # every period (each once: None when none ended).
                    util = gpu.utilization_new
                else:
                    seen = [gpu.process_util[pid] for pid in use.pids if pid in gpu.process_util]
                    util = sum(seen) if seen else None
            gpu_time, throttled, launches = counters[key]
            active = use is not None and use.live_slots > 0
            fields = (active, util, gpu_time, throttled, launches, alone)
            s = self._samples.get(key)
            if s != fields:  # a SliceSample is the tuple of its fields
                s = ctl.SliceSample(*fields)
            samples[key] = s
            gpus.setdefault(a.gpu, {})[a.vgpu_id] = s
        self._samples = samples
        return ctl.Snapshot(
            now_ns=now_ns,
            gpus={
                uuid: ctl.GpuSample(device_util.get(uuid), slices) for uuid, slices in gpus.items()
            },
        )


def _alone(listed: frozenset[int] | None, pids: tuple[int, ...]) -> bool:
    """Whether NVML lists processes on the GPU (``listed``) and every one
    of them is among ``pids`` (a vGPU's, as the tracker attributed them:
    facts a tenant cannot forge). A process of no vGPU, or of another,
    makes it false."""
    return listed is not None and 0 < len(listed) <= len(pids) and listed.issubset(pids)
