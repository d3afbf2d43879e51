"""vgpud/vgpus/cdi.py: the CDI spec of a vGPU, written atomically, cleaned up
without touching anything that is not ours."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.fakes import create, delete, gpus, update
from vgpud.policy.placement import Rules
from vgpud.units import parse_memory
from vgpud.vgpus import cdi
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.model import CreateRequest, Limits, UpdateRequest
from vgpud.vgpus.recipe import container_recipe
from vgpud.vgpus.registry import Registry
from vgpud.vgpus.state import StateStore


def _mount(host: str, container: str, read_only: bool) -> dict[str, object]:
    return {"host_path": host, "container_path": container, "read_only": read_only}


# The shape of vgpud/vgpus/recipe.py's container recipe.
RECIPE = {
    "env": {
        "VGPU_USAGE": "/run/vgpud/vgpu/usage",
        "LD_PRELOAD": "/usr/lib/vgpud/libvgpu.so",
        "VGPU_ID": "v1",
        "VGPU_CONTROL": "/run/vgpud/vgpu/control",
    },
    "mounts": [
        _mount("/usr/lib/vgpud/libvgpu.so", "/usr/lib/vgpud/libvgpu.so", True),
        _mount("/run/vgpud/v1/control", "/run/vgpud/vgpu/control", True),
        _mount("/run/vgpud/v1/usage", "/run/vgpud/vgpu/usage", False),
    ],
    "cdi_device": "vgpud.io/vgpu=v1",
}


@pytest.fixture
def umask_077() -> Iterator[None]:
    old = os.umask(0o077)
    yield
    os.umask(old)


def test_spec_carries_the_recipe_and_nothing_more() -> None:
    spec = cdi.build_spec("v1", "train", RECIPE)

    assert spec["kind"] == "vgpud.io/vgpu"
    assert spec["containerEdits"] == {}
    assert [d["name"] for d in spec["devices"]] == ["v1", "train"]
    for device in spec["devices"]:
        edits = device["containerEdits"]
        assert set(edits) == {"env", "mounts"}  # no device nodes, no hooks
        assert edits["env"] == [
            "LD_PRELOAD=/usr/lib/vgpud/libvgpu.so",
            "VGPU_CONTROL=/run/vgpud/vgpu/control",
            "VGPU_ID=v1",
            "VGPU_USAGE=/run/vgpud/vgpu/usage",
        ]
        by_target = {m["containerPath"]: m for m in edits["mounts"]}
        assert by_target["/run/vgpud/vgpu/control"]["hostPath"] == "/run/vgpud/v1/control"
        assert by_target["/run/vgpud/vgpu/control"]["options"][0] == "ro"
        assert by_target["/usr/lib/vgpud/libvgpu.so"]["options"][0] == "ro"
        assert by_target["/run/vgpud/vgpu/usage"]["options"][0] == "rw"
        for mount in edits["mounts"]:
            assert set(mount) == {"hostPath", "containerPath", "options"}
            assert {"bind", "nosuid", "nodev"} <= set(mount["options"])


@pytest.mark.parametrize(
    ("vgpu_id", "name", "names"),
    [
        ("v1", None, ["v1"]),
        ("v1", "", ["v1"]),
        ("v1", "v1", ["v1"]),
        ("v1", "team-a.train:0", ["v1", "team-a.train:0"]),
    ],
)
def test_device_names(vgpu_id: str, name: str | None, names: list[str]) -> None:
    assert cdi.device_names(vgpu_id, name) == names
    assert cdi.qualified_name(names[-1]) == f"vgpud.io/vgpu={names[-1]}"


@pytest.mark.parametrize(
    ("vgpu_id", "name", "version"),
    [
        # The oldest version with env and mounts, so older runtimes read it.
        ("v1", "train", "0.3.0"),
        # A device name starting with a digit needs 0.5.0.
        ("0f3a", None, "0.5.0"),
        ("v1", "7b", "0.5.0"),
    ],
)
def test_spec_version_is_the_lowest_that_fits(vgpu_id: str, name: str, version: str) -> None:
    assert cdi.build_spec(vgpu_id, name, RECIPE)["cdiVersion"] == version


@pytest.mark.parametrize("bad", ["-a", "a-", "a b", "a/b", "ä", "a=b", "a,b", ".a"])
def test_invalid_device_names_are_refused_clearly(bad: str) -> None:
    with pytest.raises(cdi.CdiError, match="not a valid CDI device name"):
        cdi.build_spec("v1", bad, RECIPE)


@pytest.mark.parametrize(
    "bad",
    [{}, {"env": {}}, {"env": [], "mounts": []}, {"env": {}, "mounts": [{"host_path": "/x"}]}],
)
def test_a_malformed_recipe_is_refused_clearly(bad: dict[str, object]) -> None:
    with pytest.raises(cdi.CdiError, match="not a container recipe"):
        cdi.build_spec("v1", None, bad)


@pytest.mark.parametrize("bad", ["", "..", "a/b", "../x", ".hidden", "a b"])
def test_ids_that_cannot_name_a_file_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(cdi.CdiError):
        cdi.spec_path(tmp_path, bad)


def test_write_creates_the_directory_and_a_0644_file(tmp_path: Path, umask_077: None) -> None:
    spec = cdi.build_spec("v1", "train", RECIPE)
    cdi_dir = tmp_path / "etc" / "cdi"

    path = cdi.write_spec(cdi_dir, "v1", spec)

    assert path == cdi_dir / "vgpud.io-vgpu-v1.json"
    assert json.loads(path.read_text()) == spec
    # Runtimes run as other users (rootless podman): readable whatever our umask.
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(cdi_dir) == ["vgpud.io-vgpu-v1.json"]


def test_rewrite_replaces_the_file_in_one_step(tmp_path: Path) -> None:
    old = cdi.write_spec(tmp_path, "v1", cdi.build_spec("v1", None, RECIPE))
    old_inode = old.stat().st_ino
    with old.open() as reader:  # a runtime reading while the spec changes
        new = cdi.write_spec(tmp_path, "v1", cdi.build_spec("v1", "renamed", RECIPE))
        assert [d["name"] for d in json.load(reader)["devices"]] == ["v1"]

    assert new.stat().st_ino != old_inode  # renamed over, never rewritten in place
    assert [d["name"] for d in json.loads(new.read_text())["devices"]] == ["v1", "renamed"]
    assert os.listdir(tmp_path) == ["vgpud.io-vgpu-v1.json"]


def test_write_failure_is_a_clear_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(cdi.CdiError, match="cannot write CDI spec"):
        cdi.write_spec(not_a_dir, "v1", cdi.build_spec("v1", None, RECIPE))


def test_remove(tmp_path: Path) -> None:
    path = cdi.write_spec(tmp_path, "v1", cdi.build_spec("v1", None, RECIPE))
    assert cdi.remove_spec(tmp_path, "v1") is True
    assert not path.exists()
    assert cdi.remove_spec(tmp_path, "v1") is False


def test_cleanup_removes_only_our_stale_files(tmp_path: Path) -> None:
    for vgpu_id in ("keep", "gone1", "gone2"):
        cdi.write_spec(tmp_path, vgpu_id, cdi.build_spec(vgpu_id, None, RECIPE))
    leftover_tmp = tmp_path / ".vgpud.io-vgpu-gone1.1a2b3c4d.tmp"  # a crash mid-write
    leftover_tmp.write_text("{")
    foreign = [
        "nvidia.yaml",
        "nvidia.com-gpu.json",
        "vgpud.io-vgpu-x.yaml",
        "other-vgpud.io-vgpu-x.json",
        "vgpud.io-vgpu-.json",
        ".hidden.json",
    ]
    for name in foreign:
        (tmp_path / name).write_text("{}")

    removed = cdi.cleanup_stale(tmp_path, ["keep"])

    assert sorted(p.name for p in removed) == sorted(
        [leftover_tmp.name, "vgpud.io-vgpu-gone1.json", "vgpud.io-vgpu-gone2.json"]
    )
    assert sorted(os.listdir(tmp_path)) == sorted([*foreign, "vgpud.io-vgpu-keep.json"])


def test_cleanup_of_a_missing_directory_is_a_no_op(tmp_path: Path) -> None:
    assert cdi.cleanup_stale(tmp_path / "absent", []) == []


# --- the daemon's side: one spec per vGPU, following the registry ---------


def _registry(tmp_path: Path, cdi_dir: Path) -> Registry:
    registry = Registry(
        tmp_path / "run",
        StateStore(tmp_path / "state"),
        tmp_path / "libvgpu.so",
        Atomics.load(),
        cdi=cdi.publisher(str(cdi_dir)),
    )
    registry.adopt()
    return registry


def _create(registry: Registry, name: str | None) -> str:
    limits = Limits(memory=parse_memory("1g"), share=30, mode="hard", weight=100)
    entry = create(registry, CreateRequest(name=name), limits, gpus(1), Rules())
    return entry.vgpu.id


def _devices(path: Path) -> dict[str, dict[str, list[str]]]:
    spec = json.loads(path.read_text())
    return {
        d["name"]: {
            "env": d["containerEdits"]["env"],
            "mounts": [m["hostPath"] for m in d["containerEdits"]["mounts"]],
        }
        for d in spec["devices"]
    }


def test_a_vgpu_has_its_spec_from_create_to_delete(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "cdi"
    registry = _registry(tmp_path, cdi_dir)
    vgpu_id = _create(registry, "train")
    path = cdi.spec_path(cdi_dir, vgpu_id)

    # The spec carries exactly the recipe the API answers with.
    entry = registry.get(vgpu_id)
    want = container_recipe(entry.vgpu, entry.paths)
    devices = _devices(path)
    assert set(devices) == {vgpu_id, "train"}
    assert devices["train"]["env"] == [f"{k}={v}" for k, v in sorted(want["env"].items())]
    assert devices["train"]["mounts"] == [m["host_path"] for m in want["mounts"]]

    update(registry, vgpu_id, UpdateRequest(share=50), gpus(1), Rules())
    assert path.exists()

    delete(registry, vgpu_id, force=False, processes=0)
    assert not path.exists()
    registry.close()


def test_start_rewrites_specs_and_removes_stale_ones(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "cdi"
    first = _registry(tmp_path, cdi_dir)
    kept = _create(first, "kept")
    first.close()
    cdi.spec_path(cdi_dir, kept).unlink()  # lost, e.g. /var/run is a fresh tmpfs
    stale = cdi.write_spec(cdi_dir, "vg-00000000", cdi.build_spec("vg-00000000", None, RECIPE))
    foreign = cdi_dir / "nvidia.yaml"
    foreign.write_text("cdiVersion: 0.5.0\n")

    second = _registry(tmp_path, cdi_dir)

    assert cdi.spec_path(cdi_dir, kept).exists()
    assert not stale.exists()
    assert foreign.exists()
    second.close()


def test_an_unwritable_cdi_dir_does_not_stop_a_create(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    registry = _registry(tmp_path, blocker)
    vgpu_id = _create(registry, None)  # logged; `vgpuctl env` still works
    assert registry.get(vgpu_id).vgpu.id == vgpu_id
    registry.close()


def test_cdi_off() -> None:
    assert isinstance(cdi.publisher(""), cdi.NullPublisher)
