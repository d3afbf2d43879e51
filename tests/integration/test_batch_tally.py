"""The hook's batch tally (VGPU_BATCH_STATS, docs/hook.md): at exit a
process appends one JSON line saying how its launches were measured. A
benchmark judges the gates' cost by it, so it must count every launch
once, in the kind the pacer chose: a launch-bound stream whose share binds
gated, one whose share leaves room mostly sampled, an unpaced one not at
all. On the simulated GPU, build/vgpu-burn under the real hook."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BUILD

KINDS = ("gated", "shared", "sampled", "graph", "plain", "unmeasured")
# 50 us kernels, 150 us of CPU after each launch: natively a third of the GPU.
LAUNCH_BOUND = ("--kernel-us", "50", "--gap-us", "150", "--sync", "50")

pytestmark = pytest.mark.skipif(
    not (BUILD / "vgpu-burn").is_file() or not (BUILD / "libvgpu.so").is_file(),
    reason="run `make` first (build/vgpu-burn, build/libvgpu.so)",
)


def start(
    sim_env: dict[str, str], tmp_path: Path, share: int, stats: Path, *args: str
) -> subprocess.Popen[str]:
    """A burn of 2 s under the hook at a standalone `share`."""
    env = {
        **sim_env,
        "LD_PRELOAD": str(BUILD / "libvgpu.so"),
        "VGPU_USAGE": str(tmp_path / f"usage-{share}"),
        "CUDA_CORE_LIMIT": str(share),
        "VGPU_BATCH_STATS": str(stats),
    }
    cmd = [str(BUILD / "vgpu-burn"), "--json", "--seconds", "2", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def burn(
    sim_env: dict[str, str], tmp_path: Path, share: int, stats: Path, *args: str
) -> tuple[str, int]:
    """A burn run to its end: its stderr and its launches."""
    proc = start(sim_env, tmp_path, share, stats, *args)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return err, int(json.loads(out.strip().splitlines()[-1])["launches"])


def launches(line: dict[str, dict[str, int]], *kinds: str) -> int:
    return sum(line[k]["launches"] for k in kinds)


@pytest.mark.parametrize("share", [20, 60])
def test_every_launch_is_counted_once_in_the_kind_that_measured_it(
    sim_env: dict[str, str], tmp_path: Path, share: int
) -> None:
    stats = tmp_path / "stats.jsonl"
    _, launched = burn(sim_env, tmp_path, share, stats, *LAUNCH_BOUND)
    (line,) = [json.loads(s) for s in stats.read_text().splitlines()]
    assert launches(line, *KINDS) == launched, line
    assert line["unmeasured"]["launches"] == 0, line
    assert line["gated"]["batches"] > 0, line
    if share == 20:
        # Natively a third of the GPU: the share binds, the pacer holds it
        # back in every window, so every batch is gated and its span exact.
        assert launches(line, "sampled") <= 0.05 * launched, line
    else:
        # It uses about half its quota: the share leaves room, and most
        # batches go ungated, charged at the gated ones' cost.
        assert launches(line, "sampled") >= 0.5 * launched, line
        assert line["sampled"]["at_cost"] > 0, line
    assert line["gated"]["at_cost"] == 0, line  # a gated span is its own measure
    # Its CPU launches slower than its kernels run: its stream is drained
    # when a batch opens, and the gated ones are touched (docs/compute.md,
    # "Touched"); no other batch is.
    gated = line["gated"]["batches"] + line["shared"]["batches"]
    assert 0 < line["touched"] <= gated, line


def test_an_unpaced_process_measures_nothing_and_says_so(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    stats = tmp_path / "stats.jsonl"
    burn(sim_env, tmp_path, 100, stats, *LAUNCH_BOUND)
    (line,) = [json.loads(s) for s in stats.read_text().splitlines()]
    assert launches(line, *KINDS) == 0, line
    assert line["touched"] == 0, line


def test_processes_append_a_line_each_and_a_bad_path_costs_only_a_warning(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    stats = tmp_path / "stats.jsonl"
    procs = [start(sim_env, tmp_path, 60, stats, "--kernel-us", "500") for _ in range(2)]
    for proc in procs:
        proc.communicate(timeout=120)
        assert proc.returncode == 0
    lines = [json.loads(s) for s in stats.read_text().splitlines()]
    assert sorted(line["pid"] for line in lines) == sorted(p.pid for p in procs), lines

    nowhere = tmp_path / "no-such-dir" / "stats.jsonl"
    err, _ = burn(sim_env, tmp_path, 60, nowhere, "--kernel-us", "500")
    assert "VGPU_BATCH_STATS" in err and "not written" in err
    assert not nowhere.exists()
