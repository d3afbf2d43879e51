"""Run ``build/vgpu-memprobe`` (libhook/tools/vgpu-memprobe.c) under the hook.

The probe prints one JSON object per command; :func:`probe` runs a whole
command list and returns the objects, :class:`InteractiveProbe` stops at each
``wait`` command so a test can look at the shared blocks while the process
holds its memory.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.conftest import BUILD

LIBVGPU = BUILD / "libvgpu.so"
MEMPROBE = BUILD / "vgpu-memprobe"
MiB = 1 << 20


def hooked(env: Mapping[str, str], **extra: str) -> dict[str, str]:
    """``env`` with the hook preloaded and ``extra`` variables set."""
    return {**env, "LD_PRELOAD": str(LIBVGPU), **extra}


@dataclass
class ProbeRun:
    returncode: int
    lines: list[dict[str, Any]]
    stderr: str

    def ops(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("op") == name]

    @property
    def init(self) -> dict[str, Any]:
        return self.ops("init")[0]


def _parse(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def probe(
    env: Mapping[str, str], *commands: str, args: Sequence[str] = (), timeout: float = 60
) -> ProbeRun:
    proc = subprocess.run(
        [str(MEMPROBE), *args, *commands],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return ProbeRun(proc.returncode, _parse(proc.stdout), proc.stderr)


@dataclass
class InteractiveProbe:
    """A probe that pauses at every ``wait`` until :meth:`resume`."""

    env: Mapping[str, str]
    commands: Sequence[str]
    args: Sequence[str] = ()
    lines: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.proc = subprocess.Popen(
            [str(MEMPROBE), *self.args, *self.commands],
            env=dict(self.env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def until_wait(self) -> list[dict[str, Any]]:
        """Read lines up to the next ``wait`` (or the end); return them."""
        assert self.proc.stdout is not None
        got: list[dict[str, Any]] = []
        for raw in self.proc.stdout:
            line = json.loads(raw)
            got.append(line)
            if line.get("op") in ("wait", "churn"):
                break
        self.lines.extend(got)
        return got

    def resume(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60) -> ProbeRun:
        out, err = self.proc.communicate(timeout=timeout)
        self.lines.extend(_parse(out))
        return ProbeRun(self.proc.returncode, self.lines, err)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=30)
