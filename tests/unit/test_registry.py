"""Registry: blocks on disk follow the vGPUs; adoption keeps what runs."""

from __future__ import annotations

import ctypes
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.fakes import GIB, create, delete, gpus
from vgpud.errors import InsufficientStorage
from vgpud.policy.placement import Rules
from vgpud.units import parse_memory
from vgpud.vgpus.abi import TURN_WANT, TurnC
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.blocks import ControlBlock, UsageBlock
from vgpud.vgpus.model import CreateRequest, Limits
from vgpud.vgpus.registry import Registry
from vgpud.vgpus.state import StateStore

LIMITS = Limits(parse_memory("2g"), 30, "hard", 1)


def unadopted(tmp: Path) -> Registry:
    return Registry(tmp / "run", StateStore(tmp / "state"), tmp / "lib.so", Atomics.load())


def make(tmp: Path) -> Registry:
    reg = unadopted(tmp)
    reg.adopt()
    return reg


def test_adoption_keeps_blocks_and_their_counters(tmp_path: Path) -> None:
    reg = make(tmp_path)
    entry = create(reg, CreateRequest(), LIMITS, gpus(1), Rules())
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
    entry = create(reg, CreateRequest(), LIMITS, gpus(1), Rules())
    reg.close()
    if damage == "remove":
        entry.paths.usage.unlink()
    else:
        os.truncate(entry.paths.control, 100)
    again = Registry(
        tmp_path / "run", StateStore(tmp_path / "state"), tmp_path / "lib.so", Atomics.load()
    )
    repaired = again.adopt().repairs
    assert [(r.vgpu, r.block) for r in repaired] == [
        (entry.vgpu.id, "usage" if damage == "remove" else "control")
    ]
    adopted = again.get(entry.vgpu.id)
    assert adopted.control.devices()[0].share_ppm == 300_000
    ControlBlock.open(entry.paths.control).close()
    UsageBlock.open(entry.paths.usage, device_count=1).close()
    again.close()


def test_a_vgpu_with_no_directory_gets_its_blocks_made_unreported(tmp_path: Path) -> None:
    """A run dir emptied by a reboot, or a create cut between its save and
    its blocks: blocks are made, and no damage is reported."""
    reg = make(tmp_path)
    entry = create(reg, CreateRequest(), LIMITS, gpus(1), Rules())
    reg.close()
    shutil.rmtree(entry.paths.control.parent)
    again = unadopted(tmp_path)
    adoption = again.adopt()
    assert adoption.repairs == [] and [v.id for v in adoption.adopted] == [entry.vgpu.id]
    adopted = again.get(entry.vgpu.id)
    assert adopted.control.devices()[0].share_ppm == 300_000
    assert os.stat(entry.paths.control.parent).st_mode & 0o777 == 0o711
    again.close()


def test_vgpus_on_one_gpu_share_no_file(tmp_path: Path) -> None:
    """The GPU's turn is granted through each vGPU's own control block: two
    vGPUs on one GPU have nothing on disk in common, and the run directory
    holds their two directories only."""
    reg = make(tmp_path)
    a = create(reg, CreateRequest(), LIMITS, gpus(1), Rules())
    b = create(reg, CreateRequest(), LIMITS, gpus(1), Rules())
    assert a.vgpu.uuids == b.vgpu.uuids
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted([a.vgpu.id, b.vgpu.id])
    reg.close()


def ask(usage: UsageBlock) -> None:
    """What a hook does to ask for the GPU: its request word, then a wake."""
    turn = usage._c.devices[0].turn
    turn.request = TURN_WANT
    usage._atomics.futex_wake_all(ctypes.addressof(turn) + TurnC.request.offset)


def wait_for(value: Callable[[], int], what: str) -> int:
    deadline = time.monotonic() + 10
    while not (got := value()):
        assert time.monotonic() < deadline, f"no {what}"
        time.sleep(0.005)
    return got


def test_the_broker_grants_the_gpu_to_one_vgpu_at_a_time(tmp_path: Path) -> None:
    """Each vGPU asks in its own usage block; the daemon answers in its
    control block, beats there, and takes the grant back when the vGPU is
    deleted."""
    reg = make(tmp_path)
    a = create(reg, CreateRequest(), LIMITS, gpus(1), Rules())
    b = create(reg, CreateRequest(), LIMITS, gpus(1), Rules())
    assert a.control._c.turn_beat_ns > 0 and b.control._c.turn_beat_ns > 0
    ask(a.usage)
    granted = wait_for(lambda: a.control._c.devices[0].turn_grant, "grant")
    assert granted > TURN_WANT and b.control._c.devices[0].turn_grant == 0
    ask(b.usage)  # a holds it (asking still): b waits
    assert a.control._c.devices[0].turn_grant == granted
    delete(reg, a.vgpu.id, force=True, processes=0)
    assert wait_for(lambda: b.control._c.devices[0].turn_grant, "grant moving on") > TURN_WANT
    reg.close()


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

    def disk_full(data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(reg.store, "write", disk_full)
    with pytest.raises(InsufficientStorage, match="cannot record"):  # 507: the disk is full
        create(reg, CreateRequest(), LIMITS, gpus(1), Rules())
    left = [p.name for p in (tmp_path / "run").iterdir()]
    assert reg.entries == {} and left == []
    monkeypatch.undo()  # the disk has room again: the failed vGPU is counted nowhere
    rules = Rules(max_vgpus_per_gpu=1)
    assert create(reg, CreateRequest(name="next"), LIMITS, gpus(1), rules).vgpu.name == "next"
    assert [v.name for v in reg.store.load()] == ["next"]
    reg.close()
