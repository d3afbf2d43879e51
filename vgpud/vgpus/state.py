"""Durable state: the vGPUs, in state_dir/vgpus.json.

Written atomically (temporary file, fsync, rename, fsync of the directory)
so that a crash at any instant leaves either the old or the new file, never
a torn one. The format is versioned: {"version": 1, "vgpus": [...]}.

Read back as strictly as the API reads a request, with the API's own field
rules (``vgpud.vgpus.fields``) and admission's sums (``model.loads``):
the file is the truth the limits are written from, so a field out of range
(a memory of -1 would be a limit of 2^64-1), an id that is not ours (it
names a directory), two vGPUs with one id or one name, or hard shares over
100 % of a GPU refuse the start, with the field named, rather than run a
node whose limits nobody chose. What the file cannot know is not checked
here: whether its GPUs are present now (see ``Daemon._warn_absent_gpus``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vgpud.errors import Unprocessable
from vgpud.vgpus import fields
from vgpud.vgpus.abi import MAX_DEVICES, UUID_LEN
from vgpud.vgpus.blocks import ABSURD_BYTES
from vgpud.vgpus.model import ID_PATTERN, ROOT_USER, Limits, Slice, Vgpu, loads, valid_name

FORMAT_VERSION = 1
STATE_FILE = "vgpus.json"
DOC_FIELDS = frozenset({"version", "vgpus"})
VGPU_FIELDS = frozenset(
    {
        "id",
        "name",
        "slices",
        "memory",
        "share",
        "mode",
        "weight",
        "oversubscribe",
        "exclusive",
        "created_at",
        "labels",
        "owner",
    }
)
SLICE_FIELDS = frozenset({"gpu_uuid", "gpu_index", "memory"})
MAX_GPU_INDEX = 1023  # as the API accepts GPU indices


# What tempfile.mkstemp(prefix=".<final name>.") makes: the atomic writes of
# this file and of the blocks (blocks._create_file) both write beside their
# target under such a name, and a crash before the rename leaves it there.
TEMP_PATTERN = re.compile(r"\..+\.[a-z0-9_]{8}")


def remove_temps(directory: Path) -> list[Path]:
    """Remove the temporary files a crash left in ``directory``: regular
    files named like ours, never a symlink or what it points to. Returns
    what was removed; the caller logs it."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        if TEMP_PATTERN.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


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


def vgpu_from_json(d: object) -> Vgpu:
    """One recorded vGPU, checked field by field; Unprocessable names the
    field at fault."""
    obj = _fields(d, VGPU_FIELDS, frozenset({"user"}))
    vid = obj["id"]
    if not isinstance(vid, str) or not ID_PATTERN.fullmatch(vid):
        raise Unprocessable(f"id: vg- and 8 hex digits, not {vid!r}")
    name = obj["name"]
    if name is not None and not (isinstance(name, str) and valid_name(name)):
        raise Unprocessable(f"name: {name!r} is not a vGPU name")
    raw = obj["slices"]
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_DEVICES:
        raise Unprocessable(f"slices: a list of 1..{MAX_DEVICES} GPUs")
    slices = tuple(_slice(s, i) for i, s in enumerate(raw))
    if len({s.gpu_uuid for s in slices}) != len(slices):
        raise Unprocessable("slices: the same GPU twice")
    created = obj["created_at"]
    if (
        isinstance(created, bool)
        or not isinstance(created, int | float)
        or not (math.isfinite(created) and created >= 0)
    ):
        raise Unprocessable(f"created_at: a time in seconds, not {created!r}")
    return Vgpu(
        id=vid,
        name=name,
        slices=slices,
        limits=Limits(
            memory=fields.memory(obj["memory"]),
            share=fields.integer(obj, "share", 1, 100, default=0),
            mode=fields.mode(obj["mode"]),
            weight=fields.integer(obj, "weight", 1, 1000, default=0),
        ),
        oversubscribe=fields.boolean(obj, "oversubscribe"),
        exclusive=fields.boolean(obj, "exclusive"),
        created_at=float(created),
        labels=fields.string_map(obj["labels"], "labels"),
        owner=fields.string_map(obj["owner"], "owner"),
        # A vGPU recorded before vGPUs had a user is root's (its usage block
        # was 0666: adoption now gives it to root alone).
        user=ROOT_USER if obj.get("user") is None else fields.user(obj["user"]),
    )


