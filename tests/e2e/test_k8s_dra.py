"""The DRA driver end to end: the kubelet stand-in prepares a claim through
vgpud-k8s over the real gRPC socket, a real podman container starts with
the CDI id that NodePrepareResources answered and is held to the claim's
memory (its blocks carry the claim's share), a prepare repeated after a
driver restart answers the same and makes nothing new, and
NodeUnprepareResources deletes the vGPU."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import GIB, Vgpud, burn_past_one_gib
from tests.e2e.podman import Podman
from tests.e2e.test_containers_isolation import limits_in_block
from tests.k8s.apiserver import ApiServer
from tests.k8s.dra_harness import GPU0, Driver, allocated_claim
from tests.k8s.drakubelet import DraKubelet

CLAIM = ("ml", "train", "uid-e2e")


@pytest.fixture
def driver_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra"))  # socket paths < 108 bytes
    yield root
    shutil.rmtree(root, ignore_errors=True)


def managed(vgpud: Vgpud) -> list[str]:
    return [v["id"] for v in vgpud.get("/v1/vgpus") if v["kind"] == "managed"]


def test_a_claim_becomes_a_container_held_to_its_slice_and_goes_with_unprepare(
    vgpud: Vgpud,
    podman: Podman,
    api: ApiServer,
    dra_kubelet: DraKubelet,
    driver_root: Path,
    sim_state: dict[str, str],
    sim_volumes: list[str],
) -> None:
    api.put_claim(allocated_claim(CLAIM[1], CLAIM[2], (GPU0, {"memory": "1Gi", "cores": "50"})))
    driver = Driver(vgpud.socket, api, driver_root).start()
    try:
        dra_kubelet.register(driver.registration_socket)
        first = dra_kubelet.prepare(CLAIM)
        assert first.claims[CLAIM[2]].error == ""
        [device] = first.claims[CLAIM[2]].devices
        [cdi_id] = device.cdi_device_ids

        vgpu = burn_past_one_gib(vgpud, podman, cdi_id, sim_state, sim_volumes)
        assert (vgpu["memory"], vgpu["share"]) == (GIB, 50)
        assert limits_in_block(vgpu) == [(GIB, 500_000)]  # what the container's hook reads

        driver.kill()  # SIGKILL: no goodbye, its checkpoint is all that is left
        driver = Driver(vgpud.socket, api, driver_root).start()
        dra_kubelet.register(driver.registration_socket)
        assert dra_kubelet.prepare(CLAIM) == first
        assert managed(vgpud) == [vgpu["id"]]

        assert dra_kubelet.unprepare(CLAIM).claims[CLAIM[2]].error == ""
        assert managed(vgpud) == []
        gone = podman.run(["true"], devices=[cdi_id])
        assert gone.returncode != 0 and "unresolvable CDI devices" in gone.stderr
    finally:
        driver.stop()
