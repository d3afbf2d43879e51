"""A stand-in for the API server's few routes the DRA driver uses: read a
ResourceClaim; read, create and replace a ResourceSlice (with
resourceVersion checks). Plain JSON over HTTP on 127.0.0.1, served by
aiohttp on a thread of its own; objects go in and out as the official
``kubernetes`` client models serialize them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes import client as k8s

from tests.k8s.loop import LoopThread

V1 = "/apis/resource.k8s.io/v1"


class ApiServer:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.slices: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self._version = 0
        self._thread = LoopThread()
        self._runner: web.AppRunner | None = None
        self.port = self._thread.run(self._start())

    def put_claim(self, claim: Any) -> None:
        data = k8s.ApiClient().sanitize_for_serialization(claim)
        meta = data["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = data

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
            f"clusters: [{{name: test, cluster: {{server: 'http://127.0.0.1:{self.port}'}}}}]\n"
            "users: [{name: test, user: {}}]\n"
            "contexts: [{name: test, context: {cluster: test, user: test}}]\n"
        )
        return path

    def close(self) -> None:
        if self._runner is not None:
            self._thread.run(self._runner.cleanup())
        self._thread.close()

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_get(V1 + "/namespaces/{ns}/resourceclaims/{name}", self._claim)
        app.router.add_get(V1 + "/resourceslices/{name}", self._slice)
        app.router.add_post(V1 + "/resourceslices", self._create_slice)
        app.router.add_put(V1 + "/resourceslices/{name}", self._replace_slice)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        port: int = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return port

    async def _claim(self, request: web.Request) -> web.Response:
        found = self.claims.get((request.match_info["ns"], request.match_info["name"]))
        return web.json_response(found) if found else _status(404, "NotFound")

    async def _slice(self, request: web.Request) -> web.Response:
        found = self.slices.get(request.match_info["name"])
        return web.json_response(found) if found else _status(404, "NotFound")

    async def _create_slice(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = body["metadata"]["name"]
        if name in self.slices:
            return _status(409, "AlreadyExists")
        return web.json_response(self._store(name, body), status=201)

    async def _replace_slice(self, request: web.Request) -> web.Response:
        body = await request.json()
        name = request.match_info["name"]
        current = self.slices.get(name)
        if current is None:
            return _status(404, "NotFound")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return _status(409, "Conflict")
        return web.json_response(self._store(name, body))

    def _store(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        self.writes += 1
        body["metadata"]["resourceVersion"] = str(self._version)
        self.slices[name] = body
        return body


def _status(code: int, reason: str) -> web.Response:
    return web.json_response(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code},
        status=code,
    )
