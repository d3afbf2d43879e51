"""vgpuctl as a user runs it (a subprocess), against the real daemon on the
simulated GPU, and against no daemon at all."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from tests.conftest import BUILD
from tests.integration.daemon_harness import Daemon, wait_for


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("vgpuctl")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(BUILD / "sim")
    env["VGPU_SIM_STATE"] = str(tmp / "sim-state")
    d = Daemon(tmp, env).start()
    yield d
    d.cleanup()


def ctl(daemon: Daemon | str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    sock = daemon if isinstance(daemon, str) else daemon.socket
    env = {**(os.environ if isinstance(daemon, str) else daemon.env), "VGPUD_SOCKET": sock}
    done = subprocess.run(
        [sys.executable, "-m", "vgpud.ctl.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_create_list_show_update_delete(daemon: Daemon) -> None:
    vid = ctl(
        daemon, "create", "--name", "cli", "--memory", "256m", "--share", "20", "--label", "t=1"
    ).stdout.strip()
    assert vid.startswith("vg-")
    listing = ctl(daemon, "list").stdout
    assert "cli" in listing and "256.0MiB" in listing and "20%" in listing
    as_json = json.loads(ctl(daemon, "list", "--json", "--label", "t=1").stdout)
    assert [v["id"] for v in as_json] == [vid]
    assert json.loads(ctl(daemon, "show", "cli", "--json").stdout)["share"] == 20
    assert "vGPU " + vid in ctl(daemon, "show", vid).stdout
    assert "updated" in ctl(daemon, "update", "cli", "--share", "35").stdout
    assert json.loads(ctl(daemon, "show", "cli", "--json").stdout)["share"] == 35
    assert ctl(daemon, "delete", "cli").stdout.strip() == f"deleted {vid}"
    missing = ctl(daemon, "show", "cli", check=False)
    assert missing.returncode == 1 and "no vGPU 'cli'" in missing.stderr


def test_errors_from_the_daemon_are_shown(daemon: Daemon) -> None:
    done = ctl(daemon, "create", "--share", "500", check=False)
    assert done.returncode == 1 and "share: 500 is outside 1..100 (422 invalid)" in done.stderr
    assert ctl(daemon, "update", "x", check=False).returncode == 2  # nothing to change


def test_env_forms(daemon: Daemon) -> None:
    ctl(daemon, "create", "--name", "envs", "--memory", "64m")
    docker = ctl(daemon, "env", "envs", "--docker").stdout
    assert "-e VGPU_CONTROL=/run/vgpud/vgpu/control" in docker
    assert ":/run/vgpud/vgpu/control:ro" in docker and ":/usr/lib/vgpud/libvgpu.so:ro" in docker
    shell = ctl(daemon, "env", "envs", "--shell").stdout
    assert f"export VGPU_CONTROL={daemon.run_dir}" in shell
    assert ctl(daemon, "env", "envs", "--cdi").stdout.strip() == "--device vgpud.io/vgpu=envs"
    ctl(daemon, "delete", "envs")


def test_run_passes_the_exit_code_and_cleans_up(daemon: Daemon) -> None:
    done = ctl(
        daemon, "run", "--memory", "64m", "--", "sh", "-c", 'echo "$VGPU_ID"; exit 7', check=False
    )
    assert done.returncode == 7
    vid = done.stdout.strip()
    assert vid.startswith("vg-")
    assert vid not in ctl(daemon, "list").stdout


def test_run_limits_the_command(daemon: Daemon) -> None:
    done = ctl(
        daemon,
        "run",
        "--memory",
        "128m",
        "--",
        str(BUILD / "vgpu-burn"),
        "--alloc",
        "256m",
        "--seconds",
        "0",
        check=False,
    )
    assert done.returncode == 3, done.stderr  # the burn could not get its 256 MiB


def test_run_cleans_up_when_interrupted(daemon: Daemon) -> None:
    env = {**daemon.env, "VGPUD_SOCKET": daemon.socket}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpud.ctl.main", "run", "--memory", "64m", "--", "sleep", "60"],
        env=env,
        start_new_session=True,  # its own process group, like a terminal job
    )
    wait_for(lambda: len(json.loads(ctl(daemon, "list", "--json").stdout)) == 1, 20, "the vGPU")
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
    assert proc.wait(timeout=30) == 128 + signal.SIGINT
    assert json.loads(ctl(daemon, "list", "--json").stdout) == []


def test_top_once_and_doctor(daemon: Daemon) -> None:
    ctl(daemon, "create", "--name", "topped", "--memory", "64m")
    top = ctl(daemon, "top", "--once").stdout
    assert "topped" in top and "vgpud simulated GPU" in top
    doctor = ctl(daemon, "doctor", "--libcuda", str(BUILD / "sim" / "libcuda.so.1"), check=False)
    assert "ok    vgpud answers" in doctor.stdout and "NVML reachable" in doctor.stdout
    assert "cu* entry points intercepted" in doctor.stdout
    ctl(daemon, "delete", "topped")


def test_without_a_daemon_the_message_says_so() -> None:
    sock = os.path.join(tempfile.mkdtemp(dir="/tmp"), "absent.sock")
    done = ctl(sock, "list", check=False)
    assert done.returncode == 1
    assert done.stderr.strip() == f"vgpuctl: vgpud is not running: cannot connect to {sock}"


def test_top_is_live_and_q_quits(daemon: Daemon) -> None:
    env = {**daemon.env, "VGPUD_SOCKET": daemon.socket}
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vgpud.ctl.main", "top", "--interval", "0.2"],
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    seen = b""

    def frames() -> bool:
        nonlocal seen
        ready, _, _ = select.select([leader], [], [], 0.1)
        if ready:
            seen += os.read(leader, 65536)
        return seen.count(b"vgpud top") >= 2  # refreshed, not printed once

    wait_for(frames, 20, "two frames")
    assert b"(q to quit)" in seen
    os.write(leader, b"q")
    assert proc.wait(timeout=10) == 0
    os.close(leader)
