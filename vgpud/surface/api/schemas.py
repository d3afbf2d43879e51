"""Request bodies and query strings: parsed strictly into domain requests.

Anything the document (openapi.json) does not allow is refused as a whole
before anything changes: unknown fields, wrong types (a bool is not a
number), values out of range. 422 with the field named.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from vgpud.errors import Unprocessable
from vgpud.units import (
    MAX_VGPU_MEMORY,
    MIN_VGPU_MEMORY,
    MemoryAmount,
    format_bytes,
    parse_memory,
)
from vgpud.vgpus.model import MODES, BlockUser, CreateRequest, UpdateRequest

MAX_GPUS = 16
MAX_LABELS = 64
MAX_TEXT = 253
# Query integers (event sequence numbers): what a signed 64-bit counter holds.
MAX_QUERY_INT = 2**63 - 1
# A uid or gid: uid_t is 32 bits and (uid_t)-1 means "no change" to chown.
MAX_ID = 2**32 - 2
_ASCII_DIGITS = re.compile(r"[0-9]{1,19}")

CREATE_FIELDS = frozenset(
    {
        "name",
        "gpus",
        "count",
        "memory",
        "share",
        "mode",
        "weight",
        "oversubscribe",
        "exclusive",
        "labels",
        "owner",
        "user",
    }
)
UPDATE_FIELDS = frozenset({"memory", "share", "mode", "weight"})


def parse_create(body: object) -> CreateRequest:
    obj = _object(body, CREATE_FIELDS)
    gpus = _gpus(obj.get("gpus", ["any"]))
    count = _int(obj, "count", 1, MAX_GPUS, default=1)
    if gpus != ("any",) and "count" in obj and count != len(gpus):
        raise Unprocessable('count: only with gpus ["any"] (the GPUs named give the count)')
    return CreateRequest(
        name=_opt(obj, "name", _text("name")),
        gpus=gpus,
        count=count if gpus == ("any",) else len(gpus),
        memory=_opt(obj, "memory", _memory),
        share=_opt_int(obj, "share", 1, 100),
        mode=_opt(obj, "mode", _mode),
        weight=_opt_int(obj, "weight", 1, 1000),
        oversubscribe=_bool(obj, "oversubscribe"),
        exclusive=_bool(obj, "exclusive"),
        labels=_string_map(obj.get("labels", {}), "labels"),
        owner=_string_map(obj.get("owner", {}), "owner"),
        user=_opt(obj, "user", _user),
    )


def parse_update(body: object) -> UpdateRequest:
    obj = _object(body, UPDATE_FIELDS)
    if not obj:
        raise Unprocessable("nothing to change: give memory, share, mode or weight")
    return UpdateRequest(
        memory=_opt(obj, "memory", _memory),
        share=_opt_int(obj, "share", 1, 100),
        mode=_opt(obj, "mode", _mode),
        weight=_opt_int(obj, "weight", 1, 1000),
    )


def parse_bool_query(query: Mapping[str, str], key: str, default: bool = False) -> bool:
    value = query.get(key)
    if value is None:
        return default
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise Unprocessable(f"{key}: use true or false, not {value!r}")


def parse_int_query(query: Mapping[str, str], key: str, default: int) -> int:
    """A non-negative integer of at most MAX_QUERY_INT, in ASCII digits
    (str.isdigit alone takes "١٢٣" and "²", and int() of 5000 digits raises)."""
    value = query.get(key)
    if value is None:
        return default
    if not (_ASCII_DIGITS.fullmatch(value) and int(value) <= MAX_QUERY_INT):
        raise Unprocessable(f"{key}: an integer 0..{MAX_QUERY_INT}, not {_short(value)}")
    return int(value)


def parse_label_query(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise Unprocessable(f"label: use key=value, not {value!r}")
    return key, val


# --- pieces -------------------------------------------------------------------


def _object(body: object, allowed: frozenset[str], key: str | None = None) -> dict[str, Any]:
    """A JSON object with no field outside ``allowed``: the body, or field ``key``."""
    if not isinstance(body, dict):
        raise Unprocessable(f"{key}: a JSON object" if key else "the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        where = f" in {key}" if key else ""
        raise Unprocessable(f"unknown field(s){where}: {', '.join(unknown)}")
    return body


def _opt(obj: Mapping[str, Any], key: str, parse: Callable[[Any], Any]) -> Any:
    if key not in obj or obj[key] is None:
        return None
    return parse(obj[key])


def _int(
    obj: Mapping[str, Any], key: str, low: int, high: int, *, default: int, what: str = ""
) -> int:
    what = what or key
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unprocessable(f"{what}: an integer {low}..{high}, not {_short(value)}")
    if not low <= value <= high:
        raise Unprocessable(f"{what}: {_short(value)} is outside {low}..{high}")
    return int(value)


def _short(value: object) -> str:
    """A value for an error's detail: a 4000-digit number is not repeated."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def _opt_int(obj: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    if key not in obj or obj[key] is None:
        return None
    return _int(obj, key, low, high, default=low)


