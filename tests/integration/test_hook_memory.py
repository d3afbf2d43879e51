"""Memory enforcement through the hook, on the simulated GPU.

Every allocation path is charged against the limit and given back by its
own free; over the limit every path answers CUDA_ERROR_OUT_OF_MEMORY with
one warning line and a count; the process sees its slice (cuMemGetInfo,
cuDeviceTotalMem, NVML); limits change live; oversubscription serves what
the device cannot hold from host memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.memprobe import InteractiveProbe, MiB, hooked, probe
from vgpud.vgpus.blocks import ControlBlock, DeviceSlice, UsageBlock

GPU0 = "GPU-5117a000-0000-4000-8000-000000000000"
LIMIT = 100 * MiB
OOM = "CUDA_ERROR_OUT_OF_MEMORY"

# What each path charges for a 4 MiB request (see vgpu-memprobe.c for the
# shapes): the 2D mipmapped array has a second level of a quarter the size.
CHARGE = {
    "alloc": 4 * MiB,
    "alloc_v1": 4 * MiB,
    "pitch": 4 * MiB,
    "managed": 4 * MiB,
    "async": 4 * MiB,
    "pool": 4 * MiB,
    "vmm": 4 * MiB,
    "array": 4 * MiB,
    "array3d": 4 * MiB,
    "mipmap": 5 * MiB,
    "graph": 4 * MiB,
}
# Freed pool memory stays on the device until the pool is trimmed.
POOLED = {"async", "pool", "graph"}


def standalone(sim_env: dict[str, str], tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {"CUDA_MEM_LIMIT": str(LIMIT), "VGPU_USAGE": str(tmp_path / "usage")}
    env.setdefault("VGPU_SIM_CTX_OVERHEAD", "0")
    env.update(extra)
    return hooked(sim_env, **env)


@pytest.mark.parametrize("path", sorted(CHARGE))
def test_each_path_is_charged_refused_and_given_back(
    sim_env: dict[str, str], tmp_path: Path, path: str
) -> None:
    run = probe(
        standalone(sim_env, tmp_path),
        "meminfo",
        f"alloc:{path}:4m",
        "meminfo",
        f"alloc:{path}:200m",
        "free",
        "meminfo",
        "trim",
        "meminfo",
    )
    assert run.returncode == 0, run.stderr
    fresh, held, freed, trimmed = (m["free"] for m in run.ops("meminfo"))
    first, refused = run.ops("alloc")
    assert first["result"] == "CUDA_SUCCESS"
    assert fresh == LIMIT
    assert fresh - held == CHARGE[path]
    assert refused["result"] == OOM
    assert freed == (held if path in POOLED else LIMIT)
    assert trimmed == LIMIT
    warning = [line for line in run.stderr.splitlines() if "refused" in line]
    assert len(warning) == 1
    assert GPU0 in warning[0] and str(LIMIT) in warning[0] and "warning" in warning[0]
    with UsageBlock.open(tmp_path / "usage") as usage:
        dev = usage.devices()[0]
        assert (dev.used, dev.oom_count, dev.mem_limit) == (0, 1, LIMIT)
        assert usage.slots() == []


def test_host_memory_is_not_device_memory(sim_env: dict[str, str], tmp_path: Path) -> None:
    run = probe(standalone(sim_env, tmp_path), "alloc:host:200m", "meminfo")
    assert run.ops("alloc")[0]["result"] == "CUDA_SUCCESS"
    assert run.ops("meminfo")[0]["free"] == LIMIT


def test_the_process_sees_its_slice(sim_env: dict[str, str], tmp_path: Path) -> None:
    sim_env["VGPU_SIM_MEMORY"] = "1g"
    run = probe(standalone(sim_env, tmp_path), "alloc:alloc:30m", "meminfo", "nvml")
    meminfo, nvml = run.ops("meminfo")[0], run.ops("nvml")[0]
    assert (meminfo["total"], meminfo["total_mem"], meminfo["free"]) == (LIMIT, LIMIT, 70 * MiB)
    assert (nvml["total"], nvml["used"], nvml["free"]) == (LIMIT, 30 * MiB, 70 * MiB)
    # The only process on the device is this one, in the root namespace.
    assert len(nvml["pids"]) == 1


def test_free_memory_is_capped_by_what_is_physically_free(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    sim_env["VGPU_SIM_MEMORY"] = "64m"
    run = probe(standalone(sim_env, tmp_path), "meminfo")
    meminfo = run.ops("meminfo")[0]
    assert meminfo["total"] == LIMIT
    assert meminfo["free"] <= 64 * MiB


def test_device_without_a_limit_is_shown_as_it_is(sim_env: dict[str, str], tmp_path: Path) -> None:
    sim_env["VGPU_SIM_MEMORY"] = "1g"
    env = standalone(sim_env, tmp_path, CUDA_MEM_LIMIT_1="10m")
    del env["CUDA_MEM_LIMIT"]
    run = probe(env, "alloc:alloc:200m", "meminfo")
    assert run.ops("alloc")[0]["result"] == "CUDA_SUCCESS"
    assert run.ops("meminfo")[0]["total"] == 1 << 30
    limited = probe(env, "alloc:alloc:20m", args=["--device", "1"])
    assert limited.ops("alloc")[0]["result"] == OOM


def test_managed_memory_never_beyond_physically_free(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    sim_env["VGPU_SIM_MEMORY"] = "64m"
    env = standalone(sim_env, tmp_path, CUDA_MEM_LIMIT="1g", CUDA_MEMORY_OVERSUBSCRIBE="true")
    run = probe(env, "alloc:managed:96m", "alloc:managed:32m")
    assert [a["result"] for a in run.ops("alloc")] == [OOM, "CUDA_SUCCESS"]


def test_oversubscription_serves_from_host_memory(sim_env: dict[str, str], tmp_path: Path) -> None:
    """A vGPU promised 2.5x the device: allocations beyond the device come
    from mapped host memory, hold their contents and count against the limit."""
    sim_env["VGPU_SIM_MEMORY"] = "256m"
    env = standalone(sim_env, tmp_path, CUDA_MEM_LIMIT="768m", CUDA_MEMORY_OVERSUBSCRIBE="1")
    chunks = ["alloc:alloc:64m" for _ in range(10)]
    run = probe(
        env, *chunks, "fill:0x5a5a1234", "meminfo", "alloc:alloc:200m", "freeall", "meminfo"
    )
    assert run.returncode == 0, run.stderr
    allocs = run.ops("alloc")
    assert [a["result"] for a in allocs[:10]] == ["CUDA_SUCCESS"] * 10
    assert allocs[10]["result"] == OOM  # 640m + 200m passes the 768m limit
    fill = run.ops("fill")[0]
    assert fill == {"op": "fill", "checked": 10, "ok": True}
    held, after = run.ops("meminfo")
    assert held["total"] == 768 * MiB
    assert after["free"] > held["free"]
    with UsageBlock.open(tmp_path / "usage") as usage:
        assert usage.devices()[0].used == 0
    # Without the flag the device's own exhaustion is an ordinary OOM.
    plain = probe(standalone(sim_env, tmp_path, CUDA_MEM_LIMIT="768m"), *chunks)
    results = [a["result"] for a in plain.ops("alloc")]
    assert OOM in results and results.index(OOM) <= 4


def test_ipc_memory_is_counted_once_to_its_owner(sim_env: dict[str, str], tmp_path: Path) -> None:
    env = standalone(sim_env, tmp_path)
    owner = InteractiveProbe(env, ["alloc:alloc:8m", "fill:7", "ipc-export", "wait"])
    try:
        lines = owner.until_wait()
        handle = next(line for line in lines if line["op"] == "ipc-export")["handle"]
        opener = probe(env, "meminfo", f"ipc-open:{handle}", "meminfo")
        before, after = opener.ops("meminfo")
        assert opener.ops("ipc-open")[0]["result"] == "CUDA_SUCCESS"
        assert before["free"] == after["free"] == LIMIT - 8 * MiB
        with UsageBlock.open(tmp_path / "usage") as usage:
            assert usage.devices()[0].used == 8 * MiB
    finally:
        owner.resume()
        owner.finish()


def vgpu_blocks(tmp_path: Path, limit: int, uuid: str = GPU0, flags: int = 0) -> dict[str, str]:
    ControlBlock.create(
        tmp_path / "control", "test-vgpu", [DeviceSlice(uuid, limit)], flags
    ).close()
    UsageBlock.create(tmp_path / "usage").close()
    return {"VGPU_CONTROL": str(tmp_path / "control"), "VGPU_USAGE": str(tmp_path / "usage")}


def test_vgpu_mode_limit_changes_live(sim_env: dict[str, str], tmp_path: Path) -> None:
    blocks = vgpu_blocks(tmp_path, 64 * MiB)
    env = hooked(sim_env, VGPU_SIM_CTX_OVERHEAD="0", **blocks)
    proc = InteractiveProbe(
        env, ["alloc:alloc:32m", "meminfo", "wait", "alloc:alloc:8m", "meminfo"]
    )
    lines = proc.until_wait()
    assert [line["result"] for line in lines if line["op"] == "alloc"] == ["CUDA_SUCCESS"]
    with ControlBlock.open(tmp_path / "control") as control:
        control.set_mem_limit(0, 16 * MiB)
    proc.resume()
    run = proc.finish()
    assert run.ops("alloc")[-1]["result"] == OOM
    assert run.ops("meminfo")[-1]["total"] == 16 * MiB
    assert "test-vgpu" in run.stderr


def test_vgpu_mode_device_outside_the_vgpu_has_no_memory(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    blocks = vgpu_blocks(tmp_path, 64 * MiB, uuid="GPU-00000000-0000-0000-0000-00000000beef")
    run = probe(hooked(sim_env, VGPU_SIM_CTX_OVERHEAD="0", **blocks), "alloc:alloc:1m")
    # Not even a context: it would cost device memory the vGPU has none of.
    assert run.init["result"] == OOM
    assert "not part of vGPU test-vgpu" in run.stderr


def test_vgpu_mode_nvml_lists_only_the_vgpus_processes(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    blocks = vgpu_blocks(tmp_path, 64 * MiB)
    outsider = InteractiveProbe(sim_env, ["alloc:alloc:8m", "wait"])
    try:
        outsider.until_wait()
        run = probe(hooked(sim_env, **blocks), "alloc:alloc:4m", "nvml")
        plain = probe(sim_env, "nvml")
    finally:
        outsider.resume()
        outsider.finish()
    nvml = run.ops("nvml")[0]
    assert len(plain.ops("nvml")[0]["pids"]) == 2  # the outsider and the plain probe
    assert len(nvml["pids"]) == 1 and nvml["pids"][0] != outsider.proc.pid
    assert nvml["total"] == 64 * MiB
    assert nvml["used"] == nvml["mem"][0]  # the vGPU's use = its one process


def test_context_overhead_counts_against_the_limit(sim_env: dict[str, str], tmp_path: Path) -> None:
    sim_env["VGPU_SIM_CTX_OVERHEAD"] = "48m"
    run = probe(standalone(sim_env, tmp_path, VGPU_SIM_CTX_OVERHEAD="48m"), "meminfo")
    assert run.ops("meminfo")[0]["free"] == LIMIT - 48 * MiB
    # A slice smaller than a context cannot even create one.
    tight = probe(standalone(sim_env, tmp_path, CUDA_MEM_LIMIT="32m", VGPU_SIM_CTX_OVERHEAD="48m"))
    assert tight.init["result"] == OOM


NVML_LISTS = r"""
import ctypes, json, struct
nv = ctypes.CDLL("libnvidia-ml.so.1")
assert nv.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
out = {}
for kind in ("Compute", "Graphics", "MPSCompute"):
    for suffix, size in (("", 16), ("_v2", 24), ("_v3", 24)):
        fn = getattr(nv, f"nvmlDeviceGet{kind}RunningProcesses{suffix}")
        count = ctypes.c_uint(0)
        asked = fn(dev, ctypes.byref(count), None)
        need = count.value
        buf = ctypes.create_string_buffer(size * max(need, 1))
        count = ctypes.c_uint(need)
        answered = fn(dev, ctypes.byref(count), buf)
        pids = [struct.unpack_from("I", buf.raw, i * size)[0] for i in range(count.value)]
        out[kind + suffix] = [asked, need, answered, pids]
