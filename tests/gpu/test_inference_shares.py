"""Launch-bound work (eager inference) at a share that binds, on a real GPU.

Eager decoding launches small kernels one by one, and the GPU idles between
them. The hook must charge the kernels' time, not those gaps
(docs/compute.md, "Launch-bound work: gated batches"), so that such a
process at share s keeps the GPU busy min(s, its native busy): measured
from outside by NVML's device utilization, within 3 points. The hook's own
figure must agree with NVML's. Charged with the gaps, an H100 gave the
decode chain 16.9 % and the adds 11.4 % at share 30, while the hook
believed it had given 30.

Next to a GPU-bound tenant, a launch-bound one whose share does not bind
goes without the GPU turn (libhook/src/turnless.h): with turns, an H100
gave a transformers decoder at 30 next to a GEMM tenant at 60 0.36-0.57 of
its native work, and the GEMM tenant 61 % of its native work where alone at
60 it does 70 %.

The workloads are benchmarks/inference_workload.py's: "chain" is 32
matrix-vector products (4096 x 4096, bf16) per token, synchronised every
token; "adds" is 1000 in-place adds on 1M elements per synchronisation;
"hf-b1" a transformers Llama decoder with random weights, generating
greedily at batch 1; "gemm" 8192 x 8192 bf16 matmuls (work counted in
matmuls, true under the GPU's time-slicing).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from benchmarks.bench_inference import Standalone, Tenancy, Vgpus, run_case
from tests.integration.compute_harness import Sampler

SECONDS = 5.0
TOLERANCE = 3.0  # points of GPU utilization


@pytest.fixture
def sampler() -> Iterator[Sampler]:
    s = Sampler(dict(os.environ), 0)
    s.wait_ready()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("workload", ["chain", "adds"])
def test_launch_bound_work_gets_its_share_and_is_charged_what_nvml_sees(
    sampler: Sampler, tmp_path: Path, workload: str
) -> None:
    share = 30
    sides = Standalone(tmp_path, separate_turns=False)
    native = run_case(workload, None, None, SECONDS, sampler, sides)
    case = run_case(workload, share, None, SECONDS, sampler, sides)
    want = min(share, native["busy"])
    seen = (
        f"{workload} at {share}: NVML busy {case['busy']:.1f} (native {native['busy']:.1f}), "
        f"the hook charged {case['hook_busy']:.1f} and held it back "
        f"{case['hook_throttled']:.1f} % of the time; work {case['rate'] / native['rate']:.2f} "
        "of native"
    )
    assert case["busy"] == pytest.approx(want, abs=TOLERANCE), seen
    assert case["hook_busy"] == pytest.approx(case["busy"], abs=TOLERANCE), seen


class Beside(NamedTuple):
    native: dict[str, Any]  # the workload alone, native
    case: dict[str, Any]  # at 30 beside the GEMM tenant at 60
    alone_work: float  # the GEMM tenant's work alone at 60, % of its native
    gemm_rate: float  # the GEMM loop's native rate

    @property
    def demand(self) -> float:
        """What the two tenants can use: the GEMM its 60, the workload
        min(30, its native busy)."""
        return 60 + min(30.0, float(self.native["busy"]))

    def gemm_seen(self) -> str:
        return (
            f"GEMM at 60: {self.case['neighbour_work']:.1f} % of its native work beside it, "
            f"{self.alone_work:.1f} % alone; GPU busy {self.case['busy']:.1f} for a demand "
            f"of {self.demand:.1f}"
        )

    def assert_the_gemm_keeps_its_share(self, seen: str) -> None:
        """The GEMM tenant's work as when alone at 60, and the GPU busy for
        95 % of the demand."""
        assert self.case["neighbour_work"] >= self.alone_work - TOLERANCE, seen
        assert self.case["busy"] >= 0.95 * self.demand, seen


def _beside_a_gemm_tenant(workload: str, sampler: Sampler, sides: Tenancy) -> Beside:
    """`workload` natively, then at 30 beside a GEMM tenant at 60."""
    gemm_native = run_case("gemm", None, None, SECONDS, sampler, sides)
    gemm_alone = run_case("gemm", 60, None, SECONDS, sampler, sides)
    native = run_case(workload, None, None, SECONDS, sampler, sides)
    case = run_case(
        workload,
        30,
        60,
        SECONDS,
        sampler,
        sides,
        neighbour_workload=("gemm", gemm_native["rate"]),
    )
    alone_work = gemm_alone["rate"] / gemm_native["rate"] * 100
    return Beside(native, case, alone_work, gemm_native["rate"])


def test_a_decoder_next_to_a_gemm_tenant_keeps_its_pace_and_the_gemm_its_share(
    sampler: Sampler, tmp_path: Path
) -> None:
    sides = Standalone(tmp_path, separate_turns=False)
    beside = _beside_a_gemm_tenant("hf-b1", sampler, sides)
    native, case = beside.native, beside.case
    # The decoder uses less than its share. Beside the GEMM tenant it waits
    # for the GPU's time-slicing, whatever the hook does: so its pace is
    # judged against both native beside a native GEMM loop, run just after
    # (a CPU-bound decoder's native rate moves with the lent VM's CPU by a
    # third within minutes: 55.8 and 76.8 tokens/s on one H200 node within
    # the hour). With a turn for every batch it got 0.36-0.57 of its native
    # rate and the GEMM tenant lost 9 points of work (H100).
    both_native = run_case(
        "hf-b1",
        None,
        0,
        SECONDS,
        sampler,
        sides,
        neighbour_workload=("gemm", beside.gemm_rate),
    )
    pace = case["rate"] / both_native["rate"]
    seen = (
        f"decoder at 30: {pace:.2f} of its tokens/s with both native (alone "
        f"{case['rate'] / native['rate']:.2f}; native busy {native['busy']:.1f}), held back "
        f"{case['hook_throttled']:.1f} % of the time; {beside.gemm_seen()}"
    )
    # Its pacer never holds it back, and it keeps the pace time-slicing
    # leaves it, less the hook's cost on paced launch-bound work (0.90-0.93
    # of native: docs/benchmarks/hook-cost-h200.md): on an H200 1.01 and
    # 0.79 of it, where against its rate alone it read 0.46-0.80.
    assert case["hook_throttled"] <= 1.0, seen
    assert pace >= 0.7, seen
    beside.assert_the_gemm_keeps_its_share(seen)


def test_a_decode_chain_beside_a_gemm_tenant_is_charged_what_it_runs(
    sampler: Sampler, tmp_path: Path
) -> None:
    """Through the daemon, the decode chain at 30 beside a GEMM tenant at
    60. Each token ends in a read-back (a copy), so the next token's first
    batch opens on a drained stream, and its start event took in the GEMM's
    time slice until the hook ran its own empty kernel in front of it
    (docs/compute.md, "Touched"). Charged what it runs, the chain is not
    held back, and the GEMM tenant keeps its share: on an H200 the chain
    was charged 19.4-20.3 for 18.4-19.5 points of work at its native
    efficiency (29.9-30.1 for ~19.8 before), the GEMM did 71.4-72.5 % of its
    native work (64.1-66.0) and the GPU was 93-94 % busy (80.5-82.2).
    The chain's own share is not asserted: beside a GEMM it gets what the
    GPU's time-slicing gives it (0.25-0.31 of its native work)."""
    sides = Vgpus(tmp_path, device=0, calibrate=True)
    try:
        beside = _beside_a_gemm_tenant("chain", sampler, sides)
    finally:
        sides.stop()
    native, case = beside.native, beside.case
    work = case["rate"] / native["rate"]
    ran = work * native["busy"]
    seen = (
        f"chain at 30: charged {case['hook_busy']:.1f} for {work:.2f} of its native work "
        f"({ran:.1f} points at its native busy {native['busy']:.1f}); {beside.gemm_seen()}"
    )
    assert case["hook_busy"] == pytest.approx(ran, abs=TOLERANCE), seen
    beside.assert_the_gemm_keeps_its_share(seen)


