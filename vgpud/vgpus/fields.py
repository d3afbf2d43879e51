"""The fields of a vGPU's description, each parsed strictly: the API's
request bodies (surface/api/schemas.py) and the state file
(vgpus/state.py) share them, so that a vGPU the state file restores meets
exactly the rules a vGPU the API creates meets. Each raises Unprocessable
(422) with the field named.
"""

from __future__ import annotations

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
from vgpud.vgpus.model import MODES, BlockUser

MAX_GPUS = 16
MAX_LABELS = 64
MAX_TEXT = 253
# A uid or gid: uid_t is 32 bits and (uid_t)-1 means "no change" to chown.
MAX_ID = 2**32 - 2


def object_with(body: object, allowed: frozenset[str], key: str | None = None) -> dict[str, Any]:
    """A JSON object with no field outside ``allowed``: the body, or field ``key``."""
    if not isinstance(body, dict):
        raise Unprocessable(f"{key}: a JSON object" if key else "the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        where = f" in {key}" if key else ""
        raise Unprocessable(f"unknown field(s){where}: {', '.join(unknown)}")
    return body


def optional(obj: Mapping[str, Any], key: str, parse: Callable[[Any], Any]) -> Any:
    if key not in obj or obj[key] is None:
        return None
    return parse(obj[key])


def integer(
    obj: Mapping[str, Any], key: str, low: int, high: int, *, default: int, what: str = ""
) -> int:
    what = what or key
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unprocessable(f"{what}: an integer {low}..{high}, not {short(value)}")
    if not low <= value <= high:
        raise Unprocessable(f"{what}: {short(value)} is outside {low}..{high}")
    return int(value)


def short(value: object) -> str:
    """A value for an error's detail: a 4000-digit number is not repeated."""
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


def optional_integer(obj: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    if key not in obj or obj[key] is None:
        return None
    return integer(obj, key, low, high, default=low)


def boolean(obj: Mapping[str, Any], key: str) -> bool:
    value = obj.get(key, False)
    if not isinstance(value, bool):
        raise Unprocessable(f"{key}: true or false, not {value!r}")
    return value


def text(key: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if not isinstance(value, str) or not 0 < len(value) <= MAX_TEXT:
            raise Unprocessable(f"{key}: a string of 1..{MAX_TEXT} characters")
        return value

    return parse


def memory(value: Any) -> MemoryAmount:
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


def mode(value: Any) -> str:
    if value not in MODES:
        raise Unprocessable(f"mode: {' or '.join(MODES)}, not {value!r}")
    return str(value)


def user(value: Any) -> BlockUser:
    """{"uid": N} or {"uid": N, "gid": M}: host ids, 0..MAX_ID."""
    obj = object_with(value, frozenset({"uid", "gid"}), "user")
    if "uid" not in obj:
        raise Unprocessable("user: uid is required")
    uid = integer(obj, "uid", 0, MAX_ID, default=0, what="user.uid")
    gid = (
        None
        if obj.get("gid") is None
        else integer(obj, "gid", 0, MAX_ID, default=0, what="user.gid")
    )
    return BlockUser(uid, gid)


def gpus(value: Any) -> tuple[str, ...]:
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


def string_map(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_LABELS:
        raise Unprocessable(f"{key}: an object of at most {MAX_LABELS} string values")
    for k, v in value.items():
        if not isinstance(v, str) or not 0 < len(k) <= MAX_TEXT or len(v) > MAX_TEXT:
            raise Unprocessable(f"{key}: {k!r} must map to a string (keys 1..{MAX_TEXT} chars)")
    return dict(value)
