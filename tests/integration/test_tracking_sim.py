"""The NVML gateway, tracker and backstop against the simulated GPU.

Each scenario runs in a subprocess with the simulator's environment: the
gateway loads build/sim/libnvidia-ml.so.1 by explicit path (as ``vgpud
--sim`` does), and pynvml's process-wide state stays out of pytest's.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.cgroup import Cgroup
from tests.fixtures.hook import FakeVgpu, MappedSleepers
from tests.fixtures.simgpu import BYPASS, SCAN, SIM_CUDA, SIM_GPU0, SIM_NVML, run_json

GIB = 1 << 30
SIM_GPU1 = "GPU-5117a000-0000-4000-8000-000000000001"

pytestmark = pytest.mark.skipif(
    not (SIM_NVML.exists() and SIM_CUDA.exists()), reason="simulator not built (make sim)"
)

# Opens the gateway on the simulator, injects health trouble through the
# simulator's control entry points, and prints what the gateway reported.
HEALTH = f"""
import asyncio, ctypes, json
from vgpud.observe.nvml import open_nvml
async def main():
    events = asyncio.Queue()
    gw = await open_nvml({str(SIM_NVML)!r}, on_health=events.put_nowait)
    sim = ctypes.CDLL({str(SIM_NVML)!r})
    first = await gw.sample()
    sim.vgpuSimInjectXid(0, 13)   # an application's fault
    sim.vgpuSimInjectXid(1, 79)   # the GPU fell off the bus
    got = [await asyncio.wait_for(events.get(), 30) for _ in range(2)]
    sim.vgpuSimSetLost(0, 1)
    after = await gw.sample()
    got.append(await asyncio.wait_for(events.get(), 30))
    print(json.dumps({{
        "type": type(gw).__name__,
        "driver": gw.driver_version,
        "devices": [[d.uuid, d.sms, d.memory_total, d.healthy] for d in gw.devices()],
        "topology": int(gw.topology(gw.devices()[0].uuid, gw.devices()[1].uuid)),
        "first": sorted(first.gpus),
        "after": sorted(after.gpus),
        "events": [[e.uuid, e.kind, e.xid, e.critical] for e in got],
    }}))
    await gw.close()
asyncio.run(main())
"""


def test_gateway_on_the_simulator_inventory_and_health(sim_env: dict[str, str]) -> None:
    (out,) = run_json(HEALTH, sim_env)
    assert out["type"] == "NvmlGateway" and "sim" in out["driver"]
    assert [d[0] for d in out["devices"]] == [SIM_GPU0, SIM_GPU1]
    assert all(d[1] and d[1] > 0 and d[2] > 0 for d in out["devices"])
    assert out["topology"] == 10  # NVML_TOPOLOGY_SINGLE: the simulator pairs 0-1
    assert out["first"] == [SIM_GPU0, SIM_GPU1]
    assert out["events"] == [
        [SIM_GPU0, "xid", 13, False],
        [SIM_GPU1, "xid", 79, True],
        [SIM_GPU0, "gpu_lost", None, True],
    ]
    assert out["after"] == []  # one lost by NVML, one retired by its Xid
    assert [d[3] for d in out["devices"]] == [False, False]


HOLDER = """
import sys
from tests.fixtures.hook import FakeHook
hook = FakeHook(sys.argv[1])  # kept mapped, as the hook keeps its block
hook.claim_self(0, {0: int(sys.argv[2])})
print("claimed", flush=True)
sys.stdin.read()
"""


@pytest.mark.root
@pytest.mark.parametrize("action", ["report", "kill"])
def test_process_bypassing_the_hook_is_caught_by_nvml(
    sim_env: dict[str, str], tmp_path: Path, cgroup: Cgroup, action: str
) -> None:
    """A vGPU of 1 GiB: its hooked process holds 256 MiB by the block; a
    second process in the same cgroup allocates 2 GiB on the simulated GPU
    without the hook. NVML sees it, the tracker charges it to the vGPU by
    its cgroup, the backstop reports it and, with "kill", kills it."""
    vgpu = FakeVgpu(tmp_path / "v1", "v1", (GIB,), uuids=(SIM_GPU0,))
    env = dict(sim_env, PYTHONPATH=str(ROOT))
    procs: list[subprocess.Popen[str]] = []
    try:
        for code, arg in ((HOLDER, str(vgpu.usage.path)), (BYPASS, str(2 * GIB))):
            extra = [str(256 << 20)] if code is HOLDER else []
            p = subprocess.Popen(
                [sys.executable, "-c", code, arg, *extra],
                env=env,
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() in ("claimed", "allocated")
            cgroup.add(p.pid)
        holder, bypass = procs
        scans = run_json(SCAN, sim_env, str(tmp_path / "v1"), action, "3")
        assert sorted(scans[0]["pids"]) == sorted([holder.pid, bypass.pid])
        assert scans[0]["nvml_used"] >= 2 * GIB  # the bypass's bytes, plus its context
        assert scans[0]["hooked"] == 256 << 20
        assert scans[0]["events"] == [["over_limit", bypass.pid]]
        if action == "kill":
            assert scans[1]["events"] == [["killed", bypass.pid]]
            assert bypass.wait(timeout=30) == -signal.SIGKILL
        else:
            assert all(s["events"] == [] for s in scans[1:])
            assert bypass.poll() is None
        assert holder.poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()
        vgpu.close()


# Samples the simulator twice and prints each sample's running processes
# on the first GPU (pid -> bytes).
LISTED = f"""
import asyncio, json
from vgpud.observe.nvml import open_nvml
async def main():
    gw = await open_nvml({str(SIM_NVML)!r})
    for _ in range(2):
        print(json.dumps((await gw.sample()).gpus[{SIM_GPU0!r}].processes), flush=True)
    await gw.close()
asyncio.run(main())
"""


def test_gateway_reads_every_process_the_simulator_lists(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    """More processes than the gateway's first buffer holds (64): NVML's
    "too small" answer grows it, and every pid and byte count comes through
    the C array as the simulator wrote it."""
    sim_env.update(VGPU_SIM_MEMORY="8g", VGPU_SIM_CTX_OVERHEAD="3m")
    block = tmp_path / "block"
    block.write_bytes(bytes(4096))  # MappedSleepers maps one; its content is not read here
    sleepers = MappedSleepers([(block, 150)], gpus=[0], env=sim_env)
    try:
        samples = run_json(LISTED, sim_env)
    finally:
        sleepers.close()
    expected = {str(pid): (1 + 3) << 20 for pid in sleepers.pids}  # 1 MiB and the context
    assert samples == [expected, expected]
