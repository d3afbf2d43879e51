"""sd_notify: a real notifier only when systemd asks for one."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from vgpud.systemd import NullNotifier, SdNotifier, notifier


def test_no_notify_socket_means_the_null_notifier() -> None:
    n = notifier({})
    assert isinstance(n, NullNotifier) and n.watchdog_interval is None
    n.ready()  # harmless


def test_messages_reach_the_socket_and_the_watchdog_runs_at_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    # sdnotify takes the address from the process environment, as systemd sets it.
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    n = notifier(os.environ)
    assert isinstance(n, SdNotifier) and n.watchdog_interval == 1.5
    for send in (n.ready, n.watchdog, n.stopping):
        send()
    n.status("2 vGPUs")
    got = [sock.recv(100).decode() for _ in range(4)]
    sock.close()
    assert got == ["READY=1", "WATCHDOG=1", "STOPPING=1", "STATUS=2 vGPUs"]


def test_a_watchdog_meant_for_another_pid_is_ignored() -> None:
    n = notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"})
    assert n.watchdog_interval is None
