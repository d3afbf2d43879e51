"""ExitWatch on real child processes: exits are reported once, by pidfd or by
reading stat; a pid that is another process's now is never watched; and a
tracker scan of unchanged slots reads nothing from /proc."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.fixtures.hook import FakeVgpu, mapping_process
from vgpud.observe.exitwatch import ExitWatch
from vgpud.observe.procfs import Identity, Process, ProcessTable, ProcFS
from vgpud.observe.tracker import Tracker

GIB = 1 << 30


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen(["sleep", "600"])
    yield p
    p.kill()
    p.wait()


def process_of(pid: int) -> Process:
    process = ProcessTable(ProcFS()).lookup(pid)
    assert process is not None
    return process


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def poll(fn: Callable[[], set[Identity]], deadline_s: float = 10.0) -> set[Identity]:
    """ended() until it reports something (the kernel ends a killed process
    asynchronously); a condition polled, never a bare sleep."""
    deadline = time.monotonic() + deadline_s
    while not (found := fn()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "stat"])
def test_exit_is_reported_once_even_before_the_zombie_is_reaped(
    child: subprocess.Popen[bytes], pidfds: bool
) -> None:
    watch = ExitWatch(ProcFS(), pidfds=pidfds)
    process = process_of(child.pid)
    assert watch.watch(process)
    assert watch.ended() == set()
    child.kill()  # not reaped yet: a zombie with no thread left has ended
    assert poll(watch.ended) == {process.identity}
    assert watch.ended() == set() and watch.watched == set()
    watch.close()


def test_a_pid_that_names_another_process_now_is_not_watched(
    child: subprocess.Popen[bytes],
) -> None:
    watch = ExitWatch(ProcFS())
    real = process_of(child.pid)
    earlier = Process(**{**real.__dict__, "start_time": real.start_time - 1})
    assert not watch.watch(earlier)
    assert watch.watched == set()
    watch.close()


def test_without_descriptors_left_the_process_is_watched_by_stat(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    def exhausted(pid: int) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(os, "pidfd_open", exhausted)
    watch = ExitWatch(ProcFS())
    process = process_of(child.pid)
    assert watch.watch(process)
    child.kill()
    assert poll(watch.ended) == {process.identity}


def test_one_process_whose_pidfd_is_refused_leaves_pidfds_on_for_the_others(
    child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pid is the tenant's word: one pidfd_open refused (EINVAL, as for
    a thread's id) falls back to stat for that process only."""
    other = subprocess.Popen(["sleep", "600"])
    try:
        real_open = os.pidfd_open

        def refusing(pid: int, flags: int = 0) -> int:
            if pid == child.pid:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_open(pid, flags)

        monkeypatch.setattr(os, "pidfd_open", refusing)
        watch = ExitWatch(ProcFS())
        refused = process_of(child.pid)
        assert watch.watch(refused)
        watched = process_of(other.pid)
        before = open_fds()
        assert watch.watch(watched)
        assert open_fds() == before + 1  # the other one has its pidfd
        child.kill()
        assert poll(watch.ended) == {refused.identity}  # found by stat
        other.kill()
        assert poll(watch.ended) == {watched.identity}
        watch.close()
    finally:
        other.kill()
        other.wait()


def test_a_slot_naming_a_thread_is_not_held(tmp_path: Path) -> None:
    """/proc/<tid> of a thread opens though /proc does not list it; a slot
    naming a thread's id (and its start time) names no process."""
    vgpu = FakeVgpu(tmp_path / "v1", "v1", (GIB,))
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    try:
        tid = thread.native_id
        assert tid is not None
        stat = ProcFS().stat(tid)
        assert stat is not None
        pidns = os.stat("/proc/self/ns/pid").st_ino
        vgpu.hook.claim(0, pid=tid, pidns=pidns, start_time=stat.start_time)  # this process maps it
        tracker = Tracker(sees_all_pids=True)
        snap = tracker.scan({"v1": vgpu.blocks}, None)
        assert [(s.host_pid, s.held) for s in snap.slots] == [(None, False)]
        assert snap.processes == {} and vgpu.control.slot_host_pid(0) == 0
        tracker.close()
    finally:
        done.set()
        thread.join()
        vgpu.close()


def test_unwatch_and_close_give_the_descriptors_back(child: subprocess.Popen[bytes]) -> None:
    before = open_fds()
    watch = ExitWatch(ProcFS())
    mine = process_of(os.getpid())
    assert watch.watch(process_of(child.pid)) and watch.watch(mine)
    assert open_fds() == before + 3  # the epoll set and two pidfds
    watch.unwatch(mine.identity)
    assert open_fds() == before + 2 and watch.watched == {
        (child.pid, process_of(child.pid).start_time)
    }
    watch.close()
    assert open_fds() == before


def test_a_scan_of_unchanged_slots_reads_nothing_from_proc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vgpu = FakeVgpu(tmp_path / "v1", "v1", (4 * GIB,))
    child = mapping_process(vgpu.usage.path)  # the host's evidence that it is the vGPU's
    try:
        process = process_of(child.pid)
        vgpu.hook.claim(
            0, pid=child.pid, pidns=process.pidns, start_time=process.start_time, used={0: GIB}
        )
        tracker = Tracker(sees_all_pids=True)
        first = tracker.scan({"v1": vgpu.blocks}, None)
        assert [s.host_pid for s in first.slots] == [child.pid]

        reads: list[str] = []
        real_read = ProcFS._read

        def counting(self: ProcFS, pid: int, name: str, *args: object, **kw: object) -> object:
            reads.append(f"{pid}/{name}")
            return real_read(self, pid, name, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(ProcFS, "_read", counting)
        monkeypatch.setattr(os, "listdir", lambda *a: pytest.fail("/proc listed"))
        steady = tracker.scan({"v1": vgpu.blocks}, None)
        assert reads == []
        assert steady.processes == first.processes and steady.arrivals == ()

        child.kill()
        child.wait()
        deadline = time.monotonic() + 10
        while tracker.scan({"v1": vgpu.blocks}, None).slots[0].host_pid is not None:
            assert time.monotonic() < deadline, "the exit was never seen"
            time.sleep(0.01)
        assert vgpu.control.slot_host_pid(0) == 0
        tracker.close()
    finally:
        child.kill()
        child.wait()
        vgpu.close()
