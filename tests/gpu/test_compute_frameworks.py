"""Compute shares under the frameworks people run, on a real GPU.

A share is a share of GPU time. Alone on the GPU, a process at share s must
keep the GPU busy s of the time (NVML's device utilization, read from
outside, within 5 points) and keep at least 0.9 s of its unlimited
throughput (GEMMs completed per second). Its throughput may be MORE than s:
an H200 running bf16 GEMMs flat out is held at its power limit and lowers
its clocks, so each GEMM of a paced process runs faster than the unlimited
one's (measured: ~1490 MHz at ~690 W unlimited, 1980 MHz at ~370 W at 30 %;
30 % of the time gave 35 % of the GEMMs; docs/gpu/clocks-h200-2026-11-21.log). Sharing the GPU
with other tenants, all run at the same clocks, so there each one's
throughput against the unlimited one is its share of time: within 5
points, next to another limited process or next to a hooked process with no
compute limit (which takes turns while the limited one paces). The pacer
alone (CUDA_CORE_LIMIT, standalone); the daemon's steering of it is covered
by benchmarks/bench_compute.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import GiB, Hooked, Result

TOLERANCE = 0.05  # of the unlimited throughput
SECONDS = 6.0  # measured, after WARMUP
WARMUP = 1.5

# GEMMs of ~1.5 ms on an H100/H200, synchronised every 10 like a training
# step; prints what it got done in the measured seconds.
TORCH_GEMM = r"""
import json, sys, time, torch
seconds, warmup = float(sys.argv[1]), float(sys.argv[2])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
start = time.monotonic()
while time.monotonic() < start + warmup:
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
done, t0 = 0, time.monotonic()
while time.monotonic() < t0 + seconds:
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    done += 10
t1 = time.monotonic()
print(json.dumps({"rate": done / (t1 - t0), "t0": time.time() - (t1 - t0), "t1": time.time()}))
"""

JAX_GEMM = r"""
import json, sys, time, jax, jax.numpy as jnp
seconds, warmup = float(sys.argv[1]), float(sys.argv[2])
k1, k2 = jax.random.split(jax.random.PRNGKey(0))
a = jax.random.normal(k1, (8192, 8192), dtype=jnp.bfloat16)
b = jax.random.normal(k2, (8192, 8192), dtype=jnp.bfloat16)
mm = jax.jit(lambda x, y: x @ y)
def ten():
    for _ in range(10):
        out = mm(a, b)
    out.block_until_ready()
start = time.monotonic()
while time.monotonic() < start + warmup:
    ten()
done, t0 = 0, time.monotonic()
while time.monotonic() < t0 + seconds:
    ten()
    done += 10
t1 = time.monotonic()
print(json.dumps({"rate": done / (t1 - t0), "t0": time.time() - (t1 - t0), "t1": time.time()}))
"""

# Each tenant: its own usage block (its own bucket), a memory slice so the
# hook is active even with no compute limit, JAX not preallocating the GPU.
SLICE = 16 * GiB
JAX_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


@dataclass
class Run:
    rate: float  # GEMMs per second in its measured window
    busy: float  # NVML device utilization (fraction) over that window


class DeviceUtil(threading.Thread):
    """NVML's device utilization every 100 ms, stamped (time.time())."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self._done = threading.Event()

    def run(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not self._done.is_set():
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            self.samples.append((time.time(), util / 100))
            time.sleep(0.1)

    def mean(self, t0: float, t1: float) -> float:
        inside = [u for t, u in self.samples if t0 <= t <= t1]
        assert inside, "NVML gave no device utilization in the measured window"
        return sum(inside) / len(inside)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)


