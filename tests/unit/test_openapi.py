"""openapi.json and the app's router describe the same API, route for route."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import jsonschema

from tests.unit.apiclient import DOCUMENT
from tests.unit.fakes import FakeInventory
from vgpud.config import Config
from vgpud.surface import events
from vgpud.surface.api.app import make_app
from vgpud.surface.events import EventLog
from vgpud.surface.metrics import Metrics
from vgpud.surface.service import Service

HTTP_METHODS = {"get", "post", "put", "patch", "delete", "head", "options"}


def router_operations(tmp_path: Path) -> set[tuple[str, str]]:
    no_vgpus = SimpleNamespace(all=list, entries={})  # the routes, not a registry, are looked at
    service = Service(Config(), no_vgpus, FakeInventory([]), EventLog(10))  # type: ignore[arg-type]
    app = make_app(service, Metrics(service))
    out = set()
    for route in app.router.routes():
        method = route.method.lower()
        if method == "head":  # aiohttp adds HEAD to every GET by itself
            continue
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter")
        out.add((method, re.sub(r"\{(\w+)\}", r"{\1}", str(path))))
    return out


def document_operations() -> set[tuple[str, str]]:
    return {
        (method, path)
        for path, item in DOCUMENT["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def test_every_route_is_documented_and_every_documented_route_exists(tmp_path: Path) -> None:
    served = router_operations(tmp_path)
    documented = document_operations()
    assert served - documented == set(), "served but not in openapi.json"
    assert documented - served == set(), "in openapi.json but not served"


def test_the_document_is_well_formed() -> None:
    refs = set(re.findall(r'"#/components/schemas/(\w+)"', str(DOCUMENT).replace("'", '"')))
    assert refs <= set(DOCUMENT["components"]["schemas"])
    for schema in DOCUMENT["components"]["schemas"].values():
        jsonschema.Draft7Validator.check_schema(schema)
    for path, item in DOCUMENT["paths"].items():
        for method, op in item.items():
            if method in HTTP_METHODS:
                assert "200" in op["responses"] or "201" in op["responses"], (method, path)


def test_every_event_type_the_daemon_sends_is_in_the_document() -> None:
    """A client that validates the stream against the document (or
    switches on its enum) must know every type: usage.drift was sent and
    missing."""
    sent = {v for k, v in vars(events).items() if k.isupper() and isinstance(v, str)}
    enum = DOCUMENT["components"]["schemas"]["Event"]["properties"]["type"]["enum"]
    assert sent == set(enum)
