"""The DRA kubelet plugin (``v1.DRAPlugin``): a prepared claim is one vGPU
per device allocated to it, of exactly the memory and cores the claim
consumed (consumable capacity) or the whole GPU (otherwise); unprepare
deletes them. Claims are read from the API server (the kubelet sends only
their namespace, name and uid); the answer per claim is its CDI ids."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import grpc
import structlog
from kubernetes import client as k8s
from kubernetes.utils import parse_quantity

from vgpud.k8s.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from vgpud.k8s.daemon import MANAGED_BY, ApiFailure, Daemon, DaemonUnreachable, Gpu
from vgpud.k8s.drahealth import Health
from vgpud.k8s.proto.dra.v1 import api_pb2 as dra
from vgpud.k8s.proto.dra.v1 import api_pb2_grpc as dra_grpc
from vgpud.k8s.proto.drahealth.v1alpha1 import api_pb2_grpc as health_grpc
from vgpud.k8s.resources import CORES_PER_GPU, BadRequest
from vgpud.k8s.slices import DRIVER, device_name

DRA_OWNER = "dra"
# Each claim's vGPUs carry its uid: found by it when no checkpoint says.
CLAIM_UID = "vgpud.io/claim-uid"
log = structlog.get_logger(__name__)


class Claims(Protocol):
    async def get(self, namespace: str, name: str) -> k8s.ResourceV1ResourceClaim: ...


class ApiClaims:
    """ResourceClaims from the API server."""

    def __init__(self, api: k8s.ResourceV1Api) -> None:
        self.api = api

    async def get(self, namespace: str, name: str) -> k8s.ResourceV1ResourceClaim:
        return await asyncio.to_thread(self.api.read_namespaced_resource_claim, name, namespace)


def ours(claim: Any) -> list[Any]:
    """The allocation results of ``claim`` that are this driver's."""
    allocation = claim.status.allocation if claim.status else None
    if allocation is None or allocation.devices is None:
        return []
    return [r for r in allocation.devices.results or [] if r.driver == DRIVER]


def vgpu_body(claim_uid: str, results: Sequence[Any], gpus: Mapping[str, Gpu]) -> dict[str, Any]:
    """The claim's one vGPU, over every GPU allocated to it: a container is
    given a claim's devices together, and it holds one vGPU (its blocks are
    mounted at fixed paths, its variables name one vGPU). A vGPU has the
    same memory and share on each of its GPUs, so the devices must have been
    given the same: what the claim consumed of each, or all of each when the
    API server allocates whole devices (whole GPUs of unequal memory are
    refused)."""
    chosen: list[Gpu] = []
    sizes = set()
    for result in results:
        gpu = gpus.get(result.device)
        if gpu is None:
            raise BadRequest(f"device {result.device!r} is not on this node")
        if gpu in chosen:
            raise BadRequest(f"two of the claim's devices are {result.device!r}: one vGPU each GPU")
        chosen.append(gpu)
        sizes.add(_consumed(result, gpu))
    if len(sizes) != 1:
        raise BadRequest(
            "the claim's devices consume different memory or cores: its one vGPU has the same"
            " on each GPU"
        )
    [(memory, cores)] = sizes
    return {
        "name": f"dra-{claim_uid}-0",
        "gpus": [g.uuid for g in chosen],
        "memory": memory,
        "share": cores,
        "labels": {MANAGED_BY: DRA_OWNER, CLAIM_UID: claim_uid},
    }


def _consumed(result: Any, gpu: Gpu) -> tuple[int, int]:
    """Memory and cores one allocated device gives the claim."""
    consumed = result.consumed_capacity or {}
    memory = _quantity(consumed["memory"]) if "memory" in consumed else gpu.memory_total
    cores = _quantity(consumed["cores"]) if "cores" in consumed else CORES_PER_GPU
    if not 1 <= cores <= CORES_PER_GPU:
        raise BadRequest(f"cores {cores}: a share is 1-100")
    if memory > gpu.memory_total:
        raise BadRequest(f"memory {memory} bytes: more than {result.device} holds")
    return memory, cores


