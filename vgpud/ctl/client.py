"""A small synchronous client for vgpud's API over its unix socket (stdlib
http.client): what vgpuctl, the demo, the tests and the benchmark use."""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

DEFAULT_SOCKET = "/run/vgpud.sock"


def default_socket() -> str:
    return os.environ.get("VGPUD_SOCKET") or DEFAULT_SOCKET


class DaemonUnreachable(Exception):
    """The daemon cannot be reached; the message says why, for a person."""


class ApiFailure(Exception):
    """The daemon answered with an error."""

    def __init__(self, status: int, error: str, detail: str) -> None:
        super().__init__(f"{detail} ({status} {error})")
        self.status = status
        self.error = error
        self.detail = detail


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("vgpud", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    def __init__(self, socket_path: str | None = None, timeout: float = 30.0) -> None:
        self.socket_path = socket_path or default_socket()
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """JSON in, JSON out; ApiFailure for an error answer."""
        status, data = self.raw(method, path, body)
        answer = json.loads(data) if data else None
        if status >= 400:
            answer = answer if isinstance(answer, dict) else {}
            raise ApiFailure(status, str(answer.get("error", "")), str(answer.get("detail", data)))
        return answer

    def raw(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        conn = self._connect()
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def stream(self, path: str) -> Iterator[bytes]:
        """Lines of a streaming answer (the event stream)."""
        conn = self._connect()
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            if response.status >= 400:
                answer = json.loads(response.read() or b"{}")
                raise ApiFailure(response.status, answer.get("error", ""), answer.get("detail", ""))
            while line := response.readline():
                yield line
        finally:
            conn.close()

    def _connect(self) -> _UnixConnection:
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            conn.connect()
        except PermissionError:
            raise DaemonUnreachable(
                f"permission denied on {self.socket_path}: you need root or the 'vgpud' group"
            ) from None
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
                raise DaemonUnreachable(
                    f"vgpud is not running: cannot connect to {self.socket_path}"
                ) from None
            raise DaemonUnreachable(
                f"cannot connect to {self.socket_path}: {exc.strerror}"
            ) from None
        return conn

    # conveniences

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)
