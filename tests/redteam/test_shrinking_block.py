"""A tenant shrinks and regrows its usage block while the daemon opens it.

Opening a block checked the file's size, mapped it and read its header (and
a standalone block's device count) through the mapping before the SIGBUS
guard covered it: a file cut short in between killed the daemon with
SIGBUS, and one cut short between the size check and mmap raised mmap's
ValueError, which the scan and the registry's adoption do not expect (no
reaping or backstop for anyone). Every open of a block a tenant can write
must end in a block or a BlockError.

The daemon's side runs in a child Python, so that a SIGBUS is its exit
status rather than the end of pytest.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import ROOT
from vgpud.vgpus.abi import UsageC
from vgpud.vgpus.blocks import UsageBlock

# How long the daemon's side opens the block, and the most the child is
# given before it counts as hung (not timing assertions).
OPENING_S = 2.0
HUNG = 60

TENANT = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
good = os.pread(fd, os.fstat(fd).st_size, 0)
print("ready", flush=True)
end = time.monotonic() + 60
while time.monotonic() < end:  # killed by the test long before
    os.ftruncate(fd, 0)
    os.ftruncate(fd, len(good))
    os.pwrite(fd, good[:4096], 0)  # the header and the device count back
"""

DAEMON = """
import os, sys, time
from pathlib import Path
from vgpud.vgpus.abi import BlockError
from vgpud.vgpus.blocks import UsageBlock

path = Path(sys.argv[1])
opened = refused = 0
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    for how in ("path", "adopted", "fd"):
        try:
            if how == "fd":  # the scan's road: an fd of /proc/<pid>/map_files
                fd = os.open(path, os.O_RDWR)
                try:
                    block = UsageBlock.open_fd(fd, str(path))
                finally:
                    os.close(fd)
            else:  # a standalone block's own count, or the registry's
                block = UsageBlock.open(path, device_count=None if how == "path" else 1)
        except BlockError:
            refused += 1
            continue
        # Read through the guarded mapping: zeros where the file is short.
        block.standalone_limits()
        block.devices()
        block.slots()
        block.close()
        opened += 1
print(opened, refused)
print("ok")
"""


def test_a_block_shrunk_and_regrown_while_the_daemon_opens_it_is_opened_or_refused_never_a_crash(
    tmp_path: Path,
) -> None:
    path = tmp_path / "block"
    UsageBlock.create(path, device_count=1).close()
    # A standalone hook's block: its own device count said.
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, (1).to_bytes(4, sys.byteorder), UsageC.device_count.offset)
    finally:
        os.close(fd)
    assert os.path.getsize(path) == ctypes.sizeof(UsageC)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    tenant = subprocess.Popen(
        [sys.executable, "-c", TENANT, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert tenant.stdout is not None and tenant.stdout.readline().strip() == "ready"
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(DAEMON), str(path), str(OPENING_S)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=HUNG,
            check=False,
        )
    finally:
        tenant.kill()
        tenant.wait()
    assert done.returncode != -signal.SIGBUS, "the daemon's side died of SIGBUS"
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["ok"], done.stderr
