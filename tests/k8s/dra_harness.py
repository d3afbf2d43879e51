"""The DRA driver as its tests run it: vgpud-k8s dra as a subprocess
against the API server stand-in, and ResourceClaims as the scheduler leaves
them. Shared by tests/k8s and the end-to-end test in tests/e2e."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from tests.conftest import ROOT
from tests.integration.daemon_harness import wait_for
from tests.k8s.apiserver import ApiServer

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

    def __init__(self, vgpud_socket: str, api: ApiServer, root: Path, *extra: str) -> None:
        self.root = root
        self.registry = root / "registry"
        self.registry.mkdir(exist_ok=True)
        self.args = [
            sys.executable, "-m", "vgpud.k8s.main", "--socket", vgpud_socket,
            "--log-format", "console", "dra", "--node-name", NODE,
            "--plugin-dir", str(root / "plugin"), "--registry", str(self.registry),
            "--kubeconfig", str(api.kubeconfig(root / "kubeconfig")),
            "--health-interval", "0.1", *extra,
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
