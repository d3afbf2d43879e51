"""A corrupt state file: the start is refused (exit 3) with one line that
names the field, never a guess and never a traceback; nothing is made from
it (no limit lifted, no block outside the run dir). The content is the
newest slot of vgpus.state, its digest right (a save that ended, of a
document that does not read: never passed over for the slot before), or
vgpus.json, the format before."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.daemon_harness import Daemon, base_env
from vgpud.daemon import EXIT_START_FAILED
from vgpud.vgpus.state import HEADER_SIZE, MIN_SLOT, StateError, StateStore

GIB = 1 << 30
GPU = "GPU-5117a000-0000-4000-8000-000000000001"


def vgpu(vid: str, *, name: str | None = None, share: int = 30, mode: str = "hard") -> Any:
    return {
        "id": vid,
        "name": name,
        "slices": [{"gpu_uuid": GPU, "gpu_index": 0, "memory": GIB}],
        "memory": "1g",
        "share": share,
        "mode": mode,
        "weight": 100,
        "oversubscribe": False,
        "exclusive": False,
        "created_at": 1.5,
        "labels": {},
        "owner": {},
    }


def doc(*vgpus: Any) -> bytes:
    return json.dumps({"version": 1, "vgpus": list(vgpus)}).encode()


def changed(path: str, value: Any) -> bytes:
    v = copy.deepcopy(vgpu("vg-00000001"))
    *parents, last = path.split(".")
    target = v
    for key in parents:
        target = target[int(key)] if key.isdigit() else target[key]
    target[last] = value
    return doc(v)


CASES = {
    "memory of -1 (a 2^64-1 limit)": (changed("slices.0.memory", -1), "slices[0]: memory"),
    "memory over any GPU": (changed("slices.0.memory", 1 << 60), "slices[0]: memory"),
    "memory as text": (changed("slices.0.memory", "1g"), "slices[0]: memory"),
    "share 0": (changed("share", 0), "share"),
    "share as a bool": (changed("share", True), "share"),
    "mode unknown": (changed("mode", "turbo"), "mode"),
    "weight too big": (changed("weight", 10**6), "weight"),
    "id climbing out of the run dir": (changed("id", "../../../tmp/x"), "vgpus[0]: id"),
    "name shaped like an id": (changed("name", "vg-00000002"), "name"),
    "no slices": (changed("slices", []), "slices"),
    "the same GPU twice": (
        changed("slices", [vgpu("vg-00000001")["slices"][0]] * 2),
        "same GPU twice",
    ),
    "a field missing": (
        doc({k: v for k, v in vgpu("vg-00000001").items() if k != "share"}),
        "share",
    ),
    "an unknown field": (changed("limit_override", 1), "limit_override"),
    "a label that is not text": (changed("labels", {"k": 1}), "labels"),
    "created_at not a number": (changed("created_at", "now"), "created_at"),
    "a duplicate id": (doc(vgpu("vg-00000001"), vgpu("vg-00000001")), "vgpus[1].id"),
    "a duplicate name": (
        doc(vgpu("vg-00000001", name="a"), vgpu("vg-00000002", name="a")),
        "vgpus[1].name",
    ),
    "hard shares summing to 180 %": (
        doc(vgpu("vg-00000001", share=90), vgpu("vg-00000002", share=90)),
        "hard shares on GPU",
    ),
    "vgpus not a list": (b'{"version": 1, "vgpus": {}}', "vgpus"),
    "a top level that is not an object": (b"[]", "JSON object"),
    "garbage": (b"\x00\x01garbage", "not JSON"),
    "invalid UTF-8": (b'{"version": 1, "vgpus": [], "x": "\xff"}', "not UTF-8"),
    "nesting deeper than the parser goes": (b"[" * 100_000, "not JSON"),
}


def record(state_dir: Path, name: str, content: bytes) -> None:
    """``content`` as the state: the newest slot of vgpus.state over a
    valid older one, or vgpus.json."""
    if name == "vgpus.state":
        store = StateStore(state_dir)
        store.write(doc(vgpu("vg-00000001")))
        store.write(content)
    else:
        (state_dir / name).write_bytes(content)


@pytest.mark.parametrize("name", ["vgpus.state", "vgpus.json"])
@pytest.mark.parametrize(("content", "field"), CASES.values(), ids=CASES.keys())
def test_a_corrupt_state_file_is_refused_naming_the_field(
    tmp_path: Path, content: bytes, field: str, name: str
) -> None:
    record(tmp_path, name, content)
    with pytest.raises(StateError) as raised:
        StateStore(tmp_path).load()
    assert field in str(raised.value) and name in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("name", ["vgpus.state", "vgpus.json"])
def test_soft_shares_over_100_are_what_admission_allows(tmp_path: Path, name: str) -> None:
    record(
        tmp_path,
        name,
        doc(vgpu("vg-00000001", share=90), vgpu("vg-00000002", share=90, mode="soft")),
    )
    assert [v.id for v in StateStore(tmp_path).load()] == ["vg-00000001", "vg-00000002"]


@pytest.mark.parametrize(
    "case",
    ["memory of -1 (a 2^64-1 limit)", "id climbing out of the run dir", "garbage", "invalid UTF-8"],
)
def test_the_daemon_refuses_to_start_on_it_with_exit_3_and_one_line(
    tmp_path: Path, case: str
) -> None:
    content, field = CASES[case]
    daemon = Daemon(tmp_path, base_env(), sim=False)
    daemon.state_dir.mkdir()
    record(daemon.state_dir, "vgpus.state", content)
    refused_with_one_line(daemon, field)


def refused_with_one_line(daemon: Daemon, field: str) -> None:
    try:
        daemon.start(wait=False)
        assert daemon.wait() == EXIT_START_FAILED
        log = daemon.log()
        errors = [line for line in log.splitlines() if "[error" in line]
        assert len(errors) == 1 and "failed to start" in errors[0] and field in errors[0], log
        assert "Traceback" not in log
        # Nothing was made from it: no vGPU directory, and nothing outside the run dir.
        assert not [p for p in daemon.run_dir.glob("vg-*")]
        assert not (daemon.run_dir / "../../../tmp/x").resolve().exists()
    finally:
        daemon.cleanup()


def test_the_daemon_refuses_to_start_when_neither_slot_is_whole(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, base_env(), sim=False)
    daemon.state_dir.mkdir()
    store = StateStore(daemon.state_dir)
    store.write(doc(vgpu("vg-00000001")))
    store.write(doc(vgpu("vg-00000002")))
    with open(store.path, "r+b") as f:  # a byte of each slot's payload
        for slot in (0, 1):
            f.seek(slot * MIN_SLOT + HEADER_SIZE + 3)
            f.write(b"X")
    refused_with_one_line(daemon, "vgpus.state is corrupt: neither slot holds a whole save")


def test_a_vgpu_on_a_gpu_absent_now_is_kept_and_said(tmp_path: Path) -> None:
    daemon = Daemon(tmp_path, base_env(), sim=False)  # no driver here: no GPU present
    daemon.state_dir.mkdir()
    StateStore(daemon.state_dir).write(doc(vgpu("vg-00000001")))
    try:
        daemon.start()
        assert [v["id"] for v in daemon.client.get("/v1/vgpus")] == ["vg-00000001"]
        assert "vGPU kept on GPUs not present now" in daemon.log()
    finally:
        daemon.cleanup()
