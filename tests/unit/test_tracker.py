"""Tracker on fixture /proc trees with real blocks: slots to host pids, PID
reuse, NVML-only processes, attribution, arrivals and exits."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.hook import GPU_UUIDS, FakeVgpu
from vgpud.observe.cgroups import Runtime, classify_path
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.tracker import ProcessKind, Tracker, TrackSnapshot, attributable
from vgpud.vgpus.abi import SLOT_CLAIMING

GPU0, GPU1 = GPU_UUIDS
GIB = 1 << 30
# docker-cgroupfs-v1: pids 4100 (ns pid 1) and 4150 (ns pid 7) share PID
# namespace 4026532201 and a container; start time = 1000 + host pid.
DOCKER_NS = 4026532201


def Vgpu(directory: Path, vgpu_id: str, limits: tuple[int, ...] = (4 * GIB,)) -> FakeVgpu:
    return FakeVgpu(directory, vgpu_id, limits)


@pytest.fixture
def vgpu(tmp_path: Path, proc: Path) -> Iterator[FakeVgpu]:
    """A vGPU whose blocks the container's two processes map."""
    v = Vgpu(tmp_path / "v1", "v1")
    v.mapped_by(proc, 4100)
    v.mapped_by(proc, 4150)
    yield v
    v.close()


def clone_process(proc: Path, src: int, dst: int, *, ns_pid: int) -> None:
    """Another process of the same container (same namespace and cgroup)."""
    shutil.copytree(proc / str(src), proc / str(dst), symlinks=True)
    status = proc / str(dst) / "status"
    text = status.read_text().replace(f"NSpid:\t{src} ", f"NSpid:\t{dst} {ns_pid}\n#")
    status.write_text(text.replace(f"Tgid:\t{src}\n", f"Tgid:\t{dst}\n"))
    (proc / str(dst) / "environ").write_bytes(b"PATH=/bin\0")


def sample(processes: dict[int, int], util: dict[int, float] | None = None) -> NvmlSample:
    gpu = GpuSample(
        uuid=GPU0,
        index=0,
        utilization_gpu=50,
        memory_used=sum(processes.values()),
        memory_total=80 * GIB,
        processes=dict(processes),
        process_util=util or {},
    )
    return NvmlSample(monotonic=0.0, gpus={GPU0: gpu})


def test_slot_maps_to_host_pid_through_namespace_and_start_time(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(3, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    vgpu.hook.claim(4, pid=7, pidns=DOCKER_NS, start_time=5150, used={0: 2 * GIB})
    tracker = Tracker(proc, sees_all_pids=True)
    snap = tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB + 300, 4150: 2 * GIB}, {4100: 30.0}))
    assert {s.slot.index: s.host_pid for s in snap.slots} == {3: 4100, 4: 4150}
    assert (vgpu.control.slot_host_pid(3), vgpu.control.slot_host_pid(4)) == (4100, 4150)
    p = snap.processes[4100]
    assert (p.kind, p.vgpu_id, p.slot, p.ns_pid, p.pidns) == (
        ProcessKind.VGPU,
        "v1",
        3,
        1,
        DOCKER_NS,
    )
    assert p.container.runtime is Runtime.DOCKER
    assert (p.memory, p.sm_util, p.hooked) == ({GPU0: GIB + 300}, {GPU0: 30.0}, {GPU0: GIB})
    use = snap.vgpus["v1"].gpus[GPU0]
    assert (use.limit, use.hooked_used, use.nvml_used, use.sm_util, use.processes) == (
        4 * GIB,
        3 * GIB,
        3 * GIB + 300,
        30.0,
        2,
    )
    assert snap.vgpus["v1"].live_slots == 2
    assert sorted(p.pid for p in snap.arrivals) == [4100, 4150] and snap.exits == ()


def test_pid_reuse_is_told_apart_by_start_time(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=4999)  # an earlier process
    vgpu.hook.claim(1, pid=1, pidns=DOCKER_NS + 1, start_time=5100)  # another namespace
    snap = Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, None)
    assert {s.slot.index: s.host_pid for s in snap.slots} == {0: None, 1: None}
    assert snap.processes == {} and snap.vgpus["v1"].live_slots == 0
    assert vgpu.control.slot_host_pid(0) == 0


def test_exit_clears_host_pid_and_is_reported(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100)
    tracker = Tracker(proc, sees_all_pids=True)
    tracker.scan({"v1": vgpu.blocks}, None)
    assert vgpu.control.slot_host_pid(0) == 4100
    shutil.rmtree(proc / "4100")
    snap = tracker.scan({"v1": vgpu.blocks}, None)
    assert [s.host_pid for s in snap.slots] == [None]
    assert vgpu.control.slot_host_pid(0) == 0
    assert [p.pid for p in snap.exits] == [4100] and snap.arrivals == ()


