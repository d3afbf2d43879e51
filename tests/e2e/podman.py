"""podman as the container tests drive it.

On the CI machine (cgroup v1 + v2 hybrid, no CAP_SYS_RESOURCE, no registry)
podman works with: runc (crun refuses the hybrid layout), the cgroupfs
cgroup manager, no network, explicit ulimits (podman's default process limit
is above what the host lets it set), and ``--rootfs DIR`` instead of an
image. Storage, run root and tmp dir are private to the test session so the
tests neither see nor disturb other containers on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ULIMITS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")
CDI_SYSTEM_DIR = Path("/var/run/cdi")


def find_runc() -> str | None:
    return shutil.which("runc") or next(
        (p for p in ("/usr/sbin/runc", "/usr/bin/runc") if os.access(p, os.X_OK)), None
    )


def missing_requirements() -> str | None:
    """Why the container tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "container tests need root (podman with cgroupfs)"
    if shutil.which("podman") is None or find_runc() is None:
        return "podman/runc not installed: run `make e2e-deps` (as root)"
    if shutil.which("busybox") is None and not os.access("/bin/busybox", os.X_OK):
        return "busybox not installed: run `make e2e-deps` (as root)"
    return None


def supports_cdi_spec_dir() -> bool:
    """Newer podman takes --cdi-spec-dir; Debian 12's 4.3 reads only /etc/cdi
    and /var/run/cdi."""
    out = subprocess.run(["podman", "--help"], capture_output=True, text=True, check=False)
    return "--cdi-spec-dir" in out.stdout


@dataclass
class Podman:
    storage: Path
    rootfs: Path
    cdi_dir: Path | None = None  # None: podman's own directories
    runtime: str = field(default_factory=lambda: find_runc() or "runc")
    names: list[str] = field(default_factory=list)

    def base(self) -> list[str]:
        args = [
            "podman",
            "--runtime",
            self.runtime,
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "none",
            "--root",
            str(self.storage / "root"),
            "--runroot",
            str(self.storage / "runroot"),
            "--tmpdir",
            str(self.storage / "tmp"),
        ]
        if self.cdi_dir is not None:
            args += ["--cdi-spec-dir", str(self.cdi_dir)]
        return args

    def run(
        self,
        command: Sequence[str],
        *,
        devices: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        volumes: Iterable[str] = (),
        extra: Sequence[str] = (),
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """Run a container to its end; the result has its exit code and output.
        ``extra``: more `podman run` flags, as given."""
        args = [*self.base(), *self._run_args(devices, env, volumes), *extra, "--rm"]
        return subprocess.run(
            [*args, "--rootfs", str(self.rootfs), *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(
        self,
        name: str,
        command: Sequence[str],
        *,
        devices: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        volumes: Iterable[str] = (),
    ) -> None:
        """Start a container in the background (removed by remove_all)."""
        self.names.append(name)
        args = [*self._run_args(devices, env, volumes), "--detach", "--name", name]
        self._podman(*args, "--rootfs", str(self.rootfs), *command)

    def exec(
        self, name: str, command: Sequence[str], *, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        args = [*self.base(), "exec", name, *command]
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)

    def inspect(self, name: str) -> dict[str, object]:
        out = self._podman("inspect", name)
        result: list[dict[str, object]] = json.loads(out)
        return result[0]

    def host_pid(self, name: str) -> int:
        state = self.inspect(name)["State"]
        assert isinstance(state, dict)
        return int(state["Pid"])

    def container_id(self, name: str) -> str:
        return str(self.inspect(name)["Id"])

    def kill(self, name: str) -> None:
        self._podman("kill", name)

    def logs(self, name: str) -> str:
        return self._podman("logs", name)

    def wait(self, name: str, timeout: float = 60) -> int:
        return int(self._podman("wait", name, timeout=timeout).strip())

    def remove_all(self) -> None:
        for name in self.names:
            subprocess.run(
                [*self.base(), "rm", "--force", "--time", "0", name],
                capture_output=True,
                timeout=60,
                check=False,
            )
        self.names.clear()

    def close(self) -> None:
        """Remove the containers and undo the mounts podman made in storage
        (it mounts its overlay directory over itself), so the directory can
        be deleted."""
        self.remove_all()
        prefix = str(self.storage.resolve()) + "/"
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        for point in sorted({m.split()[4] for m in mounts}, reverse=True):
            if point.startswith(prefix):
                subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)

    def _run_args(
        self, devices: Iterable[str], env: Mapping[str, str] | None, volumes: Iterable[str]
    ) -> list[str]:
        # One root filesystem serves every container: read-only, with a
        # private tmpfs on /tmp, /var/tmp and /run in each (podman's default
        # for --read-only), so no container sees another's files.
        args = ["run", "--network", "none", "--read-only", *ULIMITS]
        for device in devices:
            args += ["--device", device]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        for volume in volumes:
            args += ["--volume", volume]
        return args

    def _podman(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [*self.base(), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout
