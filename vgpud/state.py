"""Durable state: the vGPUs, in state_dir/vgpus.json.

Written atomically (temporary file, fsync, rename, fsync of the directory)
so that a crash at any instant leaves either the old or the new file, never
a torn one. The format is versioned: {"version": 1, "vgpus": [...]}.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vgpud.model import ROOT_USER, BlockUser, Limits, Slice, Vgpu
from vgpud.units import parse_memory

FORMAT_VERSION = 1
STATE_FILE = "vgpus.json"


class StateError(Exception):
    """The state file exists but cannot be used; the message says why."""


def vgpu_to_json(v: Vgpu) -> dict[str, Any]:
    return {
        "id": v.id,
        "name": v.name,
        "slices": [
            {"gpu_uuid": s.gpu_uuid, "gpu_index": s.gpu_index, "memory": s.memory} for s in v.slices
        ],
        "memory": v.limits.memory.to_json(),
        "share": v.limits.share,
        "mode": v.limits.mode,
        "weight": v.limits.weight,
        "oversubscribe": v.oversubscribe,
        "exclusive": v.exclusive,
        "created_at": v.created_at,
        "labels": dict(v.labels),
        "owner": dict(v.owner),
        "user": {"uid": v.user.uid, "gid": v.user.gid},
    }


def vgpu_from_json(d: dict[str, Any]) -> Vgpu:
    return Vgpu(
        id=str(d["id"]),
        name=d["name"],
        slices=tuple(
            Slice(str(s["gpu_uuid"]), int(s["gpu_index"]), int(s["memory"])) for s in d["slices"]
        ),
        limits=Limits(
            memory=parse_memory(d["memory"]),
            share=int(d["share"]),
            mode=str(d["mode"]),
            weight=int(d["weight"]),
        ),
        oversubscribe=bool(d["oversubscribe"]),
        exclusive=bool(d["exclusive"]),
        created_at=float(d["created_at"]),
        labels={str(k): str(v) for k, v in d["labels"].items()},
        owner={str(k): str(v) for k, v in d["owner"].items()},
        user=_user_from_json(d.get("user")),
    )


def _user_from_json(d: dict[str, Any] | None) -> BlockUser:
    """A recorded user; a vGPU recorded before vGPUs had one is root's (its
    usage block was 0666: adoption now gives it to root alone)."""
    if d is None:
        return ROOT_USER
    gid = d["gid"]
    return BlockUser(int(d["uid"]), None if gid is None else int(gid))


class StateStore:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE

    def load(self) -> list[Vgpu]:
        """The recorded vGPUs; none when there is no file yet."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from exc
        try:
            doc = json.loads(text)
            if doc.get("version") != FORMAT_VERSION:
                raise StateError(
                    f"{self.path} has format version {doc.get('version')!r}, "
                    f"this vgpud reads {FORMAT_VERSION}"
                )
            return [vgpu_from_json(v) for v in doc["vgpus"]]
        except StateError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateError(f"{self.path} is corrupt: {exc!r}") from exc

    def save(self, vgpus: Iterable[Vgpu]) -> None:
        doc = {"version": FORMAT_VERSION, "vgpus": [vgpu_to_json(v) for v in vgpus]}
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{STATE_FILE}.", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, self.path)
        except BaseException:
            os.unlink(tmp)
            raise
        dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)  # the rename itself must survive a power cut
        finally:
            os.close(dir_fd)
