"""An in-process API (real app, fake GPUs) and OpenAPI response validation."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from aiohttp.test_utils import TestClient, TestServer

from tests.unit.fakes import FakeInventory, gpus
from vgpud.config import Config
from vgpud.surface.api.app import make_app, openapi_document
from vgpud.surface.events import EventLog, publish_adoption
from vgpud.surface.metrics import Metrics
from vgpud.surface.service import Service
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.registry import Registry
from vgpud.vgpus.state import StateStore


@dataclass
class Api:
    client: TestClient[Any, Any]
    service: Service
    inventory: FakeInventory
    tmp: Path


async def get_ok(api: Api, path: str) -> Any:
    """GET path, which must answer 200; its JSON body."""
    r = await api.client.get(path)
    body = await r.json()
    assert r.status == 200, body
    return body


@asynccontextmanager
async def running_api(
    tmp: Path, config: Config | None = None, ngpus: int = 2
) -> AsyncIterator[Api]:
    config = config or Config(run_dir=str(tmp / "run"), state_dir=str(tmp / "state"))
    events = EventLog(config.event_buffer)
    registry = Registry(
        Path(config.run_dir),
        StateStore(Path(config.state_dir)),
        tmp / "libvgpu.so",
        Atomics.load(),
    )
    publish_adoption(events, registry.adopt())
    inventory = FakeInventory(gpus(ngpus))
    service = Service(config, registry, inventory, events)
    app = make_app(service, Metrics(service))
    async with TestClient(TestServer(app)) as client:
        yield Api(client, service, inventory, tmp)
    registry.close()


def _openapi_30_to_jsonschema(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` is not JSON Schema: turn it into a null option."""
    if isinstance(node, list):
        return [_openapi_30_to_jsonschema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _openapi_30_to_jsonschema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


DOCUMENT = openapi_document()
_COMPONENTS = _openapi_30_to_jsonschema(copy.deepcopy(DOCUMENT["components"]))


def response_schema(path: str, method: str, status: int, ctype: str = "application/json") -> Any:
    op = DOCUMENT["paths"][path][method.lower()]
    response = op["responses"][str(status)]
    return response["content"][ctype]["schema"]


def validate(
    body: Any, path: str, method: str, status: int, ctype: str = "application/json"
) -> None:
    """Fail unless ``body`` is what the document promises for this answer."""
    schema = {
        **_openapi_30_to_jsonschema(response_schema(path, method, status, ctype)),
        "components": _COMPONENTS,
    }
    jsonschema.validate(body, schema)
