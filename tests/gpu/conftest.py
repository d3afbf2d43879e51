"""Tests on a real NVIDIA GPU: the truth the simulator stands in for.

They run the frameworks a user runs (PyTorch, JAX, CuPy, nvidia-smi) under
build/libvgpu.so and check, from outside the process through the real NVML,
that the limits hold. Skipped where no NVIDIA driver answers. `make test-gpu`
runs them with the node's framework Python (GPU_PYTHON, default python3).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
HOOK = BUILD / "libvgpu.so"
GiB = 1 << 30
MiB = 1 << 20


def _real_driver_present() -> bool:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    if nvml.nvmlInit_v2() != 0:
        return False
    version = ctypes.create_string_buffer(96)
    nvml.nvmlSystemGetDriverVersion(version, 96)
    return b"sim" not in version.value


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _real_driver_present() and HOOK.exists():
        return
    reason = "no NVIDIA driver here" if HOOK.exists() else "build/libvgpu.so not built"
    for item in items:
        item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class Hooked:
    """Runs Python snippets under the hook in standalone mode."""

    usage_file: Path
    env: dict[str, str] = field(default_factory=dict)

    def environ(self, limit: int, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            LD_PRELOAD=str(HOOK),
            CUDA_MEM_LIMIT=str(limit),
            VGPU_USAGE=str(self.usage_file),
            LOGGER_LEVEL="3",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        env.update(extra)
        return env

    def run(self, code: str, limit: int, timeout: float = 240, **extra: str) -> Result:
        env = self.environ(limit, **extra)
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        peak = NvmlPeak(proc.pid)
        peak.start()
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            peak.stop()
        return Result(proc.returncode, out, err, peak.peak)


@dataclass
class Result:
    rc: int
    out: str
    err: str
    nvml_peak: int

    def json(self) -> dict[str, object]:
        lines = [ln for ln in self.out.splitlines() if ln.startswith("{")]
        assert lines, f"no JSON from child\nstdout:\n{self.out}\nstderr:\n{self.err}"
        parsed: dict[str, object] = json.loads(lines[-1])
        return parsed


class NvmlPeak(threading.Thread):
    """The most device memory NVML ever showed for one process (and its children)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self._done = threading.Event()

    def run(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        while not self._done.is_set():
            pids = _family(self.pid)
            used = sum(
                p.usedGpuMemory or 0
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if p.pid in pids
            )
            self.peak = max(self.peak, used)
            time.sleep(0.02)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)


def _family(pid: int) -> set[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return {pid} | {c.pid for c in root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return {pid}


@pytest.fixture
def hooked(tmp_path: Path) -> Iterator[Hooked]:
    yield Hooked(usage_file=tmp_path / "vgpu.usage")