def _fields(
    d: object, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """An object with these keys (the API's unknown-field rule, and none
    required missing: the file is written whole, never partly)."""
    obj = fields.object_with(d, required | optional)
    missing = sorted(required - set(obj))
    if missing:
        raise Unprocessable(f"missing field(s): {', '.join(missing)}")
    return obj


def _slice(d: object, i: int) -> Slice:
    try:
        obj = _fields(d, SLICE_FIELDS)
        uuid = fields.text("gpu_uuid")(obj["gpu_uuid"])
        if len(uuid.encode()) >= UUID_LEN:
            raise Unprocessable(f"gpu_uuid: longer than a block holds ({UUID_LEN - 1} bytes)")
        index = fields.integer(obj, "gpu_index", 0, MAX_GPU_INDEX, default=0)
        # The limit the hooks obey: bounded like every byte figure of a block.
        memory = fields.integer(obj, "memory", 1, ABSURD_BYTES, default=0)
    except Unprocessable as exc:
        raise Unprocessable(f"slices[{i}]: {exc.detail}") from None
    return Slice(uuid, index, memory)


def check_node(vgpus: list[Vgpu]) -> None:
    """What no single vGPU shows: ids and names are unique, and every GPU
    holds what admission would have let it hold (hard shares at most 100,
    an exclusive vGPU alone). Memory is not summed: that needs the GPUs'
    sizes, which the file does not record."""
    seen_ids: dict[str, int] = {}
    seen_names: dict[str, int] = {}
    for i, v in enumerate(vgpus):
        if v.id in seen_ids:
            raise StateError(f"vgpus[{i}].id: {v.id} is also vgpus[{seen_ids[v.id]}]")
        seen_ids[v.id] = i
        if v.name is not None and v.name in seen_names:
            raise StateError(f"vgpus[{i}].name: {v.name!r} is also vgpus[{seen_names[v.name]}]")
        if v.name is not None:
            seen_names[v.name] = i
    for uuid, load in loads(vgpus).items():
        on = [v.id for v in vgpus if v.on_gpu(uuid) is not None]
        if load.hard_share > 100:
            raise StateError(
                f"share: hard shares on GPU {uuid} sum to {load.hard_share}% ({', '.join(on)})"
            )
        if load.exclusive and load.vgpus > 1:
            raise StateError(f"exclusive: GPU {uuid} is held whole but shared ({', '.join(on)})")


class StateStore:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        # Each vGPU's line, kept while its record is the same object (records
        # are immutable): a save encodes what changed, not the whole node.
        self._lines: dict[str, tuple[Vgpu, bytes]] = {}

    def load(self) -> list[Vgpu]:
        """The recorded vGPUs; none when there is no file yet. StateError
        names what is wrong, never a traceback."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from exc
        try:
            doc = json.loads(raw.decode())
        except UnicodeDecodeError as exc:
            raise StateError(f"{self.path} is corrupt: not UTF-8 (byte {exc.start})") from None
        except (ValueError, RecursionError) as exc:
            raise StateError(f"{self.path} is corrupt: not JSON ({exc})") from None
        if isinstance(doc, dict) and doc.get("version") != FORMAT_VERSION:
            raise StateError(
                f"{self.path} has format version {doc.get('version')!r}, "
                f"this vgpud reads {FORMAT_VERSION}"
            )
        try:
            vgpus = _fields(doc, DOC_FIELDS)["vgpus"]
            if not isinstance(vgpus, list):
                raise Unprocessable("vgpus: a list")
        except Unprocessable as exc:
            raise StateError(f"{self.path} is corrupt: {exc.detail}") from None
        out = []
        for i, d in enumerate(vgpus):
            try:
                out.append(vgpu_from_json(d))
            except Unprocessable as exc:
                raise StateError(f"{self.path} is corrupt: vgpus[{i}]: {exc.detail}") from None
        try:
            check_node(out)
        except StateError as exc:
            raise StateError(f"{self.path} is corrupt: {exc}") from None
        return out

    def save(self, vgpus: Iterable[Vgpu]) -> None:
        self.write(self.encode(vgpus))

    def encode(self, vgpus: Iterable[Vgpu]) -> bytes:
        """The file's bytes: one vGPU a line (readable, and each line is
        encoded once per change of its vGPU, by the C encoder: indent= would
        use the pure-Python one, most of a write's cost at 100 vGPUs)."""
        lines = {}
        for v in vgpus:
            kept = self._lines.get(v.id)
            if kept is None or kept[0] is not v:
                kept = (v, json.dumps(vgpu_to_json(v), sort_keys=True).encode())
            lines[v.id] = kept
        self._lines = lines
        body = b",\n".join(line for _, line in lines.values())
        return b'{"version": %d, "vgpus": [\n%s\n]}\n' % (FORMAT_VERSION, body)

    def write(self, data: bytes) -> None:
        """Replace the file with ``data``, durably (see the module's
        docstring). Blocking: the API calls it on a thread."""
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
