"""The simulated libnvidia-ml.so.1 seen through pynvml, as the daemon sees it.

pynvml loads "libnvidia-ml.so.1" by name, so every query runs in a child
Python with the ``sim_env`` environment; workloads are build/vgpu-burn.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import BUILD

BURN = str(BUILD / "vgpu-burn")
SIMCTL = str(BUILD / "vgpu-simctl")
MIB = 1 << 20

# Preamble of every NVML script: pynvml, ctypes, and a JSON printer.
PRELUDE = """
import ctypes, json, sys, time
import pynvml as n
def out(value):
    print(json.dumps(value), flush=True)
"""


def nvml(env: dict[str, str], script: str) -> Any:
    """Run an NVML script against the machine of ``env``; its last line of JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def wait_for(condition: Callable[[], Any], timeout: float = 15.0) -> Any:
    """Poll until condition() is truthy; its value, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.fixture
def burns(sim_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start vgpu-burn processes on the simulated machine; killed at teardown."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [BURN, *args], env=sim_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


PROCESSES = """
h = n.nvmlDeviceGetHandleByIndex(0)
mem = n.nvmlDeviceGetMemoryInfo(h)
out({"procs": {p.pid: p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(h)},
     "used": mem.used, "free": mem.free, "total": mem.total})
"""


def processes(env: dict[str, str]) -> dict[str, Any]:
    result: dict[str, Any] = nvml(env, "n.nvmlInit()\n" + PROCESSES)
    result["procs"] = {int(pid): used for pid, used in result["procs"].items()}
    return result


def test_identity_follows_config(sim_env: dict[str, str]) -> None:
    sim_env.update(VGPU_SIM_DEVICES="4", VGPU_SIM_MEMORY="2g", VGPU_SIM_SMS="8", VGPU_SIM_MIG="2")
    got = nvml(
        sim_env,
        """
n.nvmlInit()
hs = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
topo = lambda a, b: n.nvmlDeviceGetTopologyCommonAncestor(hs[a], hs[b])
out({
    "count": len(hs),
    "driver": n.nvmlSystemGetDriverVersion(),
    "cuda": n.nvmlSystemGetCudaDriverVersion(),
    "names": [n.nvmlDeviceGetName(h) for h in hs],
    "uuids": [n.nvmlDeviceGetUUID(h) for h in hs],
    "by_uuid": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(hs[3]))),
    "bus": n.nvmlDeviceGetPciInfo(hs[2]).busId,
    "by_bus": n.nvmlDeviceGetIndex(
        n.nvmlDeviceGetHandleByPciBusId(n.nvmlDeviceGetPciInfo(hs[2]).busId)),
    "total": n.nvmlDeviceGetMemoryInfo(hs[1]).total,
    "sms": n.nvmlDeviceGetAttributes(hs[0]).multiprocessorCount,
    "capability": n.nvmlDeviceGetCudaComputeCapability(hs[3]),
    "mig": [n.nvmlDeviceGetMigMode(h)[0] for h in hs],
    "topology": [topo(0, 1), topo(2, 3), topo(1, 2), topo(0, 0)],
})
""",
    )
    assert got["count"] == 4
    assert "sim" in got["driver"] and got["cuda"] == 13000
    assert got["names"] == ["vgpud simulated GPU"] * 4
    assert got["uuids"][3] == "GPU-5117a000-0000-4000-8000-000000000003"
    assert got["by_uuid"] == 3
    assert got["bus"] == "00000000:03:00.0" and got["by_bus"] == 2
    assert got["total"] == 2 << 30 and got["sms"] == 8
    assert got["capability"] == [9, 0]  # what the simulated CUDA driver says
    assert got["mig"] == [0, 0, 1, 0]
    assert got["topology"] == [10, 10, 40, 0]  # SINGLE, SINGLE, NODE, INTERNAL


def test_process_memory_shows_and_goes_with_sigkill(
    sim_env: dict[str, str], burns: Callable[..., subprocess.Popen[str]]
) -> None:
    sim_env["VGPU_SIM_CTX_OVERHEAD"] = "32m"
    burn = burns("--alloc", "256m", "--hold", "--seconds", "600", "--duty", "0.01")
    seen = wait_for(lambda: (p := processes(sim_env))["procs"].get(burn.pid) and p)
    assert seen["procs"][burn.pid] == (256 + 32) * MIB
    assert seen["used"] == (256 + 32) * MIB
    assert seen["free"] == seen["total"] - seen["used"]

    os.kill(burn.pid, signal.SIGKILL)
    gone = wait_for(lambda: (p := processes(sim_env))["used"] == 0 and p)
    assert burn.pid not in gone["procs"]


def test_a_process_listed_before_is_gone_at_the_first_query_after_its_exit(
    sim_env: dict[str, str], burns: Callable[..., subprocess.Popen[str]]
) -> None:
    """One NVML client asks again and again, as the daemon does: it
    remembers the owners it found alive, and must still see an exit at
    once, not a query later."""
    burn = burns("--alloc", "64m", "--hold", "--seconds", "600", "--duty", "0.01")
    wait_for(lambda: burn.pid in processes(sim_env)["procs"])
    client = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PRELUDE
            + "n.nvmlInit()\nwhile sys.stdin.readline():"
            + PROCESSES.replace("\n", "\n    "),
        ],
        env=sim_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert client.stdin is not None and client.stdout is not None

    def ask() -> dict[str, Any]:
        client.stdin.write("\n")  # type: ignore[union-attr]
        client.stdin.flush()  # type: ignore[union-attr]
        return json.loads(client.stdout.readline())  # type: ignore[union-attr, no-any-return]

    try:
        for _ in range(3):
            assert str(burn.pid) in ask()["procs"]
        burn.kill()
        burn.wait()
        after = ask()
        assert str(burn.pid) not in after["procs"] and after["used"] == 0
    finally:
        client.kill()
        client.wait()


def test_list_protocol_reports_needed_size(
    sim_env: dict[str, str], burns: Callable[..., subprocess.Popen[str]]
) -> None:
    first = burns("--alloc", "64m", "--hold", "--seconds", "600", "--duty", "0.01")
    second = burns("--alloc", "64m", "--hold", "--seconds", "600", "--duty", "0.01")
    wait_for(lambda: {first.pid, second.pid} <= set(processes(sim_env)["procs"]))
    got = nvml(
        sim_env,
        """
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
fn = n.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3
count = ctypes.c_uint(0)
empty = fn(h, ctypes.byref(count), None)
needed = count.value
short = (n.c_nvmlProcessInfo_v3_t * 1)()
count.value = 1
too_small = fn(h, ctypes.byref(count), short)
count_after_short = count.value
full = (n.c_nvmlProcessInfo_v3_t * needed)()
count.value = needed
ok = fn(h, ctypes.byref(count), full)
gfx = ctypes.c_uint(5)
graphics = n.nvmlLib.nvmlDeviceGetGraphicsRunningProcesses_v3(h, ctypes.byref(gfx), None)
pids = sorted(p.pid for p in full)
out([empty, needed, too_small, count_after_short, ok, pids, graphics, gfx.value])
""",
    )
    insufficient = 7
    assert got[:5] == [insufficient, 2, insufficient, 2, 0]
    assert got[5] == sorted([first.pid, second.pid])
    assert got[6:] == [0, 0]


UTILIZATION = """
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
samples = []
end = time.monotonic() + 1.2
while time.monotonic() < end:
    samples.append(n.nvmlDeviceGetUtilizationRates(h).gpu)
    time.sleep(0.1)
