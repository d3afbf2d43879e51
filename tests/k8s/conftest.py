"""Fixtures of vgpud-k8s's tests: the real vgpud on a simulated machine of
two 4 GiB GPUs, the kubelet stand-ins (device plugin, DRA), the API server
stand-in, and vgpud-k8s as a subprocess in either mode."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import BUILD, ROOT, sim_environment
from tests.integration.daemon_harness import Daemon, base_env
from tests.k8s.apiserver import ApiServer
from tests.k8s.dra_harness import Driver
from tests.k8s.drakubelet import DraKubelet
from tests.k8s.kubelet import Kubelet

SIM_MACHINE = {"VGPU_SIM_DEVICES": "2", "VGPU_SIM_MEMORY": "4g"}


@pytest.fixture(scope="module")
def vgpud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    if not (BUILD / "sim" / "libnvidia-ml.so.1").exists():
        pytest.skip("the simulated GPU is not built (run `make`)")
    workdir = tmp_path_factory.mktemp("vgpud")
    env = {**base_env(), **sim_environment(workdir / "sim-state"), **SIM_MACHINE}
    daemon = Daemon(workdir, env, config="scan_interval = 0.5\n").start()
    yield daemon
    daemon.cleanup()


@pytest.fixture
def clean_vgpud(vgpud: Daemon) -> Iterator[Daemon]:
    """The module's vgpud; the vGPUs a test leaves are deleted after it."""
    yield vgpud
    for vgpu in vgpud.client.get("/v1/vgpus"):
        if vgpu["kind"] == "managed":
            vgpud.client.delete(f"/v1/vgpus/{vgpu['id']}?force=true")


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="k8s"))  # socket paths < 108 bytes
    stand_in = Kubelet(root)
    yield stand_in
    stand_in.close()
    shutil.rmtree(root, ignore_errors=True)


class PluginProcess:
    """vgpud-k8s device-plugin, as a DaemonSet's container runs it."""

    def __init__(self, vgpud: Daemon, kubelet: Kubelet, log: Path, *extra: str) -> None:
        self.args = [
            sys.executable,
            "-m",
            "vgpud.k8s.main",
            "--socket",
            vgpud.socket,
            "--log-format",
            "console",
            "device-plugin",
            "--plugin-dir",
            str(kubelet.plugin_dir),
            "--pod-resources",
            str(kubelet.pod_resources_socket),
            "--health-interval",
            "0.1",
            "--reconcile-interval",
            "0.2",
            "--grace",
            "2",
            *extra,
        ]
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> PluginProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log, cwd=ROOT)
        return self

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(30)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def start_plugin(
    clean_vgpud: Daemon, kubelet: Kubelet, tmp_path: Path
) -> Iterator[Callable[..., PluginProcess]]:
    started: list[PluginProcess] = []

    def start(*extra: str) -> PluginProcess:
        plugin = PluginProcess(clean_vgpud, kubelet, tmp_path / "plugin.log", *extra).start()
        started.append(plugin)
        return plugin

    yield start
    for plugin in started:
        if plugin.proc is not None and plugin.proc.poll() is None:
            plugin.stop()


@pytest.fixture
def api() -> Iterator[ApiServer]:
    """The API server stand-in, for the DRA driver."""
    server = ApiServer()
    yield server
    server.close()


@pytest.fixture
def dra_kubelet() -> Iterator[DraKubelet]:
    stand_in = DraKubelet()
    yield stand_in
    stand_in.close()


@pytest.fixture
def start_driver(clean_vgpud: Daemon, api: ApiServer) -> Iterator[Callable[..., Driver]]:
    """Start vgpud-k8s dra (again: the same plugin directory, so its
    checkpoint and sockets stay), with ``extra`` flags; every one started
    is stopped after."""
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="dra"))
    started: list[Driver] = []

    def start(*extra: str) -> Driver:
        started.append(Driver(clean_vgpud.socket, api, root, *extra).start())
        return started[-1]

    yield start
    for driver in started:
        driver.stop()
    shutil.rmtree(root, ignore_errors=True)
