"""Fuzz the API from its own OpenAPI document (schemathesis): valid and
invalid requests alike must never get a 5xx, and every answer must be what
the document says (status, content type, schema).

The app runs in process on a loopback TCP port (the real app, real blocks
in a tmp dir, two fake GPUs); the event stream is left out (it streams
until the client goes, which a fuzzer does not do; tests/unit/test_api.py
covers it).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis import DataGenerationMethod
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.unit.fakes import FakeInventory, gpus
from vgpud.config import Config
from vgpud.surface.api.app import make_app, openapi_document
from vgpud.surface.events import EventLog
from vgpud.surface.metrics import Metrics
from vgpud.surface.service import Service
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.registry import Registry
from vgpud.vgpus.state import StateStore

EXAMPLES = 40  # per operation and generation method: the whole file stays well under 60 s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner: dict[str, Any] = {}

    async def start() -> None:
        config = Config(run_dir=str(tmp / "run"), state_dir=str(tmp / "state"))
        events = EventLog(100)
        registry = Registry(tmp / "run", StateStore(tmp / "state"), tmp / "lib.so", Atomics.load())
        registry.adopt()
        service = Service(config, registry, FakeInventory(gpus(2)), events)
        app_runner = web.AppRunner(make_app(service, Metrics(service)), access_log=None)
        await app_runner.setup()
        await web.TCPSite(app_runner, "127.0.0.1", port).start()
        runner["runner"] = app_runner

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(30)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner["runner"].cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


@pytest.fixture(scope="module")
def api_schema(base_url: str) -> Any:
    return schemathesis.from_dict(
        openapi_document(),
        base_url=base_url,
        data_generation_methods=[DataGenerationMethod.positive, DataGenerationMethod.negative],
    )


schema = schemathesis.from_pytest_fixture("api_schema")


@schema.exclude(path="/v1/events").parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_api_conforms_to_its_document(case: Any) -> None:
    case.call_and_validate(
        checks=(
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ),
        timeout=10,
    )
