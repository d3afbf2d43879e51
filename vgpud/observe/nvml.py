"""The NVML gateway: every NVML call of the daemon goes through here.

The only importer of pynvml. Every call runs on one worker thread (NVML
calls block, sometimes for milliseconds); health events are awaited on a
second, dedicated thread with ``nvmlEventSetWait_v2`` timeouts, so a wait
never delays a sample.

Public interface
----------------
``GpuGateway``: the protocol both classes below satisfy (what the daemon holds).
``open_nvml(library_path=None, on_health=None) -> GpuGateway``
    (async) a started gateway, or the null one when no driver loads (the
    reason is logged once).
``NvmlGateway(library_path=None, on_health=None, *, cuda_library="libcuda.so.1")``
    ``library_path``: an explicit ``libnvidia-ml.so.1`` (e.g.
    ``build/sim/libnvidia-ml.so.1`` for ``--sim``). It is loaded with
    RTLD_GLOBAL before ``nvmlInit``; pynvml's own ``dlopen`` by soname then
    finds that copy, so no LD_LIBRARY_PATH is needed.
    ``cuda_library``: the CUDA driver asked for the SM counts NVML does not
    give (cudainfo.py), once at start, on the worker thread.
    ``on_health(HealthEvent)`` runs on the event loop that called ``start``.
    ``async start()``     nvmlInit, device inventory, topology, health thread;
                          raises ``NvmlUnavailable`` when NVML cannot start.
    ``devices() -> list[GpuInfo]``  the inventory, health included (no I/O).
    ``driver_version -> str | None``
    ``async sample() -> NvmlSample``  one read of every device.
    ``sample_soon() -> Future[(NvmlSample, seconds)]``  the same read, asked
                          for without an event loop to wake when it is done
                          (a ``concurrent.futures`` future; the read's time).
    ``topology(uuid_a, uuid_b) -> TopologyLevel | None`` (cached, no I/O).
    ``async close()``     stops the health thread, nvmlShutdown.
``NullNvml``: the same protocol with no devices; ``available`` is False.

Degrading, never failing: a function the driver lacks or does not support
is logged once and its figure is ``None``; running-process queries are
probed once (v3, then v2) and the answer kept; a device that reports "GPU is
lost" is marked unhealthy and emits a HealthEvent, the other devices go on.
The running processes and per-process utilization are array queries, read
through the C functions pynvml loaded into reusable buffers
(nvml_arrays.py: pynvml would build an object per process per sample),
grown on the driver's INSUFFICIENT_SIZE answer; utilization's NOT_FOUND
means no new sample. Utilization is asked from a little before the newest
sample seen and deduplicated per process (see ``_UtilCursor``).
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import IntEnum
from functools import cached_property
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

import pynvml
import structlog

from vgpud.observe import cudainfo
from vgpud.observe.nvml_arrays import (
    PROCESS_INFO,
    PROCESS_UTILIZATION_SAMPLE,
    SUCCESS,
    VALUE_NOT_AVAILABLE,
    ArrayReader,
)
from vgpud.threadname import name_this_thread

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Xids that name an application's fault, not the GPU's (the same list the
# NVIDIA device plugin ignores): a user's bad kernel must not retire a GPU.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
HEALTH_WAIT_MS = 1000
# How far apart the newest samples of different processes may be stamped.
UTIL_LOOKBACK_US = 1_000_000
_SAMPLE_RETRIES = 3  # a process may appear between NVML's size and data calls
_RUNNING_PROCESSES = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
)


class TopologyLevel(IntEnum):
    """nvmlGpuTopologyLevel_t: lower is closer."""

    INTERNAL = 0
    SINGLE = 10  # one PCIe switch (or NVLink-paired in the simulator)
    MULTIPLE = 20
    HOSTBRIDGE = 30
    NODE = 40
    SYSTEM = 50


class NvmlUnavailable(Exception):
    """NVML could not be started: no driver, no library, no permission."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total: int
    sms: int | None  # NVML's, else the CUDA driver's; None: neither says
    compute_capability: str | None  # "major.minor" (e.g. "9.0"); None: NVML does not say
    mig_mode: bool  # False also when the driver cannot say (no MIG support)
    pci_bus_id: str | None
    healthy: bool = True
    health_reason: str | None = None


@dataclass(frozen=True)
class UtilSample:
    pid: int
    timestamp_us: int  # CLOCK_REALTIME microseconds, as NVML gives it
    sm_util: int


