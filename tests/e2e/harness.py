"""The real daemon as the container tests run it: a subprocess on the
simulated GPU, its API over the unix socket, and polling helpers."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.conftest import ROOT

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T | None], what: str, timeout: float = 30, every: float = 0.1
) -> T:
    """Poll ``probe`` until it returns something truthy; fail saying ``what``
    did not happen in time."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("vgpud", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


@dataclass
class Vgpud:
    """A running vgpud; ``stop()`` ends it (SIGTERM, then SIGKILL)."""

    process: subprocess.Popen[bytes]
    socket: Path
    run_dir: Path
    cdi_dir: Path
    log: Path

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = _UnixConnection(str(self.socket), timeout=10)
        try:
            payload = None if body is None else json.dumps(body)
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        is_json = response.getheader("Content-Type", "").startswith("application/json")
        return response.status, json.loads(data) if is_json else data.decode()

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        assert status == 200, f"GET {path}: {status} {body}"
        return body

    def create(self, **fields: Any) -> dict[str, Any]:
        status, body = self.request("POST", "/v1/vgpus", fields)
        assert status == 201, f"create {fields}: {status} {body}"
        return dict(body)

    def delete(self, vgpu_id: str) -> None:
        status, body = self.request("DELETE", f"/v1/vgpus/{vgpu_id}?force=true")
        assert status in (200, 204, 404), f"delete {vgpu_id}: {status} {body}"

    def events(self, vgpu_id: str | None = None) -> list[dict[str, Any]]:
        """The events so far (of one vGPU)."""
        status, body = self.request("GET", "/v1/events?follow=false")
        assert status == 200, body
        events = [json.loads(line) for line in body.splitlines() if line.strip()]
        return [e for e in events if vgpu_id is None or e.get("vgpu") == vgpu_id]

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_vgpud(
    workdir: Path, socket_dir: Path, env: Mapping[str, str], config: Mapping[str, Any]
) -> Vgpud:
    """Start vgpud on the simulated GPU with ``config`` written to a file
    (the socket in ``socket_dir``: unix socket paths must stay short)."""
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir, cdi_dir = workdir / "run", Path(config["cdi_dir"])
    config_file = workdir / "vgpud.toml"
    config_file.write_text(
        "".join(f"{key} = {json.dumps(value)}\n" for key, value in config.items())
    )
    log = workdir / "vgpud.log"
    sock = socket_dir / "vgpud.sock"
    args = [sys.executable, "-m", "vgpud.daemon", "--sim", "--config", str(config_file)]
    args += [
        "--socket",
        str(sock),
        "--run-dir",
        str(run_dir),
        "--state-dir",
        str(workdir / "state"),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            args, cwd=ROOT, env=dict(env), stdout=out, stderr=subprocess.STDOUT
        )
    daemon = Vgpud(process, sock, run_dir, cdi_dir, log)

    def answers() -> bool:
        if not daemon.alive():
            raise AssertionError(f"vgpud exited at start:\n{daemon.log_text()}")
        try:
            return daemon.request("GET", "/v1/health")[0] == 200
        except OSError:
            return False

    wait_for(answers, "vgpud to answer on its socket", timeout=60)
    return daemon


def read_env(pid: int) -> dict[str, str]:
    """A host process's environment (to check what a container got)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode() for k, v in pairs}


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
