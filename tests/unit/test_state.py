"""Durable state: two slots saved in turn in place, one flush a save; a save
cut short falls back to the one before; versioned, refusing what it cannot
read; vgpus.json (the format before) migrated."""

from __future__ import annotations

import errno
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import structlog

from vgpud.units import parse_memory
from vgpud.vgpus.model import Limits, Slice, Vgpu
from vgpud.vgpus.state import HEADER_SIZE, MIN_SLOT, StateError, StateStore

V = Vgpu(
    id="vg-00000001",
    name="n",
    slices=(Slice("GPU-a", 0, 1 << 30), Slice("GPU-b", 1, 1 << 30)),
    limits=Limits(parse_memory("10%"), 30, "soft", 7),
    oversubscribe=True,
    exclusive=False,
    created_at=12.5,
    labels={"k": "v"},
    owner={"pod_uid": "p"},
)
W = replace(V, id="vg-00000002", name="w")
X = replace(V, id="vg-00000003", name="x")


def slots(path: Path) -> list[tuple[int, bytes] | None]:
    """Each slot's (generation, payload) as its header tells, unchecked;
    None for a slot never written."""
    image = path.read_bytes()
    capacity = len(image) // 2
    out: list[tuple[int, bytes] | None] = []
    for start in (0, capacity):
        head = image[start : start + HEADER_SIZE]
        if not any(head):
            out.append(None)
            continue
        magic, version, generation, length, _digest = head.split()
        assert (magic, version) == (b"vgpud-state", b"1")
        body = start + HEADER_SIZE
        out.append((int(generation, 16), image[body : body + int(length, 16)]))
    return out


def damage(path: Path, offset: int, flip: int = 0x20) -> None:
    """One byte changed, as a torn write or a bad sector would."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ flip]))


def big(vid: str) -> Vgpu:
    """A vGPU of about 33 kB of labels (64 of the longest): ten overflow a slot."""
    labels = {f"{i:02d}".ljust(253, "k"): "v" * 253 for i in range(64)}
    return replace(V, id=vid, name=None, labels=labels)


def test_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    assert store.load() == []
    store.save([V])
    assert StateStore(tmp_path / "state").load() == [V]
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["vgpus.state"]  # no temp left
    assert (tmp_path / "state" / "vgpus.state").stat().st_size == 2 * MIN_SLOT


def test_saves_alternate_slots_with_growing_generations(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    path = tmp_path / "vgpus.state"
    store.save([V])
    assert slots(path) == [(1, store.encode([V])), None]
    store.save([V, W])
    assert slots(path) == [(1, store.encode([V])), (2, store.encode([V, W]))]
    store.save([W])
    assert slots(path) == [(3, store.encode([W])), (2, store.encode([V, W]))]
    assert StateStore(tmp_path).load() == [W]
    # A store that opens the file later goes on from the newest slot.
    StateStore(tmp_path).save([X])
    assert slots(path) == [(3, store.encode([W])), (4, store.encode([X]))]
    assert StateStore(tmp_path).load() == [X]


def test_a_save_in_place_is_one_data_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No rename, no fsync of the file or the directory: the same inode,
    written and fdatasynced once a save."""
    store = StateStore(tmp_path)
    store.save([V])
    inode = (tmp_path / "vgpus.state").stat().st_ino
    calls: list[str] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        calls.append("fdatasync")
        real(fd)

    def forbidden(*args: object) -> None:
        raise AssertionError(f"not in a save in place: {args}")

    monkeypatch.setattr("os.fdatasync", fdatasync)
    for name in ("os.fsync", "os.rename", "os.replace", "tempfile.mkstemp"):
        monkeypatch.setattr(name, forbidden)
    for vgpus in ([V, W], [W], [], [X]):
        store.save(vgpus)
    monkeypatch.undo()
    assert calls == ["fdatasync"] * 4
    assert (tmp_path / "vgpus.state").stat().st_ino == inode
    assert StateStore(tmp_path).load() == [X]


