"""vgpud-k8s's DRA driver driven over real gRPC by the kubelet's side
(plugin watcher registration, NodePrepareResources / NodeUnprepareResources)
with claims and slices in an API server stand-in, on a real vgpud with the
simulated GPU (two 4 GiB GPUs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity

from tests.integration.daemon_harness import Daemon, wait_for
from tests.k8s.apiserver import ApiServer
from tests.k8s.dra_harness import GIB, GPU0, GPU1, NODE, Driver, allocated_claim
from tests.k8s.drakubelet import DraKubelet
from vgpud.k8s.daemon import MANAGED_BY
from vgpud.k8s.dra import CLAIM_UID, DRA_OWNER


def vgpus(vgpud: Daemon) -> list[dict[str, Any]]:
    return [v for v in vgpud.client.get("/v1/vgpus") if v["kind"] == "managed"]


def least(capacity: dict[str, Any]) -> int:
    """What a claim asking as little as it may consumes of one capacity of a
    published device: the scheduler rounds a request up into the policy's
    range or values, and an allocation takes all of a capacity with none."""
    policy = capacity.get("requestPolicy")
    if policy is None:
        return int(parse_quantity(capacity["value"]))
    if policy.get("validValues"):
        return min(int(parse_quantity(v)) for v in policy["validValues"])
    return int(parse_quantity(policy["validRange"]["min"]))


def test_the_driver_registers_through_the_plugin_watcher(
    dra_kubelet: DraKubelet, start_driver: Callable[[], Driver]
) -> None:
    driver = start_driver()

    info = dra_kubelet.register(driver.registration_socket)

    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin",
        "vgpud.io",
        ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"],
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
    dra_kubelet: DraKubelet,
    start_driver: Callable[[], Driver],
    clean_vgpud: Daemon,
) -> None:
    driver = start_driver()
    dra_kubelet.register(driver.registration_socket)
    api.put_claim(allocated_claim("train", "uid-1", (GPU1, {"memory": "1Gi", "cores": "30"})))

    first = dra_kubelet.prepare(("ml", "train", "uid-1"))

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

    assert dra_kubelet.prepare(("ml", "train", "uid-1")) == first  # the kubelet may ask again
    driver.kill()
    dra_kubelet.register(start_driver().registration_socket)
    assert dra_kubelet.prepare(("ml", "train", "uid-1")) == first  # ... and after a restart
    assert [v["id"] for v in vgpus(clean_vgpud)] == [vgpu["id"]]

    done = dra_kubelet.unprepare(("ml", "train", "uid-1"))
    assert done.claims["uid-1"].error == ""
    assert vgpus(clean_vgpud) == []
    assert dra_kubelet.unprepare(("ml", "train", "uid-1")).claims["uid-1"].error == ""


def test_a_claim_of_a_whole_device_gets_the_whole_gpu(
    api: ApiServer,
    dra_kubelet: DraKubelet,
    start_driver: Callable[[], Driver],
    clean_vgpud: Daemon,
) -> None:
    dra_kubelet.register(start_driver().registration_socket)
    api.put_claim(allocated_claim("whole", "uid-2", (GPU0, {})))

    answer = dra_kubelet.prepare(("ml", "whole", "uid-2"))

    assert answer.claims["uid-2"].error == ""
    [vgpu] = vgpus(clean_vgpud)
    assert (vgpu["memory"], vgpu["share"]) == (4 * GIB, 100)


def test_bad_claims_get_an_error_per_claim_and_create_nothing(
    api: ApiServer,
    dra_kubelet: DraKubelet,
    start_driver: Callable[[], Driver],
    clean_vgpud: Daemon,
) -> None:
    dra_kubelet.register(start_driver().registration_socket)
    api.put_claim(allocated_claim("elsewhere", "uid-3", (GPU0, {}), ("gpu-not-here", {})))
    api.put_claim(allocated_claim("greedy", "uid-4", (GPU0, {"memory": "5Gi"})))

    answer = dra_kubelet.prepare(
        ("ml", "elsewhere", "uid-3"), ("ml", "greedy", "uid-4"), ("ml", "missing", "uid-5")
    )

    assert "device 'gpu-not-here' is not on this node" in answer.claims["uid-3"].error
    assert "more than" in answer.claims["uid-4"].error
    assert "reading the claim: 404" in answer.claims["uid-5"].error
    assert vgpus(clean_vgpud) == []  # the first device of uid-3 was not left behind


def test_every_claim_the_slice_has_room_for_is_prepared_however_small(
    api: ApiServer,
    dra_kubelet: DraKubelet,
    start_driver: Callable[..., Driver],
    clean_vgpud: Daemon,
) -> None:
    """A tenant's claims of the least memory and cores each took every vGPU
    vgpud lets a GPU have (max_vgpus_per_gpu) while the slice still showed
    room: the scheduler went on placing claims on the GPU, and every one of
    them failed to prepare, for good."""
    dra_kubelet.register(start_driver("--memory-unit", "64m").registration_socket)
    published = wait_for(lambda: api.slices.get(f"{NODE}-vgpud.io"), what="the ResourceSlice")
    [gpu0] = [d for d in published["spec"]["devices"] if d["name"] == GPU0]
    smallest = {name: least(c) for name, c in gpu0["capacity"].items()}
    room = min(
        int(parse_quantity(c["value"])) // smallest[name] for name, c in gpu0["capacity"].items()
    )
    assert room >= 2
    claims = [("ml", f"tiny-{n}", f"uid-tiny-{n}") for n in range(room)]
    for _, name, uid in claims:  # as the scheduler allocates them, one after another
        consumed = {capacity: str(amount) for capacity, amount in smallest.items()}
        api.put_claim(allocated_claim(name, uid, (GPU0, consumed)))

    answer = dra_kubelet.prepare(*claims)

    refused = {uid: claim.error for uid, claim in answer.claims.items() if claim.error}
    assert refused == {}
    assert len(vgpus(clean_vgpud)) == room


def test_a_claim_unprepared_after_a_crash_before_its_checkpoint_leaves_no_vgpu(
    dra_kubelet: DraKubelet,
    start_driver: Callable[[], Driver],
    clean_vgpud: Daemon,
) -> None:
    """The driver killed after vgpud made a claim's vGPU and before the
    checkpoint said so: if the kubelet then unprepares the claim instead of
    preparing it again, the vGPU is found by its claim's label and deleted,
    not left for ever. Other claims' vGPUs and vGPUs made by hand stay."""

    def made(name: str, labels: dict[str, str]) -> None:
        body = {"name": name, "gpus": [0], "memory": "1g", "share": 30, "labels": labels}
        clean_vgpud.client.request("POST", "/v1/vgpus", body)

    made("dra-uid-9-0", {MANAGED_BY: DRA_OWNER, CLAIM_UID: "uid-9"})
    made("dra-uid-8-0", {MANAGED_BY: DRA_OWNER, CLAIM_UID: "uid-8"})
    made("by-hand", {CLAIM_UID: "uid-9"})
    dra_kubelet.register(start_driver().registration_socket)

    done = dra_kubelet.unprepare(("ml", "crashed", "uid-9"))

    assert done.claims["uid-9"].error == ""
    assert sorted(v["name"] for v in vgpus(clean_vgpud)) == ["by-hand", "dra-uid-8-0"]