def test_stale_host_pids_from_a_previous_daemon_are_cleared(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.control.set_slot_host_pid(9, 12345)
    Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, None)
    assert vgpu.control.slot_host_pid(9) == 0


def test_outside_the_host_pid_namespace_no_slot_is_called_dead(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100)
    vgpu.hook.claim(1, pid=99, pidns=DOCKER_NS, start_time=1)
    snap = Tracker(proc, sees_all_pids=False).scan({"v1": vgpu.blocks}, None)
    assert [(s.slot.index, s.host_pid) for s in snap.slots] == [(0, 4100)]


def test_claiming_slot_is_matched_too(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, state=SLOT_CLAIMING)
    snap = Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, None)
    assert snap.slots[0].host_pid == 4100


def test_unmanaged_process_in_the_container_is_attributed(proc: Path, vgpu: FakeVgpu) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    snap = Tracker(proc, sees_all_pids=True).scan(
        {"v1": vgpu.blocks}, sample({4100: GIB, 4150: 3 * GIB, 1: GIB})
    )
    bypass = snap.processes[4150]
    assert (bypass.kind, bypass.vgpu_id, bypass.slot) == (ProcessKind.UNMANAGED, "v1", None)
    host = snap.processes[1]  # systemd in init.scope: on the GPU, not in the container
    assert (host.kind, host.vgpu_id) == (ProcessKind.UNMANAGED, None)
    assert snap.vgpus["v1"].gpus[GPU0].nvml_used == 4 * GIB
    assert snap.vgpus["v1"].pids == (4100, 4150)


def test_two_vgpus_in_one_container_attribute_nothing(proc: Path, tmp_path: Path) -> None:
    a, b = Vgpu(tmp_path / "a", "a"), Vgpu(tmp_path / "b", "b")
    try:
        a.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100)
        b.hook.claim(0, pid=7, pidns=DOCKER_NS, start_time=5150)
        clone_process(proc, 4150, 9, ns_pid=8)  # an unmanaged third process
        snap = Tracker(proc, sees_all_pids=True).scan(
            {"a": a.blocks, "b": b.blocks}, sample({9: GIB})
        )
        assert snap.processes[9].vgpu_id is None
    finally:
        a.close()
        b.close()


def test_hooked_without_slot(proc: Path, vgpu: FakeVgpu) -> None:
    # 4100's env names VGPU_CONTROL: a vGPU process whose slot is not (yet) seen.
    snap = Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, sample({4100: GIB}))
    assert (snap.processes[4100].kind, snap.processes[4100].vgpu_id) == (ProcessKind.HOOKED, None)


def test_nvml_pid_without_a_process_is_ignored(proc: Path, vgpu: FakeVgpu) -> None:
    snap = Tracker(proc, sees_all_pids=True).scan({"v1": vgpu.blocks}, sample({31337: GIB}))
    assert snap.processes == {}


def reuse_pid(proc: Path, pid: int, *, start_time: int) -> None:
    """The host gives ``pid`` to a new process of the same container."""
    shutil.rmtree(proc / str(pid), ignore_errors=True)
    clone_process(proc, 4100, pid, ns_pid=9)
    stat = proc / str(pid) / "stat"
    head, rest = stat.read_text().rsplit(")", 1)
    fields = rest.split()
    fields[19] = str(start_time)
    stat.write_text(f"{head}) {' '.join(fields)}\n")


def test_a_new_process_at_a_reused_pid_is_charged_in_full_once_nvml_let_the_pid_go(
    proc: Path, vgpu: FakeVgpu
) -> None:
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    tracker = Tracker(proc, sees_all_pids=True)
    tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB, 4150: 3 * GIB}))
    shutil.rmtree(proc / "4150")
    tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB, 4150: 3 * GIB}))  # a ghost
    tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB}))  # NVML let it go: a gap
    reuse_pid(proc, 4150, start_time=7000)
    snap = tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB, 4150: 2 * GIB}))
    p = snap.processes[4150]
    assert (p.kind, p.start_time, p.memory) == (ProcessKind.UNMANAGED, 7000, {GPU0: 2 * GIB})
    assert snap.vgpus["v1"].gpus[GPU0].nvml_used == 3 * GIB


