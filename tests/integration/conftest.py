"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.cgroup import Cgroup


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    """A real cgroup of the test's own, removed after it."""
    group = Cgroup()
    yield group
    group.remove()
