"""Placement and admission: which GPUs a vGPU goes on, and whether it fits.

Pure functions over the GPUs, the vGPUs already placed and the rules; no
I/O. Errors carry the HTTP status the API answers with: 422 for a request
that can never be right on this node (unknown GPU, oversubscription
disabled), 409 for one that does not fit now (full, MIG, unhealthy).

Admission per GPU:
- the hard shares of its vGPUs sum to at most 100 (soft shares are not
  admitted against anything: a soft vGPU only gets its share back from
  other soft vGPUs and idle time);
- the memory promised sums to at most physical memory, or physical x
  ``memory_scaling`` for a vGPU that asks for oversubscription on a node
  that allows it;
- at most ``max_vgpus_per_gpu`` vGPUs;
- an exclusive vGPU takes a whole GPU (no other vGPU, share 100, all
  memory), and nothing joins a GPU an exclusive vGPU holds;
- GPUs in MIG mode are never sliced, unhealthy GPUs get nothing new.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from vgpud.errors import for_status
from vgpud.units import MIN_VGPU_MEMORY, MemoryAmount, format_bytes
from vgpud.vgpus.model import CreateRequest, GpuLike, GpuLoad, Limits, Slice, Vgpu, loads
from vgpud.vgpus.registry import Placer, Refitter

# (uuid_a, uuid_b) -> NVML topology level (smaller = closer: NVLink/same
# board first, across sockets last), None when unknown.
Distance = Callable[[str, str], int | None]
UNKNOWN_DISTANCE = 1000
# Above this many candidate sets, multi-GPU choice stops looking for the
# best-linked one and takes the policy's order (keeps admission O(small)).
MAX_COMBINATIONS = 5000


class PlacementError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Rules:
    policy: str = "binpack"  # or "spread"
    allow_oversubscribe: bool = False
    memory_scaling: float = 1.0
    max_vgpus_per_gpu: int = 16


@dataclass(frozen=True)
class Ask:
    """One vGPU's demand on each of its GPUs."""

    memory: MemoryAmount
    share: int
    mode: str
    oversubscribe: bool = False
    exclusive: bool = False


def check_rules(ask: Ask, rules: Rules) -> None:
    """Request-wide checks that do not depend on any GPU."""
    if ask.oversubscribe and not rules.allow_oversubscribe:
        raise PlacementError(422, "oversubscription is disabled on this node (allow_oversubscribe)")


def fit(
    gpu: GpuLike, load: GpuLoad, ask: Ask, rules: Rules, *, arriving: bool = True
) -> tuple[int, str | None]:
    """The bytes this vGPU would get on ``gpu``, and why it does not fit
    (None when it does). ``arriving`` False: a vGPU already there changes
    its limits, which a GPU's MIG mode or health does not forbid."""
    name = f"GPU {gpu.index} ({gpu.uuid})"
    if arriving and gpu.mig_mode:
        return 0, f"{name} is in MIG mode: vgpud does not slice MIG GPUs"
    if arriving and not gpu.healthy:
        return 0, f"{name} is unhealthy"
    if ask.exclusive:
        if load.vgpus:
            return 0, f"{name} already has {load.vgpus} vGPU(s); exclusive needs a whole GPU"
        return gpu.memory_total, None
    memory = ask.memory.resolve(gpu.memory_total)
    if memory < MIN_VGPU_MEMORY:  # a tiny percentage ("0.0000001%")
        return 0, (
            f"{ask.memory} of {name} is {format_bytes(memory)}, below the "
            f"{format_bytes(MIN_VGPU_MEMORY)} a vGPU needs at least"
        )
    if load.exclusive:
        return memory, f"{name} is held whole by an exclusive vGPU"
    if load.vgpus >= rules.max_vgpus_per_gpu:
        return memory, f"{name} already has {load.vgpus} vGPUs (max_vgpus_per_gpu)"
    if ask.mode == "hard" and load.hard_share + ask.share > 100:
        free = 100 - load.hard_share
        return memory, f"{name}: hard share {ask.share}% asked, {free}% left"
    scaling = rules.memory_scaling if ask.oversubscribe and rules.allow_oversubscribe else 1.0
    capacity = int(gpu.memory_total * scaling)
    if load.memory + memory > capacity:
        left = max(capacity - load.memory, 0)
        return memory, f"{name}: {format_bytes(memory)} asked, {format_bytes(left)} left"
    return memory, None


