"""Directories the daemon makes get the modes it means under any umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from vgpud.dirs import PARENT_MODE, make_dirs
from vgpud.vgpus import cdi
from vgpud.vgpus.state import STATE_DIR_MODE, StateStore


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_made_parents_are_not_left_writable_by_everyone(tmp_path: Path, umask_000: None) -> None:
    make_dirs(tmp_path / "a" / "b" / "c", 0o711)

    assert _mode(tmp_path / "a") == PARENT_MODE
    assert _mode(tmp_path / "a" / "b") == PARENT_MODE
    assert _mode(tmp_path / "a" / "b" / "c") == 0o711


def test_a_directory_that_exists_keeps_its_mode(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(mode=0o750)
    os.chmod(tmp_path / "a", 0o750)

    make_dirs(tmp_path / "a", 0o711)
    make_dirs(tmp_path / "a" / "b", 0o711)

    assert _mode(tmp_path / "a") == 0o750
    assert _mode(tmp_path / "a" / "b") == 0o711


def test_a_nested_cdi_dir_made_under_umask_000_cannot_be_swapped_by_other_users(
    tmp_path: Path, umask_000: None
) -> None:
    """The attack: a parent of the spec directory writable by everyone lets
    any local user rename the directory away and put one of theirs, with a
    spec of their own (mounts, devices), in its place."""
    cdi_dir = tmp_path / "etc" / "cdi" / "vgpud"
    spec = cdi.build_spec("v1", None, {"env": {}, "mounts": [], "cdi_device": "vgpud.io/vgpu=v1"})

    cdi.write_spec(cdi_dir, "v1", spec)

    for d in (tmp_path / "etc", tmp_path / "etc" / "cdi", cdi_dir):
        assert _mode(d) & (stat.S_IWGRP | stat.S_IWOTH) == 0, d


def test_a_state_dir_made_under_umask_000_is_the_daemons_alone(
    tmp_path: Path, umask_000: None
) -> None:
    state_dir = tmp_path / "var" / "lib" / "vgpud"

    StateStore(state_dir).save([])

    assert _mode(state_dir) == STATE_DIR_MODE
    assert _mode(tmp_path / "var") & (stat.S_IWGRP | stat.S_IWOTH) == 0
