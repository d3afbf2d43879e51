"""procfs: fixture /proc trees for every runtime, PID reuse, vanishing processes."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_cgroups import LINE_BREAKS
from vgpud.observe.cgroups import classify, parse_cgroup_file
from vgpud.observe.procfs import (
    MappedFile,
    Mount,
    ProcessTable,
    ProcFS,
    parse_maps,
    parse_mountinfo,
    parse_stat,
    parse_status,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "proc"
CASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def expected(case: str) -> dict[int, dict[str, Any]]:
    data = json.loads((FIXTURES / case / "expected.json").read_text())
    return {int(pid): fields for pid, fields in data.items()}


@pytest.mark.parametrize("case", CASES)
def test_fixture_processes_read_as_expected(case: str) -> None:
    fs = ProcFS(FIXTURES / case)
    want = expected(case)
    assert sorted(fs.pids()) == sorted(want)
    live = ProcessTable(fs).refresh()
    assert sorted(live) == sorted(pid for pid, fields in want.items() if fields["live"])
    for pid, fields in want.items():
        process = fs.process(pid)
        assert process is not None
        assert (process.comm, process.start_time, process.uid) == (
            fields["comm"],
            fields["start_time"],
            fields["uid"],
        )
        assert list(process.nspid) == fields["nspid"]
        assert process.pidns == fields["pidns"]
        assert fs.environ(pid) == fields["env"]
        text = fs.cgroup(pid)
        assert text is not None
        ref = classify(parse_cgroup_file(text))
        got = {
            "runtime": str(ref.runtime),
            "cgroup_path": ref.cgroup_path,
            "container_id": ref.container_id,
            "pod_uid": ref.pod_uid,
            "qos_class": None if ref.qos_class is None else str(ref.qos_class),
            "unit": ref.unit,
        }
        assert got == {key: fields[key] for key in got}, f"pid {pid}"


def test_every_runtime_and_cgroup_version_has_a_fixture() -> None:
    runtimes = set()
    for case in CASES:
        runtimes |= {fields["runtime"] for fields in expected(case).values()}
    assert runtimes == {"docker", "containerd", "cri-o", "cri", "podman", "systemd", "host"}
    assert {case.rsplit("-", 1)[1] for case in CASES} == {"v1", "v2", "hybrid"}


def test_stat_comm_with_spaces_and_parentheses() -> None:
    line = b"5230 ((sd-pam) x)) S 1 5230 5230 0 -1 0 0 0 0 0 0 0 0 0 20 0 4 0 6230 0 0\n"
    stat = parse_stat(5230, line)
    assert stat is not None
    assert (stat.comm, stat.state, stat.ppid, stat.threads, stat.start_time) == (
        "(sd-pam) x)",
        "S",
        1,
        4,
        6230,
    )
    assert parse_stat(1, b"1 (truncated") is None
    assert parse_stat(1, b"1 (short) S 1 2") is None


def test_maps_keeps_file_backed_mappings_only() -> None:
    text = (
        "7f1a2b3c4000-7f1a2b3fd000 rw-s 00000000 00:2a 131077    /run/vgpud/vgpu/usage\n"
        "7f1a2c000000-7f1a2c021000 rw-p 00000000 00:00 0 \n"
        "7ffd1c3e1000-7ffd1c402000 rw-p 00000000 00:00 0          [stack]\n"
        "55d0c0a00000-55d0c0a28000 r--p 00001000 fd:01 2365   /usr/bin/with space (deleted)\n"
        "garbage line\n"
    )
    maps = parse_maps(text)
    assert maps == [
        MappedFile(
            0x7F1A2B3C4000,
            0x7F1A2B3FD000,
            "rw-s",
            0,
            os.makedev(0, 0x2A),
            131077,
            "/run/vgpud/vgpu/usage",
        ),
        MappedFile(
            0x55D0C0A00000,
            0x55D0C0A28000,
            "r--p",
            0x1000,
            os.makedev(0xFD, 1),
            2365,
            "/usr/bin/with space (deleted)",
        ),
    ]
    assert maps[0].shared and not maps[1].shared
    assert maps[0].range_name == "7f1a2b3c4000-7f1a2b3fd000"
    assert maps[0].size == 0x39000


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=[f"U+{ord(c):04X}" for c in LINE_BREAKS])
def test_names_holding_another_line_break_do_not_make_a_line(brk: str) -> None:
    """The kernel ends lines with "\\n" and escapes it in names, but prints
    these as they are: a mapped file, mount point or process named with one
    and a line after it held a line the kernel never wrote
    (tests/redteam/test_hostile_names.py)."""
    forged = f"x{brk}7f0000000000-7f0000001000 rw-s 00000000 00:2a 4242 /p"
    maps = parse_maps(f"7f1a2b3c4000-7f1a2b3c5000 r--s 00000000 fd:01 77    /tmp/{forged}\n")
    assert [(m.inode, m.path) for m in maps] == [(77, f"/tmp/{forged}")]
    point = f"/tmp/x{brk}1\x1f1\x1f0:42\x1f/vgpud/vg-00000000/usage\x1f/p"
    mounts = parse_mountinfo(f"63 43 254:0 /src {point} rw,relatime - ext4 /dev/vda rw\n")
    assert mounts == [Mount(os.makedev(254, 0), "/src", point)]
    status = f"Name:\tx{brk}Uid:\t0\nTgid:\t7\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t7\n"
    assert parse_status(7, status.encode()) == (1000, (7,), 7)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    shutil.copytree(FIXTURES / "docker-cgroupfs-v1", root, symlinks=True)
    return root


def test_vanished_files_skip_the_process(tree: Path) -> None:
    (tree / "4150" / "status").unlink()
    shutil.rmtree(tree / "4100")
    os.mkdir(tree / "4100")  # listed, then every read finds nothing
    fs = ProcFS(tree)
    assert fs.process(4150) is None
    assert fs.stat(4100) is None
    assert fs.environ(4100) is None and fs.maps(4100) is None and fs.cgroup(4100) is None
    assert fs.pidns(4100) is None
    assert sorted(ProcessTable(fs).refresh()) == [1]


@pytest.mark.parametrize("code", [errno.EACCES, errno.ESRCH, errno.EPERM])
def test_unreadable_process_is_skipped(
    tree: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    real_open = os.open

    def deny(path: Any, flags: int, *args: Any) -> int:
        if str(path).startswith(str(tree / "4100")):
            raise OSError(code, os.strerror(code))
        return real_open(path, flags, *args)

    monkeypatch.setattr("vgpud.observe.procfs.os.open", deny)
    assert sorted(ProcessTable(ProcFS(tree)).refresh()) == [1, 4150]


def test_other_errors_are_raised(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(path: Any, flags: int, *args: Any) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr("vgpud.observe.procfs.os.open", broken)
    with pytest.raises(OSError, match="Too many open files"):
        ProcFS(tree).stat(1)


def write_stat(tree: Path, pid: int, start_time: int, state: str = "S", threads: int = 1) -> None:
    fields = [state, "1"] + ["0"] * 15 + [str(threads), "0", str(start_time)] + ["0"] * 10
    (tree / str(pid) / "stat").write_text(f"{pid} (python3) {' '.join(fields)}\n")


def test_identity_is_read_once_per_process_and_again_on_pid_reuse(tree: Path) -> None:
    table = ProcessTable(ProcFS(tree))
    first = table.refresh()[4100]
    assert first.nspid == (4100, 1)
    status = tree / "4100" / "status"
    status.write_text(status.read_text().replace("NSpid:\t4100 1", "NSpid:\t4100 9"))
    # Same start time: the same process; its namespace identity is cached.
    assert table.refresh(watch={4100})[4100].nspid == (4100, 1)
    # Another start time on a watched pid: reused by a new process; read again.
    write_stat(tree, 4100, first.start_time + 500)
    reused = table.refresh(watch={4100})[4100]
    assert (reused.start_time, reused.nspid) == (first.start_time + 500, (4100, 9))


def test_unwatched_pid_is_reread_when_its_directory_is_new(tree: Path) -> None:
    table = ProcessTable(ProcFS(tree))
    first = table.refresh()[4150]
    write_stat(tree, 4150, first.start_time + 1)
    # Same directory: an unwatched process is not read again...
    assert table.refresh()[4150].start_time == first.start_time
    # ...a reused pid has a new /proc/<pid> directory, and is.
    shutil.copytree(tree / "4150", tree / "4150.new", symlinks=True)
    shutil.rmtree(tree / "4150")
    (tree / "4150.new").rename(tree / "4150")
    assert table.refresh()[4150].start_time == first.start_time + 1


def test_a_threads_id_is_no_process(tree: Path) -> None:
    """/proc/<tid> of a thread opens though /proc does not list it: its
    status names its thread group, and a lookup of it finds no process."""
    shutil.copytree(tree / "4100", tree / "4101", symlinks=True)  # 4100's second thread
    thread = ProcFS(tree).process(4101)
    assert thread is not None and not thread.leader
    assert ProcessTable(ProcFS(tree)).lookup(4101) is None
    assert ProcessTable(ProcFS(tree)).lookup(4100) is not None


def test_zombie_is_not_live_but_zombie_leader_with_threads_is(tree: Path) -> None:
    table = ProcessTable(ProcFS(tree))
    start = table.refresh()[4100].start_time
    write_stat(tree, 4100, start, state="Z", threads=1)
    assert 4100 not in table.refresh(watch={4100})
    write_stat(tree, 4100, start, state="Z", threads=3)
    assert 4100 in table.refresh(watch={4100})


def test_open_mapped_goes_through_map_files(tree: Path, tmp_path: Path) -> None:
    target = tmp_path / "usage-block"
    target.write_bytes(b"x" * 4096)
    mapping = parse_maps(
        "7f1a2b3c4000-7f1a2b3c5000 rw-s 00000000 00:2a 131077  /run/vgpud/vgpu/usage\n"
    )[0]
    (tree / "4100" / "map_files").mkdir()
    (tree / "4100" / "map_files" / mapping.range_name).symlink_to(target)
    fd = ProcFS(tree).open_mapped(4100, mapping, write=False)
    assert fd is not None
    try:
        assert os.fstat(fd).st_ino == target.stat().st_ino
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError):
        ProcFS(tree).open_mapped(4150, mapping, write=False)


def test_real_proc_self() -> None:
    fs = ProcFS()
    me = fs.process(os.getpid())
    assert me is not None
    assert me.pidns == os.stat("/proc/self/ns/pid").st_ino
    assert me.nspid[0] == os.getpid()
    assert me.uid == os.getuid()
    assert me.start_time > 0
    maps = fs.maps(os.getpid())
    assert maps is not None and maps.complete and any(".so" in m.path for m in maps.files)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll until ``condition`` holds (a child process has got somewhere)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_real_environ_keeps_only_the_hook_variables() -> None:
    env = {"PATH": "/usr/bin:/bin", "CUDA_MEM_LIMIT_1": "1g", "VGPU_ID": "v1", "SECRET": "x"}
    child = subprocess.Popen(["sleep", "30"], env=env)
    fs = ProcFS()
    try:
        # Until exec has set the new image's environment up, /proc shows the
        # parent's or none: wait for the child's own, then check the filter.
        wait_for(lambda: "CUDA_MEM_LIMIT_1" in (fs.environ(child.pid) or {}))
        assert fs.environ(child.pid) == {"CUDA_MEM_LIMIT_1": "1g", "VGPU_ID": "v1"}
    finally:
        child.kill()
        child.wait()


def test_lookup_reads_one_process_now(tree: Path) -> None:
    table = ProcessTable(ProcFS(tree))
    first = table.lookup(4100)
    assert first is not None and (first.nspid, first.pidns) == ((4100, 1), 4026532201)
    status = tree / "4100" / "status"
    status.write_text(status.read_text().replace("NSpid:\t4100 1", "NSpid:\t4100 9"))
    # Same start time: the same process (identity cached, its stat read again).
    write_stat(tree, 4100, first.start_time, state="R")
    again = table.lookup(4100)
    assert again is not None and (again.state, again.nspid) == ("R", (4100, 1))
    # A reused pid is another process: read whole.
    write_stat(tree, 4100, first.start_time + 7)
    reused = table.lookup(4100)
    assert reused is not None and reused.nspid == (4100, 9)
    write_stat(tree, 4100, first.start_time + 7, state="Z")
    assert table.lookup(4100) is None  # ended
    assert table.lookup(31337) is None  # no such process


def test_lookups_of_processes_that_ended_do_not_pile_up(tree: Path) -> None:
    """A node runs for months and its GPU processes come and go: what
    lookup() remembered of the dead is let go, without a refresh."""
    table = ProcessTable(ProcFS(tree))
    for pid in range(10_000, 13_000):
        shutil.copytree(tree / "4100", tree / str(pid), symlinks=True)
        status = tree / str(pid) / "status"
        status.write_text(status.read_text().replace("Tgid:\t4100\n", f"Tgid:\t{pid}\n"))
        assert table.lookup(pid) is not None
        shutil.rmtree(tree / str(pid))  # it ends
    assert len(table) < 2100
    assert table.lookup(4100) is not None
