"""The DRA driver's health stream (v1alpha1.DRAResourceHealth) followed over
real gRPC by the kubelet stand-in: every GPU of the node's pool reported,
a critical Xid turning its GPU UNHEALTHY with vgpud's reason, vgpud not
answering turning every GPU UNHEALTHY until it is back. (A module of its
own: it harms its vgpud's GPUs.)"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from tests.conftest import BUILD
from tests.integration.daemon_harness import Daemon, wait_for
from tests.k8s.dra_harness import GPU0, GPU1, NODE, Driver
from tests.k8s.drakubelet import DraKubelet
from vgpud.k8s.drahealth import TIMEOUT_S


def test_the_stream_reports_every_gpu_of_the_pool_healthy(
    dra_kubelet: DraKubelet, start_driver: Callable[[], Driver]
) -> None:
    dra_kubelet.register(start_driver().registration_socket)

    wait_for(lambda: dra_kubelet.health_reports, what="a health report")

    [report] = dra_kubelet.health_reports[:1]
    assert {d.device.pool_name for d in report.devices} == {NODE}
    assert {d.health_check_timeout_seconds for d in report.devices} == {TIMEOUT_S}
    assert all(d.last_updated_time > 0 for d in report.devices)
    assert dra_kubelet.health() == {GPU0: ("HEALTHY", ""), GPU1: ("HEALTHY", "")}


def test_a_gpu_with_a_critical_xid_turns_unhealthy_live_with_the_reason(
    dra_kubelet: DraKubelet, start_driver: Callable[[], Driver], clean_vgpud: Daemon
) -> None:
    dra_kubelet.register(start_driver().registration_socket)
    wait_for(lambda: dra_kubelet.health().get(GPU0, ("",))[0] == "HEALTHY", what="GPU 0 healthy")

    subprocess.run([str(BUILD / "vgpu-simctl"), "xid", "0", "79"], env=clean_vgpud.env, check=True)

    wait_for(lambda: dra_kubelet.health()[GPU0][0] == "UNHEALTHY", what="GPU 0 unhealthy")
    assert "79" in dra_kubelet.health()[GPU0][1]  # vgpud's reason names the Xid
    assert dra_kubelet.health()[GPU1] == ("HEALTHY", "")  # GPU 1 goes on


def test_while_vgpud_does_not_answer_every_gpu_is_unhealthy(
    dra_kubelet: DraKubelet, start_driver: Callable[[], Driver], vgpud: Daemon
) -> None:
    dra_kubelet.register(start_driver().registration_socket)
    wait_for(lambda: dra_kubelet.health().get(GPU1, ("",))[0] == "HEALTHY", what="GPU 1 healthy")

    vgpud.stop()
    try:
        wait_for(
            lambda: {h for h, _ in dra_kubelet.health().values()} == {"UNHEALTHY"},
            what="every GPU unhealthy",
        )
        assert dra_kubelet.health()[GPU1] == ("UNHEALTHY", "vgpud does not answer")
    finally:
        vgpud.start()
    wait_for(lambda: dra_kubelet.health()[GPU1] == ("HEALTHY", ""), what="GPU 1 healthy again")
