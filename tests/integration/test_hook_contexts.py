"""A context's overhead is charged when the context is created, whichever
cuCtxCreate variant creates it and whichever road led the program to it
(simulated GPU).

CUDA 11.4-12.x runtimes create contexts through cuCtxCreate_v3 and 12.5+
through cuCtxCreate_v4 (docs/gpu/driver-facts.md): each is wrapped like
cuCtxCreate_v2, so the overhead counts before the first allocation, and a
context that does not fit is undone and answered CUDA_ERROR_OUT_OF_MEMORY.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.memprobe import InteractiveProbe, MiB, hooked, probe
from vgpud.vgpus.blocks import UsageBlock

CTX = 32 * MiB  # the simulator's overhead per context
OOM = "CUDA_ERROR_OUT_OF_MEMORY"

# (how the probe resolves, the CUDA version it asks for, the variant it must get)
ROADS = [
    ("dlsym", 12080, "cuCtxCreate"),
    ("dlsym", 12080, "cuCtxCreate_v2"),
    ("dlsym", 12080, "cuCtxCreate_v3"),
    ("dlsym", 12080, "cuCtxCreate_v4"),
    ("procaddr", 3020, "cuCtxCreate_v2"),
    ("procaddr", 11040, "cuCtxCreate_v3"),
    ("procaddr", 12000, "cuCtxCreate_v3"),
    ("procaddr", 12080, "cuCtxCreate_v4"),
    ("procaddr", 13000, "cuCtxCreate_v4"),
]


def standalone(sim_env: dict[str, str], tmp_path: Path, limit: int) -> dict[str, str]:
    sim_env["VGPU_SIM_CTX_OVERHEAD"] = str(CTX)
    return hooked(sim_env, CUDA_MEM_LIMIT=str(limit), VGPU_USAGE=str(tmp_path / "usage"))


def road_args(resolve: str, version: int) -> list[str]:
    return ["--resolve", resolve, "--cuda-version", str(version)]


@pytest.mark.parametrize(("resolve", "version", "name"), ROADS)
def test_overhead_is_charged_at_creation(
    sim_env: dict[str, str], tmp_path: Path, resolve: str, version: int, name: str
) -> None:
    env = standalone(sim_env, tmp_path, 100 * MiB)
    proc = InteractiveProbe(env, [f"ctx:{name}", "wait"], road_args(resolve, version))
    try:
        lines = proc.until_wait()
        assert [line["result"] for line in lines if line["op"] == "ctx"] == ["CUDA_SUCCESS"]
        # No allocation yet: the primary context (at init) and the created one.
        with UsageBlock.open(tmp_path / "usage") as usage:
            (slot,) = usage.slots()
            assert slot.devices[0].overhead == slot.devices[0].used == 2 * CTX
            assert usage.devices()[0].used == 2 * CTX
    finally:
        proc.resume()
        proc.finish()


@pytest.mark.parametrize(("resolve", "version", "name"), ROADS)
def test_a_context_that_does_not_fit_is_refused_and_undone(
    sim_env: dict[str, str], tmp_path: Path, resolve: str, version: int, name: str
) -> None:
    limit = 48 * MiB  # room for the primary context, not for a second one
    run = probe(
        standalone(sim_env, tmp_path, limit),
        f"ctx:{name}",
        "meminfo",
        "nvml",
        args=road_args(resolve, version),
    )
    assert run.init["result"] == "CUDA_SUCCESS"
    assert run.ops("ctx")[0]["result"] == OOM
    # The warning names the process's whole overhead it could not hold.
    assert f"context creation of {2 * CTX} bytes refused" in run.stderr
    # Undone, not leaked: the budget and the driver both hold the primary only.
    assert run.ops("meminfo")[0]["free"] == limit - CTX
    assert run.ops("nvml")[0]["mem"] == [CTX]
    with UsageBlock.open(tmp_path / "usage") as usage:
        assert usage.devices()[0].used == 0  # the probe has exited
        assert usage.devices()[0].oom_count == 1
