"""A process killed inside the hook's reservation window, while another
process of its vGPU lives: the daemon finds the total apart from its slots,
sets it back, and says so (a usage.drift event, a metric), instead of
keeping the leak until the vGPU is idle. The limit holds throughout."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.memprobe import InteractiveProbe, probe
from tests.integration.daemon_harness import Daemon, wait_for
from tests.integration.test_hook_leak_window import (
    CALL,
    HELD,
    LIMIT,
    OOM,
    WINDOWS,
    budget,
    kill_in_window,
    stopped_in_window,
)


@pytest.fixture
def daemon(tmp_path: Path, sim_env: dict[str, str]) -> Iterator[Daemon]:
    # The first process on the simulated machine fixes its configuration:
    # no context overhead, so that the budget holds only what the probes ask.
    sim_env["VGPU_SIM_CTX_OVERHEAD"] = "0"
    d = Daemon(tmp_path, sim_env).start()
    yield d
    d.cleanup()


def drift_events(daemon: Daemon) -> list[dict[str, Any]]:
    lines = daemon.client.raw("GET", "/v1/events?follow=false")[1].splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == "usage.drift"]


def metric(daemon: Daemon, name: str) -> float:
    for line in daemon.client.raw("GET", "/metrics")[1].decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_a_leak_under_a_live_process_is_repaired_and_reported(
    daemon: Daemon, sim_env: dict[str, str]
) -> None:
    vgpu = daemon.client.post("/v1/vgpus", {"memory": str(LIMIT)})
    env = {**sim_env, **vgpu["host_env"]}
    usage = Path(vgpu["host_env"]["VGPU_USAGE"])
    holder = InteractiveProbe(env, ["alloc:alloc:4m", "wait"])
    try:
        holder.until_wait()
        kill_in_window(env, "reserve", usage)  # the total holds CALL that no slot does
        events = wait_for(lambda: drift_events(daemon), 30, "a usage.drift event")
        assert [(e["vgpu"], e["detail"]["freed"]) for e in events] == [(vgpu["id"], [CALL])]
        assert budget(usage) == (HELD, HELD)  # the holder keeps what it holds
        assert metric(daemon, "vgpud_usage_drift_repairs_total") == 1
        assert metric(daemon, "vgpud_usage_drift_bytes_total") == CALL
        # The limit is the limit again: all that is left fits, one more MiB does not.
        fits = probe(env, f"alloc:alloc:{(LIMIT - HELD) >> 20}m")
        assert fits.ops("alloc")[0]["result"] == "CUDA_SUCCESS"
        over = probe(env, f"alloc:alloc:{(LIMIT - HELD) >> 20}m", "alloc:alloc:1m")
        assert [op["result"] for op in over.ops("alloc")] == ["CUDA_SUCCESS", OOM]
    finally:
        holder.resume()
        holder.finish()


def scans(daemon: Daemon) -> float:
    return metric(daemon, 'vgpud_loop_duration_seconds_count{loop="scan"}')


def test_a_process_stopped_inside_the_window_is_not_realigned_under_it(
    daemon: Daemon, sim_env: dict[str, str]
) -> None:
    """Stopped between its two steps (as a paused container or a debugger
    would leave it), the process may go on at any moment: its reservation
    is not taken from it however many scans see the same figures."""
    vgpu = daemon.client.post("/v1/vgpus", {"memory": str(LIMIT)})
    env = {**sim_env, **vgpu["host_env"]}
    usage = Path(vgpu["host_env"]["VGPU_USAGE"])
    victim = InteractiveProbe({**env, "VGPU_TEST_STOP_IN": "reserve"}, WINDOWS["reserve"])
    try:
        stopped_in_window(victim)
        seen = scans(daemon)
        wait_for(lambda: scans(daemon) >= seen + 6, 60, "six scans")  # twice what a repair needs
        assert drift_events(daemon) == []
        assert budget(usage) == (CALL, 0)
        os.kill(victim.proc.pid, signal.SIGCONT)  # it finishes its step: nothing was lost
        victim.until_wait()
        assert budget(usage) == (CALL, CALL)
        assert drift_events(daemon) == []
    finally:
        victim.kill()
