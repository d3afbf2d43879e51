"""tests/e2e/install_deps.sh, which `make test` runs first: it says what it
installs before it does, installs only what is missing, and can be told not
to. Driven with stand-ins for apt-get, id and the tools it looks for."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "e2e" / "install_deps.sh"
PRESENT = ("podman", "runc", "busybox", "patch")


def stand_in(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    """A PATH of stand-ins: root, an apt-get that logs its calls (and whose
    simulation plans 32 packages), and the few real tools the script uses."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in(bin_dir, "id", "echo 0")
    plan = 'for i in $(seq 32); do echo "Inst pkg$i"; done'
    apt = f'echo "$*" >> {tmp_path}/apt.log\ncase "$*" in *" -s "*) {plan};; esac'
    stand_in(bin_dir, "apt-get", apt)
    for tool in ("grep", "seq"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    return tmp_path


def run(machine: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", str(SCRIPT)],
        env={"PATH": str(machine / "bin"), **env},
        capture_output=True,
        text=True,
        check=True,
    )


def apt_calls(machine: Path) -> list[str]:
    log = machine / "apt.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.skipif(
    os.path.exists("/usr/sbin/runc") or os.path.exists("/bin/busybox"),
    reason="this host has runc or busybox outside PATH",
)
def test_as_root_it_says_what_it_installs_first(machine: Path) -> None:
    done = run(machine)
    first = done.stdout.splitlines()[0]
    assert first.startswith("e2e-deps: installing podman runc busybox-static patch")
    assert "32 new packages" in first and "VGPUD_E2E_DEPS=skip" in first
    assert apt_calls(machine)[-1] == "install -y -qq podman runc busybox-static patch"


def test_with_everything_there_it_does_nothing(machine: Path) -> None:
    for tool in PRESENT:
        stand_in(machine / "bin", tool, "exit 0")
    assert run(machine).stdout == ""
    assert apt_calls(machine) == []


def test_it_can_be_told_to_install_nothing(machine: Path) -> None:
    done = run(machine, VGPUD_E2E_DEPS="skip")
    assert "not installing" in done.stdout
    assert "the tests that need them will be skipped" in done.stdout
    assert apt_calls(machine) == []
