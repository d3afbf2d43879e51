"""A tenant decides how often some of the daemon's log lines come (its own
usage block regrown, dead identities forged into its slots, before every
scan): each was a line a scan, for ever, journal disk and log shipping
spent by the tenant and real warnings drowned. Such lines are bounded per
vGPU and kind: the first is logged, the others counted, and one line per
interval (``vgpud.log.SUMMARY_INTERVAL_S``) says how many were held back."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

from tests.fixtures.hook import FakeHook
from tests.unit.apiclient import Api, running_api
from vgpud.log import SUMMARY_INTERVAL_S, TenantLines
from vgpud.loops.scan import Watch
from vgpud.observe.tracker import Tracker
from vgpud.vgpus.abi import SLOT_ACTIVE

REPAIRED = "block missing or corrupt: recreated"
REAPED = "reaper repaired a vGPU"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextmanager
def scanning(api: Api) -> Iterator[Watch]:
    tracker = Tracker(sees_all_pids=True)
    try:
        yield Watch(api.service, api.service.events, tracker)
    finally:
        tracker.close()


def said(logs: list[MutableMapping[str, Any]], event: str, vgpu: str) -> list[dict[str, Any]]:
    return [dict(e) for e in logs if e["event"] == event and e.get("vgpu") == vgpu]


def grow(path: Path) -> None:
    """As the tenant: a page written past the layout of its own block."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size)
        f.write(b"x" * 4096)


async def test_a_tenant_regrowing_its_block_every_scan_gets_a_bounded_number_of_lines(
    tmp_path: Path, tenant_lines: TenantLines
) -> None:
    clock = Clock()
    tenant_lines.clock = clock
    async with running_api(tmp_path) as api:
        made = [await api.client.post("/v1/vgpus", json={"memory": "64m"}) for _ in range(2)]
        attacker, neighbour = [(await r.json())["id"] for r in made]
        usage = {v: api.service.registry.get(v).paths.usage for v in (attacker, neighbour)}
        scans = 150
        with scanning(api) as watch, structlog.testing.capture_logs() as logs:
            for n in range(scans):
                clock.now += 1
                grow(usage[attacker])
                if n == 100:
                    grow(usage[neighbour])  # once, amid the attacker's lines
                await watch.scan()
            cut = usage[attacker].stat().st_size
            clock.now += SUMMARY_INTERVAL_S
            await watch.scan()  # the tenant has stopped: its last count is still said
        lines = said(logs, REPAIRED, attacker)
        # Before the bound: 150 warnings, one a scan.
        assert len(lines) <= 2 + scans / SUMMARY_INTERVAL_S, lines
        first, *summaries = lines
        assert first["log_level"] == "warning" and "suppressed" not in first
        assert "grown by its tenant" in first["reason"]
        assert summaries and all(s["log_level"] == "warning" for s in summaries)
        assert 1 + sum(s["suppressed"] for s in summaries) == scans  # every one counted
        # Its own bound holds the neighbour's line back not at all.
        [theirs] = said(logs, REPAIRED, neighbour)
        assert "suppressed" not in theirs
        # And the repair is done every scan all the same.
        assert cut == usage[neighbour].stat().st_size
        repairs = api.service.events.since(0)
        assert sum(e.type == "block.repaired" and e.vgpu == attacker for e in repairs) == scans


async def test_dead_identities_forged_into_slots_every_scan_get_a_bounded_number_of_lines(
    tmp_path: Path, tenant_lines: TenantLines
) -> None:
    clock = Clock()
    tenant_lines.clock = clock
    async with running_api(tmp_path) as api:
        attacker = (await (await api.client.post("/v1/vgpus", json={"memory": "64m"})).json())["id"]
        hook = FakeHook(api.service.registry.get(attacker).paths.usage)
        gone = await asyncio.create_subprocess_exec("true")
        await gone.wait()
        pidns = os.stat("/proc/self/ns/pid").st_ino
        scans = 30
        try:
            with scanning(api) as watch, structlog.testing.capture_logs() as logs:
                for n in range(scans):
                    clock.now += 1
                    for i in range(256):
                        hook.claim(
                            i, pid=gone.pid, pidns=pidns, start_time=1000 * n + i, state=SLOT_ACTIVE
                        )
                    await watch.scan()
                clock.now += SUMMARY_INTERVAL_S
                tenant_lines.flush()  # as the next scan does before it reaps again
        finally:
            hook.close()
        reclaimed = sum(
            e.type == "slot.reclaimed" and e.vgpu == attacker for e in api.service.events.since(0)
        )
        assert reclaimed >= 16 * scans  # the evidence budget's worth a scan, each an event
        lines = said(logs, REAPED, attacker)
        # Before the bound: a line per reclaimed slot (480).
        assert len(lines) == 2, len(lines)
        first, summary = lines
        assert first["action"] == "slot_reclaimed" and "suppressed" not in first
        assert summary["action"] == "slot_reclaimed"
        assert 1 + summary["suppressed"] == reclaimed


def test_a_kind_quiet_for_an_interval_has_its_next_line_logged_as_a_first() -> None:
    clock = Clock()
    lines = TenantLines(interval_s=60, clock=clock)
    logger = structlog.get_logger("vgpud.test")
    with structlog.testing.capture_logs() as logs:
        lines.say(logger, "warning", "regrown", tenant="vg-a", n=1)
        clock.now += 10
        lines.say(logger, "warning", "regrown", tenant="vg-a", n=2)
        lines.say(logger, "warning", "regrown", tenant="vg-b", n=3)  # another vGPU's own first
        clock.now += 60
        lines.flush()  # the count of vg-a's interval
        clock.now += 60
        lines.flush()  # a quiet interval: nothing to say, vg-a forgotten
        lines.say(logger, "warning", "regrown", tenant="vg-a", n=4)
    assert [(e["n"], e.get("suppressed")) for e in logs] == [
        (1, None),
        (3, None),
        (2, 1),
        (4, None),
    ]
