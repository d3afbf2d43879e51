"""vgpu-burn --trace on the simulated GPU: the record of completed work that
the compute benchmark judges short windows by (see compute_harness.work_series).

Every worker thread of every process appends one whole line per completed
batch; the lines add up to the kernels each process reports; a trace that
cannot be written never stops the run.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BUILD
from tests.integration.compute_harness import parse_trace

BURN = str(BUILD / "vgpu-burn")

pytestmark = pytest.mark.skipif(
    not (BUILD / "vgpu-burn").is_file(), reason="run `make` first (build/vgpu-burn)"
)


def burn(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BURN, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def workers(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    return [r for r in reports if "pid" in r]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "--trace needs a file name"),
        ("/nonexistent-dir/burn.trace", "No such file or directory"),
        ("/", "Is a directory"),
    ],
)
def test_a_trace_that_cannot_be_opened_is_a_usage_error(
    sim_env: dict[str, str], path: str, message: str
) -> None:
    proc = burn(sim_env, "--seconds", "0.1", "--trace", path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    ("args", "per_batch"),
    [
        (("--sync", "4", "--kernel-us", "200"), 4),
        (("--graph", "3", "--kernel-us", "200"), 3),
    ],
)
def test_every_thread_of_every_process_records_each_batch(
    sim_env: dict[str, str], tmp_path: Path, args: tuple[str, ...], per_batch: int
) -> None:
    trace = tmp_path / "burn.trace"
    trace.write_text("")  # appended to, never truncated
    before = time.time()
    proc = burn(
        sim_env, "--procs", "2", "--streams", "2", "--seconds", "0.5", "--json",
        "--trace", str(trace), *args,
    )  # fmt: skip
    after = time.time()
    assert proc.returncode == 0, proc.stderr
    lines = parse_trace(trace.read_text().splitlines())  # whole lines, or it raises
    assert {c.kernels for c in lines} == {per_batch}
    assert all(before <= c.t <= after for c in lines)
    kernels: Counter[int] = Counter()
    for c in lines:
        kernels[c.pid] += c.kernels
    assert dict(kernels) == {w["pid"]: w["kernels"] for w in workers(proc)}
    assert len(kernels) == 2 and all(k > 0 for k in kernels.values())


def test_a_failed_write_is_reported_once_per_process_and_the_run_goes_on(
    sim_env: dict[str, str],
) -> None:
    proc = burn(
        sim_env, "--procs", "2", "--streams", "2", "--seconds", "0.3", "--kernel-us", "200",
        "--json", "--trace", "/dev/full",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    complaints = [line for line in proc.stderr.splitlines() if "--trace '/dev/full'" in line]
    pids = [w["pid"] for w in workers(proc)]
    assert sorted(complaints) == sorted(
        f"vgpu-burn: pid {pid}: --trace '/dev/full': No space left on device; "
        "tracing stops, the run goes on"
        for pid in pids
    )
    assert all(w["kernels"] > 0 for w in workers(proc))
