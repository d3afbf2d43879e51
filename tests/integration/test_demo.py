"""`make demo` end to end on the simulated GPU: the daemon, two vGPUs, a burn
in each, and the closing table saying every limit held."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from demo.demo import keep_or_remove
from tests.conftest import BUILD, ROOT


@pytest.mark.skipif(not (BUILD / "vgpu-burn").exists(), reason="run `make` first")
def test_demo_shows_every_limit_held_on_the_simulator() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPU", "LD_"))}
    done = subprocess.run(
        [sys.executable, "-m", "demo", "--seconds", "8"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    assert out.splitlines()[0] == "GPU: SIMULATED (no NVIDIA driver found)"
    assert "CUDA_ERROR_OUT_OF_MEMORY" in out
    verdict = out[out.index("did the limits hold?") :].splitlines()
    rows = [line.split() for line in verdict if line.startswith("demo-")]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("demo-small", "memory", "held"),
        ("demo-small", "compute", "held"),
        ("demo-large", "memory", "held"),
        ("demo-large", "compute", "held"),
    ]


def test_demo_refuses_a_bad_duration() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "demo", "--seconds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--seconds" in done.stderr


def test_a_limit_not_held_keeps_the_log_it_names(tmp_path: Path) -> None:
    work = tmp_path / "vgpud-demo-x"
    work.mkdir()
    (work / "vgpud.log").write_text("the daemon's story")
    message = keep_or_remove(work, held=False)
    assert message is not None
    named = Path(message.split("the daemon's log ")[1].split()[0])
    assert named.read_text() == "the daemon's story"
    assert keep_or_remove(work, held=True) is None
    assert not work.exists()
