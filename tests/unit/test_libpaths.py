"""Where vgpud finds its own libraries, and what it says when it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpud.libpaths import LibraryNotFound, find_library


def test_find_library_names_every_place_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VGPUD_LIB_DIR", str(tmp_path / "env"))
    with pytest.raises(LibraryNotFound, match=r"libnothing\.so not found \(looked in .*/env"):
        find_library("libnothing.so", tmp_path / "cfg")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "libnothing.so").touch()
    assert find_library("libnothing.so", tmp_path / "cfg") == tmp_path / "cfg" / "libnothing.so"
