"""Fixtures of the red-team suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.cgroup import Cgroup


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    """A real cgroup of the test's own (a tenant's container), removed after it."""
    group = Cgroup()
    yield group
    group.remove()


@pytest.fixture
def other_cgroup() -> Iterator[Cgroup]:
    """A second tenant's cgroup."""
    group = Cgroup()
    yield group
    group.remove()
