"""Issue 10, item 7: a local user outside the vgpud group attacks the files.

Before the fix, usage blocks were 0666 in 0755 directories: any local user
could open a vGPU's usage block and set its ``used`` to 2^62, denying it
service. And the hook used a standalone block in /tmp whoever had made it:
a squatter's pre-created ``/tmp/vgpud-<uid>.usage`` was accepted.

Now a usage block belongs to its vGPU's user (the API caller, or a uid and
group root names), mode 0600 (0660 with a group), in directories no one but
root lists; the hook refuses a standalone block that is not its own 0600
file, and CUDA does not start rather than run unlimited.

The attackers are real processes of other uids (setpriv), so the kernel's
permission checks are what is tested. Needs root (to switch uids).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import BUILD, sim_environment
from tests.helpers.memprobe import MEMPROBE, hooked
from tests.unit.apiclient import Api, running_api
from tests.unit.fakes import FakeInventory, gpus
from vgpud.config import Config
from vgpud.surface.api.app import make_app
from vgpud.surface.events import EventLog, publish_adoption
from vgpud.surface.metrics import Metrics
from vgpud.surface.service import Service
from vgpud.vgpus.abi import UsageC
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.blocks import UsageBlock
from vgpud.vgpus.registry import Registry
from vgpud.vgpus.state import StateStore

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (processes of other uids)"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux setpriv missing"),
]

ATTACKER = 54321  # a local user with no vGPU
TENANT = 54322  # the user a vGPU is made for
TEAM = 54400  # a group that shares a vGPU
USED = UsageC.devices.offset  # devices[0].used: the vGPU's budget in use
SIM_GPU = "GPU-5117a000-0000-4000-8000-000000000000"  # the simulator's GPU 0

# Run as another user: open the block for writing and set `used` to 2^62,
# the attack of the issue. Prints what happened.
WRITE_USED = """
import errno, mmap, os, struct, sys
try:
    fd = os.open(sys.argv[1], os.O_RDWR)
except OSError as exc:
    print("refused", errno.errorcode[exc.errno])
    sys.exit(0)
with mmap.mmap(fd, 0) as m:
    struct.pack_into("<Q", m, int(sys.argv[2]), 1 << 62)
print("written")
"""

LIST = """
import errno, os, sys
try:
    print("listed", len(os.listdir(sys.argv[1])))
except OSError as exc:
    print("refused", errno.errorcode[exc.errno])
