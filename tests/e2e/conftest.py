"""Fixtures of the container tests: podman, a root filesystem built here,
and vgpud on a simulated GPU that host and containers share.

The simulated GPU is one state file; its directory is bind-mounted into
every container at the same path, so the daemon's NVML and the containers'
CUDA calls see one machine. Podman reads CDI specs from the daemon's
``cdi_dir``: a private directory when podman takes ``--cdi-spec-dir``
(newer podman), else the system's /var/run/cdi (Debian 12's podman 4.3),
where the test daemon touches only its own vgpud.io-vgpu-*.json files.

Everything skips, saying why, without root, podman, runc or the build.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BUILD, SIM_LIB_DIR, sim_environment
from tests.e2e.harness import Vgpud
from tests.e2e.podman import CDI_SYSTEM_DIR, Podman, missing_requirements, supports_cdi_spec_dir
from tests.k8s.conftest import api, dra_kubelet  # noqa: F401 (the DRA stand-ins, for test_k8s_dra)

HERE = Path(__file__).resolve().parent
NEEDED = (
    BUILD / "vgpu-burn",
    BUILD / "libvgpu.so",
    SIM_LIB_DIR / "libcuda.so.1",
    SIM_LIB_DIR / "libnvidia-ml.so.1",
)
# The simulated machine every test shares (fixed by the first process).
SIM_MACHINE = {"VGPU_SIM_DEVICES": "2", "VGPU_SIM_MEMORY": "4g"}
# A short scan so that "within one scan" stays short.
DAEMON_CONFIG = "scan_interval = 0.5\n"


@pytest.fixture(scope="session")
def e2e_ready() -> None:
    reason = missing_requirements()
    if reason is None:
        missing = [str(p) for p in NEEDED if not p.exists()]
        reason = f"not built: {', '.join(missing)} (run `make`)" if missing else None
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> Path:
    dest = tmp_path_factory.mktemp("rootfs")
    subprocess.run(
        [str(HERE / "build_rootfs.sh"), str(dest), str(BUILD)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dest


@pytest.fixture(scope="session")
def sim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sim")


@pytest.fixture(scope="session")
def sim_state(sim_dir: Path) -> dict[str, str]:
    """What a container needs to join the simulated machine: env and volume."""
    return {"VGPU_SIM_STATE": str(sim_dir / "state")}


@pytest.fixture(scope="session")
def session_podman(tmp_path_factory: pytest.TempPathFactory, rootfs: Path) -> Iterator[Podman]:
    storage = tmp_path_factory.mktemp("podman")
    private_cdi = storage / "cdi" if supports_cdi_spec_dir() else None
    podman = Podman(storage, rootfs, private_cdi)
    yield podman
    podman.close()


@pytest.fixture
def podman(session_podman: Podman) -> Iterator[Podman]:
    """The session's podman; containers a test starts are removed after it."""
    yield session_podman
    session_podman.remove_all()


@pytest.fixture(scope="module")
def vgpud(
    tmp_path_factory: pytest.TempPathFactory,
    session_podman: Podman,
    sim_dir: Path,
    sim_state: dict[str, str],
) -> Iterator[Vgpud]:
    workdir = tmp_path_factory.mktemp("vgpud")
    cdi_dir = session_podman.cdi_dir or CDI_SYSTEM_DIR
    env = {**sim_environment(sim_dir / "state"), **SIM_MACHINE, "VGPUD_CDI_DIR": str(cdi_dir)}
    daemon = Vgpud(workdir, env, DAEMON_CONFIG)
    yield daemon
    for vgpu in daemon.get("/v1/vgpus"):
        if vgpu["kind"] == "managed":  # standalone ones end with their processes
            daemon.delete(vgpu["id"])
    daemon.stop()


@pytest.fixture
def make_vgpu(vgpud: Vgpud) -> Iterator[Callable[..., dict[str, Any]]]:
    """Create vGPUs for one test; they are deleted after it."""
    made: list[str] = []

    def make(**fields: Any) -> dict[str, Any]:
        vgpu = vgpud.create(**fields)
        made.append(vgpu["id"])
        return vgpu

    yield make
    for vgpu_id in made:
        vgpud.delete(vgpu_id)


@pytest.fixture
def sim_volumes(sim_dir: Path) -> list[str]:
    return [f"{sim_dir}:{sim_dir}"]
