"""The real daemon as the container tests use it: tests/integration's
``Daemon`` (a subprocess on the simulated GPU) with the CDI directory the
container runtime reads, and the few API calls the tests make."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.podman import Podman
from tests.integration.daemon_harness import Daemon, base_env
from vgpud.ctl.client import ApiFailure

MIB = 1 << 20
GIB = 1 << 30


class Vgpud:
    """A running vgpud whose CDI specs land in ``cdi_dir``."""

    def __init__(self, workdir: Path, env: dict[str, str], config: str) -> None:
        self.daemon = Daemon(workdir, {**base_env(), **env}, config=config)
        self.socket = self.daemon.socket
        self.daemon.start()

    def get(self, path: str) -> Any:
        """JSON answers as data; text answers (the metrics) as text."""
        status, data = self.daemon.client.raw("GET", path)
        assert status == 200, f"GET {path}: {status} {data!r}"
        text = data.decode()
        return json.loads(text) if text[:1] in "[{" else text

    def create(self, **fields: Any) -> dict[str, Any]:
        vgpu: dict[str, Any] = self.daemon.client.post("/v1/vgpus", fields)
        return vgpu

    def delete(self, vgpu_id: str) -> None:
        try:
            self.daemon.client.delete(f"/v1/vgpus/{vgpu_id}?force=true")
        except ApiFailure as exc:
            if exc.status != 404:
                raise

    def healthy(self) -> bool:
        return self.daemon.client.raw("GET", "/v1/health")[0] == 200

    def events(self, vgpu_id: str | None = None) -> list[dict[str, Any]]:
        """The events so far (of one vGPU)."""
        text = self.daemon.client.raw("GET", "/v1/events?follow=false")[1].decode()
        events = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [e for e in events if vgpu_id is None or e.get("vgpu") == vgpu_id]

    def alive(self) -> bool:
        proc = self.daemon.proc
        return proc is not None and proc.poll() is None

    def log_text(self) -> str:
        return self.daemon.log()

    def stop(self) -> None:
        self.daemon.cleanup()


def burn_past_one_gib(
    vgpud: Vgpud, podman: Podman, device: str, sim_state: dict[str, str], volumes: list[str]
) -> dict[str, Any]:
    """Run a container with ``device`` (a vGPU of 1 GiB) that asks for 2 GiB
    in 128 MiB chunks; check that it was refused past the limit and that the
    hook's high-water mark reached the limit (less than one chunk left over)
    and never passed it. The vGPU as vgpud shows it afterwards."""
    done = podman.run(
        ["vgpu-burn", "--alloc", "2g", "--chunk", "128m", "--seconds", "0"],
        devices=[device],
        env=sim_state,
        volumes=volumes,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 3, output  # the allocation was not fully satisfied
    assert "CUDA_ERROR_OUT_OF_MEMORY" in output
    vgpu: dict[str, Any] = vgpud.get(f"/v1/vgpus/{device.split('=', 1)[1]}")
    assert GIB - 128 * MIB < vgpu["gpus"][0]["memory_peak"] <= GIB
    return vgpu
