"""Request bodies and query strings: parsed strictly into domain requests.

Anything the document (openapi.json) does not allow is refused as a whole
before anything changes: unknown fields, wrong types (a bool is not a
number), values out of range. 422 with the field named.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from vgpud.errors import Unprocessable
from vgpud.vgpus import fields
from vgpud.vgpus.fields import MAX_GPUS
from vgpud.vgpus.model import CreateRequest, UpdateRequest

# Query integers (event sequence numbers): what a signed 64-bit counter holds.
MAX_QUERY_INT = 2**63 - 1
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
    obj = fields.object_with(body, CREATE_FIELDS)
    gpus = fields.gpus(obj.get("gpus", ["any"]))
    count = fields.integer(obj, "count", 1, MAX_GPUS, default=1)
    if gpus != ("any",) and "count" in obj and count != len(gpus):
        raise Unprocessable('count: only with gpus ["any"] (the GPUs named give the count)')
    return CreateRequest(
        name=fields.optional(obj, "name", fields.text("name")),
        gpus=gpus,
        count=count if gpus == ("any",) else len(gpus),
        memory=fields.optional(obj, "memory", fields.memory),
        share=fields.optional_integer(obj, "share", 1, 100),
        mode=fields.optional(obj, "mode", fields.mode),
        weight=fields.optional_integer(obj, "weight", 1, 1000),
        oversubscribe=fields.boolean(obj, "oversubscribe"),
        exclusive=fields.boolean(obj, "exclusive"),
        labels=fields.string_map(obj.get("labels", {}), "labels"),
        owner=fields.string_map(obj.get("owner", {}), "owner"),
        user=fields.optional(obj, "user", fields.user),
    )


def parse_update(body: object) -> UpdateRequest:
    obj = fields.object_with(body, UPDATE_FIELDS)
    if not obj:
        raise Unprocessable("nothing to change: give memory, share, mode or weight")
    return UpdateRequest(
        memory=fields.optional(obj, "memory", fields.memory),
        share=fields.optional_integer(obj, "share", 1, 100),
        mode=fields.optional(obj, "mode", fields.mode),
        weight=fields.optional_integer(obj, "weight", 1, 1000),
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
        raise Unprocessable(f"{key}: an integer 0..{MAX_QUERY_INT}, not {fields.short(value)}")
    return int(value)


def parse_label_query(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise Unprocessable(f"label: use key=value, not {value!r}")
    return key, val
