"""CDI specs: how a CDI-aware runtime turns ``--device vgpud.io/vgpu=NAME``
into a vGPU's environment and mounts.

One JSON file per vGPU, ``<cdi_dir>/vgpud.io-vgpu-<id>.json``, holding one
device per name the vGPU answers to (its id, and its name when it has one),
each with the vGPU's injection recipe (the same env and mounts as
``vgpuctl env --docker``) and nothing else: no device nodes, no hooks.

Public interface (the daemon calls these on create, patch, delete, start):

- ``build_spec(vgpu_id, name, recipe) -> dict``: pure; ``recipe`` is the
  container recipe of vgpud/vgpus/recipe.py (``{"env": {NAME: value}, "mounts":
  [{"host_path", "container_path", "read_only"}], ...}``), so the spec and
  ``vgpuctl env --docker`` cannot drift apart.
- ``write_spec(cdi_dir, vgpu_id, spec) -> Path``: atomic (temp file in the
  same directory, fsync, rename), mode 0644, creates ``cdi_dir`` if needed.
- ``remove_spec(cdi_dir, vgpu_id) -> bool``.
- ``cleanup_stale(cdi_dir, known_ids) -> list[Path]``: removes our files
  (and our leftover temp files) for vGPUs that no longer exist; files that
  do not match our name pattern are never touched.
- ``validate_device_name(name)``, ``spec_path(cdi_dir, vgpu_id)``,
  ``CdiError``.
- ``publisher(cdi_dir)``: what the registry calls on every change —
  ``.publish(vgpu, paths)``, ``.withdraw(vgpu_id)``, ``.sync(entries)`` at
  start. A ``Publisher`` for a directory, a ``NullPublisher`` when
  ``cdi_dir`` is empty (CDI off). It logs failures and never raises: a vGPU
  works without its spec (``vgpuctl env``), and an unwritable CDI directory
  must not stop the daemon.

Spec version: the lowest CDI version that has every feature the spec uses,
as the CDI project asks of producers. Runtimes reject versions newer than
the CDI library they vendor: Debian 12's podman 4.3 accepts up to 0.5.0 and
refuses 0.6.0, so writing the newest version would lock out runtimes that
would read our spec perfectly well.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from vgpud.dirs import make_dirs
from vgpud.vgpus.model import Vgpu
from vgpud.vgpus.recipe import Paths, container_recipe

KIND = "vgpud.io/vgpu"
FILE_PREFIX = "vgpud.io-vgpu-"
FILE_SUFFIX = ".json"
# Temp files start with a dot and end in .tmp so that no runtime, which reads
# only *.json and *.yaml, ever loads a half-written spec.
_TMP_PREFIX = "." + FILE_PREFIX
_TMP_SUFFIX = ".tmp"
SPEC_MODE = 0o644
DIR_MODE = 0o755

# CDI device names: alphanumerics, '-', '_', '.', ':'; first and last
# character alphanumeric.
_DEVICE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")
# Our file names embed the vGPU id: keep it to characters that are safe in a
# path and unambiguous in the pattern.
_FILE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# 0.3.0 is the oldest version current CDI libraries read and has env and
# mounts; 0.5.0 first allows a device name that starts with a digit.
_BASE_VERSION = "0.3.0"
_DIGIT_NAME_VERSION = "0.5.0"

# Bind mounts that give the container nothing beyond the file itself.
_MOUNT_OPTIONS = ("nosuid", "nodev", "bind")


log = structlog.get_logger(__name__)


class CdiError(Exception):
    """A spec that cannot be built or written; the message says why."""


def validate_device_name(name: str) -> None:
    """Raise CdiError unless ``name`` is a valid CDI device name."""
    if not _DEVICE_NAME.fullmatch(name):
        raise CdiError(
            f"{name!r} is not a valid CDI device name: use letters, digits, '-', '_', "
            "'.', ':', starting and ending with a letter or digit"
        )


def device_names(vgpu_id: str, name: str | None) -> list[str]:
    """The names ``--device vgpud.io/vgpu=...`` accepts for this vGPU."""
    names = [vgpu_id] if not name or name == vgpu_id else [vgpu_id, name]
    for each in names:
        validate_device_name(each)
    return names


def qualified_name(device: str) -> str:
    """``vgpud.io/vgpu=<device>``: what to pass to ``--device``."""
    return f"{KIND}={device}"


def build_spec(vgpu_id: str, name: str | None, recipe: Mapping[str, Any]) -> dict[str, Any]:
    """The CDI spec (as a JSON-ready dict) of one vGPU."""
    edits = _container_edits(recipe)
    names = device_names(vgpu_id, name)
    return {
        "cdiVersion": _required_version(names),
        "kind": KIND,
        "devices": [{"name": each, "containerEdits": edits} for each in names],
        "containerEdits": {},
    }


def spec_path(cdi_dir: Path, vgpu_id: str) -> Path:
    if not _FILE_ID.fullmatch(vgpu_id):
        raise CdiError(f"vGPU id {vgpu_id!r} cannot name a CDI spec file")
    return cdi_dir / f"{FILE_PREFIX}{vgpu_id}{FILE_SUFFIX}"


def write_spec(cdi_dir: Path, vgpu_id: str, spec: Mapping[str, Any]) -> Path:
    """Write the spec atomically: readers see the old file or the new one."""
    target = spec_path(cdi_dir, vgpu_id)
    data = (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()
    try:
        make_dirs(cdi_dir, DIR_MODE)
        tmp = cdi_dir / f"{_TMP_PREFIX}{vgpu_id}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, SPEC_MODE)
        try:
            os.fchmod(fd, SPEC_MODE)  # whatever the umask
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, target)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(cdi_dir)
    except OSError as exc:
        raise CdiError(f"cannot write CDI spec {target}: {exc.strerror or exc}") from exc
    return target


def remove_spec(cdi_dir: Path, vgpu_id: str) -> bool:
    """Remove a vGPU's spec; False when there was none."""
    target = spec_path(cdi_dir, vgpu_id)
    try:
        target.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise CdiError(f"cannot remove CDI spec {target}: {exc.strerror or exc}") from exc
    return True


