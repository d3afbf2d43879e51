"""Durable state: atomic, versioned, refusing what it cannot read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vgpud.units import parse_memory
from vgpud.vgpus.model import Limits, Slice, Vgpu
from vgpud.vgpus.state import StateError, StateStore

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


def test_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    assert store.load() == []
    store.save([V])
    assert StateStore(tmp_path / "state").load() == [V]
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["vgpus.json"]  # no temp left


def test_a_failed_save_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path)
    store.save([V])

    def boom(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.rename", boom)
    with pytest.raises(OSError):
        store.save([])
    monkeypatch.undo()
    assert store.load() == [V]
    assert [p.name for p in tmp_path.iterdir()] == ["vgpus.json"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"version": 2, "vgpus": []}', "format version 2"),
        ("{not json", "corrupt"),
        ('{"version": 1, "vgpus": [{"id": "x"}]}', "corrupt"),
        ("[]", "corrupt"),
    ],
)
def test_unreadable_state_is_refused_not_guessed(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "vgpus.json").write_text(text)
    with pytest.raises(StateError, match=message):
        StateStore(tmp_path).load()


def test_the_format_is_versioned(tmp_path: Path) -> None:
    StateStore(tmp_path).save([V])
    doc = json.loads((tmp_path / "vgpus.json").read_text())
    assert doc["version"] == 1 and doc["vgpus"][0]["memory"] == "10%"
