"""Issue 10, item 4: a tenant holds a seqlock word of its own usage block odd.

The steer entries of a usage block are the daemon's output, but they lie in
a file the tenant writes: an odd ``steer.throttle[i].seq`` used to make the
daemon's seqlock reader retry for ever on the scan thread, with the blocks
lock held (no tracking, reaping or backstop for any vGPU, DELETE hung).
Every read of tenant-written data must be bounded: the hostile vGPU loses
the display of its own steering, the daemon goes on.

Each attack runs in a child Python with a generous timeout, so that a
regression fails the test (TimeoutExpired) instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import BUILD, ROOT

# Not a timing assertion: only how long a hung child is given before the
# test calls it hung. A bounded read takes microseconds.
HUNG = 60

PRELUDE = """
import mmap, os, sys
from pathlib import Path
from vgpud.vgpus.abi import UsageC
from vgpud.vgpus.blocks import UsageBlock, ControlBlock, DeviceSlice, UNSTEERED

def hold_odd(path, dev, seq=0x7777_7777):
    # The tenant's side: its own mapping of the file, the word set odd.
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, 0, mmap.MAP_SHARED)
    os.close(fd)
    UsageC.from_buffer(mm).steer.throttle[dev].seq = seq
    return mm
"""


def run_child(code: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code), str(tmp_path), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HUNG,
        check=False,
    )


def assert_ok(done: subprocess.CompletedProcess[str]) -> None:
    """The child ran to its end (its log lines go to stdout before "ok")."""
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["ok"], done.stderr


def test_an_odd_steer_seq_reads_as_never_steered_and_the_daemon_goes_on(tmp_path: Path) -> None:
    done = run_child(
        """
        tmp = Path(sys.argv[1])
        victim = UsageBlock.create(tmp / "hostile", device_count=2)
        victim.write_steer(0, 400_000)
        victim.write_steer(1, 600_000)
        tenant = hold_odd(tmp / "hostile", 0)
        assert victim.read_steer(0) == UNSTEERED
        assert victim.read_steer(1).quota_ppm == 600_000  # its other entry still reads
        # The daemon's next write makes the entry whole again.
        victim.write_steer(0, 300_000)
        assert victim.read_steer(0).quota_ppm == 300_000
        print("ok")
        """,
        tmp_path,
    )
    assert_ok(done)


def test_a_hostile_block_is_reported_once_not_at_every_read(tmp_path: Path) -> None:
    done = run_child(
        """
        import structlog
        tmp = Path(sys.argv[1])
        victim = UsageBlock.create(tmp / "hostile", device_count=1)
        tenant = hold_odd(tmp / "hostile", 0)
        with structlog.testing.capture_logs() as logs:
            for _ in range(50):  # fifty scans
                assert victim.read_steer(0) == UNSTEERED
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert len(warnings) == 1, logs
        assert warnings[0]["path"] == str(tmp / "hostile")
        print("ok")
        """,
        tmp_path,
    )
    assert_ok(done)


def test_a_control_entry_left_odd_by_a_dead_daemon_is_read_and_repaired(tmp_path: Path) -> None:
    # Only the daemon writes the control block, but a daemon killed inside
    # a write leaves seq odd, and its successor must not spin on it either.
    done = run_child(
        """
        tmp = Path(sys.argv[1])
        path = tmp / "control"
        control = ControlBlock.create(path, "vg-00000001", [DeviceSlice("GPU-a", 1 << 30, 250_000)])
        entry = control._c.devices[0].throttle
        entry.seq = 5  # killed between the odd store and the even one
        assert control.read_throttle(0).quota_ppm == 250_000
        restarted = ControlBlock.open(path)
        # The same quota again: written anyway, since the entry is unreadable.
        assert restarted.write_throttle(0, 250_000)
        assert entry.seq % 2 == 0 and restarted.read_throttle(0).quota_ppm == 250_000
        print("ok")
        """,
        tmp_path,
    )
    assert_ok(done)


# The attack as it reaches the daemon: a standalone process (hook named in
# LD_PRELOAD, seed limits in its environment) maps a usage block whose steer
# seq it holds odd; the tracker adopts the block and reads it every scan.
STANDALONE_TENANT = """
import sys
from tests.fixtures.hook import FakeHook
hook = FakeHook(sys.argv[1])
hook.claim_self(0, {0: 1 << 28})
hook.block.steer.throttle[0].seq = 0x7777_7777
print("claimed", flush=True)
sys.stdin.read()
"""

SCAN = """
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.tracker import Tracker
tenant = int(sys.argv[2])
gpu = sys.argv[3]
sample = NvmlSample(
    monotonic=0.0,
    gpus={gpu: GpuSample(gpu, 0, 0, 1 << 28, 80 << 30, {tenant: 1 << 28}, {})},
)
tracker = Tracker()
for _ in range(3):
    snap = tracker.scan({}, sample)
use = snap.vgpus[snap.processes[tenant].vgpu_id]
print("steered", use.gpus[gpu].steered_ppm)
tracker.close()
"""


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (/proc/<pid>/map_files)")
def test_the_scan_finishes_with_a_hostile_standalone_block_adopted(tmp_path: Path) -> None:
    from tests.fixtures.hook import GPU_UUIDS, FakeHook
    from vgpud.vgpus.blocks import UsageBlock

    block = tmp_path / "standalone.usage"
    UsageBlock.create(block, device_count=1).close()
    recorder = FakeHook(block)
    recorder.standalone([GPU_UUIDS[0]], [1 << 30])
    recorder.close()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        LD_PRELOAD=str(BUILD / "libvgpu-atomics.so"),  # named "libvgpu": counts as hooked
        CUDA_MEM_LIMIT="1g",
    )
    tenant = subprocess.Popen(
        [sys.executable, "-c", STANDALONE_TENANT, str(block)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        assert tenant.stdout is not None and tenant.stdout.readline().strip() == "claimed"
        done = run_child(SCAN, tmp_path, str(tenant.pid), GPU_UUIDS[0])
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[-2:] == ["steered", "0"]
    finally:
        tenant.kill()
        tenant.wait(timeout=HUNG)
