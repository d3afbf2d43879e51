"""Red team: a tenant tries to make the daemon charge, kill or name a
process that is not its own, or to step around the memory backstop.

Each test is an attack of docs/security.md's table of attacks (1, 2, 8 and
the fork case of 5), run against the real tracker and backstop on real
processes of this machine; it asserts that the attack fails.
"""

from __future__ import annotations

import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BUILD, ROOT
from tests.fixtures.cgroup import Cgroup
from tests.fixtures.hook import GPU_UUIDS, FakeHook, FakeVgpu, MappedSleepers, mapping_process
from tests.fixtures.simgpu import BYPASS, SCAN, SIM_GPU0, run_json
from tests.unit.apiclient import get_ok, running_api, validate
from vgpud.loops.repairs import check, reap
from vgpud.observe import tracker as tracker_module
from vgpud.observe.evidence import READS_PER_SCAN
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.procfs import ProcFS
from vgpud.observe.tracker import ProcessKind, Tracker
from vgpud.policy.backstop import BackstopPolicy, BackstopState, decide
from vgpud.policy.reaper import ReaperState
from vgpud.vgpus.abi import SLOT_FREE, UsageC
from vgpud.vgpus.blocks import UsageBlock

GIB = 1 << 30
GPU0 = GPU_UUIDS[0]
DOCKER_NS = 4026532201  # docker-cgroupfs-v1: 4100 = ns pid 1, 4150 = ns pid 7


def nvml(processes: dict[int, int]) -> NvmlSample:
    gpu = GpuSample(GPU0, 0, 0, sum(processes.values()), 80 * GIB, processes, {})
    return NvmlSample(monotonic=0.0, gpus={GPU0: gpu})


def identity(pid: int) -> tuple[int, int]:
    """(PID namespace inode, start time) of a live process, as a hook
    would write them, or as an attacker who guessed them right would."""
    process = ProcFS().process(pid)
    assert process is not None
    return process.pidns, process.start_time


@pytest.fixture
def two_vgpus(tmp_path: Path) -> Iterator[tuple[FakeVgpu, FakeVgpu]]:
    a = FakeVgpu(tmp_path / "attacker", "attacker", (GIB,))
    b = FakeVgpu(tmp_path / "victim", "victim", (8 * GIB,))
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def victim(two_vgpus: tuple[FakeVgpu, FakeVgpu], cgroup: Cgroup) -> Iterator[subprocess.Popen[str]]:
    """A process of the victim vGPU, in a container (cgroup) of its own: it
    maps the victim's blocks and holds a slot there, as a hooked process does."""
    _, b = two_vgpus
    p = mapping_process(b.usage.path, b.control.path)
    cgroup.add(p.pid)
    pidns, start = identity(p.pid)
    b.hook.claim(0, pid=p.pid, pidns=pidns, start_time=start, used={0: 2 * GIB})
    yield p
    p.kill()
    p.wait()


def test_a_forged_slot_neither_charges_nor_kills_another_tenants_process(
    two_vgpus: tuple[FakeVgpu, FakeVgpu], victim: subprocess.Popen[str]
) -> None:
    a, b = two_vgpus
    pidns, start = identity(victim.pid)
    # The attacker writes the victim's exact identity into its own block.
    a.hook.claim(0, pid=victim.pid, pidns=pidns, start_time=start, used={0: GIB})
    tracker = Tracker(sees_all_pids=True)
    views = {"victim": b.blocks, "attacker": a.blocks}  # the attacker's vGPU came later
    state = BackstopState()
    for _ in range(3):  # past confirm_scans: a kill would have happened
        snap = tracker.scan(views, nvml({victim.pid: 3 * GIB}))
        events, state = check(snap, BackstopPolicy("kill", tolerance=0), state)
        assert events == []
        p = snap.processes[victim.pid]
        assert (p.kind, p.vgpu_id, p.slot) == (ProcessKind.VGPU, "victim", 0)
        assert snap.vgpus["attacker"].gpus[GPU0].nvml_used == 0
        assert snap.vgpus["attacker"].pids == ()
        # No answer to the guess: the attacker's control block names nobody.
        assert a.control.slot_host_pid(0) == 0
    assert victim.poll() is None
    assert b.control.slot_host_pid(0) == victim.pid


