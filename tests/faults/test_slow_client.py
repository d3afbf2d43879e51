"""Half-sent requests: a client that stops inside a request's head, or
inside its body, is disconnected after a bound (request_header_timeout,
request_body_timeout), instead of holding a connection for ever."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.integration.daemon_harness import Daemon, base_env

# Far beyond the bounds configured below: a connection still open then was
# never going to be closed by the daemon.
CLIENT_PATIENCE = 30.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(
        tmp_path_factory.mktemp("slow"),
        base_env(),
        sim=False,
        config="request_header_timeout = 0.5\nrequest_body_timeout = 0.5\n",
    )
    d.start()
    yield d
    d.cleanup()


def connect(daemon: Daemon) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(CLIENT_PATIENCE)
    s.connect(daemon.socket)
    return s


def read_to_eof(s: socket.socket) -> bytes:
    """Everything the daemon sends until it closes the connection."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /v1/heal", b"GET /v1/health HTTP/1.1\r\nHost: vgpud\r\n"],
    ids=["nothing", "half a request line", "headers without their end"],
)
def test_a_half_sent_head_is_disconnected(daemon: Daemon, sent: bytes) -> None:
    with connect(daemon) as s:
        s.sendall(sent)
        assert read_to_eof(s) == b""  # closed, nothing answered


def test_a_half_sent_body_gets_408_and_is_disconnected(daemon: Daemon) -> None:
    with connect(daemon) as s:
        s.sendall(
            b"POST /v1/vgpus HTTP/1.1\r\nHost: vgpud\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"memory":'
        )
        answer = read_to_eof(s)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert json.loads(body)["error"] == "request_timeout"
    assert daemon.client.get("/v1/vgpus") == []  # nothing was made
