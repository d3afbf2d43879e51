"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.cgroup import Cgroup
from tests.helpers.vgpus import BrokeredVgpus


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    """A real cgroup of the test's own, removed after it."""
    group = Cgroup()
    yield group
    group.remove()


@pytest.fixture
def vgpus(tmp_path: Path) -> Iterator[BrokeredVgpus]:
    """vGPUs made as the daemon makes them, with the GPU turn broker."""
    v = BrokeredVgpus(tmp_path)
    yield v
    v.close()