@pytest.mark.parametrize("restarted", [False, True], ids=["running", "restarted"])
def test_a_new_process_at_a_reused_pid_is_charged_what_it_adds_to_the_exited_ones_memory(
    proc: Path, vgpu: FakeVgpu, restarted: bool
) -> None:
    """NVML lists the exited process's memory and the newcomer's as one
    figure: the newcomer is charged what the figure grew by since it came,
    and the exited process's part only ever shrinks. A daemon that starts
    while the pid is listed with no process knows no more than that."""
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    tracker = Tracker(proc, sees_all_pids=True)
    tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB, 4150: 3 * GIB}))
    shutil.rmtree(proc / "4150")
    tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB, 4150: 3 * GIB}))
    if restarted:
        tracker = Tracker(proc, sees_all_pids=True)
        tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB, 4150: 3 * GIB}))
    reuse_pid(proc, 4150, start_time=7000)
    charged = []
    for listed in (3, 5, 2, 4):
        snap = tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB, 4150: listed * GIB}))
        charged.append(snap.processes[4150].memory.get(GPU0, 0) // GIB)
        # The exited process's part is the vGPU's while the tracker knows whose it was.
        ghost = 0 if restarted else listed * GIB - charged[-1] * GIB
        assert snap.vgpus["v1"].gpus[GPU0].nvml_used == GIB + charged[-1] * GIB + ghost
    assert charged == [0, 2, 0, 2]  # the exited part fell to 2 GiB with the figure


def test_deleted_vgpu_is_forgotten(proc: Path, vgpu: FakeVgpu) -> None:
    tracker = Tracker(proc, sees_all_pids=True)
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100)
    tracker.scan({"v1": vgpu.blocks}, None)
    snap = tracker.scan({}, None)
    assert snap.vgpus == {} and snap.slots == ()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/docker/" + "a" * 64, True),
        ("/system.slice/run-u123.scope", True),
        ("/vgpud-test/job1", True),
        ("/kubepods/besteffort/pod0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", True),
        ("/", False),
        ("/user.slice", False),
        ("/user.slice/user-1000.slice/session-3.scope", False),
        ("/init.scope", False),
        ("/system.slice/vgpud.service", False),
    ],
)
def test_attributable(path: str, expected: bool) -> None:
    assert attributable(classify_path(path)) is expected


def test_a_holder_shows_each_samples_nvml_figures_and_is_kept_while_they_stay(
    proc: Path, vgpu: FakeVgpu
) -> None:
    vgpu.hook.claim(3, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    tracker = Tracker(proc, sees_all_pids=True)
    first = tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB}, {4100: 30.0}))
    # A new sample with the same figures: the same process, as the API's
    # per-process answers rely on (each is serialised once per object).
    same = tracker.scan({"v1": vgpu.blocks}, sample({4100: GIB}, {4100: 30.0}))
    assert same.processes[4100] is first.processes[4100]
    for memory, util in ((2 * GIB, 30.0), (2 * GIB, 55.0), (2 * GIB, None)):
        snap = tracker.scan(
            {"v1": vgpu.blocks}, sample({4100: memory}, None if util is None else {4100: util})
        )
        p = snap.processes[4100]
        assert (p.memory, p.sm_util) == ({GPU0: memory}, {} if util is None else {GPU0: util})
    gone = tracker.scan({"v1": vgpu.blocks}, sample({}))
    assert (gone.processes[4100].memory, gone.processes[4100].sm_util) == ({}, {})


