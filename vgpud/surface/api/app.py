"""The HTTP API (aiohttp): routes, error answers, request timing.

Every error is JSON {"error": code, "detail": text} with its 4xx/5xx status,
including aiohttp's own (unknown route 404, wrong method 405, body over
max_request_bytes 413) and a body that does not arrive within
request_body_timeout (408, and the connection is closed). Handlers are
thin: parse, call the Service, answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from importlib import resources
from typing import Any

import structlog
from aiohttp import web

from vgpud.errors import ApiError, BadRequest, PayloadTooLarge, RequestTimeout, Unprocessable
from vgpud.surface.api import schemas
from vgpud.surface.events import Event, EventLog
from vgpud.surface.metrics import CONTENT_TYPE, Metrics
from vgpud.surface.service import Service
from vgpud.vgpus.model import Credentials

log = structlog.get_logger(__name__)

SERVICE = web.AppKey("service", Service)
METRICS = web.AppKey("metrics", Metrics)
EVENTS = web.AppKey("events", EventLog)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# No request of openapi.json nests deeper than 2 (an object of label objects);
# 8 leaves room to grow and keeps a hostile body's walk short.
MAX_JSON_DEPTH = 8
# The request histogram's `method` label: HTTP's methods, and "other" for
# any other a client sends (HTTP allows any token; aiohttp's C parser takes
# some thirty, its Python parser any): each value is a series the daemon
# keeps, and shows at every scrape, for ever.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def make_app(service: Service, metrics: Metrics) -> web.Application:
    app = web.Application(
        client_max_size=service.config.max_request_bytes,
        middlewares=[_timing, _errors],
    )
    app[SERVICE] = service
    app[METRICS] = metrics
    app[EVENTS] = service.events
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/devices", devices)
    app.router.add_get("/v1/vgpus", list_vgpus)
    app.router.add_post("/v1/vgpus", create_vgpu)
    app.router.add_get("/v1/vgpus/{id}", get_vgpu)
    app.router.add_patch("/v1/vgpus/{id}", update_vgpu)
    app.router.add_delete("/v1/vgpus/{id}", delete_vgpu)
    app.router.add_get("/v1/processes", processes)
    app.router.add_get("/v1/events", events)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/openapi.json", openapi)
    return app


def make_metrics_app(metrics: Metrics) -> web.Application:
    """/metrics alone, for the optional TCP listener."""
    app = web.Application()
    app[METRICS] = metrics
    app.router.add_get("/metrics", metrics_handler)
    return app


def openapi_document() -> dict[str, Any]:
    text = resources.files("vgpud.surface.api").joinpath("openapi.json").read_text()
    doc: dict[str, Any] = json.loads(text)
    return doc


# --- middleware ---------------------------------------------------------------


def error_response(status: int, code: str, detail: str) -> web.Response:
    return web.json_response({"error": code, "detail": detail}, status=status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        response = error_response(exc.status, exc.code, exc.detail)
        if exc.close_connection:
            response.force_close()
        return response
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SERVICE].config.max_request_bytes
        err = PayloadTooLarge(f"the body is over the {limit} bytes this daemon accepts")
        return error_response(err.status, err.code, err.detail)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        return error_response(exc.status, code, exc.reason)
    except Exception:
        log.exception("API handler failed", method=request.method, path=request.path)
        return error_response(500, "internal", "internal error; see the daemon's log")


@web.middleware
async def _timing(request: web.Request, handler: Handler) -> web.StreamResponse:
    start = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    finally:
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        method = request.method if request.method in HTTP_METHODS else "other"
        request.app[METRICS].request_seconds.labels(method, name, str(status)).observe(
            time.perf_counter() - start
        )


# --- handlers -----------------------------------------------------------------


async def _json_body(request: web.Request) -> object:
    """The body as strict JSON (RFC 8259: no NaN or Infinity, no key given
    twice), nested at most MAX_JSON_DEPTH deep; anything else is a 400.
    Python's parser takes all of those, and a body nested thousands deep
    ends in RecursionError: each must be the client's error, not a 500."""
    limit = request.app[SERVICE].config.request_body_timeout
    try:
        async with asyncio.timeout(limit):
            raw = await request.read()
    except TimeoutError:
        raise RequestTimeout(f"the body did not arrive within {limit:g} s") from None
    try:
        body = json.loads(raw, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise BadRequest(f"the body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if _depth(body) > MAX_JSON_DEPTH:
        raise BadRequest(f"the body is nested deeper than {MAX_JSON_DEPTH} levels")
    return body


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:  # which one counts would differ between parsers
            raise ValueError(f"key {key!r} given twice")
        out[key] = value
    return out


def _depth(value: object) -> int:
    """How deep arrays and objects nest (a scalar is 0), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        )
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest


async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return _json(service, "health", service.health_json)


async def devices(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return _json(service, "devices", service.devices_json)


async def list_vgpus(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    q = request.query
    label = q.get("label")
    if label is not None:
        schemas.parse_label_query(label)
    gpu, owner_pod = q.get("gpu"), q.get("owner_pod")
    return _rendered(
        service, ("vgpus", gpu, label, owner_pod), lambda: service.list_body(gpu, label, owner_pod)
    )


async def create_vgpu(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    req = schemas.parse_create(await _json_body(request))
    entry = await service.create(req, caller(request))
    return web.Response(body=service.vgpu_body(entry), status=201, content_type="application/json")


def caller(request: web.Request) -> Credentials:
    """Who sent the request, as the kernel vouches for it: SO_PEERCRED of the
    unix socket (a body cannot claim it). The API listens on that socket
    alone (daemon.py); a TCP peer, which only tests use, has no credentials
    and counts as the daemon's own user."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family != socket.AF_UNIX:
        return Credentials(os.geteuid(), os.getegid())
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
    _pid, uid, gid = struct.unpack("iII", raw)
    return Credentials(uid, gid)


async def get_vgpu(request: web.Request) -> web.Response:
    # Not rendered once per snapshot: one vGPU's answer is cheap (its bytes
    # are kept on the snapshot's vGPU), and its usage counters must be the
    # latest, so that a peak or an OOM written just before a process exits
    # shows in the next GET (Service.find_body).
    service, key = request.app[SERVICE], request.match_info["id"]
    return web.Response(body=service.find_body(key), content_type="application/json")


async def update_vgpu(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    key = request.match_info["id"]
    # 404 (or 409 for a standalone vGPU) before a body error: the id is the first thing wrong.
    service.refuse_standalone(key)
    service.registry.get(key)
    req = schemas.parse_update(await _json_body(request))
    entry, warnings = await service.update(key, req)
    return web.json_response({**service.vgpu_json(entry), "warnings": warnings})


async def delete_vgpu(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    force = schemas.parse_bool_query(request.query, "force")
    vgpu = await service.delete(request.match_info["id"], force)
    return web.json_response({"deleted": vgpu.id})


async def processes(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return _rendered(service, "processes", service.processes_body)


def _json(service: Service, key: Hashable, build: Callable[[], object]) -> web.Response:
    """A read route's answer, rendered once per snapshot of the node."""
    return _rendered(service, key, lambda: json.dumps(build()).encode())


def _rendered(service: Service, key: Hashable, build: Callable[[], bytes]) -> web.Response:
    body = service.rendered(key, build)
    return web.Response(body=body, content_type="application/json")


async def events(request: web.Request) -> web.StreamResponse:
    """NDJSON by default, server-sent events with Accept: text/event-stream
    or ?format=sse. ?since=N resumes after event N; ?follow=false ends after
    the backlog (all of it without ?since=) instead of streaming new events."""
    log_ = request.app[EVENTS]
    follow = schemas.parse_bool_query(request.query, "follow", default=True)
    # A follower with no ?since= gets what happens from now on, not the
    # whole buffer again; a one-off read (follow=false) gets the buffer.
    since = schemas.parse_int_query(request.query, "since", log_.last_seq if follow else 0)
    fmt = request.query.get("format")
    if fmt not in (None, "ndjson", "sse"):
        raise Unprocessable(f"format: ndjson or sse, not {fmt!r}")
    sse = fmt == "sse" or (fmt is None and "text/event-stream" in request.headers.get("Accept", ""))
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream" if sse else "application/x-ndjson",
            "Cache-Control": "no-cache",
        }
    )
    await response.prepare(request)
    source = log_.follow(since) if follow else _replay(log_, since)
    try:
        async for event in source:
            line = json.dumps(event.to_json())
            data = f"id: {event.seq}\nevent: {event.type}\ndata: {line}\n\n" if sse else line + "\n"
            await response.write(data.encode())
        await response.write_eof()
    except ConnectionResetError:  # the follower left: the ordinary end of a stream
        log.debug("events follower disconnected")
    return response


async def _replay(log_: EventLog, since: int) -> AsyncIterator[Event]:
    for event in log_.read(since):
        yield event


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())
