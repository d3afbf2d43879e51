"""vgpud-k8s's device plugin driven by the kubelet stand-in over real gRPC,
on a real vgpud with the simulated GPU (two 4 GiB GPUs)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from tests.conftest import BUILD
from tests.integration.daemon_harness import Daemon, wait_for
from tests.k8s.conftest import PluginProcess
from tests.k8s.kubelet import Kubelet
from vgpud.k8s.resources import CORES, MEMORY, VGPU

StartPlugin = Callable[..., PluginProcess]
GIB = 1 << 30
MIB = 1 << 20


def gpu_ids(kubelet: Kubelet, resource: str, gpu: int, count: int) -> list[str]:
    """``count`` device ids of ``resource`` on GPU ``gpu`` (by index)."""
    uuid = f"gpu-5117a000-0000-4000-8000-00000000000{gpu}"
    return sorted(d for d in kubelet.devices(resource) if d.startswith(uuid))[:count]


def run_container(
    kubelet: Kubelet, pod: str, slots: list[str], memory: int = 0, cores: int = 0
) -> Any:
    """What the kubelet does for a container asking these amounts."""
    answer = kubelet.allocate("default", pod, "main", VGPU, slots)
    if memory:
        kubelet.allocate("default", pod, "main", MEMORY, gpu_ids(kubelet, MEMORY, 0, memory))
    if cores:
        kubelet.allocate("default", pod, "main", CORES, gpu_ids(kubelet, CORES, 1, cores))
    kubelet.prestart(VGPU, slots)
    return answer


def vgpus(vgpud: Daemon) -> list[dict[str, Any]]:
    return [v for v in vgpud.client.get("/v1/vgpus") if v["kind"] == "managed"]


def test_the_three_resources_register_and_list_every_device_healthy(
    kubelet: Kubelet, start_plugin: StartPlugin
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU, MEMORY, CORES)

    assert kubelet.plugins[VGPU].options.pre_start_required
    assert kubelet.plugins[VGPU].options.get_preferred_allocation_available
    assert not kubelet.plugins[MEMORY].options.pre_start_required
    # 4 slots, 4 GiB / 256 MiB units and 100 cores per GPU, two GPUs
    assert len(kubelet.devices(VGPU)) == 8
    assert len(kubelet.devices(MEMORY)) == 32
    assert len(kubelet.devices(CORES)) == 200
    assert {h for r in (VGPU, MEMORY, CORES) for h in kubelet.devices(r).values()} == {"Healthy"}
    assert all(len(d) <= 63 for d in kubelet.devices(MEMORY))


def test_allocate_answers_the_cdi_name_env_and_mounts_and_prestart_sizes_the_vgpu(
    kubelet: Kubelet, start_plugin: StartPlugin, clean_vgpud: Daemon
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU, MEMORY, CORES)
    slots = gpu_ids(kubelet, VGPU, 0, 1)

    answer = run_container(kubelet, "train", slots, memory=8, cores=30)

    [vgpu] = vgpus(clean_vgpud)
    assert [d.name for d in answer.cdi_devices] == [f"vgpud.io/vgpu={vgpu['name']}"]
    assert dict(answer.envs) == vgpu["recipe"]["env"]
    assert [(m.host_path, m.container_path, m.read_only) for m in answer.mounts] == [
        (m["host_path"], m["container_path"], m["read_only"]) for m in vgpu["recipe"]["mounts"]
    ]
    # 8 units of 256 MiB and 30 cores, on the slot's GPU
    assert (vgpu["memory"], vgpu["share"]) == (2 * GIB, 30)
    assert [g["index"] for g in vgpu["gpus"]] == [0]


def test_a_container_asking_only_a_slot_gets_its_part_of_the_gpu(
    kubelet: Kubelet, start_plugin: StartPlugin, clean_vgpud: Daemon
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU)

    run_container(kubelet, "small", gpu_ids(kubelet, VGPU, 1, 1))

    [vgpu] = vgpus(clean_vgpud)
    assert (vgpu["memory"], vgpu["share"]) == (1 * GIB, 25)  # 1/4 of a 4 GiB GPU


def test_two_slots_make_one_vgpu_over_two_gpus_with_the_amounts_split(
    kubelet: Kubelet, start_plugin: StartPlugin, clean_vgpud: Daemon
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU, MEMORY, CORES)
    slots = kubelet.preferred(VGPU, sorted(kubelet.devices(VGPU)), [], 2)

    run_container(kubelet, "wide", slots, memory=16, cores=100)

    [vgpu] = vgpus(clean_vgpud)
    assert sorted(g["index"] for g in vgpu["gpus"]) == [0, 1]
    assert (vgpu["memory"], vgpu["share"]) == (2 * GIB, 50)  # 4 GiB and 100 over two GPUs


def test_preferred_allocation_spreads_slots_over_gpus_and_keeps_what_must_be(
    kubelet: Kubelet, start_plugin: StartPlugin
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU)
    available = sorted(kubelet.devices(VGPU))
    must = gpu_ids(kubelet, VGPU, 1, 1)

    chosen = kubelet.preferred(VGPU, available, must, 2)

    assert chosen[0] == must[0]
    assert {c.split("-s")[0] for c in chosen} == {a.split("-s")[0] for a in available}


@pytest.mark.parametrize(
    ("what", "memory", "cores", "message"),
    [
        ("more memory than a GPU has", 20, 0, "more than a GPU holds (4096 MiB)"),
        ("a share over 100", 0, 150, "a share of 150 per GPU, over 100"),
    ],
)
def test_a_container_asking_too_much_is_refused_clearly_and_leaves_nothing(
    kubelet: Kubelet,
    start_plugin: StartPlugin,
    clean_vgpud: Daemon,
    what: str,
    memory: int,
    cores: int,
    message: str,
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU, MEMORY, CORES)
    slots = gpu_ids(kubelet, VGPU, 0, 1)
    kubelet.allocate("default", "greedy", "main", VGPU, slots)
    if memory:
        kubelet.allocate(
            "default", "greedy", "main", MEMORY, sorted(kubelet.devices(MEMORY))[:memory]
        )
    if cores:
        kubelet.allocate("default", "greedy", "main", CORES, sorted(kubelet.devices(CORES))[:cores])

    for _ in range(2):  # the kubelet retries a failed start: the same answer
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            kubelet.prestart(VGPU, slots)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, what
        assert message in (refused.value.details() or ""), refused.value.details()
        assert "default/greedy/main" in (refused.value.details() or "")
        assert vgpus(clean_vgpud) == []


def test_unknown_device_ids_are_refused_and_create_nothing(
    kubelet: Kubelet, start_plugin: StartPlugin, clean_vgpud: Daemon
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU, MEMORY)
    bad = [
        ["gpu-00000000-0000-0000-0000-000000000000-s0"],  # no such GPU
        [gpu_ids(kubelet, VGPU, 0, 1)[0].replace("-s0", "-s4")],  # slot 4 of 4
        gpu_ids(kubelet, MEMORY, 0, 1),  # a memory unit offered as a slot
        ["../../etc/passwd"],
    ]
    for ids in bad:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            kubelet.allocate("default", "bad", "main", VGPU, ids)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown device id" in (refused.value.details() or "")
    assert vgpus(clean_vgpud) == []


def test_the_vgpu_of_a_pod_that_is_gone_is_deleted_never_while_a_process_runs(
    kubelet: Kubelet, start_plugin: StartPlugin, clean_vgpud: Daemon
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU, MEMORY)
    run_container(kubelet, "worker", gpu_ids(kubelet, VGPU, 0, 1), memory=4)
    [vgpu] = vgpus(clean_vgpud)
    # While the pod is listed, rounds of reconciliation past the grace keep it.
    wait_for(lambda: time.time() - vgpu["created_at"] > 2.5, timeout=5, what="the grace")
    rounds = kubelet.lists
    wait_for(lambda: kubelet.lists >= rounds + 3, what="three rounds")
    assert [v["id"] for v in vgpus(clean_vgpud)] == [vgpu["id"]]

    # A process of the container, still running when the pod leaves the list.
    burn = subprocess.Popen(
        [str(BUILD / "vgpu-burn"), "--alloc", "64m", "--hold", "--seconds", "60"],
        env={**clean_vgpud.env, **vgpu["host_env"]},
    )
    try:
        show = f"/v1/vgpus/{vgpu['id']}"
        wait_for(lambda: clean_vgpud.client.get(show)["processes"] >= 1, what="the process")
        kubelet.remove_pod("default", "worker")
        rounds = kubelet.lists
        wait_for(lambda: kubelet.lists >= rounds + 3, what="three rounds")
        assert [v["id"] for v in vgpus(clean_vgpud)] == [vgpu["id"]]
    finally:
        burn.kill()
        burn.wait()
    wait_for(lambda: vgpus(clean_vgpud) == [], timeout=15, what="the vGPU deleted")


def test_after_a_kubelet_restart_the_plugin_registers_again_and_serves(
    kubelet: Kubelet, start_plugin: StartPlugin, clean_vgpud: Daemon
) -> None:
    start_plugin()
    kubelet.wait_registered(VGPU, MEMORY, CORES)

    kubelet.restart()

    kubelet.wait_registered(VGPU, MEMORY, CORES, after=1)
    assert len(kubelet.devices(VGPU)) == 8
    run_container(kubelet, "after", gpu_ids(kubelet, VGPU, 1, 1), memory=4, cores=10)
    assert [(v["memory"], v["share"]) for v in vgpus(clean_vgpud)] == [(GIB, 10)]


def test_a_restarted_plugin_registers_again_and_still_cleans_up_earlier_vgpus(
    kubelet: Kubelet, start_plugin: StartPlugin, clean_vgpud: Daemon
) -> None:
    first = start_plugin()
    kubelet.wait_registered(VGPU, MEMORY, CORES)
    run_container(kubelet, "old", gpu_ids(kubelet, VGPU, 0, 1), cores=20)
    first.kill()  # SIGKILL: no goodbye

    start_plugin()
    kubelet.wait_registered(VGPU, MEMORY, CORES, after=1)
    assert [v["share"] for v in vgpus(clean_vgpud)] == [20]  # untouched
    kubelet.remove_pod("default", "old")
    wait_for(lambda: vgpus(clean_vgpud) == [], timeout=15, what="the vGPU deleted")
