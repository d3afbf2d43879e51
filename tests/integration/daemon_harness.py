"""Run the real vgpud as a subprocess for a test: short socket path, private
run/state dirs, the simulated GPU when asked. Readiness is polled (the
socket answers /v1/health), never slept for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vgpud.ctl.client import Client, DaemonUnreachable
from vgpud.vgpus.model import Vgpu
from vgpud.vgpus.state import StateStore

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


def wait_for(condition: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class Daemon:
    def __init__(
        self,
        workdir: Path,
        env: Mapping[str, str],
        *,
        sim: bool = True,
        args: tuple[str, ...] = (),
        config: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.sockdir = Path(tempfile.mkdtemp(dir="/tmp", prefix="vgd"))  # < 108 bytes
        self.socket = str(self.sockdir / "s")
        self.run_dir = workdir / "run"
        self.state_dir = workdir / "state"
        self.log_path = workdir / "vgpud.log"
        self.config_path = workdir / "vgpud.toml"
        self.config_path.write_text(config or "")
        self.env = {  # the caller's env may override these (tests/e2e sets a CDI dir)
            "VGPUD_CDI_DIR": "",
            "VGPUD_SOCKET_GROUP": "",
            "VGPUD_LOG_FORMAT": "console",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.args = [
            sys.executable,
            "-m",
            "vgpud.daemon",
            "--config",
            str(self.config_path),
            "--socket",
            self.socket,
            "--run-dir",
            str(self.run_dir),
            "--state-dir",
            str(self.state_dir),
            *(["--sim"] if sim else []),
            *args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = Client(self.socket, timeout=10)

    def start(self, wait: bool = True) -> Daemon:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=log, cwd=ROOT)
        log.close()
        if wait:
            wait_for(self._answers, START_TIMEOUT, f"vgpud to answer on {self.socket}")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"vgpud exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return bool(self.client.get("/v1/health"))
        except DaemonUnreachable:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def recorded(self) -> list[Vgpu]:
        """The vGPUs the state file holds, read as the daemon reads them."""
        return StateStore(self.state_dir).load()

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def cleanup(self) -> None:
        self.stop()
        for leftover in self.sockdir.iterdir():
            leftover.unlink()
        self.sockdir.rmdir()


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in list(env):
        if key.startswith(("VGPUD_", "NOTIFY_SOCKET", "WATCHDOG_")):
            del env[key]
    return env