class Driver(dra_grpc.DRAPluginServicer):
    def __init__(
        self,
        daemon: Daemon,
        claims: Claims,
        checkpoint: Checkpoint,
        user: dict[str, int] | None = None,
    ) -> None:
        self.daemon = daemon
        self.claims = claims
        self.checkpoint = checkpoint
        self.user = user
        self._lock = asyncio.Lock()  # one claim change at a time: the checkpoint is one file

    async def NodePrepareResources(
        self, request: dra.NodePrepareResourcesRequest, context: Any
    ) -> dra.NodePrepareResourcesResponse:
        answer = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            try:
                prepared = await self.prepare(claim.namespace, claim.name, claim.uid)
            except (BadRequest, ApiFailure, DaemonUnreachable, k8s.ApiException) as exc:
                log.warning("claim not prepared", claim=claim.uid, reason=_reason(exc))
                answer.claims[claim.uid].error = f"{claim.namespace}/{claim.name}: {_reason(exc)}"
                continue
            answer.claims[claim.uid].devices.extend(
                dra.Device(
                    request_names=d.request_names,
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=d.cdi_ids,
                )
                for d in prepared.devices
            )
        return answer

    async def NodeUnprepareResources(
        self, request: dra.NodeUnprepareResourcesRequest, context: Any
    ) -> dra.NodeUnprepareResourcesResponse:
        answer = dra.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            try:
                await self.unprepare(claim.uid)
            except (BadRequest, ApiFailure, DaemonUnreachable) as exc:
                answer.claims[claim.uid].error = _reason(exc)
            else:
                answer.claims[claim.uid].SetInParent()
        return answer

    async def prepare(self, namespace: str, name: str, uid: str) -> PreparedClaim:
        async with self._lock:
            done = self.checkpoint.get(uid)
            if done is not None:
                return done
            claim = await self.claims.get(namespace, name)
            found = claim.metadata.uid if claim.metadata else None
            if found != uid:
                raise BadRequest(f"the claim is now another one (uid {found})")
            results = ours(claim)
            if not results:
                raise BadRequest("no device of this driver is allocated to the claim")
            gpus = {device_name(g): g for g in await self.daemon.gpus()}
            body = vgpu_body(uid, results, gpus)
            if self.user is not None:
                body["user"] = self.user
            vgpu = await self._create(body)
            # The vGPU's CDI device comes with the first device only: a
            # container is given each of the claim's devices' ids.
            made = [
                PreparedDevice(
                    [r.request],
                    r.pool,
                    r.device,
                    [vgpu["recipe"]["cdi_device"]] if n == 0 else [],
                    vgpu["id"],
                )
                for n, r in enumerate(results)
            ]
            prepared = PreparedClaim(namespace, name, made)
            self.checkpoint.put(uid, prepared)
            log.info("claim prepared", claim=f"{namespace}/{name}", vgpus=[d.vgpu for d in made])
            return prepared

    async def unprepare(self, uid: str) -> None:
        async with self._lock:
            done = self.checkpoint.get(uid)
            if done is None:
                # Never prepared here, already unprepared, or prepared up to
                # a crash before the checkpoint: what that left is found by
                # the claim's label, never left for good.
                made = await self.daemon.vgpus(DRA_OWNER)
                await self._delete([v["id"] for v in made if v["labels"].get(CLAIM_UID) == uid])
                return
            await self._delete([d.vgpu for d in done.devices])
            self.checkpoint.drop(uid)
            log.info("claim unprepared", claim=uid)

    async def _delete(self, vgpus: Sequence[str]) -> None:
        """A claim's vGPUs gone (those gone already included; each once,
        though several devices name it); refused while one still has
        processes."""
        for vgpu in dict.fromkeys(vgpus):
            if await self.daemon.vgpu(vgpu) is None:
                continue
            if not await self.daemon.delete(vgpu):
                raise BadRequest(f"vGPU {vgpu} still has processes")

    async def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Make the vGPU; one of that name left by a crash before the
        checkpoint was written is taken over rather than made twice."""
        try:
            return await self.daemon.create(body)
        except ApiFailure as exc:
            existing = await self.daemon.vgpu(body["name"]) if exc.status == 409 else None
            if existing is None or existing["labels"].get(MANAGED_BY) != DRA_OWNER:
                raise
            return existing


def _quantity(text: str) -> int:
    """A Kubernetes quantity ("8Gi", "30") as a whole number."""
    value = parse_quantity(text)  # type: ignore[no-untyped-call]
    if value != int(value):
        raise BadRequest(f"{text!r} is not a whole number")
    return int(value)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ApiFailure):
        return f"vgpud refused: {exc.detail}"
    if isinstance(exc, k8s.ApiException):
        return f"reading the claim: {exc.status} {exc.reason}"
    return str(exc)


def grpc_server(driver: Driver, health: Health, socket_path: str) -> grpc.aio.Server:
    """The driver's socket: claims and device health, as registration lists them."""
    server = grpc.aio.server()
    dra_grpc.add_DRAPluginServicer_to_server(driver, server)
    health_grpc.add_DRAResourceHealthServicer_to_server(health, server)
    server.add_insecure_port(f"unix://{socket_path}")
    return server


__all__: Sequence[str] = ["ApiClaims", "Claims", "Driver", "grpc_server", "ours", "vgpu_body"]