out(sum(samples) / len(samples))
"""


def test_device_utilization_follows_duty(
    sim_env: dict[str, str], burns: Callable[..., subprocess.Popen[str]]
) -> None:
    burn = burns("--duty", "0.3", "--kernel-us", "2000", "--seconds", "30")
    wait_for(lambda: burn.pid in processes(sim_env)["procs"])
    assert 20 <= nvml(sim_env, UTILIZATION) <= 40


DEVICE_SAMPLES = """
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
time.sleep(2.0)  # whole 200 ms periods of the duty cycle
kind, everything = n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES, 0)
stamps = [s.timeStamp for s in everything]
newer = []
while not newer:  # the next period's end brings one sample, after the newest
    time.sleep(0.05)
    try:
        newer = n.nvmlDeviceGetSamples(h, n.NVML_GPU_UTILIZATION_SAMPLES, max(stamps))[1]
    except n.NVMLError_NotFound:
        pass
fn = n.nvmlLib.nvmlDeviceGetSamples
kind_out, count = ctypes.c_int(0), ctypes.c_uint(0)
future = fn(h, 1, ctypes.c_ulonglong(max(stamps) + 60_000_000), ctypes.byref(kind_out),
            ctypes.byref(count), None)
power = fn(h, 0, ctypes.c_ulonglong(0), ctypes.byref(kind_out), ctypes.byref(count), None)
out({"kind": kind, "stamps": stamps, "values": [s.sampleValue.uiVal for s in everything],
     "newer": [(s.timeStamp, s.sampleValue.uiVal) for s in newer], "codes": [future, power]})
