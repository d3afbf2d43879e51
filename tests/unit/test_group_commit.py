"""The registry's writes: durable before answered, many to one fsync, never
two on the same capacity, and the loop free while the disk works."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.unit.apiclient import running_api
from tests.unit.fakes import gpus
from vgpud.errors import Conflict, InsufficientStorage
from vgpud.policy import placement
from vgpud.policy.placement import Rules
from vgpud.units import parse_memory
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.model import CreateRequest, Limits, UpdateRequest, Vgpu
from vgpud.vgpus.registry import Entry, Registry
from vgpud.vgpus.state import StateStore

HARD_60 = Limits(parse_memory("1g"), 60, "hard", 1)
SOFT = Limits(parse_memory("1g"), 10, "soft", 1)


class SlowDisk:
    """The state file's writes, counted, each held until the test lets it end."""

    def __init__(self, store: StateStore) -> None:
        self.real = store.write
        self.writes: list[bytes] = []
        self.go = threading.Event()
        self.fail: OSError | None = None

    def __call__(self, data: bytes) -> None:
        self.go.wait(10)
        self.writes.append(data)
        if self.fail is not None:
            raise self.fail
        self.real(data)


@pytest.fixture
def reg(tmp_path: Path) -> Iterator[Registry]:
    r = Registry(
        tmp_path / "run", StateStore(tmp_path / "state"), tmp_path / "lib.so", Atomics.load()
    )
    r.adopt()
    yield r
    r.close()  # the turn broker's thread reads the blocks until then


def slow(reg: Registry, monkeypatch: pytest.MonkeyPatch) -> SlowDisk:
    disk = SlowDisk(reg.store)
    monkeypatch.setattr(reg.store, "write", disk)
    return disk


async def create(reg: Registry, limits: Limits, name: str | None = None) -> Entry:
    req = CreateRequest(name=name)
    return await reg.create(req, limits, placement.placer(req, gpus(1), Rules()))


def saved_once(disk: SlowDisk) -> None:
    """On the blocks' thread: until the save made beside them has been tried."""
    for _ in range(5000):
        if disk.writes:
            return
        time.sleep(0.001)
    raise AssertionError("no save beside the blocks")


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("never")


