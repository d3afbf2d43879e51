"""A real systemd, booted as PID 1 of private namespaces for one test module.

``boot_systemd()`` runs boot.sh (read it for what is isolated and how: an
in-memory root, fresh /run, /tmp and /var/tmp, only the test's units) and
yields a ``SystemdNamespace`` to work with: ``run`` a command inside
(nsenter), ``systemctl``, ``show`` unit properties, read the ``journal``,
and reach files inside from the host (``host_path``: /proc/<pid1>/root/...).

Whatever happens, the namespace is shut down at the end (poweroff, then
SIGKILL of its PID 1, which ends every process in it), its cgroup is
removed, and the host's /tmp and /var/tmp are checked to still hold the
marker files that the boot refused to see: proof that systemd never
touched them.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

HERE = Path(__file__).resolve().parent
BOOT = HERE / "boot.sh"
CHECKOUT = HERE.parents[2]  # the repository the tests run from
UNITS = HERE / "units"
SYSTEMD = Path("/lib/systemd/systemd")
TOOLS = ("unshare", "nsenter", "setpriv", "pivot_root", "chroot", "groupadd", "systemctl")
CGROUP_PREFIX = "vgpud-systemd-test-"
# Commands run inside see this environment only, not the test runner's.
INSIDE_ENV = {
    "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "SYSTEMD_COLORS": "0",
    "SYSTEMD_PAGER": "",
}
BOOT_TIMEOUT = 90.0

T = TypeVar("T")


def unavailable() -> str | None:
    """Why systemd cannot be booted in a namespace here; None when it can."""
    if os.geteuid() != 0:
        return "needs root (namespaces, mounts, a cgroup)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"not installed: {', '.join(missing)}"
    if not SYSTEMD.exists():
        return f"systemd is not installed ({SYSTEMD})"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    if not Path(f"/proc/self/task/{os.getpid()}/children").exists():
        return "the kernel does not list a task's children (CONFIG_PROC_CHILDREN)"
    if _cgroup2_mount() is None:
        return "no cgroup v2 hierarchy is mounted (systemd needs one to manage)"
    return None


def wait_for(probe: Callable[[], T | None], what: str, timeout: float, every: float = 0.1) -> T:
    """Poll ``probe`` until it returns something truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


class SystemdNamespace:
    """A booted systemd; see the module docstring."""

    def __init__(self, launcher: subprocess.Popen[bytes], console: _Console) -> None:
        self.launcher = launcher
        self.console = console
        self.pid1 = wait_for(self._find_pid1, "systemd to become the namespace's PID 1", 60)

    # --- inside -------------------------------------------------------------

    def run(
        self, *argv: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run a command in every namespace of the booted system."""
        nsenter = ["nsenter", "-t", str(self.pid1), "-m", "-u", "-i", "-n", "-p", "-C", "--"]
        result = subprocess.run(
            [*nsenter, *argv],
            env=INSIDE_ENV,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"`{' '.join(argv)}` exited {result.returncode} inside the namespace:\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", "--no-pager", *args, check=check)

    def show(self, unit: str | None, *properties: str) -> dict[str, str]:
        """A unit's properties (the manager's for None), as unparsed strings."""
        args = [f"--property={name}" for name in properties]
        out = self.systemctl("show", *args, *([unit] if unit else [])).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str) -> str:
        return self.run("journalctl", "--no-pager", "-o", "cat", "-u", unit).stdout

    def host_path(self, path: str) -> Path:
        """The host's way to a path inside (sockets included)."""
        return Path(f"/proc/{self.pid1}/root") / path.lstrip("/")

    def diagnostics(self) -> str:
        """What to read when a test fails: the console and the whole journal."""
        journal = ""
        if self.launcher.poll() is None:
            with suppress(AssertionError, subprocess.TimeoutExpired):
                journal = self.run("journalctl", "--no-pager", "-b", "-n", "200").stdout
        return f"--- console ---\n{self.console.text()[-6000:]}\n--- journal ---\n{journal}"

    # --- lifecycle ------------------------------------------------------------

    def wait_booted(self) -> None:
        """Until systemd has finished starting vgpud-test.target."""
        wait_for(
            lambda: self._alive() and self.host_path("/run/systemd/private").exists(),
            "systemd's control socket",
            BOOT_TIMEOUT,
        )
        state = self.run("systemctl", "is-system-running", "--wait", check=False).stdout.strip()
        if state != "running":
            failed = self.systemctl("list-units", "--failed", "--no-legend").stdout
            raise AssertionError(f"boot ended {state!r}; failed units:\n{failed}")

    def shutdown(self) -> None:
        """Power off; if that does not end it in time, SIGKILL its PID 1."""
        if self.launcher.poll() is None:
            with suppress(AssertionError, subprocess.TimeoutExpired):
                self.systemctl("poweroff", "--no-block")
            try:
                self.launcher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # The launcher has not reaped PID 1, so the PID is still its.
                os.kill(self.pid1, signal.SIGKILL)
                self.launcher.kill()
                self.launcher.wait(timeout=30)
        self.console.close()

    def _alive(self) -> bool:
        if self.launcher.poll() is not None:
            raise AssertionError(
                f"the namespace ended (exit {self.launcher.returncode}):\n{self.console.text()}"
            )
        return True

    def _find_pid1(self) -> int | None:
        self._alive()
        children = Path(f"/proc/{self.launcher.pid}/task/{self.launcher.pid}/children")
        for pid in children.read_text().split():
            with suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    return int(pid)
        return None


