"""The device plugin end to end: the kubelet stand-in allocates a container
through vgpud-k8s, a real podman container starts with the CDI name that
Allocate answered, its memory limit holds, and once the pod is gone its
vGPU is deleted."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import GIB, Vgpud, burn_past_one_gib
from tests.e2e.podman import Podman
from tests.integration.daemon_harness import wait_for
from tests.k8s.conftest import PluginProcess
from tests.k8s.kubelet import Kubelet
from vgpud.k8s.resources import CORES, MEMORY, VGPU


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="k8s"))
    stand_in = Kubelet(root)
    yield stand_in
    stand_in.close()
    shutil.rmtree(root, ignore_errors=True)


def test_a_pod_gets_its_vgpu_through_cdi_the_limit_holds_and_it_goes_with_the_pod(
    vgpud: Vgpud,
    podman: Podman,
    kubelet: Kubelet,
    sim_state: dict[str, str],
    sim_volumes: list[str],
    tmp_path: Path,
) -> None:
    plugin = PluginProcess(vgpud, kubelet, tmp_path / "plugin.log", "--inject", "cdi").start()
    try:
        kubelet.wait_registered(VGPU, MEMORY, CORES)
        slot = sorted(kubelet.devices(VGPU))[:1]
        answer = kubelet.allocate("ml", "train", "main", VGPU, slot)
        kubelet.allocate("ml", "train", "main", MEMORY, sorted(kubelet.devices(MEMORY))[:4])
        kubelet.allocate("ml", "train", "main", CORES, sorted(kubelet.devices(CORES))[:50])
        kubelet.prestart(VGPU, slot)
        [device] = [d.name for d in answer.cdi_devices]
        assert (dict(answer.envs), list(answer.mounts)) == ({}, [])  # --inject cdi

        vgpu = burn_past_one_gib(vgpud, podman, device, sim_state, sim_volumes)
        assert (vgpu["memory"], vgpu["share"]) == (GIB, 50)

        kubelet.remove_pod("ml", "train")
        wait_for(
            lambda: not any(v["id"] == vgpu["id"] for v in vgpud.get("/v1/vgpus")),
            timeout=15,
            what="the pod's vGPU deleted",
        )
        gone = podman.run(["true"], devices=[device])
        assert gone.returncode != 0 and "unresolvable CDI devices" in gone.stderr
    finally:
        plugin.stop()
