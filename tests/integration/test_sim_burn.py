"""vgpu-burn on the simulated GPU: arguments, allocation paths and their
failures, and the engine sharing one device between processes (and the
tools' --help)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.conftest import BUILD

BURN = str(BUILD / "vgpu-burn")
MIB = 1 << 20


def burn(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BURN, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def reports(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duty", "0"], "--duty '0'"),
        (["--duty", "1.5"], "--duty '1.5'"),
        (["--seconds", "soon"], "--seconds 'soon'"),
        (["--alloc", "12q"], "--alloc '12q'"),
        (["--alloc-api", "magic", "--alloc", "1m"], "--alloc-api 'magic'"),
        (["--streams", "0"], "--streams '0'"),
        (["--hold"], "need --alloc"),
        (["--alloc", "1m", "--alloc-api", "array", "--verify"], "--verify"),
        (["--frobnicate"], "unknown option '--frobnicate'"),
        (["extra"], "unexpected argument 'extra'"),
    ],
)
def test_bad_arguments_exit_2_with_a_reason(
    sim_env: dict[str, str], args: list[str], message: str
) -> None:
    proc = burn(sim_env, *args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("tool", "mentions"), [("vgpu-burn", "--alloc-api"), ("vgpu-memprobe", "alloc:PATH:SIZE")]
)
def test_help_exits_0(tool: str, mentions: str) -> None:
    proc = subprocess.run([BUILD / tool, "--help"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {tool} ") and mentions in proc.stdout


def test_meminfo_reports_capacity_less_context(sim_env: dict[str, str]) -> None:
    sim_env.update(VGPU_SIM_MEMORY="2g", VGPU_SIM_CTX_OVERHEAD="100m")
    proc = burn(sim_env, "--meminfo", "--json")
    assert proc.returncode == 0, proc.stderr
    assert reports(proc) == [
        {
            "device": 0,
            "free": 2048 * MIB - 100 * MIB,
            "total": 2048 * MIB,
            "device_total": 2048 * MIB,
        }
    ]


@pytest.mark.parametrize("api", ["alloc", "pitch", "managed", "async", "pool", "vmm", "array"])
def test_capacity_is_enforced_on_every_path(sim_env: dict[str, str], api: str) -> None:
    sim_env.update(VGPU_SIM_MEMORY="1g", VGPU_SIM_CTX_OVERHEAD="0")
    proc = burn(
        sim_env, "--alloc", "2g", "--chunk", "256m", "--alloc-api", api, "--seconds", "0", "--json"
    )
    assert proc.returncode == 3, proc.stderr
    first = reports(proc)[0]
    assert first["alloc_bytes"] == 1024 * MIB
    assert first["alloc_error"] == "CUDA_ERROR_OUT_OF_MEMORY"

    best_effort = burn(
        sim_env,
        "--alloc",
        "2g",
        "--chunk",
        "256m",
        "--alloc-api",
        api,
        "--seconds",
        "0",
        "--alloc-best-effort",
    )
    assert best_effort.returncode == 0, best_effort.stderr


@pytest.mark.parametrize("api", ["alloc", "pitch", "managed", "async", "pool", "vmm"])
def test_verify_reads_back_what_the_fill_kernel_wrote(sim_env: dict[str, str], api: str) -> None:
    proc = burn(
        sim_env, "--alloc", "8m", "--chunk", "2m", "--alloc-api", api, "--verify", "--seconds", "0"
    )
    assert proc.returncode == 0, proc.stderr


def test_two_processes_share_the_device(sim_env: dict[str, str]) -> None:
    proc = burn(sim_env, "--procs", "2", "--seconds", "2", "--kernel-us", "1000", "--json")
    assert proc.returncode == 0, proc.stderr
    *workers, _summary = reports(proc)
    assert len(workers) == 2
    # Each got about half the device by work done, and says so; its event
    # span also covers the other's kernels, as on a time-slicing GPU: well
    # over its own work (spans of 0.84-0.95 of the run were seen; over 0.9
    # was asserted, and failed once in a clean-clone run at 0.89).
    work = [w["kernels"] * 0.001 / w["wall_s"] for w in workers]
    for share, worker in zip(work, workers, strict=True):
        assert 0.35 <= share <= 0.65, workers
        assert worker["work"] == pytest.approx(share, abs=0.001)
        assert worker["event_span"] > 1.5 * share
    assert sum(work) <= 1.02  # the device never runs two kernels at once


def test_the_figure_to_read_is_named_work(sim_env: dict[str, str]) -> None:
    proc = burn(sim_env, "--procs", "2", "--seconds", "1", "--kernel-us", "1000")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all("work " in line and "% of the GPU" in line for line in lines)
    assert "busy" not in proc.stdout


def test_graph_launches_run_the_captured_kernels(sim_env: dict[str, str]) -> None:
    proc = burn(sim_env, "--graph", "4", "--kernel-us", "500", "--seconds", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    worker = reports(proc)[0]
    assert worker["kernels"] == 4 * worker["launches"] > 0
    # Each graph launch is 4 kernels of 0.5 ms: GPU time follows the kernels.
    assert worker["event_time_s"] >= worker["kernels"] * 0.0005
    assert worker["work"] == pytest.approx(worker["kernels"] * 0.0005 / worker["wall_s"], rel=0.01)


def test_bad_simulator_config_is_a_cuda_error(sim_env: dict[str, str]) -> None:
    sim_env["VGPU_SIM_DEVICES"] = "0"
    proc = burn(sim_env, "--meminfo")
    assert proc.returncode == 1
    assert "VGPU_SIM_DEVICES='0'" in proc.stderr
    assert "CUDA_ERROR_NO_DEVICE" in proc.stderr