def _bool(obj: Mapping[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise Unprocessable(f"{key}: true or false, not {value!r}")
    return value


def _text(key: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT:
            raise Unprocessable(f"{key}: a string of 1..{MAX_TEXT} characters")
        return value

    return parse


def _memory(value: Any) -> MemoryAmount:
    """A memory limit; in bytes, MIN_VGPU_MEMORY..MAX_VGPU_MEMORY (a
    percentage is checked against that range per GPU, at placement)."""
    try:
        amount = parse_memory(value)
    except ValueError as exc:
        raise Unprocessable(f"memory: {exc}") from None
    if amount.nbytes is not None and not MIN_VGPU_MEMORY <= amount.nbytes <= MAX_VGPU_MEMORY:
        raise Unprocessable(
            f"memory: {amount.nbytes} bytes is outside {format_bytes(MIN_VGPU_MEMORY)}.."
            f"{format_bytes(MAX_VGPU_MEMORY)} (the smallest is one allocation granule)"
        )
    return amount


def _mode(value: Any) -> str:
    if value not in MODES:
        raise Unprocessable(f"mode: {' or '.join(MODES)}, not {value!r}")
    return str(value)


def _user(value: Any) -> BlockUser:
    """{"uid": N} or {"uid": N, "gid": M}: host ids, 0..MAX_ID."""
    obj = _object(value, frozenset({"uid", "gid"}), "user")
    if "uid" not in obj:
        raise Unprocessable("user: uid is required")
    uid = _int(obj, "uid", 0, MAX_ID, default=0, what="user.uid")
    gid = (
        None if obj.get("gid") is None else _int(obj, "gid", 0, MAX_ID, default=0, what="user.gid")
    )
    return BlockUser(uid, gid)


def _gpus(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_GPUS:
        raise Unprocessable(f'gpus: a list of 1..{MAX_GPUS} GPUs (UUIDs or indices) or ["any"]')
    out = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool) and 0 <= item < 1024:
            out.append(str(item))
        elif isinstance(item, str) and 0 < len(item) <= MAX_TEXT:
            out.append(item)
        else:
            raise Unprocessable(f"gpus: {item!r} is neither a GPU UUID nor an index")
    if "any" in out and len(out) > 1:
        raise Unprocessable('gpus: "any" stands alone (use count for several)')
    return tuple(out)


def _string_map(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_LABELS:
        raise Unprocessable(f"{key}: an object of at most {MAX_LABELS} string values")
    for k, v in value.items():
        if not isinstance(v, str) or not 0 < len(k) <= MAX_TEXT or len(v) > MAX_TEXT:
            raise Unprocessable(f"{key}: {k!r} must map to a string (keys 1..{MAX_TEXT} chars)")
    return dict(value)
