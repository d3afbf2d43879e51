"""cudainfo against the simulated libcuda.so.1: SM counts by NVML-style
UUID, and nothing (never an error) when the driver cannot answer.

Each read runs in a child Python: cuInit takes a process slot of the
simulated machine, which the test process must not hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, SIM_LIB_DIR

SIM_CUDA = str(SIM_LIB_DIR / "libcuda.so.1")


def sm_counts(env: dict[str, str], library: str) -> dict[str, int]:
    script = (
        "import json, sys\n"
        "from vgpud.observe.cudainfo import sm_counts\n"
        "print(json.dumps(sm_counts(sys.argv[1])))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, library],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    counts: dict[str, int] = json.loads(proc.stdout.splitlines()[-1])
    return counts


def test_sm_counts_by_uuid_in_nvml_form(sim_env: dict[str, str]) -> None:
    uuids = ["GPU-5117a000-0000-4000-8000-00000000000b", "GPU-0123abcd-4567-89ab-cdef-0123456789ab"]
    sim_env |= {"VGPU_SIM_DEVICES": "2", "VGPU_SIM_SMS": "48", "VGPU_SIM_UUIDS": ",".join(uuids)}
    sim_env["CUDA_VISIBLE_DEVICES"] = "1,0"  # CUDA's order is not NVML's
    assert sm_counts(sim_env, SIM_CUDA) == {uuids[0]: 48, uuids[1]: 48}


def test_no_driver_or_no_device_gives_nothing(sim_env: dict[str, str], tmp_path: Path) -> None:
    assert sm_counts(sim_env, str(tmp_path / "libcuda.so.1")) == {}  # no such library
    # A library without the entry points (the simulated NVML).
    assert sm_counts(sim_env, str(SIM_LIB_DIR / "libnvidia-ml.so.1")) == {}
    sim_env["CUDA_VISIBLE_DEVICES"] = "7"  # cuInit: no device
    assert sm_counts(sim_env, SIM_CUDA) == {}
