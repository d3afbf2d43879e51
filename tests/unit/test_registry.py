"""Registry: blocks on disk follow the vGPUs; adoption keeps what runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.fakes import GIB, gpus
from vgpud.blocks import ArbiterBlock, Atomics, ControlBlock, UsageBlock
from vgpud.errors import InsufficientStorage
from vgpud.events import EventLog
from vgpud.model import CreateRequest, Limits
from vgpud.placement import Rules
from vgpud.registry import ARBITER_DIR, Registry
from vgpud.state import StateStore
from vgpud.units import parse_memory

LIMITS = Limits(parse_memory("2g"), 30, "hard", 1)


def make(tmp: Path) -> Registry:
    reg = Registry(
        tmp / "run", StateStore(tmp / "state"), tmp / "lib.so", Atomics.load(), EventLog(100)
    )
    reg.adopt()
    return reg


def test_adoption_keeps_blocks_and_their_counters(tmp_path: Path) -> None:
    reg = make(tmp_path)
    entry = reg.create(CreateRequest(), LIMITS, gpus(1), Rules())
    entry.usage._c.devices[0].used = 123  # a running process's bytes
    inodes = [os.stat(p).st_ino for p in (entry.paths.control, entry.paths.usage)]
    reg.close()
    again = make(tmp_path)
    adopted = again.get(entry.vgpu.id)
    assert [os.stat(p).st_ino for p in (adopted.paths.control, adopted.paths.usage)] == inodes
    assert adopted.usage.devices()[0].used == 123
    assert adopted.control.devices()[0].mem_limit == 2 * GIB
    again.close()


@pytest.mark.parametrize("damage", ["remove", "truncate"])
def test_a_missing_or_corrupt_block_is_recreated_and_reported(tmp_path: Path, damage: str) -> None:
    reg = make(tmp_path)
    entry = reg.create(CreateRequest(), LIMITS, gpus(1), Rules())
    reg.close()
    if damage == "remove":
        entry.paths.usage.unlink()
    else:
        os.truncate(entry.paths.control, 100)
    again = make(tmp_path)
    events = [e.type for e in again.events.since(0)]
    assert "block.repaired" in events
    adopted = again.get(entry.vgpu.id)
    assert adopted.control.devices()[0].share_ppm == 300_000
    ControlBlock.open(entry.paths.control).close()
    UsageBlock.open(entry.paths.usage, device_count=1).close()
    again.close()


def test_vgpus_on_one_gpu_share_its_arbiter_block(tmp_path: Path) -> None:
    reg = make(tmp_path)
    a = reg.create(CreateRequest(), LIMITS, gpus(1), Rules())
    arbiter = a.paths.arbiters / a.vgpu.uuids[0]
    ArbiterBlock.open_checked(arbiter)
    assert arbiter.stat().st_mode & 0o777 == 0o666  # hooks of any user take turns
    inode = arbiter.stat().st_ino
    b = reg.create(CreateRequest(), LIMITS, gpus(1), Rules())
    assert b.paths.arbiters / b.vgpu.uuids[0] == arbiter and arbiter.stat().st_ino == inode
    reg.close()
    # A corrupt one is made anew at the next start; a valid one is kept.
    os.truncate(arbiter, 10)
    again = make(tmp_path)
    ArbiterBlock.open_checked(arbiter)
    inode = arbiter.stat().st_ino
    again.close()
    make(tmp_path).close()
    assert arbiter.stat().st_ino == inode


def test_orphan_blocks_are_removed_at_adoption(tmp_path: Path) -> None:
    orphan = tmp_path / "run" / "vg-0000abcd"  # a crash between making and recording
    orphan.mkdir(parents=True)
    (orphan / "usage").write_text("x")
    reg = make(tmp_path)
    assert reg.entries == {} and not orphan.exists()
    reg.close()


def test_a_create_that_cannot_be_recorded_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = make(tmp_path)

    def disk_full(vgpus: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(reg.store, "save", disk_full)
    with pytest.raises(InsufficientStorage, match="cannot record"):  # 507: the disk is full
        reg.create(CreateRequest(), LIMITS, gpus(1), Rules())
    # The GPU's arbiter block is the node's, shared by every vGPU on it: it stays.
    left = [p.name for p in (tmp_path / "run").iterdir()]
    assert reg.entries == {} and left in ([], [ARBITER_DIR])
    assert reg.events.since(0) == []
    reg.close()
