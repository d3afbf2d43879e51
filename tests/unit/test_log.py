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


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize("fmt", ["console", "json"])
def test_a_tenants_text_cannot_write_to_the_terminal(
    capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    """A process's comm, or what a standalone block names, is a tenant's
    own text: in a log line a terminal shows, its control sequences are
    escaped (here: clear the screen, a right-to-left override)."""
    log.configure("info", fmt, {})
    structlog.get_logger("vgpud.test").info("adopted", comm="\x1b[2Jx\u202e", pid=7)
    err = capsys.readouterr().err
    assert not any(c in err for c in "\x1b\u202e"), repr(err)
    assert ("\\x1b[2Jx\\u202e" if fmt == "console" else "\\u001b[2Jx\\u202e") in err