class _Console:
    """Copies what the namespace writes on its /dev/console (a pty) to a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.master, self.slave = os.openpty()
        self._thread = threading.Thread(target=self._copy, name="systemd-console", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        with self.path.open("wb") as out:
            while True:
                try:
                    data = os.read(self.master, 65536)
                except OSError as exc:  # EIO: every writer has closed it
                    if exc.errno != errno.EIO:
                        raise
                    return
                if not data:
                    return
                out.write(data)
                out.flush()

    def text(self) -> str:
        return self.path.read_text(errors="replace") if self.path.exists() else ""

    def close(self) -> None:
        with suppress(OSError):
            os.close(self.slave)
        self._thread.join(timeout=10)
        with suppress(OSError):
            os.close(self.master)


@contextmanager
def boot_systemd(workdir: Path, stage: Path, sim: Path) -> Iterator[SystemdNamespace]:
    """Boot systemd with the ``make install DESTDIR=`` tree ``stage`` in it and
    the simulated driver ``sim``; shut it down and check the host after."""
    marker = f"{CGROUP_PREFIX}{uuid.uuid4().hex}"
    markers = [Path("/tmp") / marker, Path("/var/tmp") / marker]
    for path in markers:
        path.write_text("the vgpud systemd test checks that this file survives its boot\n")
    cgroup = _make_cgroup(marker)
    namespace: SystemdNamespace | None = None
    console = _Console(workdir / "console.log")
    try:
        args = [str(cgroup), marker, str(stage), str(UNITS), str(sim), str(CHECKOUT)]
        launcher = subprocess.Popen(
            # --pdeathsig: if the test runner dies, so does the namespace.
            ["setpriv", "--pdeathsig", "KILL", "--", str(BOOT), *args],
            stdin=subprocess.DEVNULL,
            stdout=console.slave,
            stderr=console.slave,
            start_new_session=True,
        )
        namespace = SystemdNamespace(launcher, console)
        namespace.wait_booted()
        yield namespace
    finally:
        if namespace is not None:
            namespace.shutdown()
        else:
            console.close()
        _remove_cgroup(cgroup)
        lost = [str(path) for path in markers if not path.exists()]
        for path in markers:
            path.unlink(missing_ok=True)
        assert not lost, f"the host lost {lost}: the namespace's /tmp was not private"


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype == "cgroup2":
            return Path(fields[4])
    return None


def _make_cgroup(name: str) -> Path:
    """A fresh cgroup v2 directory below ours."""
    mount = _cgroup2_mount()
    assert mount is not None
    ours = next(
        line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line[:3] == "0::"
    )
    path = mount / ours.lstrip("/") / name
    path.mkdir()
    return path


def _remove_cgroup(path: Path, timeout: float = 30) -> None:
    """Remove a cgroup tree, deepest first, once its processes are gone."""

    def remove() -> bool:
        for directory in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if directory.is_dir():
                with suppress(OSError):
                    directory.rmdir()
        with suppress(FileNotFoundError):
            path.rmdir()
        return not path.exists()

    wait_for(remove, f"cgroup {path} to empty", timeout, every=0.2)