def test_a_claim_of_two_gpus_is_one_vgpu_over_both(
    api: ApiServer,
    dra_kubelet: DraKubelet,
    start_driver: Callable[[], Driver],
    clean_vgpud: Daemon,
) -> None:
    """A container is given a claim's devices together and holds one vGPU
    (its blocks at fixed paths, its variables naming one vGPU): two vGPUs,
    one a device, put both at the same paths, and the container had one of
    them. A claim of two GPUs is one vGPU over both; devices it cannot be
    one vGPU of are refused, and nothing is made."""
    dra_kubelet.register(start_driver().registration_socket)
    half = {"memory": "1Gi", "cores": "50"}
    api.put_claim(allocated_claim("pair", "uid-p", (GPU0, half), (GPU1, half)))
    api.put_claim(allocated_claim("uneven", "uid-u", (GPU0, half), (GPU1, {**half, "cores": "40"})))
    api.put_claim(allocated_claim("twice", "uid-t", (GPU0, half), (GPU0, half)))

    answer = dra_kubelet.prepare(
        ("ml", "pair", "uid-p"), ("ml", "uneven", "uid-u"), ("ml", "twice", "uid-t")
    )

    [vgpu] = vgpus(clean_vgpud)
    assert ([g["index"] for g in vgpu["gpus"]], vgpu["memory"], vgpu["share"]) == ([0, 1], GIB, 50)
    first, second = answer.claims["uid-p"].devices
    assert (list(first.cdi_device_ids), list(second.cdi_device_ids)) == (
        [vgpu["recipe"]["cdi_device"]],
        [],
    )
    assert "consume different memory or cores" in answer.claims["uid-u"].error
    assert "two of the claim's devices" in answer.claims["uid-t"].error
    assert dra_kubelet.unprepare(("ml", "pair", "uid-p")).claims["uid-p"].error == ""
    assert vgpus(clean_vgpud) == []
