"""kill -9 of hooked processes at random points of their allocations, next
to a process that lives throughout: the budget never passes the limit, and
once the daemon has looked (reaping dead slots within a scan, realigning a
window's leak within a few), every byte is back: nothing lost, no limit
lifted, while the vGPU is never idle."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.memprobe import InteractiveProbe, probe
from tests.integration.daemon_harness import Daemon, wait_for
from tests.integration.test_hook_leak_window import HELD, LIMIT, OOM, budget

KILLS = 200
SEED = 1123  # the operations are fixed; where each kill lands is not


@pytest.fixture
def daemon(tmp_path: Path, sim_env: dict[str, str]) -> Iterator[Daemon]:
    sim_env["VGPU_SIM_CTX_OVERHEAD"] = "0"  # the budget holds only what the probes ask
    d = Daemon(tmp_path, sim_env).start()
    yield d
    d.cleanup()


def test_random_kills_during_allocations_lose_nothing_and_lift_no_limit(
    daemon: Daemon, sim_env: dict[str, str]
) -> None:
    rng = random.Random(SEED)
    vgpu = daemon.client.post("/v1/vgpus", {"memory": str(LIMIT)})
    env = {**sim_env, **vgpu["host_env"]}
    usage = Path(vgpu["host_env"]["VGPU_USAGE"])
    holder = InteractiveProbe(env, ["alloc:alloc:4m", "wait"])
    try:
        holder.until_wait()
        for _ in range(KILLS):
            worker = InteractiveProbe(env, [f"churn:alloc:{rng.choice([1, 2, 3])}m"])
            worker.until_wait()  # it allocates and frees in a loop from here
            time.sleep(rng.uniform(0, 0.02))  # the random kill point, not a wait for anything
            worker.kill()
            total, _ = budget(usage)
            assert total <= LIMIT
        # Every dead process's bytes come back, leak or not, with the holder alive.
        wait_for(lambda: budget(usage) == (HELD, HELD), 60, "the budget back to the holder's")
        fits = probe(env, f"alloc:alloc:{(LIMIT - HELD) >> 20}m", "alloc:alloc:1m")
        assert [op["result"] for op in fits.ops("alloc")] == ["CUDA_SUCCESS", OOM]
    finally:
        holder.resume()
        holder.finish()
