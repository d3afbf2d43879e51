"""Fixtures shared by every test directory.

``sim_env`` gives a test its own simulated GPU machine: an environment dict
for subprocesses in which ``libcuda.so.1`` and ``libnvidia-ml.so.1`` resolve
to the simulator in ``build/sim`` and ``VGPU_SIM_STATE`` names a state file
under the test's tmp dir. Every process started with that env shares one
simulated machine (memory, engine, NVML); processes of other tests never see
it. The first process that touches the state file fixes the machine's
configuration, so set ``VGPU_SIM_*`` keys in the dict (see
docs/simulator.md) before starting anything::

    def test_x(sim_env: dict[str, str]) -> None:
        sim_env["VGPU_SIM_MEMORY"] = "1g"
        subprocess.run([str(BUILD / "vgpu-burn"), "--meminfo"], env=sim_env, check=True)

Import the constants with ``from tests.conftest import BUILD``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from vgpud import log as vgpud_log
from vgpud.log import TenantLines

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
SIM_LIB_DIR = BUILD / "sim"

# Inherited settings that would make a test depend on the caller's shell.
_SCRUBBED_PREFIXES = ("VGPU_SIM_", "VGPU_ARBITER_")
_SCRUBBED_KEYS = ("CUDA_VISIBLE_DEVICES", "LD_PRELOAD")


def sim_environment(state: Path) -> dict[str, str]:
    """The environment of a process on the simulated machine whose state
    file is ``state`` (what ``sim_env`` gives; for wider-scoped fixtures)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _SCRUBBED_KEYS and not key.startswith(_SCRUBBED_PREFIXES)
    }
    inherited = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = f"{SIM_LIB_DIR}:{inherited}" if inherited else str(SIM_LIB_DIR)
    env["VGPU_SIM_STATE"] = str(state)
    # The simulated GPUs' turns (arbiter blocks) are the machine's too: the
    # default, /tmp, would make unrelated tests with the same simulated UUID
    # take turns with each other.
    arbiters = state.parent / f"{state.name}.arbiters"
    arbiters.mkdir(exist_ok=True)
    env["VGPU_ARBITER_DIR"] = str(arbiters)
    return env


@pytest.fixture
def sim_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment for subprocesses that run against a private simulated GPU."""
    state = tmp_path / "vgpu-sim-state"
    yield sim_environment(state)
    state.unlink(missing_ok=True)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A /proc tree of one docker container (tests/fixtures/proc/
    docker-cgroupfs-v1): host pids 4100 (ns pid 1) and 4150 (ns pid 7) in PID
    namespace 4026532201, start time 1000 + host pid, and the host's pid 1."""
    root = tmp_path / "proc"
    shutil.copytree(
        ROOT / "tests" / "fixtures" / "proc" / "docker-cgroupfs-v1", root, symlinks=True
    )
    return root


@pytest.fixture(autouse=True)
def tenant_lines(monkeypatch: pytest.MonkeyPatch) -> TenantLines:
    """The daemon's bound on tenant-driven log lines is process-wide: each
    test gets its own, so a line another test said first is not held back
    here. A test may set its ``clock``."""
    lines = TenantLines()
    monkeypatch.setattr(vgpud_log, "TENANT_LINES", lines)
    return lines
