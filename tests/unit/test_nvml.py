"""NvmlGateway against a fake binding: degrading, probing, sampling, health."""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import AsyncIterator, Sequence
from types import SimpleNamespace
from typing import Any

import pynvml  # only to raise the binding's own errors, as the real one does
import pytest
import structlog

from vgpud.observe.nvml import (
    APPLICATION_XIDS,
    UTIL_LOOKBACK_US,
    HealthEvent,
    NullNvml,
    NvmlGateway,
    NvmlUnavailable,
    TopologyLevel,
    open_nvml,
)

UUIDS = ["GPU-aaaa", "GPU-bbbb"]
GIB = 1 << 30


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


# The C signatures of the array queries the gateway calls in place.
_ProcessesFn = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p
)
_UtilizationFn = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint),
    ctypes.c_ulonglong,
)


def fill_array(records: Sequence[ctypes.Structure], count: Any, buffer: int | None) -> int:
    """NVML's array protocol: too small a buffer (or none) is answered
    INSUFFICIENT_SIZE with the count needed; an empty answer is a success."""
    if records and (buffer is None or count[0] < len(records)):
        count[0] = len(records)
        return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, record in enumerate(records):
        assert buffer is not None
        ctypes.memmove(
            buffer + i * ctypes.sizeof(record), ctypes.addressof(record), ctypes.sizeof(record)
        )
    count[0] = len(records)
    return int(pynvml.NVML_SUCCESS)


