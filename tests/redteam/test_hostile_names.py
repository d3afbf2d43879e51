"""Red team: names a tenant chooses — a file's, a mount point's, a cgroup's —
written by the kernel into /proc as they are, so that the daemon reads a
line the kernel never wrote.

The kernel ends each line of maps, mountinfo and cgroup with "\\n" and
keeps "\\n" out of what it prints (maps and mountinfo escape it, a cgroup
name cannot hold it), but prints "\\r", "\\v", "\\f", "\\x1c"-"\\x1f" and
U+0085/U+2028/U+2029 raw: Python's ``str.splitlines`` breaks lines at
those, and ``str.split()`` fields at "\\x1f" too. Each test is an attack of
docs/security.md's table, run on this machine's real kernel; it asserts
that the attack fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures.hook import FakeVgpu, mapping_process
from tests.redteam.test_attribution_attacks import GIB, GPU0, identity, nvml
from vgpud.loops.repairs import check
from vgpud.observe.cgroups import classify, parse_cgroup_file
from vgpud.observe.evidence import BlockFile
from vgpud.observe.procfs import ProcFS
from vgpud.observe.tracker import Tracker
from vgpud.policy.backstop import BackstopPolicy, BackstopState

# Whitespace that no line of the kernel's holds: between the forged fields.
FIELD = "\x1f"


def needs_unshare() -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1)")


def wait_for_comm(pid: int, comm: str, child: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 10
    while (stat := ProcFS().stat(pid)) is None or stat.comm != comm:
        assert time.monotonic() < deadline and child.poll() is None, "the attacker did not start"
        time.sleep(0.01)


@pytest.fixture
def run_dir() -> Iterator[Path]:
    """A run dir as vgpud makes it (0711), outside the test's tmp_path so
    that a mount's root field names it plainly."""
    d = Path(tempfile.mkdtemp(dir="/tmp"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d)


def test_a_file_named_with_a_forged_maps_line_does_not_prove_a_slot(run_dir: Path) -> None:
    """A process of another user maps a file whose name the attacker chose
    (in a directory both reach: a dataset, a model cache, /dev/shm). The
    name holds "\\r" and a whole maps line saying it maps the attacker's
    usage block; the attacker writes the process's identity into its own
    slot. The slot was proven: the process charged to the attacker's vGPU,
    and killed by the backstop as its offender once over the limit."""
    attacker = FakeVgpu(run_dir / "attacker", "attacker", (GIB,))
    st = os.stat(attacker.usage.path)
    forged = (
        f"x\r7f0000000000-7f0000001000 rw-s 00000000 "
        f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino} "
    )
    shared = run_dir / "shared" / forged
    shared.mkdir(parents=True)
    (shared / "data").write_bytes(b"\0" * 4096)
    victim = mapping_process(shared / "data")  # a plain GPU process: no vGPU
    try:
        pidns, start = identity(victim.pid)
        attacker.hook.claim(0, pid=victim.pid, pidns=pidns, start_time=start, used={0: GIB})
        tracker = Tracker(sees_all_pids=True)
        state = BackstopState()
        for _ in range(3):  # past confirm_scans: a kill would have happened
            snap = tracker.scan({"attacker": attacker.blocks}, nvml({victim.pid: 3 * GIB}))
            events, state = check(snap, BackstopPolicy("kill", tolerance=0), state)
            assert events == []
            assert snap.processes[victim.pid].vgpu_id is None
            assert snap.vgpus["attacker"].gpus[GPU0].nvml_used == 0
            assert attacker.control.slot_host_pid(0) == 0
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
        attacker.close()


def mount_script(tmp: Path, point: str, then: str) -> str:
    """Shell that bind-mounts an empty directory of ``tmp`` at ``point`` in
    the mount namespace it runs in, then runs ``then``."""
    source = tmp / "empty"
    source.mkdir(exist_ok=True)
    return f"mkdir -p {_q(point)} && mount --bind {source} {_q(point)} && {then}"


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@pytest.mark.root
def test_a_mount_point_holding_a_forged_mountinfo_line_does_not_put_a_process_in_a_vgpu(
    run_dir: Path, tmp_path: Path
) -> None:
    """A mount made by root at a path the attacker chose: a FUSE mount by
    the setuid ``fusermount`` on a directory of the user's (in the host's
    own mount namespace), a volume at a pod's ``mountPath``. The path holds
    "\\r" and a mountinfo line saying the victim's usage block is
    bind-mounted there: every process of that namespace was the victim's
    vGPU's, its memory charged there (the backstop then kills for it)."""
    needs_unshare()
    victim = FakeVgpu(run_dir / "victim", "victim", (8 * GIB,))
    block = BlockFile.of(victim.usage.path)
    assert block is not None and block.fs_path is not None
    dev = f"{os.major(block.key[0])}:{os.minor(block.key[0])}"
    forged = FIELD.join(("x\r1", "1", dev, block.fs_path, "/p"))
    script = mount_script(tmp_path, f"{tmp_path}/{forged}", "exec sleep 600")
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    attacker = subprocess.Popen(cmd, text=True)
    try:
        wait_for_comm(attacker.pid, "sleep", attacker)
        snap = Tracker(sees_all_pids=True).scan(
            {"victim": victim.blocks}, nvml({attacker.pid: 5 * GIB})
        )
        assert snap.processes[attacker.pid].vgpu_id is None
        assert snap.vgpus["victim"].gpus[GPU0].nvml_used == 0
    finally:
        attacker.kill()
        attacker.wait()
        victim.close()


