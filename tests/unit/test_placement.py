"""Placement and admission, table-driven: what fits where, and why not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.fakes import GIB, FakeGpu, gpus
from vgpud.policy.placement import Ask, PlacementError, Rules, check_update, place
from vgpud.units import MemoryAmount, parse_memory
from vgpud.vgpus.model import Limits, Slice, Vgpu

G = gpus(4)  # four 80 GiB GPUs


def vgpu(
    vid: str, gpu: int, memory: int, share: int, mode: str = "hard", exclusive: bool = False
) -> Vgpu:
    return Vgpu(
        id=vid,
        name=None,
        slices=(Slice(G[gpu].uuid, gpu, memory),),
        limits=Limits(MemoryAmount(nbytes=memory), share, mode, 1),
        oversubscribe=False,
        exclusive=exclusive,
        created_at=0.0,
    )


def ask(memory: str = "1g", share: int = 10, mode: str = "hard", **kw: bool) -> Ask:
    return Ask(parse_memory(memory), share, mode, **kw)


def indices(slices: tuple[Slice, ...]) -> list[int]:
    return [s.gpu_index for s in slices]


PLACED = [vgpu("a", 0, 40 * GIB, 60), vgpu("b", 1, 10 * GIB, 20)]


@pytest.mark.parametrize(
    ("name", "selectors", "count", "the_ask", "rules", "want"),
    [
        ("binpack fills the busiest GPU that fits", ["any"], 1, ask(), Rules(), [0]),
        ("spread takes the idlest", ["any"], 1, ask(), Rules(policy="spread"), [2]),
        ("binpack skips a GPU whose hard shares are full", ["any"], 1, ask(share=50), Rules(), [1]),
        (
            "soft shares are not admitted against hard ones",
            ["any"],
            1,
            ask(share=50, mode="soft"),
            Rules(),
            [0],
        ),
        ("binpack skips a GPU without the memory", ["any"], 1, ask("50g"), Rules(), [1]),
        ("a percentage is of the GPU's memory", ["any"], 1, ask("50%"), Rules(), [0]),
        ("several GPUs at once", ["any"], 3, ask(), Rules(policy="spread"), [2, 3, 1]),
        ("by index", ["3"], 1, ask(), Rules(), [3]),
        ("by UUID", [G[2].uuid], 1, ask(), Rules(), [2]),
        ("named GPUs in the order given", ["3", "1"], 2, ask(), Rules(), [3, 1]),
    ],
)
def test_where_a_vgpu_goes(
    name: str, selectors: list[str], count: int, the_ask: Ask, rules: Rules, want: list[int]
) -> None:
    assert indices(place(selectors, count, the_ask, G, PLACED, rules)) == want, name


@pytest.mark.parametrize(
    ("name", "gpu_list", "placed", "selectors", "count", "the_ask", "rules", "status", "needle"),
    [
        (
            "hard shares over 100",
            G,
            PLACED,
            ["0"],
            1,
            ask(share=41),
            Rules(),
            409,
            "hard share 41% asked, 40% left",
        ),
        ("memory over physical", G, PLACED, ["0"], 1, ask("41g"), Rules(), 409, "asked"),
        ("a vGPU bigger than the GPU", G, [], ["any"], 1, ask("81g"), Rules(), 409, "no room"),
        (
            "oversubscription off on the node",
            G,
            [],
            ["any"],
            1,
            ask(oversubscribe=True),
            Rules(),
            422,
            "disabled",
        ),
        ("more GPUs than the node has", G, [], ["any"], 5, ask(), Rules(), 409, "no room for 5"),
        ("unknown GPU", G, [], ["GPU-x"], 1, ask(), Rules(), 422, "no GPU 'GPU-x'"),
        (
            "MIG GPUs are not sliced",
            [replace(G[0], mig_mode=True)],
            [],
            ["0"],
            1,
            ask(),
            Rules(),
            409,
            "MIG mode",
        ),
        (
            "MIG GPUs are skipped by 'any'",
            [replace(G[0], mig_mode=True)],
            [],
            ["any"],
            1,
            ask(),
            Rules(),
            409,
            "MIG",
        ),
        (
            "unhealthy GPUs get nothing new",
            [replace(G[0], healthy=False)],
            [],
            ["0"],
            1,
            ask(),
            Rules(),
            409,
            "unhealthy",
        ),
        (
            "vGPU count per GPU",
            G,
            [vgpu("x", 0, GIB, 1)],
            ["0"],
            1,
            ask(),
            Rules(max_vgpus_per_gpu=1),
            409,
            "max_vgpus_per_gpu",
        ),
        (
            "exclusive needs an empty GPU",
            G,
            PLACED,
            ["0"],
            1,
            ask(exclusive=True),
            Rules(),
            409,
            "exclusive needs",
        ),
        (
            "nothing joins an exclusive GPU",
            G,
            [vgpu("x", 0, 80 * GIB, 100, exclusive=True)],
            ["0"],
            1,
            ask(share=0, mode="soft"),
            Rules(),
            409,
            "held whole",
        ),
    ],
)
def test_what_does_not_fit(
    name: str,
    gpu_list: list[FakeGpu],
    placed: list[Vgpu],
    selectors: list[str],
    count: int,
    the_ask: Ask,
    rules: Rules,
    status: int,
    needle: str,
) -> None:
    with pytest.raises(PlacementError) as err:
        place(selectors, count, the_ask, gpu_list, placed, rules)
    assert err.value.status == status, name
    assert needle in str(err.value), name


def test_oversubscription_needs_the_node_and_the_vgpu() -> None:
    rules = Rules(allow_oversubscribe=True, memory_scaling=2.0)
    assert place(["0"], 1, ask("120g", oversubscribe=True), G, [], rules)[0].memory == 120 * GIB
    with pytest.raises(PlacementError):
        place(["0"], 1, ask("120g"), G, [], rules)  # the vGPU did not ask
    with pytest.raises(PlacementError):
        place(["0"], 1, ask("161g", oversubscribe=True), G, [], rules)  # past 2 x 80


def test_exclusive_gets_all_memory() -> None:
    assert place(["2"], 1, ask(exclusive=True), G, PLACED, Rules())[0].memory == 80 * GIB


def test_multi_gpu_prefers_nvlinked_gpus() -> None:
    links = {frozenset((G[1].uuid, G[3].uuid)): 0}  # NVLink pair; everything else: across sockets

    def distance(a: str, b: str) -> int:
        return links.get(frozenset((a, b)), 50)

    assert indices(place(["any"], 2, ask(), G, [], Rules(policy="spread"), distance)) == [1, 3]
    assert indices(place(["any"], 2, ask(), G, [], Rules(policy="spread"))) == [0, 1]


def test_update_is_checked_against_the_others_only() -> None:
    placed = [vgpu("a", 0, 40 * GIB, 60), vgpu("b", 0, 10 * GIB, 30)]
    # a may grow to 70 (b holds 30), not to 71; its own 60 does not count twice.
    assert check_update(placed[0], ask("40g", share=70), G, placed, Rules())[0].memory == 40 * GIB
    with pytest.raises(PlacementError, match="hard share 71% asked, 70% left"):
        check_update(placed[0], ask("40g", share=71), G, placed, Rules())
    with pytest.raises(PlacementError):
        check_update(placed[0], ask("71g"), G, placed, Rules())
    sick = [replace(G[0], healthy=False), *G[1:]]
    assert check_update(placed[0], ask("20g"), sick, placed, Rules())[0].memory == 20 * GIB
