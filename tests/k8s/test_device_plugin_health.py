"""ListAndWatch follows health live: a GPU that vgpud marks unhealthy (an
Xid on the simulated GPU) turns its devices Unhealthy in the stream, and a
vgpud that does not answer turns them all Unhealthy until it is back.
(A module of its own: it harms its vgpud's GPUs.)"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

from tests.conftest import BUILD
from tests.integration.daemon_harness import Daemon, wait_for
from tests.k8s.conftest import PluginProcess
from tests.k8s.kubelet import Kubelet
from vgpud.k8s.resources import CORES, MEMORY, VGPU

GPU0 = "gpu-5117a000-0000-4000-8000-000000000000"


def health(kubelet: Kubelet, resource: str) -> dict[str, set[str]]:
    """Health values per GPU."""
    per_gpu: dict[str, set[str]] = {}
    for device_id, state in kubelet.devices(resource).items():
        per_gpu.setdefault(device_id.rsplit("-", 1)[0], set()).add(state)
    return per_gpu


def test_a_gpu_with_a_critical_xid_turns_its_devices_unhealthy_live(
    kubelet: Kubelet, start_plugin: Callable[..., PluginProcess], clean_vgpud: Daemon
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU, MEMORY, CORES)

    subprocess.run([str(BUILD / "vgpu-simctl"), "xid", "0", "79"], env=clean_vgpud.env, check=True)

    for resource in (VGPU, MEMORY, CORES):
        wait_for(
            lambda r=resource: health(kubelet, r)[GPU0] == {"Unhealthy"},  # type: ignore[misc]
            what=f"{resource} of GPU 0 unhealthy",
        )
        others = [s for g, s in health(kubelet, resource).items() if g != GPU0]
        assert others == [{"Healthy"}]  # GPU 1 goes on


def test_while_vgpud_does_not_answer_every_device_is_unhealthy(
    kubelet: Kubelet, start_plugin: Callable[..., PluginProcess], vgpud: Daemon
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU)

    vgpud.stop()
    try:
        wait_for(
            lambda: set(kubelet.devices(VGPU).values()) == {"Unhealthy"},
            what="every device unhealthy",
        )
    finally:
        vgpud.start()
    wait_for(lambda: "Healthy" in kubelet.devices(VGPU).values(), what="devices healthy again")


def test_a_vgpud_that_takes_the_call_but_does_not_answer_leaves_the_plugin_serving(
    kubelet: Kubelet, start_plugin: Callable[..., PluginProcess], vgpud: Daemon
) -> None:
    """A vgpud that accepts the connection and does not answer in time
    (stalled: stopped here) is as unreachable as one that is down: every
    device unhealthy, then healthy again. The timeout was not taken for
    that, and vgpud-k8s exited, leaving every pod of the node without the
    plugin until it was restarted."""
    plugin = start_plugin()
    kubelet.wait_registered(VGPU)

    vgpud.signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: set(kubelet.devices(VGPU).values()) == {"Unhealthy"},
            timeout=40,
            what="every device unhealthy",
        )
    finally:
        vgpud.signal(signal.SIGCONT)
    wait_for(lambda: "Healthy" in kubelet.devices(VGPU).values(), what="devices healthy again")
    assert plugin.proc is not None and plugin.proc.poll() is None, plugin.log()[-2000:]
