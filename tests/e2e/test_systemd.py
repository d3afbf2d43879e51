"""vgpud under a real systemd, installed by `make install`.

Each test boots systemd as PID 1 of private namespaces (tests/e2e/systemd/:
an in-memory root, fresh /run, /tmp and /var/tmp, only the test's units,
checked afterwards against marker files in the host's /tmp and /var/tmp)
with the tree of `make install DESTDIR=` copied in and the simulated GPU
where `--sim` finds it. The installed vgpud.service runs unchanged except for
tests/e2e/systemd/units/vgpud.service.d/test.conf (the simulator and a short
watchdog). The API is reached from the host through /proc/<pid1>/root.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BUILD, ROOT, SIM_LIB_DIR
from tests.e2e.systemd.namespace import SystemdNamespace, boot_systemd, unavailable, wait_for

UNIT = "vgpud.service"
SOCKET = "/run/vgpud.sock"
SIM_STATE = "/dev/shm/vgpu-sim"  # set for vgpud by units/vgpud.service.d/test.conf
# What the unit grants (CapabilityBoundingSet=), as /proc/<pid>/status shows it.
CAPABILITIES = {
    "cap_chown": 0,
    "cap_dac_override": 1,
    "cap_kill": 5,
    "cap_sys_ptrace": 19,
    "cap_sys_admin": 21,
}


def make(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"make {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make install DESTDIR=` produces (once per module: pip runs)."""
    dest = tmp_path_factory.mktemp("stage")
    make("install", f"DESTDIR={dest}")
    return dest


@pytest.fixture
def bootable(stage: Path) -> Path:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"cannot boot systemd in a namespace: {reason}")
    if not (SIM_LIB_DIR / "libnvidia-ml.so.1").exists():
        pytest.skip("the simulated driver is not built (run `make`)")
    return stage


@pytest.fixture
def system(
    bootable: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[SystemdNamespace]:
    """A freshly booted system with vgpud installed, for one test."""
    failed_before = request.session.testsfailed
    with boot_systemd(tmp_path, bootable, SIM_LIB_DIR) as namespace:
        yield namespace
        if request.session.testsfailed > failed_before:
            print(namespace.diagnostics())  # shown with the failure's report


# --- talking to the daemon --------------------------------------------------------


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("vgpud", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.path))