@pytest.mark.parametrize(
    ("where", "flip"),
    [
        (HEADER_SIZE + 10, 0x20),  # a payload byte
        (len("vgpud-state 1 ") + 2 * 17 + 5, 0x20),  # a digest byte
        (HEADER_SIZE - 2, 0x20),  # the padding
        # The generation, 2 made 3, still hex: the digest covers it (a mix of
        # two saves' bytes must never pass for a newer save).
        (len("vgpud-state 1 ") + 15, 0x01),
    ],
    ids=["payload", "digest", "padding", "generation"],
)
def test_a_newest_slot_cut_short_loads_the_save_before(
    tmp_path: Path, where: int, flip: int
) -> None:
    store = StateStore(tmp_path)
    path = tmp_path / "vgpus.state"
    store.save([V])
    store.save([V, W])  # slot 1, the newest
    damage(path, MIN_SLOT + where, flip)
    with structlog.testing.capture_logs() as logs:
        assert StateStore(tmp_path).load() == [V]
    assert [e["log_level"] for e in logs if "cut short" in e["event"]] == ["info"]
    # The next save goes over the slot cut short, never over the save before
    # it (a crash in that save would leave no whole slot).
    again = StateStore(tmp_path)
    again.save([X])
    assert slots(path) == [(1, store.encode([V])), (2, again.encode([X]))]
    assert StateStore(tmp_path).load() == [X]


def test_a_save_cut_short_after_its_first_page_loads_the_save_before(tmp_path: Path) -> None:
    """What kill -9 during a pwrite may leave: its first pages written, the
    rest of the slot as the save before the last left it."""
    store = StateStore(tmp_path)
    path = tmp_path / "vgpus.state"
    store.save([big("vg-00000010")])  # slot 0
    store.save([V])  # slot 1
    before = path.read_bytes()
    store.save([X, big("vg-00000011")])  # slot 0, cut short after its first page:
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(before[4096:MIN_SLOT])
    assert StateStore(tmp_path).load() == [V]


