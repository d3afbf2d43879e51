"""The device plugin's arithmetic, without a kubelet or a daemon: which ids
a node advertises, what size a container's vGPU gets, where its slots go,
and which vGPUs are orphans (and what the reconciler does with them)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vgpud.k8s.daemon import ApiFailure, Gpu
from vgpud.k8s.reconcile import Reconciler, orphans, vgpu_name
from vgpud.k8s.resources import (
    CORES,
    MEMORY,
    MIB,
    VGPU,
    BadRequest,
    Units,
    check_ids,
    inventory,
    parse,
    preferred,
    size,
)

GIB = 1 << 30
A = Gpu("GPU-aaaaaaaa-0000-4000-8000-000000000000", 0, "sim", 16 * GIB, True)
B = Gpu("GPU-bbbbbbbb-0000-4000-8000-000000000000", 1, "sim", 8 * GIB, False)
UNITS = Units(shares=4, memory_unit=256 * MIB)


def slot(gpu: Gpu, n: int) -> str:
    return f"{gpu.uuid.lower()}-s{n}"


def test_a_node_advertises_slots_memory_units_and_cores_healthy_as_their_gpu() -> None:
    assert len(inventory(VGPU, [A, B], UNITS)) == 8
    assert len(inventory(MEMORY, [A, B], UNITS)) == 64 + 32
    cores = inventory(CORES, [A, B], UNITS)
    assert len(cores) == 200
    assert {d.healthy for d in cores if d.id.startswith("gpu-bbbb")} == {False}
    assert all(parse(d.id) is not None and len(d.id) <= 63 for d in cores)


@pytest.mark.parametrize(
    "ids",
    [
        [],
        [slot(A, 4)],  # only 4 slots per GPU
        [slot(A, 0), slot(A, 0)],
        ["gpu-cccccccc-0000-4000-8000-000000000000-s0"],
        [f"{A.uuid.lower()}-m0"],  # a memory unit, not a slot
        [f"{A.uuid.lower()}-s01"],
        ["x" * 5000],
    ],
)
def test_ids_the_node_never_advertised_are_refused(ids: list[str]) -> None:
    with pytest.raises(BadRequest):
        check_ids(VGPU, ids, [A, B], UNITS)


def test_memory_and_cores_are_split_over_the_slots_gpus() -> None:
    assert size([slot(A, 0)], 32, 30, [A, B], UNITS).memory == 8 * GIB
    both = size([slot(A, 0), slot(B, 1), slot(A, 2)], 32, 100, [A, B], UNITS)
    assert (both.gpus, both.memory, both.share) == ((A.uuid, B.uuid), 4 * GIB, 50)
    assert size([slot(A, 0)], 0, 0, [A, B], UNITS).memory is None


def test_more_memory_than_the_smallest_gpu_or_a_share_over_100_is_refused() -> None:
    with pytest.raises(BadRequest, match="more than a GPU holds"):
        size([slot(A, 0), slot(B, 0)], 80, 0, [A, B], UNITS)  # 10 GiB each, B has 8
    with pytest.raises(BadRequest, match="over 100"):
        size([slot(A, 0)], 0, 101, [A, B], UNITS)


def test_preferred_slots_keep_the_required_and_spread_over_gpus() -> None:
    available = [slot(A, n) for n in range(4)] + [slot(B, n) for n in range(2)]
    assert preferred(available, [], 2) == [slot(A, 0), slot(B, 0)]
    assert preferred(available, [slot(B, 1)], 2) == [slot(B, 1), slot(A, 0)]
    assert preferred(available, [], 3)[2] == slot(A, 1)


def test_a_vgpu_is_an_orphan_when_no_container_holds_its_slot_after_the_grace() -> None:
    held = vgpu_name([slot(A, 1), slot(A, 0)])
    assert held == f"k8s-{slot(A, 0)}"
    vgpus = [
        {"id": "vg-held", "name": held, "created_at": 0.0},
        {"id": "vg-gone", "name": f"k8s-{slot(B, 0)}", "created_at": 0.0},
        {"id": "vg-new", "name": f"k8s-{slot(B, 1)}", "created_at": 95.0},
        {"id": "vg-else", "name": "train", "created_at": 0.0},
    ]
    assert orphans(vgpus, {slot(A, 0)}, now=100.0, grace=10.0) == ["vg-gone"]


def test_units_refuse_settings_that_cannot_work() -> None:
    with pytest.raises(ValueError):
        Units(shares=0)
    with pytest.raises(ValueError):
        Units(memory_unit=MIB)


class _Holders:
    async def holders(self) -> list[Any]:
        return []


class _Vgpud:
    """vgpud answering the reconciler: two orphans, the first one's delete
    answered with a 500; or the listing itself answered with one."""

    def __init__(self, listing_fails: bool) -> None:
        self.listing_fails = listing_fails
        self.deleted: list[str] = []

    async def vgpus(self, owner: str) -> list[dict[str, Any]]:
        if self.listing_fails:
            raise ApiFailure(500, "internal", "listing")
        return [{"id": f"vg-{n}", "name": f"k8s-{slot(A, n)}", "created_at": 0.0} for n in range(2)]

    async def delete(self, key: str) -> bool:
        if key == "vg-0":
            raise ApiFailure(500, "internal", "deleting")
        self.deleted.append(key)
        return True


@pytest.mark.parametrize("listing_fails", [False, True], ids=["delete", "list"])
def test_an_error_answer_from_vgpud_skips_a_reconcile_step_and_the_loop_goes_on(
    listing_fails: bool,
) -> None:
    """An error answer (a 500) to the reconciler's listing or to one delete
    ended its loop, and vgpud-k8s with it."""
    vgpud = _Vgpud(listing_fails)
    reconciler = Reconciler(vgpud, _Holders(), "device-plugin", 0.0, 0.0)  # type: ignore[arg-type]
    deleted = asyncio.run(reconciler.once())
    assert deleted == ([] if listing_fails else ["vg-1"])
    assert vgpud.deleted == deleted