def place(
    selectors: Sequence[str],
    count: int,
    ask: Ask,
    gpus: Sequence[GpuLike],
    placed: Iterable[Vgpu],
    rules: Rules,
    distance: Distance | None = None,
) -> tuple[Slice, ...]:
    """Choose GPUs for a new vGPU: ``selectors`` is ["any"] (then ``count``
    GPUs by policy) or UUIDs/indices."""
    check_rules(ask, rules)
    load = loads(placed)
    if list(selectors) == ["any"]:
        chosen = _choose(count, ask, gpus, load, rules, distance)
    else:
        chosen = [_select(sel, gpus) for sel in selectors]
        if len({g.uuid for g in chosen}) != len(chosen):
            raise PlacementError(422, "the same GPU is named twice")
        for g in chosen:
            reason = fit(g, load.get(g.uuid, GpuLoad()), ask, rules)[1]
            if reason is not None:
                raise PlacementError(409, reason)
    return tuple(
        Slice(g.uuid, g.index, fit(g, load.get(g.uuid, GpuLoad()), ask, rules)[0]) for g in chosen
    )


def check_update(
    vgpu: Vgpu, ask: Ask, gpus: Sequence[GpuLike], placed: Iterable[Vgpu], rules: Rules
) -> tuple[Slice, ...]:
    """New limits for a placed vGPU, checked on its own GPUs against the
    others; returns its slices with the new memory."""
    check_rules(ask, rules)
    load = loads(placed, skip=vgpu.id)
    by_uuid = {g.uuid: g for g in gpus}
    out = []
    for s in vgpu.slices:
        gpu = by_uuid.get(s.gpu_uuid)
        if gpu is None:
            raise PlacementError(409, f"GPU {s.gpu_uuid} of this vGPU is not present now")
        memory, reason = fit(gpu, load.get(gpu.uuid, GpuLoad()), ask, rules, arriving=False)
        if reason is not None:
            raise PlacementError(409, reason)
        out.append(Slice(s.gpu_uuid, s.gpu_index, memory))
    return tuple(out)


def placer(
    req: CreateRequest, gpus: Sequence[GpuLike], rules: Rules, distance: Distance | None = None
) -> Placer:
    """``place`` for the registry, which calls it with the final limits and
    every vGPU counted, under its lock; refusals are the API's errors."""

    def where(limits: Limits, placed: Sequence[Vgpu]) -> tuple[Slice, ...]:
        ask = Ask(limits.memory, limits.share, limits.mode, req.oversubscribe, req.exclusive)
        try:
            return place(req.gpus, req.count, ask, gpus, placed, rules, distance)
        except PlacementError as exc:
            raise for_status(exc.status, str(exc)) from exc

    return where


def refitter(gpus: Sequence[GpuLike], rules: Rules) -> Refitter:
    """``check_update`` for the registry, as ``placer`` is ``place``."""

    def refit(vgpu: Vgpu, limits: Limits, placed: Sequence[Vgpu]) -> tuple[Slice, ...]:
        ask = Ask(limits.memory, limits.share, limits.mode, vgpu.oversubscribe, vgpu.exclusive)
        try:
            return check_update(vgpu, ask, gpus, placed, rules)
        except PlacementError as exc:
            raise for_status(exc.status, str(exc)) from exc

    return refit


def _select(selector: str, gpus: Sequence[GpuLike]) -> GpuLike:
    for g in gpus:
        if selector == g.uuid or (selector.isdigit() and int(selector) == g.index):
            return g
    raise PlacementError(422, f"no GPU {selector!r} on this node")


def _choose(
    count: int,
    ask: Ask,
    gpus: Sequence[GpuLike],
    load: dict[str, GpuLoad],
    rules: Rules,
    distance: Distance | None,
) -> list[GpuLike]:
    fitting = []
    reasons = []
    for g in gpus:
        reason = fit(g, load.get(g.uuid, GpuLoad()), ask, rules)[1]
        if reason is None:
            fitting.append(g)
        else:
            reasons.append(reason)
    if len(fitting) < count:
        why = "; ".join(reasons) if reasons else f"the node has {len(gpus)} GPU(s)"
        raise PlacementError(409, f"no room for {count} GPU(s): {why}")

    def busy(g: GpuLike) -> float:
        cur = load.get(g.uuid, GpuLoad())
        return cur.hard_share / 100 + cur.memory / max(g.memory_total, 1)

    # binpack: busiest first; spread: idlest first; index breaks ties.
    sign = -1 if rules.policy == "binpack" else 1
    ordered = sorted(fitting, key=lambda g: (sign * busy(g), g.index))
    if count == 1 or distance is None:
        return ordered[:count]
    combos = itertools.islice(itertools.combinations(ordered, count), MAX_COMBINATIONS)

    def link(a: GpuLike, b: GpuLike) -> int:
        level = distance(a.uuid, b.uuid)
        return UNKNOWN_DISTANCE if level is None else level

    def spread_of(combo: Iterable[GpuLike]) -> int:
        return sum(link(a, b) for a, b in itertools.combinations(combo, 2))

    # min() keeps the first of equals, i.e. the policy's preferred set.
    return list(min(combos, key=spread_of))