def test_both_slots_cut_short_is_refused_naming_the_file(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save([V])
    store.save([W])
    damage(tmp_path / "vgpus.state", HEADER_SIZE + 1)
    damage(tmp_path / "vgpus.state", MIN_SLOT + HEADER_SIZE + 1)
    with pytest.raises(StateError) as refused:
        StateStore(tmp_path).load()
    assert str(refused.value) == (
        f"{tmp_path / 'vgpus.state'} is corrupt: neither slot holds a whole save"
    )


def test_a_whole_newest_slot_that_does_not_read_is_refused_not_passed_over(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path)
    store.save([V])
    store.write(b'{"version": 1, "vgpus": [{"id": "x"}]}')  # its digest is right
    with pytest.raises(StateError, match=r"vgpus\.state is corrupt: vgpus\[0\]: missing field"):
        StateStore(tmp_path).load()


def test_a_state_that_outgrows_its_slots_moves_to_a_bigger_file_then_saves_in_place(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path)
    path = tmp_path / "vgpus.state"
    store.save([V])
    small = path.stat().st_ino
    many = [V, *(big(f"vg-0000010{i}") for i in range(10))]
    assert len(store.encode(many)) > MIN_SLOT
    store.save(many)
    grown = path.stat()
    assert grown.st_ino != small and grown.st_size == 2 * (1 << 20)  # 2x what is needed
    assert StateStore(tmp_path).load() == many
    assert [p.name for p in tmp_path.iterdir()] == ["vgpus.state"]
    store.save(many[:3])
    store.save([*many, W])
    assert path.stat().st_ino == grown.st_ino and path.stat().st_size == grown.st_size
    assert StateStore(tmp_path).load() == [*many, W]


def test_a_failed_save_in_place_keeps_the_state_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path)
    store.save([V])
    store.save([W])

    def boom(*args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr("os.pwrite", boom)
    with pytest.raises(OSError):
        store.save([X])
    monkeypatch.undo()
    assert StateStore(tmp_path).load() == [W]
    store.save([V, X])  # over the older slot still, never over [W]
    assert slots(tmp_path / "vgpus.state") == [(3, store.encode([V, X])), (2, store.encode([W]))]


def test_a_failed_growth_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StateStore(tmp_path)
    store.save([V])
    inode = (tmp_path / "vgpus.state").stat().st_ino

    def boom(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("os.rename", boom)
    with pytest.raises(OSError):
        store.save([big(f"vg-0000010{i}") for i in range(10)])
    monkeypatch.undo()
    assert StateStore(tmp_path).load() == [V]
    assert [p.name for p in tmp_path.iterdir()] == ["vgpus.state"]  # the temp file went
    store.save([W])  # what fits goes in place, in the old file
    assert (tmp_path / "vgpus.state").stat().st_ino == inode
    assert StateStore(tmp_path).load() == [W]


def test_a_file_replaced_under_the_store_is_opened_again(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save([V])
    copy = tmp_path / "copy"
    copy.write_bytes((tmp_path / "vgpus.state").read_bytes())
    os.replace(copy, tmp_path / "vgpus.state")  # a restore from a backup
    store.save([W])  # into the file at the path, not the unlinked one
    assert StateStore(tmp_path).load() == [W]
    (tmp_path / "vgpus.state").unlink()
    store.save([X])
    assert StateStore(tmp_path).load() == [X]


def test_a_symlink_at_the_state_file_is_refused_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    StateStore(elsewhere).save([V])
    target = elsewhere / "vgpus.state"
    before = target.read_bytes()
    state = tmp_path / "state"
    state.mkdir()
    (state / "vgpus.state").symlink_to(target)
    with pytest.raises(StateError, match=r"vgpus\.state: a symlink"):
        StateStore(state).load()
    with pytest.raises(OSError, match="a symlink"):
        StateStore(state).save([W])
    assert target.read_bytes() == before
    assert (state / "vgpus.state").is_symlink()
    (state / "vgpus.state").unlink()
    (state / "vgpus.json").symlink_to(tmp_path / "elsewhere")  # the old name neither
    with pytest.raises(StateError, match=r"vgpus\.json: a symlink"):
        StateStore(state).load()


def test_vgpus_json_is_read_and_replaced_by_the_first_save(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    (tmp_path / "vgpus.json").write_bytes(store.encode([V]))
    assert StateStore(tmp_path).load() == [V]
    assert store.remove_superseded() is None  # nothing supersedes it yet
    store.save([V, W])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vgpus.state"]
    assert StateStore(tmp_path).load() == [V, W]


def test_vgpus_state_wins_over_a_vgpus_json_a_crash_left(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save([W])
    (tmp_path / "vgpus.json").write_bytes(store.encode([V]))
    assert StateStore(tmp_path).load() == [W]
    assert store.remove_superseded() == tmp_path / "vgpus.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vgpus.state"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"version": 2, "vgpus": []}', "format version 2"),
        ("{not json", "corrupt"),
        ('{"version": 1, "vgpus": [{"id": "x"}]}', "corrupt"),
        ("[]", "corrupt"),
    ],
)
@pytest.mark.parametrize("name", ["vgpus.state", "vgpus.json"])
def test_unreadable_state_is_refused_not_guessed(
    tmp_path: Path, text: str, message: str, name: str
) -> None:
    if name == "vgpus.state":
        StateStore(tmp_path).write(text.encode())
    else:
        (tmp_path / name).write_text(text)
    with pytest.raises(StateError, match=f"{name}.*{message}"):
        StateStore(tmp_path).load()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"vgpud-state 2 " + bytes(2 * MIN_SLOT - 14), "container version 2, this vgpud reads 1"),
        (b'{"version": 1, "vgpus": []}', "is not two slots"),
        (bytes(2 * MIN_SLOT + 2), "is not two slots"),
        (bytes(2 * MIN_SLOT), "neither slot holds a whole save"),
    ],
    ids=["a newer container", "JSON", "a size not two slots", "zeros"],
)
def test_a_state_file_of_another_shape_is_refused(
    tmp_path: Path, content: bytes, message: str
) -> None:
    (tmp_path / "vgpus.state").write_bytes(content)
    with pytest.raises(StateError, match=message):
        StateStore(tmp_path).load()


def test_a_newer_container_in_either_slot_is_refused(tmp_path: Path) -> None:
    """Never passed over for the other slot: a newer vgpud wrote it."""
    store = StateStore(tmp_path)
    store.save([V])
    with open(tmp_path / "vgpus.state", "r+b") as f:
        f.seek(MIN_SLOT)
        f.write(b"vgpud-state 2 whatever")
    with pytest.raises(StateError, match="container version 2"):
        StateStore(tmp_path).load()


def test_the_format_is_versioned(tmp_path: Path) -> None:
    StateStore(tmp_path).save([V])
    [(generation, payload), *_] = [s for s in slots(tmp_path / "vgpus.state") if s]
    doc = json.loads(payload)
    assert generation == 1 and doc["version"] == 1 and doc["vgpus"][0]["memory"] == "10%"
