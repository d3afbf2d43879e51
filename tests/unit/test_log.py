"""Logs: JSON under systemd, readable on a terminal, as configured."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from vgpud import log


@pytest.mark.parametrize(
    ("fmt", "env", "json_wanted"),
    [
        ("auto", {}, False),
        ("auto", {"JOURNAL_STREAM": "8:123"}, True),
        ("auto", {"INVOCATION_ID": "abc"}, True),
        ("console", {"INVOCATION_ID": "abc"}, False),
        ("json", {}, True),
    ],
)
def test_format_choice(fmt: str, env: dict[str, str], json_wanted: bool) -> None:
    assert log.wants_json(fmt, env) is json_wanted


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure() sets process-wide logging: put it back for the other tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    config = structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)


@pytest.mark.usefixtures("restore_logging")
def test_json_lines_carry_the_event_and_its_fields(capsys: pytest.CaptureFixture[str]) -> None:
    log.configure("info", "json", {})
    structlog.get_logger("vgpud.test").info("vGPU created", vgpu="vg-1")
    logging.getLogger("vgpud.std").warning("from the stdlib %s", "too")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[0]["event"] == "vGPU created" and lines[0]["vgpu"] == "vg-1"
    assert lines[0]["level"] == "info"
    assert lines[1]["event"] == "from the stdlib too" and lines[1]["level"] == "warning"
    log.set_level("error")
    structlog.get_logger("vgpud.test").info("hidden")
    assert capsys.readouterr().err == ""
