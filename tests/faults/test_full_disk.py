"""A full run dir: a create is refused with 507 and the API's error shape,
nothing is left half-made, the daemon lives; at start, a vGPU whose blocks
cannot be made again is skipped with one line (and kept in the state file),
never a SIGBUS crash loop. A full state dir when the state file must grow
(its slots full): the same 507, and the old file is kept whole."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.smalldisk import SmallDisk
from tests.integration.daemon_harness import Daemon
from vgpud.ctl.client import ApiFailure

# One vGPU's blocks (control 4 KiB, usage 172 KiB)
# fit in 256 KiB; a second vGPU's usage block does not.
SIZE = "256k"

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root"),
]


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    small = SmallDisk(tmp_path / "run", SIZE)
    yield small
    small.close()


# The state file of a few vGPUs (two slots of 256 KiB) fits in 1 MiB; the
# next one (two of 1 MiB: twice what is needed) does not.
STATE_SIZE = "1m"
# 64 labels of the longest keys and values the API takes: a 33 kB record,
# eight of which fill a slot.
LABELS = {f"{i:02d}".ljust(253, "k"): "v" * 253 for i in range(64)}


@pytest.fixture
def state_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    small = SmallDisk(tmp_path / "state", STATE_SIZE)
    yield small
    small.close()


def daemon_on(disk: SmallDisk, tmp_path: Path, env: dict[str, str]) -> Daemon:
    daemon = Daemon(tmp_path, env)
    daemon.args = disk.inside(*daemon.args)
    return daemon


def test_a_create_on_a_full_run_dir_is_a_clean_507(
    disk: SmallDisk, tmp_path: Path, sim_env: dict[str, str]
) -> None:
    daemon = daemon_on(disk, tmp_path, sim_env).start()
    try:
        first = daemon.client.post("/v1/vgpus", {"memory": "1g"})
        before = disk.files()
        with pytest.raises(ApiFailure) as refused:
            daemon.client.post("/v1/vgpus", {"memory": "1g"})
        assert refused.value.status == 507
        assert refused.value.error == "insufficient_storage"
        assert "No space left" in refused.value.detail
        assert disk.files() == before  # no half-made directory, block or temp file
        # The daemon lives, and what it has is whole.
        assert [v["id"] for v in daemon.client.get("/v1/vgpus")] == [first["id"]]
        assert [v.id for v in daemon.recorded()] == [first["id"]]
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()


def test_a_tenant_filling_the_run_dir_with_its_grown_block_does_not_refuse_a_create(
    tmp_path: Path, sim_env: dict[str, str]
) -> None:
    """A vGPU's user grows its usage block until the run directory is full
    (it may write its own file; the scan cuts it back, here not for a
    minute): a create meanwhile cuts the grown block back and is made,
    where it was refused with 507 until the next scan."""
    disk = SmallDisk(tmp_path / "run", "512k")  # two vGPUs' blocks, and room to spare
    daemon = Daemon(tmp_path, sim_env, config="scan_interval = 60\n")
    daemon.args = disk.inside(*daemon.args)
    try:
        daemon.start()
        tenant = daemon.client.post("/v1/vgpus", {"memory": "1g"})["id"]
        usage = str(daemon.run_dir / tenant / "usage")

        def size() -> int:  # as seen inside the small disk's namespace
            return int(disk.run("stat", "-c", "%s", usage))

        layout = size()
        disk.run("sh", "-c", f"cat /dev/zero >> {usage} || true")  # as its user may
        assert size() > layout

        made = daemon.client.post("/v1/vgpus", {"memory": "1g"})

        assert size() == layout
        assert {v["id"] for v in daemon.client.get("/v1/vgpus")} == {tenant, made["id"]}
        assert daemon.stop() == 0
    finally:
        daemon.cleanup()
        disk.close()


def test_a_repair_that_cannot_be_made_skips_the_vgpu_with_one_line(
    disk: SmallDisk, tmp_path: Path, sim_env: dict[str, str]
) -> None:
    daemon = daemon_on(disk, tmp_path, sim_env).start()
    try:
        vgpu = daemon.client.post("/v1/vgpus", {"memory": "1g", "share": 60})["id"]
        assert daemon.stop() == 0
        # Its usage block is lost and the space taken while the daemon is down.
        disk.run("rm", str(daemon.run_dir / vgpu / "usage"))
        disk.run("sh", "-c", f"cat /dev/zero > {daemon.run_dir}/filler || true")
        daemon.log_path.write_text("")
        daemon.start()
        errors = [line for line in daemon.log().splitlines() if "[error" in line]
        assert len(errors) == 1 and "vGPU skipped" in errors[0] and vgpu in errors[0]
        assert daemon.client.get("/v1/vgpus") == []
        # Still recorded, and still counted: its hard share is not given away.
        recorded = daemon.recorded()
        assert [v.id for v in recorded] == [vgpu]
        with pytest.raises(ApiFailure) as refused:
            gpu = recorded[0].slices[0].gpu_uuid
            daemon.client.post("/v1/vgpus", {"gpus": [gpu], "memory": "2m", "share": 50})
        assert refused.value.status == 409
        assert daemon.stop() == 0
        # Space comes back: the next start makes its blocks and serves it again.
        disk.run("rm", str(daemon.run_dir / "filler"))
        daemon.start()
        assert [v["id"] for v in daemon.client.get("/v1/vgpus")] == [vgpu]
    finally:
        daemon.cleanup()


def test_a_state_file_that_cannot_grow_is_a_clean_507_and_keeps_the_old_one(
    state_disk: SmallDisk, tmp_path: Path, sim_env: dict[str, str]
) -> None:
    daemon = daemon_on(state_disk, tmp_path, sim_env).start()
    try:
        made = []
        with pytest.raises(ApiFailure) as refused:
            for _ in range(12):  # saved in place, until one does not fit its slot
                body = {"memory": "2m", "share": 1, "labels": LABELS}
                made.append(daemon.client.post("/v1/vgpus", body)["id"])
        assert 5 <= len(made) < 12, made
        assert refused.value.status == 507
        assert refused.value.error == "insufficient_storage"
        assert "No space left" in refused.value.detail
        assert state_disk.files() == ["vgpud.lock", "vgpus.state"]  # no temp file left
        assert sorted(p.name for p in daemon.run_dir.glob("vg-*")) == sorted(made)
        # The daemon lives, and saves in place in the file it kept.
        assert [v["id"] for v in daemon.client.get("/v1/vgpus")] == made
        daemon.client.delete(f"/v1/vgpus/{made.pop()}")
        assert daemon.stop() == 0
        daemon.start()
        listed = daemon.client.get("/v1/vgpus")
        assert [v["id"] for v in listed] == made
        assert all(v["labels"] == LABELS for v in listed)
    finally:
        daemon.cleanup()