@dataclass(frozen=True)
class GpuSample:
    uuid: str
    index: int
    utilization_gpu: int | None  # percent over the driver's newest period
    memory_used: int | None
    memory_total: int | None
    processes: Mapping[int, int | None]  # host pid -> used bytes (None: not given)
    process_util: Mapping[int, float]  # host pid -> mean SM % of its new samples
    util_samples: tuple[UtilSample, ...] = ()
    # Mean percent over the driver's periods that ended since the previous
    # sample; None when none did (what the controller learns from: each
    # period once). See _device_util.
    utilization_new: float | None = None


_NONE: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class NvmlSample:
    monotonic: float
    gpus: Mapping[str, GpuSample] = field(default_factory=dict)  # by uuid

    def memory_of(self, pid: int) -> Mapping[str, int]:
        """Device memory a host process uses, per GPU uuid (known figures only)."""
        return self._memory.get(pid, _NONE)

    def util_of(self, pid: int) -> Mapping[str, float]:
        """A host process's SM utilization, per GPU uuid (known figures only)."""
        return self._util.get(pid, _NONE)

    # By pid, built once per sample (a scan asks for each of 1000 processes):
    # the sample is immutable, and so are the mappings handed out.
    @cached_property
    def _memory(self) -> dict[int, Mapping[str, int]]:
        out: dict[int, dict[str, int]] = {}
        for uuid, gpu in self.gpus.items():
            for pid, used in gpu.processes.items():
                if used is not None:
                    out.setdefault(pid, {})[uuid] = used
        return dict(out)

    @cached_property
    def _util(self) -> dict[int, Mapping[str, float]]:
        out: dict[int, dict[str, float]] = {}
        for uuid, gpu in self.gpus.items():
            for pid, util in gpu.process_util.items():
                out.setdefault(pid, {})[uuid] = util
        return dict(out)

    def pids(self) -> set[int]:
        return {pid for gpu in self.gpus.values() for pid in gpu.processes}

    def figured_pids(self) -> set[int]:
        """The pids this sample has any figure of (memory or utilization)."""
        return self.pids() | {pid for gpu in self.gpus.values() for pid in gpu.process_util}


@dataclass(frozen=True)
class HealthEvent:
    uuid: str
    kind: str  # "xid" | "gpu_lost"
    xid: int | None
    critical: bool  # True: the GPU is now marked unhealthy
    message: str


HealthCallback = Callable[[HealthEvent], None]


class GpuGateway(Protocol):
    """What the daemon holds as its GPU source: the NVML gateway, or the null
    one when no driver loads (k8s-device-plugin's null object, so no caller
    tests for None). ``open_nvml`` returns either as this type, so mypy
    checks that both classes satisfy it; service.GpuInventory is the part of
    it the API reads, kept narrower so tests can fake it with two methods."""

    @property
    def available(self) -> bool: ...
    @property
    def driver_version(self) -> str | None: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...
    def devices(self) -> list[GpuInfo]: ...
    def topology(self, uuid_a: str, uuid_b: str) -> TopologyLevel | None: ...
    async def sample(self) -> NvmlSample: ...
    def sample_soon(self) -> Future[tuple[NvmlSample, float]]: ...


def _code(err: BaseException) -> int | None:
    return getattr(err, "value", None) if isinstance(err, pynvml.NVMLError) else None


_UNAVAILABLE_CODES = frozenset(
    {pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED}
)
# A versioned variant answering these is absent: try the next older one.
_TRY_OLDER_CODES = frozenset(
    {pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}
)


class _NoSampleBuffer(Exception):
    """The driver keeps no device utilization samples for this GPU."""


@dataclass
class _UtilCursor:
    """How far per-process utilization has been read on one GPU.

    A driver keeps about one sample per process, stamped when that process's
    period ended, so the newest samples of different processes carry
    different timestamps: asking only for samples newer than the newest one
    seen would drop other processes' slightly older ones (vGPUs then read ~0
    while busy). So ask from UTIL_LOOKBACK_US before the newest seen, and take
    a process's sample only when it is newer than that process's own newest.
    """

    floor_us: int  # nothing stamped at or before this is new (the daemon's start)
    newest_us: dict[int, int] = field(default_factory=dict)  # pid -> its newest sample taken

    def since(self) -> int:
        newest = max(self.newest_us.values(), default=0)
        return max(self.floor_us, newest - UTIL_LOOKBACK_US)

    def take(self, answer: Iterable[UtilSample]) -> tuple[UtilSample, ...]:
        since = self.since()
        fresh = tuple(
            sorted(
                (s for s in answer if s.timestamp_us > self.newest_us.get(s.pid, since)),
                key=lambda s: s.timestamp_us,
            )
        )
        for s in fresh:
            self.newest_us[s.pid] = max(s.timestamp_us, self.newest_us.get(s.pid, 0))
        # A pid last seen at or before the next ``since`` needs no entry: the
        # driver gives nothing that old again, and anything newer is new.
        since = self.since()
        self.newest_us = {pid: t for pid, t in self.newest_us.items() if t > since}
        return fresh