def test_a_right_guess_and_a_wrong_one_look_the_same_to_the_attacker(
    two_vgpus: tuple[FakeVgpu, FakeVgpu], victim: subprocess.Popen[str]
) -> None:
    """The reaper treats a slot naming someone else's process as it treats a
    slot naming nobody: reclaimed at once. Keeping one and freeing the other
    would tell the attacker which guesses of (pid, start time) were right."""
    a, b = two_vgpus
    pidns, start = identity(victim.pid)
    a.hook.claim(0, pid=victim.pid, pidns=pidns, start_time=start, used={0: GIB // 2})
    a.hook.claim(1, pid=victim.pid, pidns=pidns, start_time=start + 1, used={0: GIB // 2})
    views = {"attacker": a.blocks, "victim": b.blocks}
    snap = Tracker(sees_all_pids=True).scan(views, None)
    events, _ = reap(snap, views, ReaperState())
    assert sorted((e.vgpu_id, e.kind, e.slot) for e in events) == [
        ("attacker", "slot_reclaimed", 0),
        ("attacker", "slot_reclaimed", 1),
    ]
    assert [a.control.slot_host_pid(i) for i in (0, 1)] == [0, 0]
    assert [s.index for s in b.usage.slots()] == [0]  # the victim's own slot untouched


def test_with_the_budget_spent_a_right_guess_and_a_wrong_one_still_look_the_same(
    two_vgpus: tuple[FakeVgpu, FakeVgpu], victim: subprocess.Popen[str]
) -> None:
    """The attacker's slots first name 16 fresh processes of its own, which
    spend its vGPU's evidence budget for the scan; then the victim's exact
    identity, and two wrong ones. A live process whose maps are not read yet
    used to be kept and nobody reclaimed at once: an answer. Every new
    identity now waits for the budget alike, and is judged alike when its
    turn comes."""
    a, _ = two_vgpus
    mine = MappedSleepers([(a.usage.path, READS_PER_SCAN)])  # fork children of its own
    try:
        for i, pid in enumerate(mine.pids):
            pidns, start = identity(pid)
            a.hook.claim(i, pid=pid, pidns=pidns, start_time=start)
        pidns, start = identity(victim.pid)
        guesses = {
            16: (victim.pid, start),  # right
            17: (victim.pid, start + 1),
            18: (victim.pid + 7, start),
        }
        for index, (pid, start_time) in guesses.items():
            a.hook.claim(index, pid=pid, pidns=pidns, start_time=start_time, used={0: GIB // 8})
        views = {"attacker": a.blocks}
        tracker = Tracker(sees_all_pids=True)
        answers = []
        for _ in range(2):
            snap = tracker.scan(views, None)
            events, _ = reap(snap, views, ReaperState())
            reclaimed = {e.slot for e in events if e.kind == "slot_reclaimed"}
            answers.append([index in reclaimed for index in guesses])
            assert [a.control.slot_host_pid(index) for index in guesses] == [0, 0, 0]
        assert answers == [[False, False, False], [True, True, True]]
    finally:
        mine.close()


def test_an_adopted_standalone_block_cannot_claim_a_vgpu_process(
    tmp_path: Path,
    two_vgpus: tuple[FakeVgpu, FakeVgpu],
    victim: subprocess.Popen[str],
    other_cgroup: Cgroup,
) -> None:
    """Standalone blocks are the tenant's files end to end; one that names
    a daemon-owned vGPU's process in a slot takes nothing from that vGPU."""
    _, b = two_vgpus
    block = tmp_path / "standalone.usage"
    UsageBlock.create(block, device_count=1).close()
    block.chmod(0o600)
    forger = FakeHook(block)
    forger.standalone([GPU0], [GIB])
    pidns, start = identity(victim.pid)
    forger.claim(1, pid=victim.pid, pidns=pidns, start_time=start, used={0: GIB})
    # The attacker's own process maps the block and looks standalone.
    env = dict(os.environ, LD_PRELOAD=str(BUILD / "libvgpu-atomics.so"), CUDA_MEM_LIMIT="1g")
    env.pop("VGPU_CONTROL", None)
    attacker = subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(block)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert attacker.stdout is not None and attacker.stdout.readline() == "mapped\n"
        other_cgroup.add(attacker.pid)  # the attacker's own container
        tracker = Tracker(sees_all_pids=True)
        sample = nvml({attacker.pid: GIB // 4, victim.pid: 2 * GIB})
        tracker.scan({"victim": b.blocks}, sample)  # adopts the attacker's block
        snap = tracker.scan({"victim": b.blocks}, sample)  # its slots are read now
        (standalone,) = snap.standalone
        assert snap.processes[attacker.pid].vgpu_id == standalone
        assert (snap.processes[victim.pid].vgpu_id, snap.processes[victim.pid].kind) == (
            "victim",
            ProcessKind.VGPU,
        )
        assert snap.vgpus[standalone].pids == (attacker.pid,)
    finally:
        forger.close()
        attacker.kill()
        attacker.wait()


MAPPER = """
import mmap, os, sys, time
kept = [mmap.mmap(os.open(p, os.O_RDWR), 0) for p in sys.argv[1:]]
print("mapped", flush=True)
time.sleep(600)
"""


def test_a_block_someone_else_owns_is_never_adopted(tmp_path: Path) -> None:
    """A squatter's file (another uid, or open to others) is not the budget
    of the process that maps it."""
    block = tmp_path / "squatted.usage"
    UsageBlock.create(block, device_count=1).close()
    block.chmod(0o666)  # open to everyone: anyone could have written it
    env = dict(os.environ, LD_PRELOAD=str(BUILD / "libvgpu-atomics.so"), CUDA_MEM_LIMIT="1g")
    p = subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(block)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "mapped\n"
        snap = Tracker(sees_all_pids=True).scan({}, nvml({p.pid: GIB}))
        assert snap.standalone == {}
        assert snap.processes[p.pid].kind is ProcessKind.HOOKED
    finally:
        p.kill()
        p.wait()


REMAPPER = """
import ctypes, mmap, os, sys
from vgpud.vgpus.abi import UsageC
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long)
size = -(-ctypes.sizeof(UsageC) // mmap.PAGESIZE) * mmap.PAGESIZE
addr = None
for line in sys.stdin:  # a new block of its own at the same address, each time asked
    fd = os.open(line.strip(), os.O_RDWR)
    flags = mmap.MAP_SHARED | (0x10 if addr else 0)  # MAP_FIXED over the last one
    addr = libc.mmap(addr, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    os.close(fd)
    slot = UsageC.from_address(addr).slots[0]
    slot.state, slot.pid, slot.pidns, slot.start_time = 2, 1, 1, 1  # "in use": never released
    print("mapped", flush=True)
"""


def own_block(path: Path) -> Path:
    """A standalone block as the hook makes it (0600, its user's), one slot in use."""
    UsageBlock.create(path, device_count=1).close()
    path.chmod(0o600)
    hook = FakeHook(path)
    hook.standalone([GPU0], [GIB])
    hook.claim(0, pid=1, pidns=1, start_time=1)
    hook.close()
    return path


def test_a_process_remapping_new_blocks_has_one_adopted(tmp_path: Path) -> None:
    """The maps file is read once in a process's life, and map_files/<range>
    opens whatever is mapped there now: a process that maps a new block of
    its own over the last one before every scan had each one adopted as a
    vGPU of its own (daemon CPU growing with every scan). It has one."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_MEM_LIMIT="1g")
    env["LD_PRELOAD"] = str(BUILD / "libvgpu-atomics.so")
    p = subprocess.Popen(
        [sys.executable, "-c", REMAPPER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdin is not None and p.stdout is not None
    tracker = Tracker(sees_all_pids=True)
    try:
        for k in range(6):
            p.stdin.write(f"{own_block(tmp_path / f'b{k}')}\n")
            p.stdin.flush()
            assert p.stdout.readline() == "mapped\n"
            snap = tracker.scan({}, nvml({p.pid: GIB}))
            assert len(snap.standalone) == 1
        assert snap.processes[p.pid].vgpu_id in snap.standalone
    finally:
        tracker.close()
        p.kill()
        p.wait()


@pytest.mark.parametrize("cap", ["per-uid", "per-node"])
def test_adopted_standalone_blocks_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: str
) -> None:
    """One user's processes, each with a block of its own, get at most
    ``STANDALONE_PER_UID`` adopted, and the node at most
    ``STANDALONE_PER_NODE`` (both made 2 here): the rest are refused."""
    monkeypatch.setattr(
        tracker_module,
        "STANDALONE_PER_UID" if cap == "per-uid" else "STANDALONE_PER_NODE",
        2,
    )
    env = dict(os.environ, LD_PRELOAD=str(BUILD / "libvgpu-atomics.so"), CUDA_MEM_LIMIT="1g")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MAPPER, str(own_block(tmp_path / f"b{k}"))],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for k in range(3)
    ]
    tracker = Tracker(sees_all_pids=True)
    try:
        for q in procs:
            assert q.stdout is not None and q.stdout.readline() == "mapped\n"
        sample = nvml({q.pid: GIB for q in procs})
        for _ in range(2):
            snap = tracker.scan({}, sample)
            assert len(snap.standalone) == 2
        kinds = sorted(snap.processes[q.pid].kind for q in procs)
        assert kinds == [ProcessKind.HOOKED, ProcessKind.STANDALONE, ProcessKind.STANDALONE]
    finally:
        tracker.close()
        for q in procs:
            q.kill()
            q.wait()


# --- bypassing the hook inside a vGPU's container --------------------------


@pytest.mark.root
@pytest.mark.parametrize("how", ["no-hook", "standalone-hook"])
def test_a_bypass_in_a_vgpu_container_is_charged_by_its_mounts_and_killed(
    sim_env: dict[str, str], tmp_path: Path, how: str
) -> None:
    """A 1 GiB vGPU's container (its block files bind-mounted, as CDI does)
    runs one process, and nothing else: it strips the vGPU's variables and
    allocates 2 GiB with no hook at all, or with the hook told to run
    standalone with no memory limit (``CUDA_CORE_LIMIT=100``). No slot, no
    proven cgroup: the mount namespace alone puts it in the vGPU, the
    backstop reports it and kills it."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1)")
    vgpu = FakeVgpu(tmp_path / "v1", "v1", (GIB,), uuids=(SIM_GPU0,))
    inside = tmp_path / "container"
    inside.mkdir()
    for name in ("control", "usage"):
        (inside / name).touch()
    env = dict(sim_env, PYTHONPATH=str(ROOT))
    if how == "standalone-hook":
        # Its own standalone block (never the machine's /tmp/vgpud-<uid>.usage).
        env.update(
            LD_PRELOAD=str(BUILD / "libvgpu.so"),
            CUDA_CORE_LIMIT="100",
            VGPU_USAGE=str(tmp_path / "standalone.usage"),
        )
    script = (
        f"mount --bind {vgpu.control.path} {inside / 'control'} && "
        f"mount --bind {vgpu.usage.path} {inside / 'usage'} && "
        f'exec {sys.executable} -c "$BYPASS" {2 * GIB}'
    )
    bypass = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env=dict(env, BYPASS=BYPASS),
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert bypass.stdout is not None and bypass.stdout.readline().strip() == "allocated"
        scans = run_json(SCAN, sim_env, str(vgpu.usage.path.parent), "kill", "3")
        kind = "hooked" if how == "standalone-hook" else "unmanaged"
        assert scans[0]["kinds"][str(bypass.pid)] == [kind, "v1"]
        assert scans[0]["nvml_used"] >= 2 * GIB
        assert scans[0]["events"] == [["over_limit", bypass.pid]]
        assert scans[1]["events"] == [["killed", bypass.pid]]
        assert bypass.wait(timeout=30) == -signal.SIGKILL
    finally:
        bypass.kill()
        bypass.wait()
        vgpu.close()


# --- on fixture /proc trees -------------------------------------------------


@pytest.fixture
def vgpu(tmp_path: Path, proc: Path) -> Iterator[FakeVgpu]:
    v = FakeVgpu(tmp_path / "v1", "v1", (4 * GIB,))
    v.mapped_by(proc, 4100)  # 4100 is the vGPU's proven process
    yield v
    v.close()


def test_a_hooked_process_with_no_slot_is_charged_and_is_the_offender(
    proc: Path, vgpu: FakeVgpu
) -> None:
    """LD_PRELOAD naming the library and VGPU_CONTROL in the environment
    (a static, musl or Go binary in a CDI container; or one that never
    claims a slot) no longer file a process as "hooked, never charged"."""
    (proc / "4150" / "environ").write_bytes(
        b"LD_PRELOAD=/usr/lib/vgpud/libvgpu.so\0VGPU_CONTROL=/run/vgpud/vgpu/control\0"
    )
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    snap = Tracker(proc, sees_all_pids=True).scan(
        {"v1": vgpu.blocks}, nvml({4100: GIB, 4150: 5 * GIB})
    )
    p = snap.processes[4150]
    assert (p.kind, p.vgpu_id) == (ProcessKind.HOOKED, "v1")
    assert snap.vgpus["v1"].gpus[GPU0].nvml_used == 6 * GIB
    policy = BackstopPolicy("kill", tolerance=0, confirm_scans=1)
    kills, _, _ = decide(snap, policy, BackstopState())
    assert [k.pid for k in kills] == [4150]


def test_memory_a_fork_child_inherited_stays_charged_after_the_parent_exits(
    proc: Path, vgpu: FakeVgpu
) -> None:
    """The parent allocated and exited; its child keeps the memory through
    inherited driver descriptors, and NVML keeps listing it under the dead
    parent's pid. It stays the vGPU's until NVML lets it go."""
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    vgpu.hook.claim(1, pid=7, pidns=DOCKER_NS, start_time=5150, used={0: 3 * GIB})
    vgpu.mapped_by(proc, 4150)
    tracker = Tracker(proc, sees_all_pids=True)
    tracker.scan({"v1": vgpu.blocks}, nvml({4100: GIB, 4150: 3 * GIB}))
    shutil.rmtree(proc / "4150")  # the parent exits; its pages live on in a child
    snap = tracker.scan({"v1": vgpu.blocks}, nvml({4100: GIB, 4150: 5 * GIB}))
    ghost = snap.processes[4150]
    assert (ghost.kind, ghost.vgpu_id) == (ProcessKind.EXITED, "v1")
    assert snap.vgpus["v1"].gpus[GPU0].nvml_used == 6 * GIB
    assert [p.pid for p in snap.exits] == [4150]
    events, _ = check(snap, BackstopPolicy("report", tolerance=0), BackstopState())
    assert [e.kind for e in events] == ["over_limit"]
    later = tracker.scan({"v1": vgpu.blocks}, nvml({4100: GIB}))  # NVML lets it go
    assert 4150 not in later.processes and later.vgpus["v1"].gpus[GPU0].nvml_used == GIB


VICTIM_NS = 4026532300
VICTIM_CG = "/docker/" + "b" * 64


def new_process(proc: Path, pid: int, *, ns_pid: int, start_time: int) -> None:
    """A process of another tenant's container (its own PID namespace and
    cgroup) at host pid ``pid``, made from the fixture's 4100."""
    d = proc / str(pid)
    shutil.copytree(proc / "4100", d, symlinks=True)
    (d / "ns" / "pid").unlink()
    os.symlink(f"pid:[{VICTIM_NS}]", d / "ns" / "pid")
    rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
    rest[19] = str(start_time)
    (d / "stat").write_text(f"{pid} (victim) {' '.join(rest)}\n")
    (d / "status").write_text(
        f"Name:\tvictim\nTgid:\t{pid}\nPid:\t{pid}\nUid:\t1001\t1001\t1001\t1001\n"
        f"NSpid:\t{pid} {ns_pid}\n"
    )
    (d / "cgroup").write_text(f"12:pids:{VICTIM_CG}\n11:memory:{VICTIM_CG}\n")
    (d / "environ").write_bytes(b"PATH=/bin\0")
    (d / "maps").write_text("")


@pytest.mark.parametrize("new", ["unslotted", "slot-holder"])
def test_memory_of_a_dead_process_listed_under_a_reused_pid_stays_its_vgpus(
    proc: Path, tmp_path: Path, new: str
) -> None:
    """The attacker's process exits while a fork child keeps its 3 GiB, so
    NVML keeps listing them under the dead pid; the host then gives that pid
    to another tenant's process. The memory stays the attacker's vGPU's (over
    its limit, reported); the new process is not charged it and is never the
    backstop's offender, whether or not it holds a slot of its own vGPU."""
    attacker = FakeVgpu(tmp_path / "attacker", "attacker", (3 * GIB,))
    victim = FakeVgpu(tmp_path / "victim", "victim", (2 * GIB,))
    attacker.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    attacker.hook.claim(1, pid=7, pidns=DOCKER_NS, start_time=5150, used={0: 3 * GIB})
    attacker.mapped_by(proc, 4100)
    attacker.mapped_by(proc, 4150)
    new_process(proc, 4200, ns_pid=1, start_time=6200)
    victim.hook.claim(0, pid=1, pidns=VICTIM_NS, start_time=6200, used={0: GIB})
    victim.mapped_by(proc, 4200)
    views = {"attacker": attacker.blocks, "victim": victim.blocks}
    listed = nvml({4100: GIB, 4150: 3 * GIB, 4200: GIB})
    tracker = Tracker(proc, sees_all_pids=True)
    tracker.scan(views, listed)
    shutil.rmtree(proc / "4150")  # the parent exits; its fork child keeps the memory
    tracker.scan(views, listed)
    new_process(proc, 4150, ns_pid=2, start_time=9999)  # the pid reused, in the victim's container
    if new == "slot-holder":
        victim.hook.claim(1, pid=2, pidns=VICTIM_NS, start_time=9999)
        victim.mapped_by(proc, 4150)
    state = BackstopState()
    for _ in range(3):  # past confirm_scans: a kill would have happened
        snap = tracker.scan(views, listed)
        kills, _, state = decide(snap, BackstopPolicy("kill", tolerance=0), state)
        assert [k.pid for k in kills if k.pid == 4150] == []
        assert snap.vgpus["victim"].gpus[GPU0].nvml_used == GIB
        assert snap.vgpus["attacker"].gpus[GPU0].nvml_used == 4 * GIB
        reused = snap.processes[4150]
        assert (reused.vgpu_id, reused.start_time, reused.memory) == ("victim", 9999, {})
    assert 4150 in snap.vgpus["attacker"].pids
    attacker.close()
    victim.close()


VICTIM_ID = "d0c4e1" * 10 + "d0c4"  # docker-cgroupfs-v1's container: /docker/<id>


def host_user_process(proc: Path, pid: int, cgroup: str) -> None:
    """A local user's process (uid 1000, the host's PID namespace) at host
    pid ``pid``, made from the fixture's pid 1, with ``cgroup`` as its
    /proc/<pid>/cgroup."""
    d = proc / str(pid)
    shutil.copytree(proc / "1", d, symlinks=True)
    rest = (d / "stat").read_text().rsplit(")", 1)[1].split()
    rest[19] = str(1000 + pid)
    (d / "stat").write_text(f"{pid} (miner) {' '.join(rest)}\n")
    (d / "status").write_text(
        f"Name:\tminer\nTgid:\t{pid}\nPid:\t{pid}\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t{pid}\n"
    )
    (d / "cgroup").write_text(cgroup)


# Cgroups a local user or a container may make and name after the victim's.
SPOOFED_LEAVES = pytest.mark.parametrize(
    "leaf",
    [
        f"user.slice/user-1000.slice/user@1000.service/app.slice/docker/{VICTIM_ID}",
        f"user.slice/user-1000.slice/user@1000.service/app.slice/docker-{VICTIM_ID}.scope",
        f"docker/{'a' * 64}/docker/{VICTIM_ID}",
    ],
    ids=["user-cgroupfs-name", "user-scope-name", "nested-in-a-container"],
)


@SPOOFED_LEAVES
def test_a_cgroup_named_after_another_container_does_not_put_a_process_in_it(
    proc: Path, vgpu: FakeVgpu, leaf: str
) -> None:
    """A local user's delegated cgroup subtree (``user@1000.service``), or a
    container's own with cgroup v2 delegation, may hold sub-cgroups of any
    name: one named after the victim container's id used to make the
    attacker's unhooked GPU process a member of the victim's vGPU. Its
    memory was charged there, and the backstop killed the victim's own
    unslotted process (the largest) for the overrun."""
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    # 4150 is the victim container's own helper without a slot (2 GiB).
    host_user_process(proc, 4300, f"12:pids:/user.slice/user-1000.slice\n0::/{leaf}\n")
    listed = nvml({4100: GIB, 4150: 2 * GIB, 4300: 3 * GIB // 2})
    tracker = Tracker(proc, sees_all_pids=True)
    state = BackstopState()
    for _ in range(3):  # past confirm_scans: a kill would have happened
        snap = tracker.scan({"v1": vgpu.blocks}, listed)
        kills, _, state = decide(snap, BackstopPolicy("kill", tolerance=0), state)
        assert kills == []
        attacker = snap.processes[4300]
        assert (attacker.kind, attacker.vgpu_id) == (ProcessKind.UNMANAGED, None)
        assert snap.vgpus["v1"].gpus[GPU0].nvml_used == 3 * GIB
        assert snap.vgpus["v1"].pids == (4100, 4150)
        assert snap.processes[4150].vgpu_id == "v1"  # its own container's, as before


@SPOOFED_LEAVES
async def test_the_operator_can_tell_the_spoofed_container_from_the_victims(
    proc: Path, vgpu: FakeVgpu, tmp_path: Path, leaf: str
) -> None:
    """/v1/processes showed the attacker's process with the victim
    container's id, as the cgroup's name says, and nothing to tell it from
    the victim's own processes: an operator would blame the victim. It now
    shows the cgroup that names the container, which the daemon takes for
    the container (its processes share it), beside the id."""
    vgpu.hook.claim(0, pid=1, pidns=DOCKER_NS, start_time=5100, used={0: GIB})
    host_user_process(proc, 4300, f"12:pids:/user.slice/user-1000.slice\n0::/{leaf}\n")
    tracker = Tracker(proc, sees_all_pids=True)
    async with running_api(tmp_path) as api:
        api.service.track = tracker.scan(
            {"v1": vgpu.blocks}, nvml({4100: GIB, 4150: GIB, 4300: GIB})
        )
        listed = await get_ok(api, "/v1/processes")
    validate(listed, "/v1/processes", "get", 200)
    shown = {p["host_pid"]: p["container"] for p in listed}
    assert shown[4100]["id"] == shown[4150]["id"] == shown[4300]["id"] == VICTIM_ID
    victims = shown[4100]["container_cgroup"]
    assert victims == shown[4150]["container_cgroup"] == f"/docker/{VICTIM_ID}"
    assert shown[4300]["container_cgroup"] == f"/{leaf}" != victims


# --- the daemon's cost is bounded by what it reads ---------------------------


MANY_MAPPINGS = """
import ctypes, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long)
fd = os.open(sys.argv[1], os.O_RDWR)
size = os.fstat(fd).st_size
# Each its own VMA: the same file range again and again (python's mmap
# would spend a descriptor per mapping).
for _ in range(int(sys.argv[2])):
    assert libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0) not in (None, 2**64 - 1)
print("mapped", flush=True)
sys.stdin.read()
"""


def test_sixty_thousand_mappings_cost_one_bounded_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process with 60,000 shared mappings of a usage block's size, that
    looks like a standalone hook, listed by NVML: its maps file is read once
    for its lifetime and no further than the limit, and a handful of files
    is tried as its block, whatever the scan count."""
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"\0" * (-(-len(bytes(UsageC())) // mmap.PAGESIZE) * mmap.PAGESIZE))
    decoy.chmod(0o600)
    env = dict(os.environ, LD_PRELOAD=str(BUILD / "libvgpu-atomics.so"), CUDA_MEM_LIMIT="1g")
    p = subprocess.Popen(
        [sys.executable, "-c", MANY_MAPPINGS, str(decoy), "60000"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline() == "mapped\n"
        reads: list[int] = []
        opens: list[int] = []
        real_read, real_open = ProcFS._read, ProcFS.open_mapped

        def counting_read(
            self: ProcFS, pid: int, name: str, limit: int | None, **kw: bool
        ) -> bytes | None:
            data = real_read(self, pid, name, limit, **kw)
            if name == "maps":
                reads.append(len(data or b""))
            return data

        def counting_open(self: ProcFS, *args: object, **kw: bool) -> int:
            opens.append(1)
            return real_open(self, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(ProcFS, "_read", counting_read)
        monkeypatch.setattr(ProcFS, "open_mapped", counting_open)
        tracker = Tracker(sees_all_pids=True)
        for _ in range(5):
            snap = tracker.scan({}, nvml({p.pid: GIB}))
            assert snap.processes[p.pid].kind is ProcessKind.HOOKED
        assert len(reads) == 1 and reads[0] <= (2 << 20) + 1
        assert len(opens) <= 5  # one distinct file (the decoy) per scan
    finally:
        p.kill()
        p.wait()


def test_a_vgpu_naming_many_processes_waits_for_its_own_reads(tmp_path: Path) -> None:
    """Slots that name hundreds of new processes spend their own vGPU's read
    budget for the scan; another vGPU's new process is proven at once."""
    noisy = FakeVgpu(tmp_path / "noisy", "noisy", (GIB,))
    quiet = FakeVgpu(tmp_path / "quiet", "quiet", (GIB,))
    procs = [mapping_process(noisy.usage.path) for _ in range(20)]
    procs.append(mapping_process(quiet.usage.path))
    try:
        for i, p in enumerate(procs[:-1]):
            pidns, start = identity(p.pid)
            noisy.hook.claim(i, pid=p.pid, pidns=pidns, start_time=start)
        pidns, start = identity(procs[-1].pid)
        quiet.hook.claim(0, pid=procs[-1].pid, pidns=pidns, start_time=start)
        tracker = Tracker(sees_all_pids=True)
        snap = tracker.scan({"noisy": noisy.blocks, "quiet": quiet.blocks}, None)
        proven = [s for s in snap.slots if s.host_pid is not None]
        assert [s.host_pid for s in proven if s.vgpu_id == "quiet"] == [procs[-1].pid]
        # The noisy vGPU's unread slots are kept (nothing reclaimed for want of a read).
        assert all(s.held for s in snap.slots)
        assert sum(1 for s in proven if s.vgpu_id == "noisy") < 20
        tracker.scan({"noisy": noisy.blocks, "quiet": quiet.blocks}, None)
        snap = tracker.scan({"noisy": noisy.blocks, "quiet": quiet.blocks}, None)
        assert all(s.host_pid is not None for s in snap.slots)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        noisy.close()
        quiet.close()


def test_a_slot_is_reclaimed_once_its_process_unmaps_the_block(
    tmp_path: Path,
) -> None:
    """exec() without the hook drops the block and every allocation the
    process had: the slot it left names a process that no longer maps the
    block, and its bytes come back."""
    v = FakeVgpu(tmp_path / "v1", "v1", (GIB,))
    p = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, text=True
    )
    try:
        pidns, start = identity(p.pid)
        v.hook.claim(0, pid=p.pid, pidns=pidns, start_time=start, used={0: GIB // 2})
        snap = Tracker(sees_all_pids=True).scan({"v1": v.blocks}, None)
        events, _ = reap(snap, {"v1": v.blocks}, ReaperState())
        assert [e.kind for e in events] == ["slot_reclaimed"]
        assert v.usage.devices()[0].used == 0
        assert v.usage.slots() == [] or all(s.state == SLOT_FREE for s in v.usage.slots())
    finally:
        p.kill()
        p.wait()
        v.close()


@pytest.mark.root
@pytest.mark.parametrize(("maker", "charged"), [("nobody", False), ("root", True)])
def test_a_mount_counts_only_when_root_or_the_vgpus_user_made_it(
    cgroup: Cgroup, maker: str, charged: bool
) -> None:
    """Any local user can bind-mount a file it can reach into a mount
    namespace of its own (``unshare -Urm``), a vGPU's block included: such
    a mount must not put its processes (and their memory) in that vGPU. The
    same mount made by root — a container runtime — does."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1)")
    # A run dir as vgpud makes it: every user may pass through (0711).
    run_dir = Path(tempfile.mkdtemp(dir="/tmp"))
    run_dir.chmod(0o711)
    target = run_dir / "mountpoint"
    target.touch()
    b = FakeVgpu(run_dir / "victim", "victim", (8 * GIB,))
    (run_dir / "victim").chmod(0o711)
    victim = mapping_process(b.usage.path)
    cgroup.add(victim.pid)  # the victim's own container
    pidns, start = identity(victim.pid)
    b.hook.claim(0, pid=victim.pid, pidns=pidns, start_time=start, used={0: GIB})
    script = f"mount --bind {b.control.path} {target} && exec sleep 600"
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    if maker == "nobody":
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "--user"]
        cmd += ["--map-root-user", "--mount", "sh", "-c", script]
    attacker = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + 10
        while (stat := ProcFS().stat(attacker.pid)) is None or stat.comm != "sleep":
            assert time.monotonic() < deadline and attacker.poll() is None, "mount refused"
            time.sleep(0.01)
        snap = Tracker(sees_all_pids=True).scan(
            {"victim": b.blocks}, nvml({victim.pid: GIB, attacker.pid: 5 * GIB})
        )
        assert snap.processes[attacker.pid].vgpu_id == ("victim" if charged else None)
        assert snap.vgpus["victim"].gpus[GPU0].nvml_used == (6 if charged else 1) * GIB
    finally:
        for p in (attacker, victim):
            p.kill()
            p.wait()
        b.close()
        shutil.rmtree(run_dir)