"""


def setpriv(uid: int, gid: int | None = None, groups: tuple[int, ...] = ()) -> list[str]:
    extra = [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    return ["setpriv", f"--reuid={uid}", f"--regid={uid if gid is None else gid}", *extra]


def as_user(uid: int, code: str, *args: str, groups: tuple[int, ...] = ()) -> str:
    """Run a snippet of Python as ``uid``; its last line of output."""
    done = subprocess.run(
        [*setpriv(uid, groups=groups), sys.executable, "-I", "-c", code, *args],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may pass through (pytest's tmp_path is 0700:
    there every attack would fail for the wrong reason)."""
    d = Path(tempfile.mkdtemp(prefix="vgpud-redteam-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def api(open_dir: Path) -> AsyncIterator[Api]:
    config = Config(run_dir=str(open_dir / "run"), state_dir=str(open_dir / "state"))
    async with running_api(open_dir, config) as a:
        yield a


async def create(api: Api, body: dict[str, Any]) -> dict[str, Any]:
    r = await api.client.post("/v1/vgpus", json=body)
    answer = await r.json()
    assert r.status == 201, answer
    return answer  # type: ignore[no-any-return]


def registry_in(d: Path, events: EventLog) -> Registry:
    """A daemon's registry over run/ and state/ in ``d``, adopted."""
    registry = Registry(d / "run", StateStore(d / "state"), d / "lib.so", Atomics.load())
    publish_adoption(events, registry.adopt())
    return registry


def mode_and_owner(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_mode & 0o7777, st.st_uid, st.st_gid


# --- the daemon's blocks ------------------------------------------------------


@pytest.mark.parametrize("body", [{}, {"user": {"uid": TENANT}}], ids=["root's", "a tenant's"])
async def test_another_user_cannot_deny_a_vgpu_service(api: Api, body: dict[str, Any]) -> None:
    vg = await create(api, {"memory": "1g", **body})
    usage = Path(vg["host_env"]["VGPU_USAGE"])
    assert as_user(ATTACKER, WRITE_USED, str(usage), str(USED)) == "refused EACCES"
    entry = api.service.registry.get(vg["id"])
    assert entry.usage.devices()[0].used == 0
    assert mode_and_owner(usage) == (0o600, body.get("user", {"uid": 0})["uid"], 0)


async def test_no_other_user_can_list_or_write_the_vgpu_files(api: Api) -> None:
    vg = await create(api, {"memory": "1g", "user": {"uid": TENANT}})
    control = Path(vg["host_env"]["VGPU_CONTROL"])
    run_dir = control.parent.parent
    for directory in (run_dir, control.parent):
        assert mode_and_owner(directory) == (0o711, 0, 0)
        assert as_user(ATTACKER, LIST, str(directory)) == "refused EACCES"
        assert as_user(TENANT, LIST, str(directory)) == "refused EACCES"
    # The control block is read-only for everyone but root, tenant included.
    assert mode_and_owner(control) == (0o644, 0, 0)
    for uid in (ATTACKER, TENANT):
        assert as_user(uid, WRITE_USED, str(control), "64") == "refused EACCES"


async def test_the_tenant_writes_its_own_block(api: Api) -> None:
    vg = await create(api, {"memory": "1g", "user": {"uid": TENANT}})
    usage = vg["host_env"]["VGPU_USAGE"]
    assert as_user(TENANT, WRITE_USED, usage, str(USED)) == "written"  # it harms itself only


async def test_a_named_group_shares_the_block_and_no_one_else(api: Api) -> None:
    vg = await create(api, {"memory": "1g", "user": {"uid": TENANT, "gid": TEAM}})
    usage = Path(vg["host_env"]["VGPU_USAGE"])
    assert mode_and_owner(usage) == (0o660, TENANT, TEAM)
    assert vg["user"] == {"uid": TENANT, "gid": TEAM}
    assert as_user(ATTACKER, WRITE_USED, str(usage), str(USED), groups=(TEAM,)) == "written"
    assert as_user(ATTACKER, WRITE_USED, str(usage), str(USED)) == "refused EACCES"


async def test_a_restarted_daemon_gives_the_block_back_to_its_user(
    api: Api, open_dir: Path
) -> None:
    vg = await create(api, {"memory": "1g", "user": {"uid": TENANT}})
    usage = Path(vg["host_env"]["VGPU_USAGE"])
    # What an older daemon left, or someone changed meanwhile.
    os.chown(usage, 0, 0)
    os.chmod(usage, 0o666)
    os.chmod(usage.parent, 0o755)
    again = registry_in(open_dir, EventLog(10))
    try:
        assert again.get(vg["id"]).vgpu.user.uid == TENANT
        assert mode_and_owner(usage) == (0o600, TENANT, 0)
        assert mode_and_owner(usage.parent)[0] == 0o711
        assert as_user(ATTACKER, WRITE_USED, str(usage), str(USED)) == "refused EACCES"
    finally:
        again.close()


# --- who the caller is: SO_PEERCRED on the real unix socket --------------------

POST = """
import json, socket, sys
body = sys.argv[2].encode()
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"POST /v1/vgpus HTTP/1.1\\r\\nHost: vgpud\\r\\nContent-Type: application/json\\r\\n"
          b"Connection: close\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body)
data = b""
while chunk := s.recv(65536):
    data += chunk
head, _, rest = data.partition(b"\\r\\n\\r\\n")
print(json.dumps({"status": int(head.split()[1]), "body": json.loads(rest)}))
"""


@pytest.fixture
async def unix_api(open_dir: Path) -> AsyncIterator[tuple[Path, Registry]]:
    """The real app on a unix socket every user may connect to (the daemon's
    is 0660 root:vgpud; here the question is who the daemon thinks is calling)."""
    events = EventLog(10)
    registry = registry_in(open_dir, events)
    config = Config(run_dir=str(open_dir / "run"), state_dir=str(open_dir / "state"))
    service = Service(config, registry, FakeInventory(gpus(1)), events)
    runner = web.AppRunner(make_app(service, Metrics(service)), access_log=None)
    await runner.setup()
    sock = open_dir / "api.sock"
    await web.UnixSite(runner, str(sock)).start()
    sock.chmod(0o666)
    try:
        yield sock, registry
    finally:
        await runner.cleanup()
        registry.close()


async def post_as(uid: int, sock: Path, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    cmd = [*setpriv(uid), sys.executable, "-I", "-c", POST, str(sock), json.dumps(body)]
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd="/", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    answer = json.loads(out.decode().strip().splitlines()[-1])
    return answer["status"], answer["body"]


async def test_a_vgpu_belongs_to_the_user_who_asked_for_it(
    unix_api: tuple[Path, Registry],
) -> None:
    sock, registry = unix_api
    status, vg = await post_as(TENANT, sock, {"memory": "1g"})
    assert status == 201, vg
    assert vg["user"] == {"uid": TENANT, "gid": None}
    assert mode_and_owner(Path(vg["host_env"]["VGPU_USAGE"])) == (0o600, TENANT, 0)
    assert registry.get(vg["id"]).vgpu.user.uid == TENANT


@pytest.mark.parametrize(
    "user", [{"uid": 0}, {"uid": ATTACKER}, {"uid": TENANT, "gid": 0}, {"uid": TENANT, "gid": TEAM}]
)
async def test_only_root_may_name_another_user(
    unix_api: tuple[Path, Registry], user: dict[str, int]
) -> None:
    sock, registry = unix_api
    status, answer = await post_as(TENANT, sock, {"memory": "1g", "user": user})
    assert (status, answer["error"]) == (403, "forbidden"), answer
    assert registry.all() == []
    # Root may.
    status, vg = await post_as(0, sock, {"memory": "1g", "user": user})
    assert status == 201, vg
    assert mode_and_owner(Path(vg["host_env"]["VGPU_USAGE"]))[1] == user["uid"]


async def test_a_user_may_name_itself(unix_api: tuple[Path, Registry]) -> None:
    sock, _ = unix_api
    own = {"uid": TENANT, "gid": TENANT}
    status, vg = await post_as(TENANT, sock, {"memory": "1g", "user": own})
    assert status == 201, vg
    assert mode_and_owner(Path(vg["host_env"]["VGPU_USAGE"])) == (0o660, TENANT, TENANT)


# --- the hook's standalone block in /tmp ---------------------------------------


@pytest.fixture
def victim_env(open_dir: Path) -> dict[str, str]:
    """A simulated GPU that a process of another uid can use."""
    open_dir.chmod(0o777)
    env = sim_environment(open_dir / "sim-state")
    os.chmod(env["VGPU_ARBITER_DIR"], 0o777)
    return hooked(env, CUDA_MEM_LIMIT="64m", VGPU_SIM_CTX_OVERHEAD="0")


def plant(path: Path, uid: int, mode: int) -> None:
    """A valid usage block at ``path``, of ``uid`` with ``mode``."""
    UsageBlock.create(path, device_count=1).close()
    os.chown(path, uid, uid)
    os.chmod(path, mode)


def probe_as(uid: int, env: dict[str, str]) -> tuple[int, list[dict[str, Any]], str]:
    done = subprocess.run(
        [*setpriv(uid), str(MEMPROBE), "alloc:alloc:8m", "meminfo"],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, lines, done.stderr


def assert_refused(returncode: int, lines: list[dict[str, Any]], stderr: str, why: str) -> None:
    """CUDA did not start, and not one allocation went through unlimited."""
    assert returncode != 0
    init = [line for line in lines if line.get("op") == "init"]
    assert init and init[0]["result"] == "CUDA_ERROR_NOT_PERMITTED", lines
    assert not [line for line in lines if line.get("result") == "CUDA_SUCCESS"], lines
    refusals = [line for line in stderr.splitlines() if "CUDA will not start" in line]
    assert len(refusals) == 1 and why in refusals[0], stderr


@pytest.fixture
def victim_uid() -> Iterator[int]:
    """A uid of its own per run, so /tmp/vgpud-<uid>.usage is this test's."""
    uid = 60000 + os.getpid() % 5000
    Path(f"/tmp/vgpud-{uid}.usage").unlink(missing_ok=True)
    yield uid
    Path(f"/tmp/vgpud-{uid}.usage").unlink(missing_ok=True)


def test_a_squatted_standalone_block_in_tmp_is_refused(
    victim_env: dict[str, str], victim_uid: int
) -> None:
    if not MEMPROBE.exists():
        pytest.skip("build/vgpu-memprobe is not built (run `make`)")
    squatted = Path(f"/tmp/vgpud-{victim_uid}.usage")
    # Another user made it first: a valid block, writable by its maker.
    plant(squatted, ATTACKER, 0o666)
    assert_refused(*probe_as(victim_uid, victim_env), why=f"belongs to uid {ATTACKER}")
    with UsageBlock.open(squatted, device_count=1) as block:  # untouched
        assert block.slots() == [] and block.devices()[0].used == 0


def test_an_own_block_others_may_write_is_refused(
    victim_env: dict[str, str], victim_uid: int
) -> None:
    if not MEMPROBE.exists():
        pytest.skip("build/vgpu-memprobe is not built (run `make`)")
    loose = Path(f"/tmp/vgpud-{victim_uid}.usage")
    plant(loose, victim_uid, 0o606)
    assert_refused(*probe_as(victim_uid, victim_env), why="mode 0606")


def test_the_hook_makes_and_reuses_its_own_private_block(
    victim_env: dict[str, str], victim_uid: int
) -> None:
    if not MEMPROBE.exists():
        pytest.skip("build/vgpu-memprobe is not built (run `make`)")
    for _ in range(2):  # made by the first process, taken as its own by the second
        returncode, lines, stderr = probe_as(victim_uid, victim_env)
        assert returncode == 0, stderr
        assert [line["result"] for line in lines if line.get("op") == "alloc"] == ["CUDA_SUCCESS"]
    assert mode_and_owner(Path(f"/tmp/vgpud-{victim_uid}.usage")) == (0o600, victim_uid, victim_uid)


def test_a_squatted_standalone_arbiter_in_tmp_is_not_used(
    victim_env: dict[str, str], victim_uid: int
) -> None:
    """Without VGPU_ARBITER_DIR a paced standalone process takes turns through
    /tmp/vgpud-<uid>.arbiter-<uuid>: one another user made is not its own."""
    burn = BUILD / "vgpu-burn"
    if not burn.exists():
        pytest.skip("build/vgpu-burn is not built (run `make`)")
    env = {k: v for k, v in victim_env.items() if k != "VGPU_ARBITER_DIR"}
    env["CUDA_CORE_LIMIT"] = "30"  # paced: it looks for the GPU's arbiter
    squatted = Path(f"/tmp/vgpud-{victim_uid}.arbiter-{SIM_GPU}")
    try:
        squatted.write_bytes(bytes(64))  # refused on its owner before its contents count
        os.chown(squatted, ATTACKER, ATTACKER)
        squatted.chmod(0o666)  # open to all: its owner, not the kernel, must refuse it
        before = squatted.read_bytes()
        done = subprocess.run(
            [*setpriv(victim_uid), str(burn), "--seconds", "0.3"],
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert f"belongs to uid {ATTACKER}" in done.stderr and "not arbitrated" in done.stderr
        assert squatted.read_bytes() == before  # no ticket taken in the squatter's file
    finally:
        squatted.unlink(missing_ok=True)
