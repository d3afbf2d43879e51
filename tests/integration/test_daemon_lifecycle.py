"""vgpud's lifecycle as systemd and an operator see it: readiness, the
watchdog, stopping, reloading, a failed start. No GPU needed (NullNvml)."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.daemon_harness import Daemon, base_env, wait_for

EXIT_START_FAILED = 3


@pytest.fixture
def notify_socket() -> Iterator[socket.socket]:
    """A fake systemd: a unix datagram socket the daemon sends sd_notify to."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="vgn")) / "n"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(30)
    yield sock
    sock.close()
    path.unlink()
    path.parent.rmdir()


def messages_until(sock: socket.socket, wanted: str) -> list[str]:
    seen: list[str] = []
    while not any(wanted in m for m in seen):
        seen.append(sock.recv(4096).decode())
    return seen


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path, base_env(), sim=False)
    yield d
    d.cleanup()


def test_ready_status_watchdog_and_stopping_reach_systemd(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    env = {
        **base_env(),
        "NOTIFY_SOCKET": notify_socket.getsockname(),
        "WATCHDOG_USEC": "400000",  # pings every 0.2 s
    }
    d = Daemon(tmp_path, env, sim=False).start(wait=False)
    try:
        seen = messages_until(notify_socket, "READY=1")
        # READY=1 comes once the socket answers, never before.
        assert d.client.get("/v1/health")["status"] == "ok"
        assert not any("READY=1" in m for m in seen[:-1])
        pings = [m for m in messages_until(notify_socket, "WATCHDOG=1") if "WATCHDOG=1" in m]
        pings += [m for m in messages_until(notify_socket, "WATCHDOG=1") if "WATCHDOG=1" in m]
        assert len(pings) >= 2
        assert any(m.startswith("STATUS=") for m in seen + messages_until(notify_socket, "STATUS="))
        d.signal(signal.SIGTERM)
        messages_until(notify_socket, "STOPPING=1")
        assert d.wait() == 0
    finally:
        d.cleanup()


def test_sigterm_stops_cleanly_and_removes_the_socket(daemon: Daemon) -> None:
    daemon.start()
    assert os.path.exists(daemon.socket)
    assert oct(os.stat(daemon.socket).st_mode & 0o777) == "0o660"
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert not os.path.exists(daemon.socket)
    log = daemon.log()
    assert log.index("stopping") < log.index("vgpud stopped")


def test_sigint_stops_too(daemon: Daemon) -> None:
    daemon.start()
    daemon.signal(signal.SIGINT)
    assert daemon.wait() == 0
    assert not os.path.exists(daemon.socket)


def open_request(path: str, head: bytes) -> socket.socket:
    """A client connection with a request sent (maybe only in part)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    conn.connect(path)
    conn.sendall(head)
    return conn


def test_an_event_stream_does_not_hold_the_shutdown(daemon: Daemon) -> None:
    daemon.config_path.write_text("shutdown_timeout = 60.0\n")
    daemon.start()
    conn = open_request(daemon.socket, b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
    assert conn.recv(4096).startswith(b"HTTP/1.1 200")  # streaming now
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(timeout=20) == 0  # well before the 60 s drain timeout
    while conn.recv(4096):
        pass  # the stream ends: EOF, not a hang
    conn.close()


SLOW_POST = b"POST /v1/vgpus HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"


def test_a_request_still_running_at_the_timeout_is_cancelled_with_a_log_line(
    daemon: Daemon,
) -> None:
    daemon.config_path.write_text("shutdown_timeout = 0.5\n")
    daemon.start()
    conn = open_request(daemon.socket, SLOW_POST)  # the body never completes
    wait_for(lambda: daemon.client.get("/v1/health"), what="the daemon")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait() == 0
    assert "cancelling requests still running at the shutdown timeout" in daemon.log()
    conn.close()


def test_a_second_sigterm_forces_the_exit(daemon: Daemon) -> None:
    daemon.config_path.write_text("shutdown_timeout = 60.0\n")
    daemon.start()
    conn = open_request(daemon.socket, SLOW_POST)  # holds the drain for 60 s
    daemon.signal(signal.SIGTERM)
    wait_for(lambda: "stopping" in daemon.log(), what="the first signal to land")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(timeout=20) == 128 + signal.SIGTERM
    assert "second stop signal" in daemon.log()
    assert not os.path.exists(daemon.socket)
    conn.close()


def test_sighup_reloads_and_says_what_needs_a_restart(daemon: Daemon) -> None:
    daemon.start()
    daemon.config_path.write_text('placement_policy = "spread"\nmetrics_listen = "127.0.0.1:1"\n')
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "config change needs a restart" in daemon.log(), what="the reload log")
    log = daemon.log()
    assert "config changed" in log and "placement_policy" in log
    assert "metrics_listen" in log
    daemon.config_path.write_text("placement_policy = 7\n")
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "reload refused" in daemon.log(), what="the refusal")
    assert daemon.client.get("/v1/health")["status"] == "ok"  # unharmed


def test_a_stale_socket_is_replaced(daemon: Daemon) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(daemon.socket)  # bound, never listening: what a crash leaves
    stale.close()
    daemon.start()
    assert daemon.client.get("/v1/health")["status"] == "ok"


def test_a_second_daemon_on_the_same_socket_is_refused(daemon: Daemon, tmp_path: Path) -> None:
    daemon.start()
    (tmp_path / "b").mkdir()
    second = Daemon(tmp_path / "b", base_env(), sim=False)
    second.args[second.args.index("--socket") + 1] = daemon.socket
    second.start(wait=False)
    assert second.wait() == EXIT_START_FAILED
    assert "another vgpud answers" in second.log()
    assert daemon.client.get("/v1/health")["status"] == "ok"
    second.sockdir.rmdir()


def test_a_bad_config_fails_the_start_with_its_own_exit_code(daemon: Daemon) -> None:
    daemon.config_path.write_text('placement_policy = "random"\n')
    daemon.start(wait=False)
    assert daemon.wait() == EXIT_START_FAILED
    assert "placement_policy" in daemon.log()


def test_metrics_are_served_on_tcp_when_configured(daemon: Daemon) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon.config_path.write_text(f'metrics_listen = "127.0.0.1:{port}"\n')
    daemon.start()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b"vgpud_loop_duration_seconds" in answer