@pytest.mark.parametrize(("workload", "share"), [("chain", 60), ("adds", 30)])
def test_a_vgpu_alone_is_calibrated_by_nvml_to_its_share(
    sampler: Sampler, tmp_path: Path, workload: str, share: int
) -> None:
    """Through the daemon, a launch-bound vGPU alone on the GPU is calibrated
    by NVML's device figure (docs/compute.md, "Calibrated by NVML while
    alone"): its control block says so, and NVML sees min(share, native busy)
    within 3 points on the mean, and in every 1 s window within 3 points of
    min(share, the native runs' windows). On an H100 without it
    (calibrate_alone = false) the chain at 60 read 62.0 and the adds at 30
    31.0; with it 59.6 and 30.0.

    A launch-bound program's pace is its CPU's: on a lent VM it moved by a
    third between two runs a minute apart (the chain natively 45.3, 71.1 and
    76.4 on one H200 within the hour; at 60, never held back, 46-54), so
    the case runs between two native runs and is judged against the slower
    (its mean) and against both (its windows)."""
    sides = Vgpus(tmp_path, device=0, calibrate=True)
    try:
        before = run_case(workload, None, None, SECONDS, sampler, sides)
        case = run_case(workload, share, None, SECONDS, sampler, sides)
        after = run_case(workload, None, None, SECONDS, sampler, sides)
    finally:
        sides.stop()
    want = min(share, before["busy"], after["busy"])
    windows = case["busy_windows"]
    native_windows = before["busy_windows"] + after["busy_windows"]
    # A window is judged against min(share, what the work kept the GPU busy
    # natively in a window): where the share does not bind, the work's own
    # pace moves with the CPU from second to second (the chain natively:
    # 63-73 within one run on an H200), and so does NVML's figure.
    low = min(share, min(native_windows)) - TOLERANCE
    high = min(share, max(native_windows)) + TOLERANCE
    seen = (
        f"{workload} at {share}: NVML busy {case['busy']:.1f}, 1 s windows "
        f"{min(windows):.1f}-{max(windows):.1f} (native before {before['busy']:.1f}, after "
        f"{after['busy']:.1f}, windows {min(native_windows):.1f}-{max(native_windows):.1f}); "
        f"held back {case['hook_throttled']:.1f} % of the time; quotas given "
        f"{sorted({q for _, q, _ in case['quotas']})} ppm"
    )
    assert any(calibrated for t, _, calibrated in case["quotas"] if t >= 0), seen
    # Above the slower native mean, the work can only be running faster than
    # in that native run (the VM's pace: on an H200 on 2026-11-29 the chain
    # at 60 read 56.0, held back 0.2 % of the time, for a native 52.6 whose
    # busiest second was 54.8): bounded above as its windows are, and so
    # never more than 3 points over its share.
    assert want - TOLERANCE <= case["busy"] <= high, seen
    assert all(low <= w <= high for w in windows), seen