def api(system: SystemdNamespace, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request on the daemon's socket, through the /run/vgpud.sock link."""
    conn = _UnixHTTPConnection(system.host_path(SOCKET))
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def start(system: SystemdNamespace) -> int:
    """systemctl start (it returns once the daemon sent READY=1); the main PID."""
    system.systemctl("start", UNIT)
    state = system.show(UNIT, "ActiveState", "SubState", "MainPID")
    assert (state["ActiveState"], state["SubState"]) == ("active", "running"), state
    return int(state["MainPID"])


def create_vgpu(system: SystemdNamespace, name: str) -> dict[str, Any]:
    status, vgpu = api(system, "POST", "/v1/vgpus", {"name": name, "memory": "1g", "share": 20})
    assert status == 201, vgpu
    return dict(vgpu)


def journal_events(system: SystemdNamespace) -> list[dict[str, Any]]:
    """The daemon's log lines (JSON under systemd), parsed."""
    return [json.loads(line) for line in system.journal(UNIT).splitlines() if line.startswith("{")]


def wait_logged(system: SystemdNamespace, event: str, **fields: Any) -> None:
    """Until the daemon's journal has ``event`` with ``fields`` (the journal
    takes a moment after the daemon wrote it)."""

    def logged() -> bool:
        return any(
            e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
            for e in journal_events(system)
        )

    wait_for(logged, f"the daemon to log {event!r} {fields}", timeout=20)


def wait_journal_line(system: SystemdNamespace, unit: str, line: str) -> None:
    wait_for(lambda: line in system.journal(unit).splitlines(), f"{line!r} in {unit}'s log", 20)


# --- the install ----------------------------------------------------------------


def test_make_install_stages_the_layout_for_usr(stage: Path) -> None:
    files = files_under(stage)
    for path in (
        "usr/lib/vgpud/libvgpu.so",
        "usr/lib/vgpud/libvgpu-atomics.so",
        "usr/lib/vgpud/venv/bin/vgpud",
        "usr/lib/vgpud/venv/bin/vgpuctl",
        "usr/lib/vgpud/venv/bin/vgpud-k8s",
        "lib/systemd/system/vgpud.service",
        "lib/systemd/system/vgpud-k8s.service",
        "lib/systemd/system/run-vgpud.mount",
        "etc/vgpud/vgpud.toml",
    ):
        assert path in files, f"make install did not install {path}"
    assert (stage / "usr/bin/vgpud").readlink() == Path("/usr/lib/vgpud/venv/bin/vgpud")
    assert (stage / "usr/bin/vgpuctl").readlink() == Path("/usr/lib/vgpud/venv/bin/vgpuctl")
    assert (stage / "usr/bin/vgpud-k8s").readlink() == Path("/usr/lib/vgpud/venv/bin/vgpud-k8s")
    assert (stage / "lib/systemd/system/vgpud.service").read_text() == (
        ROOT / "systemd/vgpud.service"
    ).read_text()
    assert (stage / "etc/vgpud/vgpud.toml").read_text() == (ROOT / "etc/vgpud.toml").read_text()
    # The venv was built under DESTDIR but must run from /usr/lib/vgpud/venv.
    script = (stage / "usr/lib/vgpud/venv/bin/vgpud").read_text()
    assert script.startswith("#!/usr/lib/vgpud/venv/bin/python"), script.splitlines()[0]
    leaks = [
        path
        for path in files
        if not (stage / path).is_symlink() and str(stage).encode() in (stage / path).read_bytes()
    ]
    assert not leaks, f"files that name the staging directory: {leaks[:5]}"


def test_upgrade_keeps_the_config_and_uninstall_removes_the_rest(
    stage: Path, tmp_path: Path
) -> None:
    """A second install (an upgrade) keeps the admin's config and swaps in a
    working venv; uninstall then leaves only the config."""
    dest = tmp_path / "dest"
    shutil.copytree(stage, dest, symlinks=True)
    config = dest / "etc/vgpud/vgpud.toml"
    config.write_text('placement_policy = "spread"\n')
    make("install", f"DESTDIR={dest}")

    assert config.read_text() == 'placement_policy = "spread"\n', "install overwrote the config"
    venv = dest / "usr/lib/vgpud/venv"
    imported = subprocess.run(
        [str(venv / "bin/python"), "-c", "import vgpud.daemon, vgpud; print(vgpud.__file__)"],
        cwd=tmp_path,  # not the checkout: the venv's own copy must import
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith(str(venv)), imported.stdout
    assert sorted(p.name for p in venv.parent.glob("venv*")) == ["venv"]

    make("uninstall", f"DESTDIR={dest}")
    assert files_under(dest) == {"etc/vgpud/vgpud.toml"}
    assert not (dest / "usr/lib/vgpud").exists()


def test_prefix_reaches_the_unit_the_links_and_lib_dir(tmp_path: Path) -> None:
    """What `make install PREFIX=/usr/local` would do (make -n: no venv built)."""
    plan = make("-n", "install", f"DESTDIR={tmp_path}", "PREFIX=/usr/local").stdout
    assert "ExecStart=/usr/local/bin/vgpud " in plan
    assert f"ln -sfn /usr/local/lib/vgpud/venv/bin/vgpud {tmp_path}/usr/local/bin/vgpud" in plan
    assert 'lib_dir = "/usr/local/lib/vgpud"' in plan


# --- under systemd ------------------------------------------------------------------


@pytest.mark.root
def test_unit_passes_systemd_analyze_verify(system: SystemdNamespace) -> None:
    if system.run("sh", "-c", "command -v systemd-analyze", check=False).returncode != 0:
        pytest.skip("systemd-analyze is not installed")
    result = system.run(
        "systemd-analyze", "verify", "/lib/systemd/system/vgpud.service", check=False
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


@pytest.mark.root
def test_start_is_ready_serves_the_api_and_logs_json(system: SystemdNamespace) -> None:
    start(system)
    status = system.show(UNIT, "StatusText", "NRestarts")
    assert "vGPUs" in status["StatusText"], status  # STATUS= from the daemon
    assert status["NRestarts"] == "0"

    code, health = api(system, "GET", "/v1/health")
    assert (code, health["status"]) == (200, "ok")
    vgpu = create_vgpu(system, "under-systemd")
    code, listed = api(system, "GET", "/v1/vgpus")
    assert [v["id"] for v in listed] == [vgpu["id"]]
    assert system.host_path(f"/run/vgpud/{vgpu['id']}/control").is_file()
    assert list(system.host_path("/run/cdi").glob(f"*{vgpu['id']}*")), "no CDI spec in /run/cdi"
    code, _ = api(system, "DELETE", f"/v1/vgpus/{vgpu['id']}")
    assert code == 200
    assert api(system, "GET", "/v1/vgpus") == (200, [])
    assert not system.host_path(f"/run/vgpud/{vgpu['id']}").exists()

    wait_logged(system, "vgpud ready")


@pytest.mark.root
def test_socket_is_for_root_and_the_vgpud_group(system: SystemdNamespace) -> None:
    start(system)
    link = system.host_path(SOCKET)
    assert link.readlink() == Path("vgpud/vgpud.sock")  # relative: right from any root
    gid = system.run("getent", "group", "vgpud").stdout.split(":")[2]
    real = link.parent / link.readlink()  # not resolve(): /proc/<pid>/root is a link too
    assert oct(real.stat().st_mode & 0o777) == oct(0o660)
    assert str(real.stat().st_gid) == gid

    # The installed vgpuctl, on its default socket path.
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    denied = system.run(*as_nobody, "vgpuctl", "list", check=False)
    assert denied.returncode != 0
    assert "permission denied" in denied.stderr and "'vgpud' group" in denied.stderr, denied
    as_member = ["setpriv", "--reuid=nobody", "--regid=nogroup", f"--groups={gid}"]
    assert json.loads(system.run(*as_member, "vgpuctl", "list", "--json").stdout) == []


@pytest.mark.root
def test_hardening_reaches_the_daemon(system: SystemdNamespace) -> None:
    pid = start(system)
    status = dict(
        line.split(":\t", 1)
        for line in system.host_path(f"/proc/{pid}/status").read_text().splitlines()
    )
    bounding = int(status["CapBnd"], 16)
    granted = {name for name, bit in CAPABILITIES.items() if bounding & (1 << bit)}
    assert granted == set(CAPABILITIES), f"CapBnd {status['CapBnd']}"
    assert bounding == sum(1 << bit for bit in CAPABILITIES.values()), "more than the unit grants"
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"  # SystemCallFilter= and friends are on


MDWE_PROBE = """\
import ctypes, mmap
twice = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda x: 2 * x)
print("callback", twice(21))
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    print("wx allowed")
except PermissionError:
    print("wx denied")
"""
MDWE_UNIT = """\
[Service]
Type=oneshot
ExecStart=/usr/lib/vgpud/venv/bin/python /run/vgpud-test/mdwe_probe.py
MemoryDenyWriteExecute=yes
SystemCallFilter=@system-service
SystemCallArchitectures=native
"""


BURN_UNIT = """\
[Service]
User=nobody
Environment=LD_PRELOAD=/usr/lib/vgpud/libvgpu.so LD_LIBRARY_PATH=/usr/lib/vgpud/sim
Environment=VGPU_SIM_STATE={sim_state} CUDA_MEM_LIMIT=1g
ExecStart={burn} --alloc 256m --hold --seconds 120 --duty 0.1
"""


@pytest.mark.root
def test_the_sandboxed_daemon_adopts_another_users_standalone_process(
    system: SystemdNamespace,
) -> None:
    """Under the unit's hardening (capabilities, PrivateTmp=, ProtectHome=,
    ...) the daemon still finds a process of another user, in another
    service, and adopts its standalone usage block (kept in that process's
    own /tmp, reached through /proc/<pid>/map_files)."""
    if not (BUILD / "vgpu-burn").exists():
        pytest.skip("build/vgpu-burn is not built (run `make`)")
    start(system)
    # One simulated machine for the daemon and the burn, whatever their uid.
    system.run("chmod", "0666", SIM_STATE)
    unit = BURN_UNIT.format(sim_state=SIM_STATE, burn=BUILD / "vgpu-burn")
    system.host_path("/run/vgpud-test/units/vgpu-burn.service").write_text(unit)
    system.systemctl("daemon-reload")
    system.systemctl("start", "vgpu-burn.service")
    pid = int(system.show("vgpu-burn.service", "MainPID")["MainPID"])

    def holding() -> dict[str, Any] | None:
        _, processes = api(system, "GET", "/v1/processes")
        mine = [p for p in processes if p["host_pid"] == pid]
        return mine[0] if mine and sum(mine[0]["memory"].values()) >= 256 << 20 else None

    process = wait_for(holding, "the daemon to report the burn's 256 MiB", timeout=30)
    assert process["kind"] == "standalone", process


@pytest.mark.root
def test_ctypes_callbacks_work_under_memory_deny_write_execute(system: SystemdNamespace) -> None:
    """The unit's MemoryDenyWriteExecute= refuses W+X memory (the negative
    control) yet leaves ctypes callbacks working, in the venv's Python."""
    system.host_path("/run/vgpud-test/mdwe_probe.py").write_text(MDWE_PROBE)
    system.host_path("/run/vgpud-test/units/mdwe-probe.service").write_text(MDWE_UNIT)
    system.systemctl("daemon-reload")
    system.systemctl("start", "mdwe-probe.service")  # oneshot: returns when it is done
    wait_journal_line(system, "mdwe-probe.service", "callback 42")
    wait_journal_line(system, "mdwe-probe.service", "wx denied")


@pytest.mark.root
def test_reload_rereads_the_config_in_the_same_process(system: SystemdNamespace) -> None:
    pid = start(system)
    system.run("sed", "-i", "s/^scan_interval = .*/scan_interval = 0.5/", "/etc/vgpud/vgpud.toml")
    system.systemctl("reload", UNIT)

    wait_logged(system, "config changed", key="scan_interval", new=0.5)
    assert int(system.show(UNIT, "MainPID")["MainPID"]) == pid


@pytest.mark.root
def test_watchdog_pings_arrive(system: SystemdNamespace) -> None:
    start(system)
    assert system.show(UNIT, "WatchdogUSec")["WatchdogUSec"] == "5s"

    def ping() -> int:
        return int(system.show(UNIT, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"])

    first = ping()
    wait_for(lambda: ping() > first, "a WATCHDOG=1 ping after the first", timeout=15)


@pytest.mark.root
def test_a_hung_daemon_is_restarted_and_its_vgpus_survive(system: SystemdNamespace) -> None:
    pid = start(system)
    vgpu = create_vgpu(system, "survivor")
    control = system.host_path(f"/run/vgpud/{vgpu['id']}/control")
    inode = control.stat().st_ino

    system.run("kill", "-STOP", str(pid))  # a hung event loop: no more pings

    def restarted() -> bool:
        state = system.show(UNIT, "NRestarts", "ActiveState", "SubState", "MainPID")
        return state["NRestarts"] == "1" and state["SubState"] == "running"

    wait_for(restarted, "the watchdog to kill the daemon and systemd to restart it", 60)
    assert int(system.show(UNIT, "MainPID")["MainPID"]) != pid
    wait_journal_line(system, UNIT, "vgpud.service: Watchdog timeout (limit 5s)!")
    # The restarted daemon adopted the blocks in place: same files, same vGPU.
    assert control.stat().st_ino == inode
    code, got = api(system, "GET", f"/v1/vgpus/{vgpu['id']}")
    assert (code, got["name"]) == (200, "survivor")


@pytest.mark.root
def test_stop_removes_the_socket_and_keeps_blocks_and_state(system: SystemdNamespace) -> None:
    start(system)
    vgpu = create_vgpu(system, "kept")
    blocks = system.host_path(f"/run/vgpud/{vgpu['id']}")

    system.systemctl("stop", UNIT)
    state = system.show(UNIT, "ActiveState", "Result")
    assert (state["ActiveState"], state["Result"]) == ("inactive", "success"), state
    assert not system.host_path(SOCKET).is_symlink()
    assert not system.host_path("/run/vgpud/vgpud.sock").exists()
    assert {p.name for p in blocks.iterdir()} >= {"control", "usage"}
    assert system.host_path("/var/lib/vgpud/vgpus.state").is_file()
    wait_logged(system, "vgpud stopped")

    start(system)
    code, got = api(system, "GET", f"/v1/vgpus/{vgpu['id']}")
    assert (code, got["name"]) == (200, "kept")


def test_a_tenant_growing_its_usage_block_fills_the_run_dirs_tmpfs_not_run(
    system: SystemdNamespace,
) -> None:
    """A vGPU's user may write its usage block, and so grow it past its
    layout (the daemon cuts it back at its next scan). On /run itself that
    filled the node's /run, every service's runtime files, for as long as
    the tenant kept writing; run-vgpud.mount gives the blocks a tmpfs of
    their own, so what it fills is that."""
    start(system)
    run, run_dir = system.host_path("/run"), system.host_path("/run/vgpud")
    assert run_dir.stat().st_dev != run.stat().st_dev, "the run dir is not a mount of its own"
    size = os.statvfs(run_dir)
    assert size.f_blocks * size.f_frsize == 256 << 20
    status, vgpu = api(
        system, "POST", "/v1/vgpus", {"name": "t", "memory": "1g", "user": {"uid": 65534}}
    )
    assert status == 201, vgpu
    usage = f"/run/vgpud/{vgpu['id']}/usage"
    layout = system.host_path(usage).stat().st_size
    free_before = os.statvfs(run).f_bavail * os.statvfs(run).f_frsize

    grow = system.run(
        "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
        "dd", "if=/dev/zero", f"of={usage}", "bs=1M", "count=512", "oflag=append",
        "conv=notrunc", check=False,
    )  # fmt: skip

    assert grow.returncode != 0 and "No space left on device" in grow.stderr, grow.stderr
    free_after = os.statvfs(run).f_bavail * os.statvfs(run).f_frsize
    assert free_before - free_after < 16 << 20, "the tenant's writes reached /run"
    # And the daemon cuts the block back to its layout at its next scan.
    wait_for(lambda: system.host_path(usage).stat().st_size == layout, "the block cut back", 20)
    assert create_vgpu(system, "after")["name"] == "after"


@pytest.mark.root
def test_make_uninstall_on_a_node_stops_the_service(system: SystemdNamespace) -> None:
    start(system)
    system.run("make", "--no-print-directory", "-C", str(ROOT), "uninstall")
    assert system.show(UNIT, "ActiveState")["ActiveState"] == "inactive"
    for path in (
        "/usr/bin/vgpud",
        "/usr/lib/vgpud/venv",
        "/lib/systemd/system/vgpud.service",
        "/lib/systemd/system/run-vgpud.mount",
    ):
        assert not system.host_path(path).exists(), f"{path} is still there"
    for path in ("/etc/vgpud/vgpud.toml", "/var/lib/vgpud"):
        assert system.host_path(path).exists(), f"uninstall removed {path}"


@pytest.mark.root
def test_the_host_tmp_is_untouched_by_a_boot(bootable: Path, tmp_path: Path) -> None:
    """The guard itself: a file in the host's /tmp outlives a boot and a
    poweroff, and what is written to /tmp inside stays inside
    (boot_systemd also checks its own markers)."""
    witness = Path("/tmp") / f"vgpud-systemd-witness-{tmp_path.name}"
    inside = Path("/tmp") / f"vgpud-systemd-inside-{tmp_path.name}"
    witness.write_text("here before the boot\n")
    try:
        with boot_systemd(tmp_path, bootable, SIM_LIB_DIR) as namespace:
            assert not namespace.host_path(str(witness)).exists()
            namespace.run("touch", str(inside))
            assert namespace.host_path(str(inside)).exists()
        assert witness.read_text() == "here before the boot\n"
        assert not inside.exists()
    finally:
        witness.unlink(missing_ok=True)