# The daemon, in a mount namespace of its own with a forged line in its own
# mount table, charges a process of a vGPU's container (the vGPU's usage
# block bind-mounted there, no slot, no hook): prints the process's vGPU and
# where the daemon took its block file to be in its filesystem.
_DAEMON_WITH_A_FORGED_MOUNT = """
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from tests.redteam.test_attribution_attacks import GIB, nvml
from tests.fixtures.hook import FakeVgpu
from vgpud.observe.evidence import BlockFile
from vgpud.observe.tracker import Tracker
from pathlib import Path
vgpu = FakeVgpu(Path(sys.argv[2]) / "v1", "v1", (GIB,))
container = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
    f"touch {sys.argv[2]}/inside && mount --bind {vgpu.usage.path} {sys.argv[2]}/inside "
    "&& echo up && exec sleep 600"], stdout=subprocess.PIPE, text=True)
assert container.stdout.readline() == "up\\n"
snap = Tracker(sees_all_pids=True).scan({"v1": vgpu.blocks}, nvml({container.pid: 2 * GIB}))
print(json.dumps([snap.processes[container.pid].vgpu_id,
                  BlockFile.of(vgpu.usage.path).fs_path]))
container.kill()
vgpu.close()
"""


@pytest.mark.root
def test_a_forged_line_in_the_daemons_own_mount_table_does_not_hide_a_vgpus_container(
    run_dir: Path, tmp_path: Path
) -> None:
    """The daemon finds where its block files lie in their filesystem (what
    a bind mount's root field names) from its own mountinfo. A mount point
    in its namespace holding "\\r" and a line that says a deeper mount of
    the same device holds the run dir (any local user's ``fusermount``
    mount in the host's namespace) moved that: a bind mount of the block
    into a container no longer matched, and a process there that bypasses
    the hook was charged to nobody (its vGPU's limit escaped)."""
    needs_unshare()
    st = os.stat(run_dir)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    forged = FIELD.join(("x\r1", "1", dev, "/elsewhere", os.path.realpath(run_dir)))
    daemon = f'{sys.executable} -c "$DAEMON" {ROOT} {run_dir}'
    script = mount_script(tmp_path, f"{tmp_path}/{forged}", daemon)
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=dict(os.environ, DAEMON=_DAEMON_WITH_A_FORGED_MOUNT, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    member, fs_path = json.loads(out.stdout.splitlines()[-1])
    expected = BlockFile.of(run_dir / "v1" / "usage")
    assert expected is not None
    assert (member, fs_path) == ("v1", expected.fs_path)


def unified_root() -> Path:
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (root / "cgroup.subtree_control").exists():
            return root
    pytest.skip("no cgroup v2 hierarchy")


@pytest.fixture
def cgroup_tree() -> Iterator[tuple[Path, str]]:
    """A subtree of the unified hierarchy of the test's own (standing in
    for a user's delegated ``user@UID.service``), as its directory and as
    /proc/<pid>/cgroup names it; removed, deepest first, after the test."""
    if os.geteuid() != 0:
        pytest.skip("needs root (cgroups)")
    name = f"vgpud-test-{uuid.uuid4().hex[:12]}"
    top = unified_root() / name
    try:
        top.mkdir()
    except OSError as err:
        pytest.skip(f"cgroup hierarchy is not writable: {err}")
    yield top, f"/{name}"
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        d.rmdir()
    top.rmdir()


def sleeper_in(cgroup: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen(["sleep", "600"], text=True)
    (cgroup / "cgroup.procs").write_text(str(p.pid))
    return p


@pytest.mark.root
@pytest.mark.parametrize("brk", ["\r", "\x0b", "\x1e", "\u2028"], ids=["cr", "vt", "rs", "u2028"])
def test_a_cgroup_name_holding_a_forged_line_does_not_put_a_process_in_another_container(
    cgroup_tree: tuple[Path, str], run_dir: Path, brk: str
) -> None:
    """cgroup v2 refuses "\\n" in a cgroup's name to keep /proc/<pid>/cgroup
    parseable, and nothing else: a local user's delegated subtree (or a
    container's, with delegation) may hold ``x\\r5:x:`` with the victim
    container's cgroup below it, whose whole path the kernel prints as one
    line. Read as two, the second named the victim's container: the
    attacker's unhooked GPU process was the victim vGPU's, its memory
    charged there (the fix of 2026-12-02, a container is the cgroup that
    names it, stepped around)."""
    top, shown = cgroup_tree
    container_id = "d0c4e1" * 10 + "d0c4"
    victims = top / "docker" / container_id
    victims.mkdir(parents=True)
    attackers = top / f"x{brk}5:x:{shown}" / "docker" / container_id
    attackers.mkdir(parents=True)
    vgpu = FakeVgpu(run_dir / "victim", "victim", (8 * GIB,))
    victim = mapping_process(vgpu.usage.path)
    (victims / "cgroup.procs").write_text(str(victim.pid))
    attacker = sleeper_in(attackers)
    try:
        pidns, start = identity(victim.pid)
        vgpu.hook.claim(0, pid=victim.pid, pidns=pidns, start_time=start, used={0: GIB})
        text = ProcFS().cgroup(attacker.pid)
        assert text is not None and f"{shown}/x{brk}5:x:{shown}/docker/" in text  # as it is
        ref = classify(parse_cgroup_file(text))
        assert ref.container_cgroup == f"{shown}/x{brk}5:x:{shown}/docker/{container_id}"
        snap = Tracker(sees_all_pids=True).scan(
            {"victim": vgpu.blocks}, nvml({victim.pid: GIB, attacker.pid: 3 * GIB})
        )
        assert snap.processes[victim.pid].vgpu_id == "victim"
        assert snap.processes[attacker.pid].vgpu_id is None
        assert snap.vgpus["victim"].gpus[GPU0].nvml_used == GIB
    finally:
        for p in (attacker, victim):
            p.kill()
            p.wait()
        vgpu.close()