"""


def test_device_samples_are_each_period_busy_share(
    sim_env: dict[str, str], burns: Callable[..., subprocess.Popen[str]]
) -> None:
    """nvmlDeviceGetSamples(GPU utilization): one sample per 200 ms period,
    stamped with its end, its busy share; only periods newer than asked. The
    daemon and the tests' yardstick read device utilization from it
    (docs/compute.md, "NVML's device figure")."""
    burn = burns("--duty", "0.3", "--kernel-us", "2000", "--seconds", "30")
    wait_for(lambda: burn.pid in processes(sim_env)["procs"])
    got = nvml(sim_env, DEVICE_SAMPLES)
    period_us = 200_000
    stamps = got["stamps"]
    assert got["kind"] == 1  # NVML_VALUE_TYPE_UNSIGNED_INT
    assert all(t % period_us == 0 for t in stamps)
    assert all(b - a == period_us for a, b in itertools.pairwise(stamps))
    assert len(got["newer"]) == 1 and got["newer"][0][0] == max(stamps) + period_us
    # The last whole periods (the burn ran through them) read its duty.
    recent = got["values"][-5:]
    assert all(20 <= v <= 40 for v in recent), got["values"]
    assert got["codes"] == [6, 3]  # nothing newer: NOT_FOUND; power: NOT_SUPPORTED


SAMPLES = """
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
def samples(last):
    # A sample that lands between pynvml's two calls makes the second too
    # small: ask again, as the daemon does (vgpud/observe/nvml.py).
    for _ in range(8):
        try:
            got = n.nvmlDeviceGetProcessUtilization(h, last)
            return [(s.pid, s.timeStamp, s.smUtil) for s in got]
        except n.NVMLError_NotFound:
            return []
        except n.NVMLError_InsufficientSize:
            continue
    raise RuntimeError("the samples kept growing between the two calls")
"""


def test_process_samples_follow_last_seen_protocol(
    sim_env: dict[str, str], burns: Callable[..., subprocess.Popen[str]]
) -> None:
    first = burns("--seconds", "30")
    second = burns("--seconds", "30")
    wait_for(lambda: {first.pid, second.pid} <= set(processes(sim_env)["procs"]))
    got = nvml(
        sim_env,
        SAMPLES
        + """
time.sleep(1.0)  # let whole 200 ms periods pass with both processes running
everything = samples(0)
latest = max(t for _, t, _ in everything)
newer = []
while not newer:  # the next period end brings new samples, all after latest
    time.sleep(0.05)
    newer = samples(latest)
fn = n.nvmlLib.nvmlDeviceGetProcessUtilization
count = ctypes.c_uint(0)
sizing = fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(0))
needed = count.value
count.value = 1
short = (n.c_nvmlProcessUtilizationSample_t * 1)()
too_small = fn(h, short, ctypes.byref(count), ctypes.c_ulonglong(0))
future = fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(latest + 60_000_000))
out({"all": everything, "latest": latest, "newer": newer,
     "codes": [sizing, needed >= 2, too_small, future]})
""",
    )
    period_us = 200_000
    assert all(t % period_us == 0 for _, t, _ in got["all"] + got["newer"])
    assert {first.pid, second.pid} <= {pid for pid, _, _ in got["all"]}
    assert all(t > got["latest"] for _, t, _ in got["newer"])
    # Two burns at duty 1.0 share the device: over the periods in which both
    # ran all along (all but the first), each had about half of it.
    samples = got["all"] + got["newer"]
    full = sorted({t for _, t, _ in samples})[1:]
    for pid in (first.pid, second.pid):
        shares = [u for p, t, u in samples if p == pid and t in full]
        assert shares and 35 <= sum(shares) / len(shares) <= 65, samples
    assert got["codes"] == [7, True, 7, 6]  # INSUFFICIENT_SIZE, ..., NOT_FOUND


def test_xid_events_and_lost_gpus(sim_env: dict[str, str]) -> None:
    waiter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PRELUDE
            + """
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(1)
es = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
print("ready", flush=True)
e = n.nvmlEventSetWait_v2(es, 20000)
out([n.nvmlDeviceGetIndex(e.device), e.eventType, e.eventData])
""",
        ],
        env=sim_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiter.stdout is not None
    assert waiter.stdout.readline().strip() == "ready"
    subprocess.run([SIMCTL, "xid", "1", "79"], env=sim_env, check=True)
    stdout, stderr = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, stderr
    assert json.loads(stdout) == [1, 8, 79]  # device 1, XID_CRITICAL_ERROR, Xid 79

    subprocess.run([SIMCTL, "lost", "1", "on"], env=sim_env, check=True)
    lost = nvml(
        sim_env,
        """
n.nvmlInit()
def memory(i):
    try:
        return n.nvmlDeviceGetMemoryInfo(n.nvmlDeviceGetHandleByIndex(i)).total > 0
    except n.NVMLError as e:
        return str(e)
out([memory(0), memory(1)])
""",
    )
    assert lost == [True, "GPU is lost"]


def test_bad_config_fails_init_with_a_message(sim_env: dict[str, str]) -> None:
    sim_env["VGPU_SIM_MEMORY"] = "lots"
    proc = subprocess.run(
        [sys.executable, "-c", "import pynvml as n; n.nvmlInit()"],
        env=sim_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "VGPU_SIM_MEMORY='lots'" in proc.stderr
    assert "Driver Not Loaded" in proc.stderr