class FakeNvml:
    """The subset of pynvml the gateway calls, with switches for failures."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.missing: set[str] = set()  # functions the "driver" lacks
        self.failing: dict[str, int] = {}  # function -> error code it returns
        self.lost: set[int] = set()  # device handles that are lost
        self.procs: dict[int, list[tuple[int, int | None]]] = {1: [], 2: []}
        self.util_samples: dict[int, list[tuple[int, int, int]]] = {1: [], 2: []}
        self.device_samples: dict[int, list[tuple[int, int]]] = {1: [], 2: []}  # (stamp, %)
        self.insufficient_once = False
        self.lists_outgrow_buffers = False  # each answer: more processes than the buffer holds
        self.pending_events: list[SimpleNamespace] = []
        self.posted = threading.Event()
        self.registered: list[int] = []
        self.array_capacities: list[int] = []  # the buffer sizes the array queries were given
        # Kept referenced: ctypes frees a callback's thunk with its object.
        self._c_functions = {
            "nvmlDeviceGetComputeRunningProcesses_v3": _ProcessesFn(self._processes_v3),
            "nvmlDeviceGetComputeRunningProcesses_v2": _ProcessesFn(self._processes_v2),
            "nvmlDeviceGetProcessUtilization": _UtilizationFn(self._process_utilization),
        }

    def _enter(self, name: str, handle: int | None = None) -> None:
        self.calls.append(name)
        if name in self.missing:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if name in self.failing:
            raise nvml_error(self.failing[name])
        if handle in self.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.0-fake"

    def nvmlDeviceGetCount(self) -> int:
        return len(UUIDS)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index + 1  # handles are non-null pointers

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return UUIDS[handle - 1].encode()

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "Fake H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo", handle)
        used = sum(b or 0 for _, b in self.procs[handle])
        return SimpleNamespace(total=80 * GIB, used=used)

    def nvmlDeviceGetAttributes(self, handle: int) -> Any:
        self._enter("nvmlDeviceGetAttributes")
        return SimpleNamespace(multiprocessorCount=132)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        self._enter("nvmlDeviceGetCudaComputeCapability")
        return (9, 0)

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        return [1 if handle == 2 else 0, 0]

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        return SimpleNamespace(busId=f"00000000:0{handle}:00.0".encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return int(pynvml.NVML_TOPOLOGY_SINGLE)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=40 + handle, memory=0)

    def nvmlDeviceGetSamples(self, handle: int, kind: int, last_seen: int) -> Any:
        self._enter("nvmlDeviceGetSamples", handle)
        assert kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        newer = [
            SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=v))
            for t, v in self.device_samples[handle]
            if t > last_seen
        ]
        if not newer:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, newer

    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        """pynvml's lookup of a C function (a symbol the driver lacks is
        FUNCTION_NOT_FOUND): the gateway calls the array queries in place."""
        if name in self.missing:
            self.calls.append(name)
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._c_functions[name]

    def _processes(self, name: str, handle: int, count: Any, buffer: int | None) -> int:
        try:
            self._enter(name, handle)
        except pynvml.NVMLError as err:
            return int(err.value)
        self.array_capacities.append(count[0])
        if self.lists_outgrow_buffers:
            count[0] += 1
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        # pynvml's own declaration of the header's struct, not the gateway's.
        records = [
            pynvml.c_nvmlProcessInfo_v3_t(
                pid=p,
                usedGpuMemory=pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value if b is None else b,
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for p, b in self.procs[handle]
        ]
        return fill_array(records, count, buffer)

    def _processes_v3(self, handle: int, count: Any, buffer: int | None) -> int:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", handle, count, buffer)

    def _processes_v2(self, handle: int, count: Any, buffer: int | None) -> int:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, count, buffer)

    def _process_utilization(
        self, handle: int, buffer: int | None, count: Any, last_seen: int
    ) -> int:
        try:
            self._enter(f"nvmlDeviceGetProcessUtilization({last_seen})", handle)
        except pynvml.NVMLError as err:
            return int(err.value)
        newer = [
            pynvml.c_nvmlProcessUtilizationSample_t(
                pid=p, timeStamp=t, smUtil=u, memUtil=1, encUtil=2, decUtil=3
            )
            for p, t, u in self.util_samples[handle]
            if t > last_seen
        ]
        if not newer:
            return int(pynvml.NVML_ERROR_NOT_FOUND)
        if self.insufficient_once:  # a process appeared since the caller sized its buffer
            self.insufficient_once = False
            count[0] = max(count[0] + 1, len(newer))
            return int(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        return fill_array(newer, count, buffer)

    def nvmlEventSetCreate(self) -> str:
        self._enter("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: str) -> None:
        self._enter("nvmlDeviceRegisterEvents")
        self.registered.append(handle)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> Any:
        # Called on the health thread: hand out queued events, else time out
        # after a short wait, as the driver does (never spin).
        self.posted.wait(min(timeout_ms / 1000, 0.05))
        if self.pending_events:
            return self.pending_events.pop(0)
        self.posted.clear()
        raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.calls.append("nvmlEventSetFree")


def xid_event(handle: int, xid: int) -> SimpleNamespace:
    return SimpleNamespace(
        device=handle, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
    )


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


@pytest.fixture
async def events() -> asyncio.Queue[HealthEvent]:
    return asyncio.Queue()


@pytest.fixture
async def gateway(fake: FakeNvml, events: asyncio.Queue[HealthEvent]) -> AsyncIterator[NvmlGateway]:
    gw = NvmlGateway(on_health=events.put_nowait, binding=fake)
    await gw.start()
    yield gw
    await gw.close()


async def test_inventory(gateway: NvmlGateway) -> None:
    devices = gateway.devices()
    assert [(d.index, d.uuid, d.name, d.memory_total) for d in devices] == [
        (0, "GPU-aaaa", "Fake H200", 80 * GIB),
        (1, "GPU-bbbb", "Fake H200", 80 * GIB),
    ]
    assert [d.sms for d in devices] == [132, 132]
    assert [d.compute_capability for d in devices] == ["9.0", "9.0"]
    assert [d.mig_mode for d in devices] == [False, True]
    assert devices[1].pci_bus_id == "00000000:02:00.0"
    assert all(d.healthy for d in devices)
    assert gateway.driver_version == "580.0-fake"
    assert gateway.topology("GPU-aaaa", "GPU-bbbb") is TopologyLevel.SINGLE
    assert gateway.topology("GPU-bbbb", "GPU-aaaa") is TopologyLevel.SINGLE
    assert gateway.topology("GPU-aaaa", "GPU-aaaa") is TopologyLevel.INTERNAL
    assert gateway.topology("GPU-aaaa", "GPU-none") is None


async def test_missing_function_degrades_one_figure_and_is_logged_once(fake: FakeNvml) -> None:
    fake.failing["nvmlDeviceGetAttributes"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.missing.add("nvmlDeviceGetSamples")
    fake.missing.add("nvmlDeviceGetUtilizationRates")
    fake.missing.add("nvmlDeviceGetCudaComputeCapability")  # drivers before 450
    gw = NvmlGateway(binding=fake, read_sms=lambda library: {})  # nor does CUDA say
    with structlog.testing.capture_logs() as logs:
        await gw.start()
        first = await gw.sample()
        second = await gw.sample()
    await gw.close()
    assert [d.sms for d in gw.devices()] == [None, None]
    assert [d.compute_capability for d in gw.devices()] == [None, None]
    assert first.gpus["GPU-aaaa"].utilization_gpu is None
    assert second.gpus["GPU-aaaa"].memory_total == 80 * GIB  # the rest still comes
    missing = [e for e in logs if e.get("call") == "nvmlDeviceGetUtilizationRates"]
    assert len(missing) == 1


async def test_sm_counts_nvml_lacks_come_from_the_cuda_driver_by_uuid(fake: FakeNvml) -> None:
    fake.failing["nvmlDeviceGetAttributes"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    asked: list[str] = []

    def read_sms(library: str) -> dict[str, int]:
        asked.append(library)
        # CUDA's order differs from NVML's and it may show a GPU NVML does not.
        return {"GPU-other": 16, "GPU-bbbb": 132}

    gw = NvmlGateway(binding=fake, cuda_library="/lib/x/libcuda.so.1", read_sms=read_sms)
    await gw.start()
    await gw.sample()
    await gw.close()
    assert [d.sms for d in gw.devices()] == [None, 132]
    assert asked == ["/lib/x/libcuda.so.1"]  # once, at start


async def test_the_cuda_driver_is_not_asked_when_nvml_gives_sm_counts(fake: FakeNvml) -> None:
    def read_sms(library: str) -> dict[str, int]:
        raise AssertionError("the CUDA driver was asked")

    gw = NvmlGateway(binding=fake, read_sms=read_sms)
    await gw.start()
    await gw.close()
    assert [d.sms for d in gw.devices()] == [132, 132]


async def test_other_errors_give_none_and_one_warning(fake: FakeNvml) -> None:
    gw = NvmlGateway(binding=fake)
    await gw.start()
    fake.failing["nvmlDeviceGetSamples"] = pynvml.NVML_ERROR_UNKNOWN
    with structlog.testing.capture_logs() as logs:
        samples = [await gw.sample() for _ in range(3)]
    assert all(s.gpus["GPU-bbbb"].utilization_gpu is None for s in samples)
    assert len([e for e in logs if e["log_level"] == "warning"]) == 1
    # A failure is not a missing buffer: the samples are read again after it.
    del fake.failing["nvmlDeviceGetSamples"]
    fake.device_samples[2] = [(1 << 60, 35)]
    after = (await gw.sample()).gpus["GPU-bbbb"]
    await gw.close()
    assert (after.utilization_gpu, after.utilization_new) == (35, 35.0)
    assert "nvmlDeviceGetUtilizationRates" not in fake.calls


async def test_running_processes_probe_newest_first_once(fake: FakeNvml) -> None:
    fake.missing.add("nvmlDeviceGetComputeRunningProcesses_v3")
    fake.procs[1] = [(100, 2 * GIB), (101, None)]
    gw = NvmlGateway(binding=fake)
    await gw.start()
    first = await gw.sample()
    second = await gw.sample()
    await gw.close()
    assert first.gpus["GPU-aaaa"].processes == {100: 2 * GIB, 101: None}
    assert second.gpus["GPU-aaaa"].processes == first.gpus["GPU-aaaa"].processes
    assert fake.calls.count("nvmlDeviceGetComputeRunningProcesses_v3") == 1
    assert fake.calls.count("nvmlDeviceGetComputeRunningProcesses_v2") == 4  # 2 GPUs x 2
    assert first.memory_of(100) == {"GPU-aaaa": 2 * GIB}
    assert first.pids() == {100, 101}


async def test_a_long_process_list_grows_the_buffer_once(
    gateway: NvmlGateway, fake: FakeNvml
) -> None:
    fake.procs[1] = [(1000 + i, i << 20) for i in range(300)]
    fake.procs[2] = [(7, None), (8, 5)]
    first = await gateway.sample()
    assert first.gpus["GPU-aaaa"].processes == {1000 + i: i << 20 for i in range(300)}
    assert first.gpus["GPU-bbbb"].processes == {7: None, 8: 5}
    query = "nvmlDeviceGetComputeRunningProcesses_v3"
    assert fake.calls.count(query) == 3  # GPU 0 told "too small" once
    grown = fake.array_capacities[-1]
    assert grown >= 300
    fake.procs[1].pop()  # a shorter answer leaves nothing of the longer one behind
    second = await gateway.sample()
    assert second.gpus["GPU-aaaa"].processes == {1000 + i: i << 20 for i in range(299)}
    assert fake.calls.count(query) == 5  # one call per GPU: the buffer was kept
    assert fake.array_capacities[-2:] == [grown, grown]


async def test_a_list_that_outgrows_every_buffer_is_not_available(
    gateway: NvmlGateway, fake: FakeNvml
) -> None:
    fake.procs[1] = [(5, GIB)]
    fake.lists_outgrow_buffers = True
    with structlog.testing.capture_logs() as logs:
        sample = await gateway.sample()
    assert sample.gpus["GPU-aaaa"].processes == {}
    assert sample.gpus["GPU-aaaa"].memory_total == 80 * GIB  # the rest of the sample stands
    assert all(d.healthy for d in gateway.devices())
    assert [e["call"] for e in logs if e["log_level"] == "warning"] == ["running processes"]
    fake.lists_outgrow_buffers = False
    assert (await gateway.sample()).gpus["GPU-aaaa"].processes == {5: GIB}


async def test_memory_info_falls_back_to_v1(fake: FakeNvml) -> None:
    fake.failing["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    fake.procs[2] = [(7, GIB)]
    gw = NvmlGateway(binding=fake)
    await gw.start()
    sample = await gw.sample()
    await gw.close()
    assert (sample.gpus["GPU-bbbb"].memory_used, sample.gpus["GPU-bbbb"].memory_total) == (
        GIB,
        80 * GIB,
    )
    assert fake.calls.count("nvmlDeviceGetMemoryInfo_v2") == 1


async def test_device_utilization_counts_each_period_once(
    gateway: NvmlGateway, fake: FakeNvml
) -> None:
    """From the driver's sample buffer: the newest period's figure, and the
    mean of the periods that ended since the last sample (None when none
    did), each period once; not nvmlDeviceGetUtilizationRates, which on an
    H200 sees only part of each period (docs/compute.md)."""
    base = 1 << 60  # later than the gateway's start time, in microseconds
    fake.device_samples[1] = [(1_000, 99), (base + 200_000, 30), (base + 400_000, 50)]
    first = (await gateway.sample()).gpus["GPU-aaaa"]
    assert (first.utilization_gpu, first.utilization_new) == (50, 40.0)  # not the 99 before start
    second = (await gateway.sample()).gpus["GPU-aaaa"]
    assert (second.utilization_gpu, second.utilization_new) == (50, None)
    assert "nvmlDeviceGetSamples" in fake.calls
    fake.device_samples[1].append((base + 600_000, 90))
    third = (await gateway.sample()).gpus["GPU-aaaa"]
    assert (third.utilization_gpu, third.utilization_new) == (90, 90.0)
    assert "nvmlDeviceGetUtilizationRates" not in fake.calls


async def test_without_a_sample_buffer_the_rate_is_read_at_every_sample(fake: FakeNvml) -> None:
    fake.missing.add("nvmlDeviceGetSamples")
    gw = NvmlGateway(binding=fake)
    await gw.start()
    with structlog.testing.capture_logs() as logs:
        samples = [(await gw.sample()).gpus["GPU-aaaa"] for _ in range(3)]
    await gw.close()
    assert [(s.utilization_gpu, s.utilization_new) for s in samples] == [(41, 41.0)] * 3
    assert [e["call"] for e in logs if e.get("call")] == ["nvmlDeviceGetSamples"]
    # Asked once per GPU, then not again.
    assert fake.calls.count("nvmlDeviceGetSamples") == 2


async def test_process_utilization_follows_last_seen(gateway: NvmlGateway, fake: FakeNvml) -> None:
    base = 1 << 60  # later than the gateway's start time, in microseconds
    fake.util_samples[1] = [
        (100, base + 200_000, 30),
        (100, base + 400_000, 50),
        (101, base + 400_000, 10),
    ]
    first = (await gateway.sample()).gpus["GPU-aaaa"]
    assert first.process_util == {100: 40.0, 101: 10.0}
    assert [s.timestamp_us for s in first.util_samples] == [
        base + 200_000,
        base + 400_000,
        base + 400_000,
    ]
    # Nothing newer: NOT_FOUND is "no new sample", not an error.
    assert (await gateway.sample()).gpus["GPU-aaaa"].process_util == {}
    assert f"nvmlDeviceGetProcessUtilization({base + 400_000 - UTIL_LOOKBACK_US})" in fake.calls
    fake.util_samples[1].append((100, base + 600_000, 90))
    fake.insufficient_once = True  # a process appeared between size and data calls
    assert (await gateway.sample()).gpus["GPU-aaaa"].process_util == {100: 90.0}


async def test_processes_with_interleaved_stamps_are_each_reported_once(
    gateway: NvmlGateway, fake: FakeNvml
) -> None:
    # A driver stamps each process's sample when that process's period
    # ended: 101's sample, stamped before 100's newest, shows up later.
    base = 1 << 60
    fake.util_samples[1] = [(100, base + 500_000, 60)]
    first = (await gateway.sample()).gpus["GPU-aaaa"]
    assert first.process_util == {100: 60.0}
    fake.util_samples[1] += [(101, base + 400_000, 30), (100, base + 700_000, 70)]
    second = (await gateway.sample()).gpus["GPU-aaaa"]
    assert second.process_util == {101: 30.0, 100: 70.0}
    assert [(s.pid, s.timestamp_us) for s in second.util_samples] == [
        (101, base + 400_000),
        (100, base + 700_000),
    ]
    # The same answer again (the lookback re-asks for it): nothing is new.
    third = (await gateway.sample()).gpus["GPU-aaaa"]
    assert third.process_util == {}
    # A sample older than the lookback behind the newest is past: not asked for.
    fake.util_samples[1].append((102, base + 700_000 - UTIL_LOOKBACK_US, 10))
    assert (await gateway.sample()).gpus["GPU-aaaa"].process_util == {}


async def test_history_before_start_is_ignored(gateway: NvmlGateway, fake: FakeNvml) -> None:
    fake.util_samples[1] = [(100, 1_000, 99)]
    assert (await gateway.sample()).gpus["GPU-aaaa"].process_util == {}


async def test_lost_gpu_is_marked_and_reported_the_rest_goes_on(
    gateway: NvmlGateway, fake: FakeNvml, events: asyncio.Queue[HealthEvent]
) -> None:
    fake.lost.add(2)
    fake.procs[1] = [(5, GIB)]
    sample = await gateway.sample()
    assert list(sample.gpus) == ["GPU-aaaa"]
    assert sample.gpus["GPU-aaaa"].processes == {5: GIB}
    event = await asyncio.wait_for(events.get(), 5)
    assert (event.uuid, event.kind, event.critical) == ("GPU-bbbb", "gpu_lost", True)
    healthy = {d.uuid: d.healthy for d in gateway.devices()}
    assert healthy == {"GPU-aaaa": True, "GPU-bbbb": False}
    await gateway.sample()
    assert events.empty()  # reported once


async def test_xid_events(
    gateway: NvmlGateway, fake: FakeNvml, events: asyncio.Queue[HealthEvent]
) -> None:
    # The health thread registers both GPUs once it runs (not before the
    # gateway's start returns): wait for it, bounded.
    for _ in range(500):
        if len(fake.registered) == 2:
            break
        await asyncio.sleep(0.01)
    assert sorted(fake.registered) == [1, 2]
    app_xid = min(APPLICATION_XIDS)
    fake.pending_events += [xid_event(1, app_xid), xid_event(2, 79)]
    fake.posted.set()
    first = await asyncio.wait_for(events.get(), 5)
    second = await asyncio.wait_for(events.get(), 5)
    assert (first.uuid, first.xid, first.critical) == ("GPU-aaaa", app_xid, False)
    assert (second.uuid, second.xid, second.critical) == ("GPU-bbbb", 79, True)
    devices = {d.uuid: d for d in gateway.devices()}
    assert devices["GPU-aaaa"].healthy
    assert not devices["GPU-bbbb"].healthy and devices["GPU-bbbb"].health_reason == "Xid 79"


async def test_no_event_support_leaves_health_to_queries(fake: FakeNvml) -> None:
    fake.failing["nvmlEventSetCreate"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gw = NvmlGateway(binding=fake)
    await gw.start()
    assert len((await gw.sample()).gpus) == 2
    await gw.close()
    assert fake.calls[-1] == "nvmlShutdown"


async def test_init_failure_raises_unavailable(fake: FakeNvml) -> None:
    fake.failing["nvmlInit"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    gw = NvmlGateway(binding=fake)
    with pytest.raises(NvmlUnavailable, match="nvmlInit failed"):
        await gw.start()
    await gw.close()


async def test_open_nvml_without_a_library_is_null(tmp_path: Any) -> None:
    nvml = await open_nvml(library_path=str(tmp_path / "libnvidia-ml.so.1"))
    assert isinstance(nvml, NullNvml) and not nvml.available
    assert nvml.devices() == [] and (await nvml.sample()).gpus == {}
    assert nvml.topology("a", "b") is None
    await nvml.close()
