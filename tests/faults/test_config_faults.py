"""A config file that is not UTF-8: refused at start (exit 3, one line) and
on SIGHUP (the running config is kept)."""

from __future__ import annotations

from pathlib import Path

import structlog

from tests.integration.daemon_harness import Daemon as DaemonProcess
from tests.integration.daemon_harness import base_env
from vgpud.config import Config, load_config
from vgpud.daemon import EXIT_START_FAILED, Daemon

NOT_UTF8 = b'log_level = "debug"\n# \xff\xfe latin-1 bytes\n'


def test_a_reload_of_a_config_that_is_not_utf8_is_refused_and_the_old_one_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "vgpud.toml"
    path.write_bytes(NOT_UTF8)
    running = Config(log_level="warning")
    daemon = Daemon(running, lambda: load_config(path, {}, {}))
    with structlog.testing.capture_logs() as logs:
        daemon._on_reload()
    assert daemon.config == running
    assert [(e["event"], e["log_level"]) for e in logs] == [
        ("reload refused: config kept as it was", "error")
    ]
    assert "not UTF-8" in logs[0]["reason"]


def test_a_start_with_a_config_that_is_not_utf8_exits_3_with_one_line(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path, base_env(), sim=False)
    daemon.config_path.write_bytes(NOT_UTF8)
    try:
        daemon.start(wait=False)
        assert daemon.wait() == EXIT_START_FAILED
        lines = daemon.log().splitlines()
        assert len(lines) == 1 and "not UTF-8" in lines[0], lines
    finally:
        daemon.cleanup()