class Tenants:
    def __init__(self, hooked: Hooked, tmp_path: Path) -> None:
        self.hooked = hooked
        self.tmp_path = tmp_path
        self.made = 0

    def start(self, code: str, core_limit: int | None, **extra: str) -> subprocess.Popen[str]:
        self.made += 1
        env = self.hooked.environ(
            SLICE, VGPU_USAGE=str(self.tmp_path / f"tenant-{self.made}.usage"), **extra
        )
        if core_limit is not None:
            env["CUDA_CORE_LIMIT"] = str(core_limit)
        return subprocess.Popen(
            [sys.executable, "-c", code, str(SECONDS), str(WARMUP)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def result(proc: subprocess.Popen[str], util: DeviceUtil) -> Run:
        out, err = proc.communicate(timeout=300)
        res = Result(proc.returncode, out, err, 0)
        assert res.rc == 0, res.err
        got = res.json()
        rate, t0, t1 = got["rate"], got["t0"], got["t1"]
        assert isinstance(rate, float) and isinstance(t0, float) and isinstance(t1, float)
        return Run(rate, util.mean(t0, t1))

    def together(self, *specs: tuple[str, int | None, dict[str, str]]) -> list[Run]:
        util = DeviceUtil()
        util.start()
        try:
            procs = [self.start(code, limit, **extra) for code, limit, extra in specs]
            return [self.result(p, util) for p in procs]
        finally:
            util.stop()


@pytest.fixture
def tenants(hooked: Hooked, tmp_path: Path) -> Iterator[Tenants]:
    yield Tenants(hooked, tmp_path)


@pytest.fixture(scope="module")
def unlimited_rates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """Each framework's throughput alone, hooked, with no compute limit."""
    tmp = tmp_path_factory.mktemp("unlimited")
    t = Tenants(Hooked(usage_file=tmp / "vgpu.usage"), tmp)
    return {
        "torch": t.together((TORCH_GEMM, None, {}))[0].rate,
        "jax": t.together((JAX_GEMM, None, JAX_ENV))[0].rate,
    }


def check_alone(run: Run, share: int, unlimited: float) -> None:
    kept = run.rate / unlimited
    figures = f"share {share}: device busy {run.busy:.3f}, throughput {kept:.3f} of unlimited"
    print(figures)  # for the record (pytest -s)
    assert run.busy == pytest.approx(share / 100, abs=TOLERANCE), figures
    assert kept >= 0.9 * share / 100, figures


@pytest.mark.parametrize("share", [30, 70])
def test_torch_gets_its_share(
    tenants: Tenants, unlimited_rates: dict[str, float], share: int
) -> None:
    (run,) = tenants.together((TORCH_GEMM, share, {}))
    check_alone(run, share, unlimited_rates["torch"])


def test_jax_gets_its_share(tenants: Tenants, unlimited_rates: dict[str, float]) -> None:
    (run,) = tenants.together((JAX_GEMM, 50, JAX_ENV))
    check_alone(run, 50, unlimited_rates["jax"])


def test_two_torch_tenants_split_30_70(tenants: Tenants, unlimited_rates: dict[str, float]) -> None:
    runs = tenants.together((TORCH_GEMM, 30, {}), (TORCH_GEMM, 70, {}))
    got = [r.rate / unlimited_rates["torch"] for r in runs]
    print(f"30/70: throughput {got}, device busy {runs[0].busy:.3f}")
    assert got[0] == pytest.approx(0.3, abs=TOLERANCE), f"got {got}"
    assert got[1] == pytest.approx(0.7, abs=TOLERANCE), f"got {got}"


def test_torch_next_to_a_tenant_with_no_compute_limit(
    tenants: Tenants, unlimited_rates: dict[str, float]
) -> None:
    """The unlimited neighbour takes turns while the other paces, so the
    paced one is not charged for the neighbour's kernels; the neighbour
    gets the rest."""
    runs = tenants.together((TORCH_GEMM, 30, {}), (TORCH_GEMM, None, {}))
    got = [r.rate / unlimited_rates["torch"] for r in runs]
    print(f"30 next to unlimited: throughput {got}, device busy {runs[0].busy:.3f}")
    assert got[0] == pytest.approx(0.3, abs=TOLERANCE), f"got {got}"
    assert got[1] >= 0.6, f"got {got}"