print(json.dumps(out))
"""


def test_nvml_process_lists_keep_the_size_protocol_after_filtering(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    import json
    import subprocess

    blocks = vgpu_blocks(tmp_path, 64 * MiB)
    member = InteractiveProbe(hooked(sim_env, **blocks), ["alloc:alloc:4m", "wait"])
    outsider = InteractiveProbe(sim_env, ["alloc:alloc:8m", "wait"])
    try:
        member.until_wait()
        outsider.until_wait()
        out = subprocess.run(
            ["python3", "-c", NVML_LISTS],
            env=hooked(sim_env, **blocks),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        for proc in (member, outsider):
            proc.resume()
            proc.finish()
    lists = json.loads(out)
    insufficient, success = 7, 0
    for version in ("Compute", "Compute_v2", "Compute_v3"):
        assert lists[version] == [insufficient, 1, success, [member.proc.pid]], version
    for version in ("Graphics", "Graphics_v3", "MPSCompute", "MPSCompute_v2"):
        assert lists[version] == [success, 0, success, []], version


def test_real_libraries_can_be_named(sim_env: dict[str, str], tmp_path: Path) -> None:
    from tests.conftest import SIM_LIB_DIR

    named = standalone(sim_env, tmp_path, VGPU_REAL_LIBCUDA=str(SIM_LIB_DIR / "libcuda.so.1"))
    assert probe(named, "meminfo").ops("meminfo")[0]["total"] == LIMIT
    missing = standalone(sim_env, tmp_path, VGPU_REAL_LIBCUDA=str(tmp_path / "libcuda.so.1"))
    # The program finds a driver itself; the hook, told to use another, refuses.
    run = probe(missing, "meminfo", args=["--resolve", "dlsym"])
    assert run.init["result"] == "CUDA_ERROR_NOT_INITIALIZED"
    assert "no CUDA driver" in run.stderr
