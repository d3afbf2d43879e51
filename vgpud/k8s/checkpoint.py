"""The DRA driver's record of prepared claims, so that NodePrepareResources
is idempotent across plugin restarts: a claim prepared once answers the same
devices again, and its vGPUs are not made twice. One JSON file, replaced
atomically (write, fsync, rename) on every change."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

VERSION = 1


@dataclass(frozen=True)
class PreparedDevice:
    request_names: list[str]
    pool: str
    device: str
    cdi_ids: list[str]
    vgpu: str  # the vGPU's id in vgpud


@dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: list[PreparedDevice]


class Checkpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.claims: dict[str, PreparedClaim] = self._load()

    def get(self, uid: str) -> PreparedClaim | None:
        return self.claims.get(uid)

    def put(self, uid: str, claim: PreparedClaim) -> None:
        self.claims[uid] = claim
        self._save()

    def drop(self, uid: str) -> None:
        if self.claims.pop(uid, None) is not None:
            self._save()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            data: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        if data.get("version") != VERSION:
            raise ValueError(f"{self.path}: checkpoint version {data.get('version')!r} unknown")
        return {
            uid: PreparedClaim(
                c["namespace"], c["name"], [PreparedDevice(**d) for d in c["devices"]]
            )
            for uid, c in data["claims"].items()
        }

    def _save(self) -> None:
        data = {"version": VERSION, "claims": {u: asdict(c) for u, c in self.claims.items()}}
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
