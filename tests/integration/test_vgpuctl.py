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
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BUILD
from tests.integration.daemon_harness import Daemon, wait_for


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def terminal_job() -> dict[str, Any]:
    """Popen arguments that start a command as a shell's foreground job:
    a process group of its own, and SIGINT at its default. A test run in
    the background (`make test &`) inherits SIGINT ignored, and so would
    the command, which Ctrl-C then could not interrupt."""
    return {"start_new_session": True, "preexec_fn": _default_sigint}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("vgpuctl")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(BUILD / "sim")
    env["VGPU_SIM_STATE"] = str(tmp / "sim-state")
    d = Daemon(tmp, env).start()
    yield d
    d.cleanup()


def ctl(
    daemon: Daemon | str,
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    sock = daemon if isinstance(daemon, str) else daemon.socket
    base = env if env is not None else os.environ if isinstance(daemon, str) else daemon.env
    env = {**base, "VGPUD_SOCKET": sock}
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
        **terminal_job(),
    )
    wait_for(lambda: len(json.loads(ctl(daemon, "list", "--json").stdout)) == 1, 20, "the vGPU")
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
    assert proc.wait(timeout=30) == 128 + signal.SIGINT
    assert json.loads(ctl(daemon, "list", "--json").stdout) == []


def test_top_once_and_doctor(daemon: Daemon) -> None:
    ctl(daemon, "create", "--name", "topped", "--memory", "64m")
    top = ctl(daemon, "top", "--once").stdout
    assert "topped" in top and "vgpud simulated GPU" in top
    ctl(daemon, "delete", "topped")


def a_users_shell() -> dict[str, str]:
    """A user's environment, who has not heard of build/sim or VGPU_SIM_STATE."""
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "VGPU_SIM_STATE")}


def test_doctor_passes_on_the_simulator_as_a_user_runs_it(daemon: Daemon) -> None:
    doctor = ctl(daemon, "doctor", check=False, env=a_users_shell())
    assert doctor.returncode == 0, doctor.stdout
    assert "on the SIMULATED GPU" in doctor.stdout and "NVML reachable" in doctor.stdout
    assert f"driver {BUILD / 'sim' / 'libcuda.so.1'}" in doctor.stdout


def test_run_on_the_simulator_needs_no_library_path(daemon: Daemon) -> None:
    shell = a_users_shell()
    burn = ctl(
        daemon,
        *("run", "--memory", "128m", "--", str(BUILD / "vgpu-burn"), "--alloc", "64m"),
        *("--seconds", "0"),
        check=False,
        env=shell,
    )
    assert burn.returncode == 0, burn.stderr
    # ... and on the daemon's own simulated machine, where its NVML sees it.
    seen = ctl(daemon, "run", "--", "sh", "-c", 'echo "$VGPU_SIM_STATE"', env=shell).stdout
    assert seen.strip() == daemon.env["VGPU_SIM_STATE"]


def test_devices_lists_the_gpus_and_their_vgpus(daemon: Daemon) -> None:
    vid = ctl(daemon, "create", "--name", "ondev", "--gpus", "1", "--memory", "64m").stdout
    rows = ctl(daemon, "devices").stdout.splitlines()
    assert rows[0].split()[:3] == ["GPU", "UUID", "NAME"]
    assert len(rows) == 3 and all("vgpud simulated GPU" in row for row in rows[1:])
    cc = rows[0].split().index("CC")
    assert [row.split()[cc + 2] for row in rows[1:]] == ["9.0", "9.0"]  # NAME is 3 words
    assert rows[2].split()[-1] == vid.strip() and "ok" in rows[1].split()
    assert len(json.loads(ctl(daemon, "devices", "--json").stdout)) == 2
    ctl(daemon, "delete", "ondev")


def test_show_lists_the_processes_and_delete_says_how_to_force(daemon: Daemon) -> None:
    env = {**daemon.env, "VGPUD_SOCKET": daemon.socket}
    run = [sys.executable, "-m", "vgpud.ctl.main", "run", "--name", "busy", "--memory", "128m"]
    burn = [str(BUILD / "vgpu-burn"), "--alloc", "32m", "--hold", "--seconds", "60"]
    proc = subprocess.Popen(
        [*run, "--", *burn],
        env=env,
        **terminal_job(),
    )
    try:

        def burn_shown() -> str | None:
            out = ctl(daemon, "show", "busy", check=False).stdout
            return out if "vgpu-burn" in out else None

        shown = wait_for(burn_shown, 20, "the burn in vgpuctl show")
        assert "none found" not in shown
        refused = ctl(daemon, "delete", "busy", check=False)
        assert refused.returncode == 1
        assert "used by 1 process(es); add --force to delete it anyway" in refused.stderr
        assert "?force" not in refused.stderr
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)


def test_a_process_name_cannot_write_to_the_operators_terminal(
    daemon: Daemon, tmp_path: Path
) -> None:
    """A tenant names its process (its comm: the file it ran) with a
    terminal's control sequence, here OSC 52, which has a terminal put text
    in the clipboard of whoever runs `vgpuctl show`. It is shown escaped."""
    osc52 = "\x1b]52;c;cm0K\x07"  # "rm\n" to the clipboard
    (tmp_path / osc52).symlink_to(BUILD / "vgpu-burn")
    env = {**daemon.env, "VGPUD_SOCKET": daemon.socket}
    run = [sys.executable, "-m", "vgpud.ctl.main", "run", "--name", "named", "--memory", "128m"]
    burn = [str(tmp_path / osc52), "--alloc", "32m", "--hold", "--seconds", "60"]
    proc = subprocess.Popen([*run, "--", *burn], env=env, **terminal_job())
    try:

        def burn_shown() -> str | None:
            out = ctl(daemon, "show", "named", check=False).stdout
            return out if "none found" not in out and "named" in out else None

        shown = wait_for(burn_shown, 20, "the renamed burn in vgpuctl show")
        assert "\\x1b]52;c;cm0K\\x07" in shown
        assert not any(c in shown for c in "\x1b\x07"), repr(shown)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)


def test_an_over_limit_run_publishes_its_oom(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("oom")
    env = {**os.environ, "LD_LIBRARY_PATH": str(BUILD / "sim")}
    env["VGPU_SIM_STATE"] = str(tmp / "sim-state")
    # No scan after the first: the news can only come from the delete.
    d = Daemon(tmp, env, config="scan_interval = 600.0\n").start()
    try:
        burn = [str(BUILD / "vgpu-burn"), "--alloc", "256m", "--seconds", "0"]
        done = ctl(
            d,
            "run",
            "--memory",
            "128m",
            "--",
            "sh",
            "-c",
            'echo "$VGPU_ID"; exec "$@"',
            "-",
            *burn,
            check=False,
        )
        assert done.returncode == 3, done.stderr  # refused its 256 MiB
        vid = done.stdout.splitlines()[0]
        events = [json.loads(line) for line in d.client.stream("/v1/events?follow=false")]
        ooms = [e for e in events if e["type"] == "oom" and e["vgpu"] == vid]
        assert len(ooms) == 1 and ooms[0]["detail"]["refused"] >= 1, events
    finally:
        d.cleanup()


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