def test_a_steady_vgpu_is_taken_whole_and_every_change_still_shows(
    proc: Path, vgpu: FakeVgpu
) -> None:
    """A vGPU whose slots, holders and NVML figures are what the last scan
    saw is taken whole from it (the same objects); a change to any of them
    shows at the next scan, as a first scan of that state would show it."""
    vgpu.hook.claim(3, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    vgpu.hook.claim(4, pid=7, pidns=DOCKER_NS, start_time=5150, used={0: GIB})
    tracker = Tracker(proc, sees_all_pids=True)
    views = {"v1": vgpu.blocks}
    first = tracker.scan(views, sample({4100: GIB, 4150: GIB}))
    again = tracker.scan(views, sample({4100: GIB, 4150: GIB}))  # a new sample, the same figures
    assert again.processes[4150] is first.processes[4150]
    assert again.vgpus["v1"] is first.vgpus["v1"] and again.slots == first.slots
    assert again.arrivals == () == again.exits

    def scan(figures: dict[int, int], util: dict[int, float] | None = None) -> TrackSnapshot:
        snap = tracker.scan(views, sample(figures, util))
        fresh = Tracker(proc, sees_all_pids=True).scan(views, sample(figures, util))
        assert snap.vgpus == fresh.vgpus and snap.slots == fresh.slots
        assert snap.processes == fresh.processes
        return snap

    snap = scan({4100: 2 * GIB, 4150: GIB}, {4150: 12.0})  # NVML's figures of one process
    assert (snap.processes[4100].memory, snap.processes[4150].sm_util) == (
        {GPU0: 2 * GIB},
        {GPU0: 12.0},
    )
    assert (snap.vgpus["v1"].gpus[GPU0].nvml_used, snap.vgpus["v1"].gpus[GPU0].sm_util) == (
        3 * GIB,
        12.0,
    )
    vgpu.hook.block.slots[4].dev[0].used += GIB  # the hook's bytes of one slot
    vgpu.hook.block.devices[0].used += GIB
    snap = scan({4100: 2 * GIB, 4150: GIB}, {4150: 12.0})
    assert snap.processes[4150].hooked == {GPU0: 2 * GIB}
    assert snap.vgpus["v1"].gpus[GPU0].hooked_used == 3 * GIB
    # The vGPU's other counters alone (a busy vGPU's move at every launch):
    # nothing of the scan's changes; the API reads them from the block.
    vgpu.hook.block.devices[0].oom_count += 1
    vgpu.hook.block.devices[0].gpu_time_ns += 10**9
    again = scan({4100: 2 * GIB, 4150: GIB}, {4150: 12.0})
    assert again.vgpus["v1"] is snap.vgpus["v1"] and again.vgpus["v1"].gpus[GPU0].counters is None
    shutil.rmtree(proc / "4150")  # an exit: reported, its slot nobody's, within one scan
    snap = tracker.scan(views, sample({4100: 2 * GIB}))
    assert [p.pid for p in snap.exits] == [4150] and list(snap.processes) == [4100]
    assert [(s.slot.index, s.host_pid, s.held) for s in snap.slots] == [
        (3, 4100, True),
        (4, None, False),
    ]
    assert (vgpu.control.slot_host_pid(4), snap.vgpus["v1"].live_slots) == (0, 1)
    vgpu.hook.free(4)
    vgpu.hook.free(3)  # a slot freed: its process is no slot holder any more
    snap = scan({4100: 2 * GIB})
    assert snap.processes[4100].slot is None and snap.slots == ()
    assert vgpu.control.slot_host_pid(3) == 0
    vgpu.hook.claim(5, pid=1, pidns=DOCKER_NS, start_time=5100)  # and claimed again
    snap = scan({4100: 2 * GIB})
    assert (snap.processes[4100].slot, vgpu.control.slot_host_pid(5)) == (5, 4100)


def test_a_process_whose_environment_never_reads_back_does_not_hold_the_scan(
    proc: Path, vgpu: FakeVgpu
) -> None:
    """Reading /proc/<pid>/environ reads the process's memory, whose pages
    are its to map: a file of a filesystem that never answers (a FUSE
    server of its own) held the scan's thread for ever, and with it every
    later scan (reaping, the backstop) on the node. Here that read is a
    FIFO nobody writes. The scan goes on past it; the process is taken as
    unreadable for its lifetime; another process's environment, while the
    stuck read holds the reader, is read again at a later scan."""
    environ = proc / "4150" / "environ"
    environ.unlink()
    os.mkfifo(environ)  # opening it blocks until a writer comes
    tracker = Tracker(proc, sees_all_pids=True)
    tracker.procfs._memory_reads.wait_s = 0.2
    snaps: list[TrackSnapshot] = []
    scan = threading.Thread(
        target=lambda: snaps.append(tracker.scan({"v1": vgpu.blocks}, sample({4150: GIB}))),
        daemon=True,  # were the scan to hang, the test fails rather than pytest
    )
    scan.start()
    scan.join(timeout=10)
    assert not scan.is_alive() and snaps, "the scan waited for the stuck read"
    assert snaps[0].processes[4150].kind is ProcessKind.UNMANAGED

    # 4100 is hooked (its environment names the hook); while 4150's read
    # holds the reader, 4100's is not made, and not taken for unreadable.
    snap = tracker.scan({"v1": vgpu.blocks}, sample({4150: GIB, 4100: GIB}))
    assert snap.processes[4100].kind is ProcessKind.UNMANAGED
    stuck = tracker.procfs._memory_reads._stuck
    assert stuck is not None
    fd = os.open(environ, os.O_WRONLY)  # the stuck read returns
    os.close(fd)
    assert stuck.done.wait(10)
    snap = tracker.scan({"v1": vgpu.blocks}, sample({4150: GIB, 4100: GIB}))
    assert snap.processes[4100].kind is ProcessKind.HOOKED
    assert snap.processes[4150].kind is ProcessKind.UNMANAGED  # unreadable for its lifetime
