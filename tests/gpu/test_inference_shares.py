"""Launch-bound work (eager inference) at a share that binds, on a real GPU.

Eager decoding launches small kernels one by one, and the GPU idles between
them. The hook must charge the kernels' time, not those gaps
(docs/compute.md, "Launch-bound work: gated batches"), so that such a
process at share s keeps the GPU busy min(s, its native busy): measured
from outside by NVML's device utilization, within 3 points. The hook's own
figure must agree with NVML's. Charged with the gaps, an H100 gave the
decode chain 16.9 % and the adds 11.4 % at share 30, while the hook
believed it had given 30.

The workloads are benchmarks/inference_workload.py's: "chain" is 32
matrix-vector products (4096 x 4096, bf16) per token, synchronised every
token; "adds" is 1000 in-place adds on 1M elements per synchronisation.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.bench_inference import run_case
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
    native = run_case(workload, None, None, SECONDS, sampler, tmp_path)
    case = run_case(workload, share, None, SECONDS, sampler, tmp_path)
    want = min(share, native["busy"])
    seen = (
        f"{workload} at {share}: NVML busy {case['busy']:.1f} (native {native['busy']:.1f}), "
        f"the hook charged {case['hook_busy']:.1f} and held it back "
        f"{case['hook_throttled']:.1f} % of the time; work {case['rate'] / native['rate']:.2f} "
        "of native"
    )
    assert case["busy"] == pytest.approx(want, abs=TOLERANCE), seen
    assert case["hook_busy"] == pytest.approx(case["busy"], abs=TOLERANCE), seen