class NvmlGateway:
    available = True

    def __init__(
        self,
        library_path: str | None = None,
        on_health: HealthCallback | None = None,
        *,
        cuda_library: str = cudainfo.DEFAULT_LIBRARY,
        binding: Any = pynvml,
        read_sms: Callable[[str], Mapping[str, int]] = cudainfo.sm_counts,
    ) -> None:
        self._library_path = library_path
        self._cuda_library = cuda_library
        self._read_sms = read_sms  # cudainfo.sm_counts, or a fake in tests
        self._on_health = on_health
        self._nvml = binding  # pynvml, or a fake with the same functions in tests
        self._pool = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="nvml",
            initializer=name_this_thread,
            initargs=("vgpud-nvml",),
        )
        self._lock = threading.Lock()  # guards _devices against the health thread
        self._devices: list[GpuInfo] = []
        self._handles: dict[str, Any] = {}
        self._topology: dict[frozenset[str], TopologyLevel] = {}
        self._util_cursors: dict[str, _UtilCursor] = {}
        # Per GPU: the newest device utilization sample taken (µs), and its
        # value; absent for a GPU whose driver keeps no sample buffer.
        self._device_seen: dict[str, tuple[int, int | None]] = {}
        # One buffer per query, shared by the GPUs: NVML runs on one thread.
        self._process_array = ArrayReader(PROCESS_INFO)
        self._util_array = ArrayReader(PROCESS_UTILIZATION_SAMPLE)
        self._logged_missing: set[str] = set()
        self._logged_failures: set[tuple[str, int | None]] = set()
        self._choices: dict[str, str | None] = {}  # probed variant per query, None: none
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._health_thread: threading.Thread | None = None
        self._library: ctypes.CDLL | None = None
        self.driver_version: str | None = None

    # lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._run(self._start_sync)
        self._health_thread = threading.Thread(
            target=self._watch_health, name="nvml-health", daemon=True
        )
        self._health_thread.start()

    async def close(self) -> None:
        self._stop.set()
        if self._health_thread is not None:
            await asyncio.to_thread(self._health_thread.join)
        await self._run(self._shutdown_sync)
        self._pool.shutdown(wait=True)

    # queries

    def devices(self) -> list[GpuInfo]:
        with self._lock:
            return list(self._devices)

    def topology(self, uuid_a: str, uuid_b: str) -> TopologyLevel | None:
        if uuid_a == uuid_b:
            return TopologyLevel.INTERNAL
        return self._topology.get(frozenset((uuid_a, uuid_b)))

    async def sample(self) -> NvmlSample:
        return await self._run(self._sample_sync)

    def sample_soon(self) -> Future[tuple[NvmlSample, float]]:
        return self._pool.submit(self._timed_sample_sync)

    # worker-thread side

    def _timed_sample_sync(self) -> tuple[NvmlSample, float]:
        start = time.monotonic()
        sample = self._sample_sync()
        return sample, time.monotonic() - start

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _start_sync(self) -> None:
        nv = self._nvml
        try:
            if self._library_path is not None:
                self._library = ctypes.CDLL(self._library_path, mode=ctypes.RTLD_GLOBAL)
            nv.nvmlInit()
        except OSError as err:
            raise NvmlUnavailable(f"cannot load {self._library_path}: {err}") from err
        except pynvml.NVMLError as err:
            raise NvmlUnavailable(f"nvmlInit failed: {err}") from err
        self.driver_version = self._optional(
            "nvmlSystemGetDriverVersion", lambda: _text(nv.nvmlSystemGetDriverVersion())
        )
        devices = []
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                info = self._inventory(index, handle)
            except pynvml.NVMLError as err:
                # Without its identity a GPU cannot be sliced; the rest can.
                log.error("GPU left out: NVML cannot describe it", index=index, error=str(err))
                continue
            self._handles[info.uuid] = handle
            devices.append(info)
        if any(d.sms is None for d in devices):
            devices = self._sms_from_cuda(devices)
        with self._lock:
            self._devices = devices
        self._topology = self._read_topology()
        # Utilization history before the daemon started is not ours to act on.
        now_us = int(time.time() * 1_000_000)
        self._util_cursors = {uuid: _UtilCursor(now_us) for uuid in self._handles}
        self._device_seen = {uuid: (now_us, None) for uuid in self._handles}
        log.info("NVML started", driver=self.driver_version, gpus=len(devices))

    def _inventory(self, index: int, handle: Any) -> GpuInfo:
        nv = self._nvml
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        memory = self._memory_info(handle)
        attributes = self._optional(
            "nvmlDeviceGetAttributes", lambda: nv.nvmlDeviceGetAttributes(handle)
        )
        mig = self._optional("nvmlDeviceGetMigMode", lambda: nv.nvmlDeviceGetMigMode(handle))
        pci = self._optional("nvmlDeviceGetPciInfo", lambda: nv.nvmlDeviceGetPciInfo(handle))
        capability = self._optional(
            "nvmlDeviceGetCudaComputeCapability",
            lambda: nv.nvmlDeviceGetCudaComputeCapability(handle),
        )
        return GpuInfo(
            index=index,
            uuid=uuid,
            name=_text(nv.nvmlDeviceGetName(handle)),
            memory_total=int(memory.total) if memory is not None else 0,
            sms=None if attributes is None else int(attributes.multiprocessorCount),
            compute_capability=None if capability is None else f"{capability[0]}.{capability[1]}",
            mig_mode=mig is not None and bool(mig[0]),
            pci_bus_id=None if pci is None else _text(pci.busId),
        )

    def _sms_from_cuda(self, devices: list[GpuInfo]) -> list[GpuInfo]:
        """SM counts NVML did not give, from the CUDA driver (matched by UUID)."""
        counts = self._read_sms(self._cuda_library)
        return [replace(d, sms=counts.get(d.uuid)) if d.sms is None else d for d in devices]

    def _read_topology(self) -> dict[frozenset[str], TopologyLevel]:
        levels: dict[frozenset[str], TopologyLevel] = {}
        uuids = list(self._handles)
        for i, a in enumerate(uuids):
            for b in uuids[i + 1 :]:
                level = self._optional("nvmlDeviceGetTopologyCommonAncestor", self._ancestor(a, b))
                if level is not None:
                    levels[frozenset((a, b))] = TopologyLevel(int(level))
        return levels

    def _ancestor(self, a: str, b: str) -> Callable[[], int]:
        handles = self._handles
        return lambda: int(self._nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b]))

    def _sample_sync(self) -> NvmlSample:
        gpus: dict[str, GpuSample] = {}
        for info in self.devices():
            if not info.healthy:
                continue
            try:
                gpus[info.uuid] = self._sample_gpu(info)
            except pynvml.NVMLError as err:  # only "GPU is lost" gets here
                self._mark_unhealthy(info.uuid, "gpu_lost", None, str(err))
        return NvmlSample(monotonic=time.monotonic(), gpus=gpus)

    def _sample_gpu(self, info: GpuInfo) -> GpuSample:
        handle = self._handles[info.uuid]
        newest, new = self._device_util(info.uuid, handle)
        memory = self._optional("memory", lambda: self._memory_info(handle))
        procs = self._optional("running processes", lambda: self._processes(handle))
        samples = self._optional("process utilization", lambda: self._util(info.uuid, handle)) or ()
        return GpuSample(
            uuid=info.uuid,
            index=info.index,
            utilization_gpu=newest,
            memory_used=None if memory is None else int(memory.used),
            memory_total=None if memory is None else int(memory.total),
            processes=procs or {},
            process_util=_mean_by_pid(samples),
            util_samples=samples,
            utilization_new=new,
        )

    def _device_util(self, uuid: str, handle: Any) -> tuple[int | None, float | None]:
        """The device's utilization: its newest period's percent, and the
        mean over the periods that ended since the last call (None: none).

        From the driver's sample buffer (nvmlDeviceGetSamples), one sample
        per period, each period counted once. nvmlDeviceGetUtilizationRates
        is not used where the buffer is: on an H200 (driver 580) it covers
        only about 100 ms of each 200 ms period, so a load paced in a cycle
        near the period reads anything from 0 to 100 % (a 100 ms on / 100 ms
        off loop read 1-18 %, the buffer 46-49; docs/compute.md, "NVML's
        device figure"). A driver without the buffer: the rate, each call."""
        seen = self._device_seen.get(uuid)
        if seen is not None:
            try:
                since = seen[0]
                taken = self._optional("nvmlDeviceGetSamples", lambda: self._samples(handle, since))
            except _NoSampleBuffer:
                del self._device_seen[uuid]  # the rate, from now on
            else:
                new = [(t, v) for t, v in taken or () if t > seen[0]]
                if not new:  # no period ended since; or the call failed (warned once)
                    return seen[1], None
                self._device_seen[uuid] = new[-1]
                return new[-1][1], sum(v for _, v in new) / len(new)
        nv = self._nvml
        util = self._optional(
            "nvmlDeviceGetUtilizationRates", lambda: nv.nvmlDeviceGetUtilizationRates(handle)
        )
        figure = None if util is None else int(util.gpu)
        return figure, figure

    def _samples(self, handle: Any, since_us: int) -> list[tuple[int, int]]:
        """The device utilization samples stamped after ``since_us``, oldest
        first; _NoSampleBuffer where the driver keeps none (logged once)."""
        try:
            _, samples = self._nvml.nvmlDeviceGetSamples(
                handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since_us
            )
        except pynvml.NVMLError as err:
            if _code(err) == pynvml.NVML_ERROR_NOT_FOUND:
                return []  # no period ended since
            if _code(err) in _UNAVAILABLE_CODES:
                self._log_missing("nvmlDeviceGetSamples", err)
                raise _NoSampleBuffer from err
            raise
        return sorted((int(s.timeStamp), int(s.sampleValue.uiVal)) for s in samples)

    def _memory_info(self, handle: Any) -> Any:
        return self._versioned(
            "memory",
            [
                (
                    "nvmlDeviceGetMemoryInfo(v2)",
                    lambda: self._nvml.nvmlDeviceGetMemoryInfo(
                        handle, version=pynvml.nvmlMemory_v2
                    ),
                ),
                ("nvmlDeviceGetMemoryInfo", lambda: self._nvml.nvmlDeviceGetMemoryInfo(handle)),
            ],
        )

    def _processes(self, handle: Any) -> dict[int, int | None]:
        procs = self._versioned(
            "running processes",
            [(name, self._process_query(name, handle)) for name in _RUNNING_PROCESSES],
        )
        return {} if procs is None else procs

    def _process_query(self, name: str, handle: Any) -> Callable[[], dict[int, int | None]]:
        def query() -> dict[int, int | None]:
            # Looked up at each call (pynvml caches it): FUNCTION_NOT_FOUND
            # then reaches _versioned as the driver's own answer would.
            fn = self._nvml._nvmlGetFunctionPointer(name)
            code, records = self._process_array.read(
                lambda count, buffer: fn(handle, count, buffer), _SAMPLE_RETRIES
            )
            if code != SUCCESS:
                raise pynvml.NVMLError(code)
            procs: dict[int, int | None] = dict(records)
            if VALUE_NOT_AVAILABLE in procs.values():  # Windows WDDM: not the driver's to say
                procs = {
                    pid: None if used == VALUE_NOT_AVAILABLE else used
                    for pid, used in procs.items()
                }
            return procs

        return query

    def _util(self, uuid: str, handle: Any) -> tuple[UtilSample, ...]:
        cursor = self._util_cursors.setdefault(uuid, _UtilCursor(0))
        since = ctypes.c_ulonglong(cursor.since())
        fn = self._nvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
        code, records = self._util_array.read(
            lambda count, buffer: fn(handle, buffer, count, since), _SAMPLE_RETRIES
        )
        if code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INSUFFICIENT_SIZE):
            return ()  # no sample newer than since; or the list kept growing
        if code != SUCCESS:
            raise pynvml.NVMLError(code)
        return cursor.take(UtilSample(pid, stamp, sm) for pid, stamp, sm in records)

    # error mapping: the one place NVML errors become values

    def _optional(self, name: str, fn: Callable[[], T]) -> T | None:
        """A figure the driver may lack or fail to give: None, logged once per
        cause. "GPU is lost" is not swallowed: the caller marks the device."""
        try:
            return fn()
        except pynvml.NVMLError as err:
            if _code(err) == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise
            if _code(err) in _UNAVAILABLE_CODES:
                self._log_missing(name, err)
            elif (name, _code(err)) not in self._logged_failures:
                self._logged_failures.add((name, _code(err)))
                log.warning(
                    "NVML call failed: figure reported as not available", call=name, error=str(err)
                )
            return None

    def _versioned(self, what: str, variants: Sequence[tuple[str, Callable[[], T]]]) -> T | None:
        """Probe versioned variants once, newest first; keep the one that works.

        None when the driver has none of them (logged once)."""
        if what in self._choices:
            chosen = self._choices[what]
            return None if chosen is None else dict(variants)[chosen]()
        for name, fn in variants:
            try:
                result = fn()
            except pynvml.NVMLError as err:
                if _code(err) in _TRY_OLDER_CODES:
                    self._log_missing(name, err)
                    continue
                raise
            self._choices[what] = name
            return result
        self._choices[what] = None
        return None

    def _log_missing(self, name: str, err: BaseException) -> None:
        if name not in self._logged_missing:
            self._logged_missing.add(name)
            log.info(
                "NVML call not available: figure reported as not available",
                call=name,
                error=str(err),
            )

    # health

    def _watch_health(self) -> None:
        name_this_thread("vgpud-health")
        nv = self._nvml
        try:
            event_set = nv.nvmlEventSetCreate()
        except pynvml.NVMLError as err:
            self._log_missing("nvmlEventSetCreate", err)
            return
        by_handle: dict[int | None, str] = {}
        for uuid, handle in self._handles.items():
            try:
                nv.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                by_handle[_handle_key(handle)] = uuid
            except pynvml.NVMLError as err:
                self._log_missing(f"Xid events on {uuid}", err)
        try:
            while by_handle and not self._stop.is_set():
                try:
                    data = nv.nvmlEventSetWait_v2(event_set, HEALTH_WAIT_MS)
                except pynvml.NVMLError as err:
                    if _code(err) == pynvml.NVML_ERROR_TIMEOUT:
                        continue
                    log.warning("NVML event wait failed, health watching stops", error=str(err))
                    return
                source = by_handle.get(_handle_key(data.device))
                if source is not None and data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    self._on_xid(source, int(data.eventData))
        finally:
            try:
                nv.nvmlEventSetFree(event_set)
            except pynvml.NVMLError as err:
                log.debug("nvmlEventSetFree failed", error=str(err))

    def _on_xid(self, uuid: str, xid: int) -> None:
        if xid in APPLICATION_XIDS:
            self._emit(HealthEvent(uuid, "xid", xid, False, f"Xid {xid} (application error)"))
        else:
            self._mark_unhealthy(uuid, "xid", xid, f"Xid {xid}")

    def _mark_unhealthy(self, uuid: str, kind: str, xid: int | None, reason: str) -> None:
        with self._lock:
            was_healthy = any(d.uuid == uuid and d.healthy for d in self._devices)
            self._devices = [
                replace(d, healthy=False, health_reason=reason) if d.uuid == uuid else d
                for d in self._devices
            ]
        if was_healthy:
            log.error("GPU marked unhealthy", gpu=uuid, reason=reason)
            self._emit(HealthEvent(uuid, kind, xid, True, reason))

    def _emit(self, event: HealthEvent) -> None:
        if self._on_health is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._on_health, event)

    def _shutdown_sync(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            log.debug("nvmlShutdown failed", error=str(err))


class NullNvml:
    """No driver: no devices, empty samples; the daemon runs on regardless."""

    available = False
    driver_version: str | None = None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def devices(self) -> list[GpuInfo]:
        return []

    def topology(self, uuid_a: str, uuid_b: str) -> TopologyLevel | None:
        return None

    async def sample(self) -> NvmlSample:
        return NvmlSample(monotonic=time.monotonic())

    def sample_soon(self) -> Future[tuple[NvmlSample, float]]:
        done: Future[tuple[NvmlSample, float]] = Future()
        done.set_result((NvmlSample(monotonic=time.monotonic()), 0.0))
        return done


async def open_nvml(
    library_path: str | None = None, on_health: HealthCallback | None = None
) -> GpuGateway:
    gateway = NvmlGateway(library_path, on_health)
    try:
        await gateway.start()
    except NvmlUnavailable as err:
        log.warning("no NVML, running without GPU data", reason=str(err))
        await gateway.close()
        return NullNvml()
    return gateway


def _mean_by_pid(samples: Sequence[UtilSample]) -> dict[int, float]:
    sums: dict[int, list[int]] = {}
    for s in samples:
        sums.setdefault(s.pid, []).append(s.sm_util)
    return {pid: sum(v) / len(v) for pid, v in sums.items()}


def _handle_key(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
