"""vgpud-k8s's DRA driver driven over real gRPC by the kubelet's side
(plugin watcher registration, NodePrepareResources / NodeUnprepareResources)
with claims and slices in an API server stand-in, on a real vgpud with the
simulated GPU (two 4 GiB GPUs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.conftest import ROOT
from tests.integration.daemon_harness import Daemon, wait_for
from tests.k8s.apiserver import ApiServer
from tests.k8s.drakubelet import DraKubelet

GIB = 1 << 30
GPU0 = "gpu-5117a000-0000-4000-8000-000000000000"
GPU1 = "gpu-5117a000-0000-4000-8000-000000000001"
NODE = "node-a"


def allocated_claim(name: str, uid: str, *results: tuple[str, dict[str, str]]) -> Any:
    """A ResourceClaim as the scheduler leaves it: devices allocated, with
    the capacity each consumed (empty: a whole device)."""
    return k8s.ResourceV1ResourceClaim(
        api_version="resource.k8s.io/v1",
        kind="ResourceClaim",
        metadata=k8s.V1ObjectMeta(name=name, namespace="ml", uid=uid),
        spec=k8s.V1ResourceClaimSpec(
            devices=k8s.V1DeviceClaim(
                requests=[
                    k8s.V1DeviceRequest(
                        name="gpu", exactly=k8s.V1ExactDeviceRequest(device_class_name="vgpud.io")
                    )
                ]
            )
        ),
        status=k8s.V1ResourceClaimStatus(
            allocation=k8s.V1AllocationResult(
                devices=k8s.V1DeviceAllocationResult(
                    results=[
                        k8s.V1DeviceRequestAllocationResult(
                            request="gpu",
                            driver="vgpud.io",
                            pool=NODE,
                            device=device,
                            consumed_capacity=consumed or None,
                        )
                        for device, consumed in results
                    ]
                )
            )
        ),
    )


class Driver:
    """vgpud-k8s dra as a subprocess, as its DaemonSet runs it."""

    def __init__(self, vgpud: Daemon, api: ApiServer, root: Path) -> None:
        self.root = root
        self.registry = root / "registry"
        self.registry.mkdir(exist_ok=True)
        self.args = [
            sys.executable, "-m", "vgpud.k8s.main", "--socket", vgpud.socket,
            "--log-format", "console", "dra", "--node-name", NODE,
            "--plugin-dir", str(root / "plugin"), "--registry", str(self.registry),
            "--kubeconfig", str(api.kubeconfig(root / "kubeconfig")),
            "--health-interval", "0.1",
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def registration_socket(self) -> Path:
        return self.registry / "vgpud.io-reg.sock"

    def start(self) -> Driver:
        before = self._socket_inode()  # a killed driver leaves its socket behind
        with open(self.root / "driver.log", "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log, cwd=ROOT)
        wait_for(
            lambda: self._socket_inode() not in (None, before),
            timeout=20,
            what="the registration socket",
        )
        return self

    def _socket_inode(self) -> tuple[int, int] | None:
        """The socket file's identity: its inode and change time, since a
        socket made again may get the inode number its predecessor freed."""
        try:
            st = self.registration_socket.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_ctime_ns

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    yield server
    server.close()


@pytest.fixture
def kubelet() -> Iterator[DraKubelet]:
    stand_in = DraKubelet()
    yield stand_in
    stand_in.close()


@pytest.fixture
def start_driver(clean_vgpud: Daemon, api: ApiServer) -> Iterator[Callable[[], Driver]]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra"))
    started: list[Driver] = []

    def start() -> Driver:
        started.append(Driver(clean_vgpud, api, root).start())
        return started[-1]

    yield start
    for driver in started:
        driver.stop()
    shutil.rmtree(root, ignore_errors=True)


def vgpus(vgpud: Daemon) -> list[dict[str, Any]]:
    return [v for v in vgpud.client.get("/v1/vgpus") if v["kind"] == "managed"]


def test_the_driver_registers_through_the_plugin_watcher(
    kubelet: DraKubelet, start_driver: Callable[[], Driver]
) -> None:
    driver = start_driver()

    info = kubelet.register(driver.registration_socket)

    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin",
        "vgpud.io",
        ["v1.DRAPlugin"],
    )
    assert Path(info.endpoint).is_socket()


def test_the_node_slice_lists_each_gpu_with_attributes_and_consumable_capacity(
    api: ApiServer, start_driver: Callable[[], Driver]
) -> None:
    start_driver()

    published = wait_for(lambda: api.slices.get(f"{NODE}-vgpud.io"), what="the ResourceSlice")

    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == ("vgpud.io", NODE, NODE)
    [gpu0] = [d for d in spec["devices"] if d["name"] == GPU0]
    assert gpu0["attributes"]["uuid"] == {"string": "GPU-5117a000-0000-4000-8000-000000000000"}
    assert gpu0["attributes"]["productName"] == {"string": "vgpud simulated GPU"}
    assert gpu0["attributes"]["computeCapability"] == {"version": "9.0.0"}
    assert gpu0["allowMultipleAllocations"] is True
    assert gpu0["capacity"]["memory"]["value"] == str(4 * GIB)
    assert gpu0["capacity"]["cores"]["requestPolicy"]["validRange"] == {
        "min": "1",
        "max": "100",
        "step": "1",
    }
    assert len(spec["devices"]) == 2


def test_a_claim_is_prepared_as_a_vgpu_of_what_it_consumed_idempotently_across_restarts(
    api: ApiServer,
    kubelet: DraKubelet,
    start_driver: Callable[[], Driver],
    clean_vgpud: Daemon,
) -> None:
    driver = start_driver()
    kubelet.register(driver.registration_socket)
    api.put_claim(allocated_claim("train", "uid-1", (GPU1, {"memory": "1Gi", "cores": "30"})))

    first = kubelet.prepare(("ml", "train", "uid-1"))

    [device] = first.claims["uid-1"].devices
    assert first.claims["uid-1"].error == ""
    assert (list(device.request_names), device.pool_name, device.device_name) == (
        ["gpu"],
        NODE,
        GPU1,
    )
    [vgpu] = vgpus(clean_vgpud)
    assert list(device.cdi_device_ids) == [vgpu["recipe"]["cdi_device"]]
    assert (vgpu["memory"], vgpu["share"], vgpu["gpus"][0]["index"]) == (GIB, 30, 1)

    assert kubelet.prepare(("ml", "train", "uid-1")) == first  # the kubelet may ask again
    driver.kill()
    kubelet.register(start_driver().registration_socket)
    assert kubelet.prepare(("ml", "train", "uid-1")) == first  # ... and after a restart
    assert [v["id"] for v in vgpus(clean_vgpud)] == [vgpu["id"]]

    done = kubelet.unprepare(("ml", "train", "uid-1"))
    assert done.claims["uid-1"].error == ""
    assert vgpus(clean_vgpud) == []
    assert kubelet.unprepare(("ml", "train", "uid-1")).claims["uid-1"].error == ""


def test_a_claim_of_a_whole_device_gets_the_whole_gpu(
    api: ApiServer,
    kubelet: DraKubelet,
    start_driver: Callable[[], Driver],
    clean_vgpud: Daemon,
) -> None:
    kubelet.register(start_driver().registration_socket)
    api.put_claim(allocated_claim("whole", "uid-2", (GPU0, {})))

    answer = kubelet.prepare(("ml", "whole", "uid-2"))

    assert answer.claims["uid-2"].error == ""
    [vgpu] = vgpus(clean_vgpud)
    assert (vgpu["memory"], vgpu["share"]) == (4 * GIB, 100)


def test_bad_claims_get_an_error_per_claim_and_create_nothing(
    api: ApiServer,
    kubelet: DraKubelet,
    start_driver: Callable[[], Driver],
    clean_vgpud: Daemon,
) -> None:
    kubelet.register(start_driver().registration_socket)
    api.put_claim(allocated_claim("elsewhere", "uid-3", (GPU0, {}), ("gpu-not-here", {})))
    api.put_claim(allocated_claim("greedy", "uid-4", (GPU0, {"memory": "5Gi"})))

    answer = kubelet.prepare(
        ("ml", "elsewhere", "uid-3"), ("ml", "greedy", "uid-4"), ("ml", "missing", "uid-5")
    )

    assert "device 'gpu-not-here' is not on this node" in answer.claims["uid-3"].error
    assert "more than" in answer.claims["uid-4"].error
    assert "reading the claim: 404" in answer.claims["uid-5"].error
    assert vgpus(clean_vgpud) == []  # the first device of uid-3 was not left behind
