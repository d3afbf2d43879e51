"""Durable state: the vGPUs, in state_dir/vgpus.state.

The file holds two slots of equal capacity C (a power of two, at least
256 KiB) at offsets 0 and C. A slot is a 128-byte ASCII header::

    vgpud-state <container version> <generation> <length> <sha256>  (padded, then a newline)

(generation and length in 16 hex digits; the sha256 covers the header's
text before it and the payload) followed by the payload, the JSON document
{"version": 1, "vgpus": [...]}. A save writes the slot that does not hold
the newest generation, header and payload in one pwrite, with the next
generation, then fdatasync: the file's blocks were written (zeros) when it
was made, so overwriting them changes no metadata and costs one data flush,
not the two journal commits of a rename and a directory fsync. A save cut
short (a crash, a power cut) leaves a slot whose digest fails: it was never
answered, and the other slot holds the last save that was. A payload that
does not fit C, or no file yet, makes a whole new file (twice the room
needed, rounded up to a power of two) through the atomic path: temporary
file, fsync, rename, fsync of the directory.

vgpus.json, the format before this one (the document alone, replaced whole
at each save), is read when vgpus.state does not exist; the first save
writes vgpus.state and removes it.

Read back as strictly as the API reads a request, with the API's own field
rules (``vgpud.vgpus.fields``) and admission's sums (``model.loads``):
the file is the truth the limits are written from, so a field out of range
(a memory of -1 would be a limit of 2^64-1), an id that is not ours (it
names a directory), two vGPUs with one id or one name, or hard shares over
100 % of a GPU refuse the start, with the field named, rather than run a
node whose limits nobody chose. A newest slot that is whole but does not
read is refused too, never passed over for the older slot: that would
bring back a state nobody chose. What the file cannot know is not checked
here: whether its GPUs are present now (see ``Daemon._warn_absent_gpus``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import stat
import tempfile
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from vgpud.dirs import make_dirs
from vgpud.errors import Unprocessable
from vgpud.vgpus import fields
from vgpud.vgpus.abi import MAX_DEVICES, UUID_LEN
from vgpud.vgpus.blocks import ABSURD_BYTES
from vgpud.vgpus.model import ID_PATTERN, ROOT_USER, Limits, Slice, Vgpu, loads, valid_name

log = structlog.get_logger(__name__)

FORMAT_VERSION = 1  # of the JSON document
STATE_FILE = "vgpus.state"
# Of a state directory the daemon makes: the unit's StateDirectoryMode.
STATE_DIR_MODE = 0o700
OLD_STATE_FILE = "vgpus.json"  # the document alone, before vgpus.state
CONTAINER_VERSION = 1  # of vgpus.state's slots and headers
MAGIC = b"vgpud-state"
HEADER_SIZE = 128
MIN_SLOT = 256 << 10
# The header's fields; the digest is checked by writing the header again.
HEADER_FIELDS = re.compile(rb"%s %d ([0-9a-f]{16}) ([0-9a-f]{16}) " % (MAGIC, CONTAINER_VERSION))
HEADER_VERSION = re.compile(rb"%s (\d{1,9}) " % MAGIC)
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


def _header(generation: int, payload: bytes) -> bytes:
    fields = b"%s %d %016x %016x " % (MAGIC, CONTAINER_VERSION, generation, len(payload))
    digest = hashlib.sha256(fields)
    digest.update(payload)
    return (fields + digest.hexdigest().encode()).ljust(HEADER_SIZE - 1) + b"\n"


@dataclass(frozen=True)
class _Slot:
    index: int
    generation: int
    payload: bytes


def _slot(image: bytes, index: int, capacity: int) -> _Slot | None:
    """Slot ``index`` if it is whole: its header parses and its digest
    matches (its generation and length included, so that no mix of two
    saves passes)."""
    start = index * capacity
    head = image[start : start + HEADER_SIZE]
    found = HEADER_FIELDS.match(head)
    if found is None:
        return None
    generation, length = int(found[1], 16), int(found[2], 16)
    if length > capacity - HEADER_SIZE:
        return None
    payload = image[start + HEADER_SIZE : start + HEADER_SIZE + length]
    return _Slot(index, generation, payload) if _header(generation, payload) == head else None


def _newest(path: Path, image: bytes) -> tuple[_Slot, bool]:
    """The slot of the last save that ended, and whether the other slot
    holds a save cut short. StateError when no slot is whole, or the file
    is not two slots of this version."""
    capacity = len(image) // 2
    if len(image) != 2 * capacity or capacity < MIN_SLOT or capacity & (capacity - 1):
        raise StateError(
            f"{path} is corrupt: {len(image)} bytes is not two slots of a power of two "
            f"of at least {MIN_SLOT} bytes"
        )
    for index in (0, 1):
        # Never a torn write of ours (each writes this version at this place):
        # a newer vgpud's file, read by no guess.
        version = HEADER_VERSION.match(image, index * capacity)
        if version is not None and int(version[1]) != CONTAINER_VERSION:
            raise StateError(
                f"{path} has container version {int(version[1])}, "
                f"this vgpud reads {CONTAINER_VERSION}"
            )
    whole = [s for s in (_slot(image, i, capacity) for i in (0, 1)) if s is not None]
    if not whole:
        raise StateError(f"{path} is corrupt: neither slot holds a whole save")
    newest = max(whole, key=lambda s: s.generation)
    other = (1 - newest.index) * capacity
    return newest, len(whole) == 1 and any(image[other : other + HEADER_SIZE])


def _open(path: Path, flags: int) -> int:
    """A regular file at ``path``, never through a symlink."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise OSError(errno.ELOOP, "a symlink (never followed)", str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def _read(path: Path) -> bytes | None:
    """The file's bytes; None when there is none."""
    try:
        fd = _open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read()
        except OSError as exc:
            raise StateError(f"cannot read {path}: {exc.strerror}") from exc


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _parse(path: Path, raw: bytes) -> list[Vgpu]:
    """The vGPUs of a JSON document (a slot's payload, or vgpus.json),
    checked as the API checks a request; StateError names ``path`` and
    the field, in one line."""
    try:
        doc = json.loads(raw.decode())
    except UnicodeDecodeError as exc:
        raise StateError(f"{path} is corrupt: not UTF-8 (byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise StateError(f"{path} is corrupt: not JSON ({exc})") from None
    if isinstance(doc, dict) and doc.get("version") != FORMAT_VERSION:
        raise StateError(
            f"{path} has format version {doc.get('version')!r}, this vgpud reads {FORMAT_VERSION}"
        )
    try:
        vgpus = _fields(doc, DOC_FIELDS)["vgpus"]
        if not isinstance(vgpus, list):
            raise Unprocessable("vgpus: a list")
    except Unprocessable as exc:
        raise StateError(f"{path} is corrupt: {exc.detail}") from None
    out = []
    for i, d in enumerate(vgpus):
        try:
            out.append(vgpu_from_json(d))
        except Unprocessable as exc:
            raise StateError(f"{path} is corrupt: vgpus[{i}]: {exc.detail}") from None
    try:
        check_node(out)
    except StateError as exc:
        raise StateError(f"{path} is corrupt: {exc}") from None
    return out


@dataclass
class _Open:
    """vgpus.state, open for saves in place."""

    fd: int
    ident: tuple[int, int]  # (st_dev, st_ino): still the file at the path?
    capacity: int
    slot: int  # the slot that holds the newest save
    generation: int


class StateStore:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / STATE_FILE
        self.old_path = self.dir / OLD_STATE_FILE
        # Each vGPU's line, kept while its record is the same object (records
        # are immutable): a save encodes what changed, not the whole node.
        self._lines: dict[str, tuple[Vgpu, bytes]] = {}
        self._file: _Open | None = None
        # Closes the open file's fd when the store goes (never while a
        # thread saves: that thread holds the store).
        self._closer: weakref.finalize[Any, Any] | None = None

    def load(self) -> list[Vgpu]:
        """The recorded vGPUs; none when there is no file yet. StateError
        names what is wrong, never a traceback."""
        image = _read(self.path)
        if image is None:
            old = _read(self.old_path)
            return [] if old is None else _parse(self.old_path, old)
        newest, cut_short = _newest(self.path, image)
        if cut_short:
            log.info(
                "the state file's newest save was cut short before it was answered: "
                "the save before it is loaded",
                path=str(self.path),
                slot=newest.index,
                generation=newest.generation,
            )
        return _parse(self.path, newest.payload)

    def remove_superseded(self) -> Path | None:
        """Remove vgpus.json when vgpus.state exists (a crash between writing
        the one and removing the other: vgpus.state is the later save).
        Never a symlink. Returns what was removed; the caller logs it."""
        try:
            if not (
                stat.S_ISREG(os.lstat(self.path).st_mode)
                and stat.S_ISREG(os.lstat(self.old_path).st_mode)
            ):
                return None
            os.unlink(self.old_path)
        except FileNotFoundError:
            return None
        return self.old_path

    def save(self, vgpus: Iterable[Vgpu]) -> None:
        self.write(self.encode(vgpus))

    def encode(self, vgpus: Iterable[Vgpu]) -> bytes:
        """The document's bytes: one vGPU a line (readable, and each line is
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
        """Save ``data`` durably (see the module's docstring): in place in
        the older slot when it fits, else as a whole new file. Blocking: the
        API calls it on a thread, one save at a time."""
        file = self._opened()
        if file is None or HEADER_SIZE + len(data) > file.capacity:
            self._replace(data, 1 if file is None else file.generation + 1)
            return
        slot, generation = 1 - file.slot, file.generation + 1
        _pwrite_all(file.fd, _header(generation, data) + data, slot * file.capacity)
        os.fdatasync(file.fd)
        # Only now: a save that failed leaves the newest slot as it was,
        # and the next save writes the same older slot again.
        file.slot, file.generation = slot, generation

    def _opened(self) -> _Open | None:
        """vgpus.state open for saves; None when it must be made whole (there
        is none, or it does not read). Opened again when the file at the
        path is not the one open (replaced, or removed)."""
        if self._file is not None:
            try:
                now = os.stat(self.path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != self._file.ident:
                self._adopt(None)
        if self._file is None:
            try:
                fd = _open(self.path, os.O_RDWR)
            except FileNotFoundError:
                return None
            self._adopt(self._reopened(fd))
        return self._file

    def _reopened(self, fd: int) -> _Open | None:
        try:
            st = os.fstat(fd)
            newest, _ = _newest(self.path, os.pread(fd, st.st_size, 0))
        except (OSError, StateError):
            os.close(fd)
            return None
        ident = (st.st_dev, st.st_ino)
        return _Open(fd, ident, st.st_size // 2, newest.index, newest.generation)

    def _adopt(self, file: _Open | None) -> None:
        """Make ``file`` the open one, closing the one before."""
        if self._closer is not None:
            self._closer()
        self._file = file
        self._closer = None if file is None else weakref.finalize(self, os.close, file.fd)

    def _replace(self, data: bytes, generation: int) -> None:
        """A whole new file, ``data`` in slot 0, through the atomic path: a
        crash at any instant leaves the old file or the new one."""
        capacity = max(MIN_SLOT, 1 << (2 * (HEADER_SIZE + len(data)) - 1).bit_length())
        image = _header(generation, data) + data
        make_dirs(self.dir, STATE_DIR_MODE)
        fd, tmp = tempfile.mkstemp(prefix=f".{STATE_FILE}.", dir=self.dir)
        try:
            # Zeros written, not a hole nor fallocate's unwritten extents: a
            # save in place must find its blocks there (no allocation, no
            # metadata to commit, no ENOSPC).
            _pwrite_all(fd, image + bytes(2 * capacity - len(image)), 0)
            os.fsync(fd)
            st = os.fstat(fd)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        self._adopt(_Open(fd, (st.st_dev, st.st_ino), capacity, 0, generation))
        dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)  # the rename itself must survive a power cut
        finally:
            os.close(dir_fd)
        # vgpus.state is durable: vgpus.json is not needed any more. Its
        # unlink needs no fsync: if a crash undoes it, vgpus.state still
        # wins and the next start removes it again.
        self.remove_superseded()
