"""The inventory's streams without a kubelet: the GPUs vgpud shows, their
health when vgpud does not answer, and the heartbeat that tells a reader
which forgets (the kubelet's DRA health cache) that nothing changed."""

from __future__ import annotations

import asyncio
from typing import Any

from vgpud.k8s.daemon import DaemonUnreachable, Gpu
from vgpud.k8s.drahealth import report
from vgpud.k8s.inventory import DAEMON_DOWN, Inventory
from vgpud.k8s.proto.drahealth.v1alpha1 import api_pb2 as health
from vgpud.k8s.resources import MIB, Units

GIB = 1 << 30
A = Gpu("GPU-aaaaaaaa-0000-4000-8000-000000000000", 0, "sim", 16 * GIB, True)


class FakeDaemon:
    def __init__(self) -> None:
        self.answers = True

    async def gpus(self) -> list[Gpu]:
        if not self.answers:
            raise DaemonUnreachable("no socket")
        return [A]


def inventory(daemon: FakeDaemon) -> Inventory:
    fake: Any = daemon
    return Inventory(fake, Units(shares=4, memory_unit=256 * MIB), interval=1.0)


async def test_with_a_heartbeat_the_same_gpus_come_again_without_a_change() -> None:
    stock = inventory(FakeDaemon())
    await stock.refresh()
    stream = stock.watch_gpus(heartbeat=0.01)

    first = await asyncio.wait_for(anext(stream), 10)
    again = await asyncio.wait_for(anext(stream), 10)  # no refresh in between

    assert first == again == [A]


async def test_vgpud_not_answering_makes_every_gpu_unhealthy_with_the_reason() -> None:
    daemon = FakeDaemon()
    stock = inventory(daemon)
    await stock.refresh()
    daemon.answers = False

    await stock.refresh()

    [gpu] = stock.gpus
    assert (gpu.healthy, gpu.reason) == (False, DAEMON_DOWN)
    [device] = report(stock.gpus, "node-a", stock.read_at).devices
    assert (device.device.pool_name, device.device.device_name) == ("node-a", A.uuid.lower())
    assert (device.health, device.message) == (health.UNHEALTHY, DAEMON_DOWN)
    assert device.last_updated_time == int(stock.read_at) > 0


def test_a_long_reason_is_cut_to_what_the_kubelet_keeps() -> None:
    sick = Gpu(A.uuid, 0, "sim", GIB, False, reason="x" * 5000)

    [device] = report([sick], "node-a", 1.0).devices

    assert len(device.message) == 1024