def cleanup_stale(cdi_dir: Path, known_ids: Iterable[str]) -> list[Path]:
    """Remove our specs of vGPUs not in ``known_ids`` and our leftover temp
    files; return what was removed. Other files in the directory (other
    vendors' specs) are never touched."""
    known = set(known_ids)
    try:
        entries = sorted(os.listdir(cdi_dir))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CdiError(f"cannot list CDI directory {cdi_dir}: {exc.strerror or exc}") from exc
    removed = []
    for entry in entries:
        vgpu_id = _owned_spec_id(entry)
        if (vgpu_id is not None and vgpu_id not in known) or _is_owned_tmp(entry):
            with contextlib.suppress(FileNotFoundError):
                (cdi_dir / entry).unlink()
                removed.append(cdi_dir / entry)
    return removed


def _container_edits(recipe: Mapping[str, Any]) -> dict[str, Any]:
    try:
        env = [f"{key}={value}" for key, value in sorted(recipe["env"].items())]
        mounts = [
            {
                "hostPath": str(m["host_path"]),
                "containerPath": str(m["container_path"]),
                "options": ["ro" if m["read_only"] else "rw", *_MOUNT_OPTIONS],
            }
            for m in recipe["mounts"]
        ]
    except (KeyError, TypeError, AttributeError) as exc:
        raise CdiError(f"not a container recipe: {exc!r}") from exc
    return {"env": env, "mounts": mounts}


def _required_version(names: Sequence[str]) -> str:
    if any(not n[0].isalpha() for n in names):
        return _DIGIT_NAME_VERSION
    return _BASE_VERSION


def _owned_spec_id(entry: str) -> str | None:
    if not (entry.startswith(FILE_PREFIX) and entry.endswith(FILE_SUFFIX)):
        return None
    vgpu_id = entry[len(FILE_PREFIX) : -len(FILE_SUFFIX)]
    return vgpu_id if _FILE_ID.fullmatch(vgpu_id) else None


def _is_owned_tmp(entry: str) -> bool:
    return entry.startswith(_TMP_PREFIX) and entry.endswith(_TMP_SUFFIX)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SpecPublisher(Protocol):
    def publish(self, vgpu: Vgpu, paths: Paths) -> None: ...
    def withdraw(self, vgpu_id: str) -> None: ...
    def sync(self, entries: Iterable[tuple[Vgpu, Paths]]) -> None: ...


class Publisher:
    """Keeps one directory's specs in step with the vGPUs."""

    def __init__(self, cdi_dir: Path) -> None:
        self.cdi_dir = cdi_dir

    def publish(self, vgpu: Vgpu, paths: Paths) -> None:
        try:
            spec = build_spec(vgpu.id, vgpu.name, container_recipe(vgpu, paths))
            path = write_spec(self.cdi_dir, vgpu.id, spec)
        except CdiError as exc:
            log.warning("CDI spec not written: use `vgpuctl env`", vgpu=vgpu.id, reason=str(exc))
            return
        log.debug("CDI spec written", vgpu=vgpu.id, path=str(path))

    def withdraw(self, vgpu_id: str) -> None:
        try:
            remove_spec(self.cdi_dir, vgpu_id)
        except CdiError as exc:
            log.warning("CDI spec not removed", vgpu=vgpu_id, reason=str(exc))

    def sync(self, entries: Iterable[tuple[Vgpu, Paths]]) -> None:
        """At start: (re)write every vGPU's spec, remove our stale ones."""
        known = []
        for vgpu, paths in entries:
            self.publish(vgpu, paths)
            known.append(vgpu.id)
        try:
            removed = cleanup_stale(self.cdi_dir, known)
        except CdiError as exc:
            log.warning("stale CDI specs not cleaned", reason=str(exc))
            return
        for path in removed:
            log.info("stale CDI spec removed", path=str(path))


class NullPublisher:
    """CDI off (``cdi_dir = ""``)."""

    def publish(self, vgpu: Vgpu, paths: Paths) -> None:
        pass

    def withdraw(self, vgpu_id: str) -> None:
        pass

    def sync(self, entries: Iterable[tuple[Vgpu, Paths]]) -> None:
        pass


def publisher(cdi_dir: str) -> SpecPublisher:
    return Publisher(Path(cdi_dir)) if cdi_dir else NullPublisher()