async def test_writes_arriving_during_a_save_share_the_next_one(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = slow(reg, monkeypatch)
    first = asyncio.create_task(create(reg, SOFT, "first"))
    await until(lambda: reg._writer is not None)  # its save is in flight, held
    rest = [asyncio.create_task(create(reg, SOFT, f"v{i}")) for i in range(8)]
    await asyncio.sleep(0.1)  # all eight queued behind it
    assert not any(t.done() for t in [first, *rest])  # none answered before durable
    disk.go.set()
    made = await asyncio.gather(first, *rest)
    assert len(disk.writes) == 2  # nine creates, two fsynced saves
    recorded = {v.id for v in reg.store.load()}
    assert recorded == {e.vgpu.id for e in made} == set(reg.entries)


async def test_two_writes_at_once_never_place_on_the_same_capacity(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = slow(reg, monkeypatch)
    tasks = [asyncio.create_task(create(reg, HARD_60)) for _ in range(3)]
    await asyncio.sleep(0.05)
    disk.go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    made = [r for r in results if isinstance(r, Entry)]
    assert len(made) == 1  # 60 % + 60 % of one GPU is over: the others are refused
    assert all(isinstance(r, Conflict) for r in results if r not in made)
    assert [v.id for v in reg.store.load()] == [made[0].vgpu.id]


async def test_a_failed_save_fails_its_writes_and_counts_them_nowhere(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = slow(reg, monkeypatch)
    disk.fail = OSError(28, "No space left on device")
    tasks = [
        asyncio.create_task(create(reg, HARD_60, "v0")),
        asyncio.create_task(create(reg, SOFT)),
    ]
    await asyncio.sleep(0.05)
    disk.go.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r) for r in results] == [InsufficientStorage] * 2
    assert reg.entries == {} and list((reg.run_dir).iterdir()) == []
    disk.fail = None  # room again: the capacity and the name are free
    again = await create(reg, HARD_60, "v0")
    assert [v.id for v in reg.store.load()] == [again.vgpu.id]


async def test_a_second_change_to_a_vgpu_waits_for_the_first(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = await create(reg, SOFT)
    disk = slow(reg, monkeypatch)
    refit = placement.refitter(gpus(1), Rules())
    share = asyncio.create_task(reg.update(entry.vgpu.id, UpdateRequest(share=20), refit))
    weight = asyncio.create_task(reg.update(entry.vgpu.id, UpdateRequest(weight=5), refit))
    await asyncio.sleep(0.05)
    disk.go.set()
    await asyncio.wait_for(asyncio.gather(share, weight), 5)
    [saved] = reg.store.load()
    assert (saved.limits.share, saved.limits.weight) == (20, 5)  # neither change lost
    assert len(disk.writes) == 2


async def test_reads_are_answered_while_a_save_is_in_flight(tmp_path: Path) -> None:
    async with running_api(tmp_path) as api:
        store = api.service.registry.store
        disk = SlowDisk(store)
        store.write = disk  # type: ignore[method-assign]
        post = asyncio.create_task(api.client.post("/v1/vgpus", json={"memory": "1g"}))
        await until(lambda: api.service.registry._writer is not None)
        health = await asyncio.wait_for(api.client.get("/v1/health"), 2)
        assert health.status == 200 and not post.done()
        disk.go.set()
        assert (await post).status == 201


async def test_a_create_whose_blocks_fail_fails_alone_in_its_save(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = slow(reg, monkeypatch)
    make_blocks = reg._make_blocks

    def full_for_bad(v: Vgpu) -> Entry:
        if v.name == "bad":
            raise InsufficientStorage("cannot create the blocks: No space left on device")
        return make_blocks(v)

    monkeypatch.setattr(reg, "_make_blocks", full_for_bad)
    tasks = [asyncio.create_task(create(reg, SOFT, name)) for name in ("good", "bad", "fine")]
    await asyncio.sleep(0.05)
    disk.go.set()
    good, bad, fine = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(bad, InsufficientStorage)
    assert isinstance(good, Entry) and isinstance(fine, Entry)
    assert sorted(v.name or "" for v in reg.store.load()) == ["fine", "good"]
    assert sorted(e.vgpu.name or "" for e in reg.entries.values()) == ["fine", "good"]


async def test_the_state_file_is_flushed_while_the_blocks_are_made(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The blocks wait for the save to have started: a writer that made them
    # first (the flush then adds their time to every create) never saves.
    saving = threading.Event()
    write = reg.store.write

    def write_flagged(data: bytes) -> None:
        saving.set()
        write(data)

    make_blocks = reg._make_blocks

    def blocks_after_the_save_starts(v: Vgpu) -> Entry:
        assert saving.wait(5), "the state file's save waited for the blocks"
        return make_blocks(v)

    monkeypatch.setattr(reg.store, "write", write_flagged)
    monkeypatch.setattr(reg, "_make_blocks", blocks_after_the_save_starts)
    made = await asyncio.wait_for(create(reg, SOFT, "v0"), 10)
    assert made.paths.control.exists() and made.paths.usage.exists()
    assert [v.id for v in reg.store.load()] == [made.vgpu.id]


async def test_a_failed_save_waits_for_the_blocks_it_then_removes(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The save fails while the blocks are still being made: they are
    # removed once made, never left behind by an undo that ran first.
    disk = slow(reg, monkeypatch)
    disk.fail = OSError(28, "No space left on device")
    disk.go.set()
    make_blocks = reg._make_blocks

    def blocks_after_the_save_failed(v: Vgpu) -> Entry:
        saved_once(disk)
        return make_blocks(v)

    monkeypatch.setattr(reg, "_make_blocks", blocks_after_the_save_failed)
    with pytest.raises(InsufficientStorage):
        await asyncio.wait_for(create(reg, SOFT, "v0"), 10)
    assert reg.entries == {} and list(reg.run_dir.iterdir()) == []


async def test_blocks_that_fail_are_saved_away_and_kept_counted_when_that_save_fails(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = slow(reg, monkeypatch)
    disk.go.set()
    make_blocks = reg._make_blocks

    def full_for_bad(v: Vgpu) -> Entry:
        if v.name == "bad":
            saved_once(disk)
            disk.fail = OSError(28, "No space left on device")  # the next save fails
            raise InsufficientStorage("cannot create the blocks: No space left on device")
        return make_blocks(v)

    monkeypatch.setattr(reg, "_make_blocks", full_for_bad)
    with pytest.raises(InsufficientStorage, match="stays recorded and counted"):
        await create(reg, HARD_60, "bad")
    # The file names it (its first save held it): it is counted, so its
    # capacity is not given twice, and a start makes its blocks.
    assert [v.name for v in reg.store.load()] == ["bad"]
    assert reg.entries == {} and [v.name for v in reg.skipped.values()] == ["bad"]
    with pytest.raises(Conflict):
        await create(reg, HARD_60, "other")
    disk.fail = None
    monkeypatch.setattr(reg, "_make_blocks", make_blocks)
    reg.close()
    again = Registry(reg.run_dir, StateStore(reg.store.dir), reg.library, reg.atomics)
    try:
        assert [v.name for v in again.adopt().adopted] == ["bad"]
    finally:
        again.close()
