"""benchmarks/soak_daemon.py: the rings' fill it counts in a whole-log read
is what the event log keeps in each ring, notice of lost events aside."""

from __future__ import annotations

import json

from benchmarks.soak_daemon import ring_fill
from vgpud.surface import events as ev


def rendered(log: ev.EventLog) -> bytes:
    """GET /v1/events?follow=false as the API writes it (NDJSON)."""
    return b"".join((json.dumps(e.to_json()) + "\n").encode() for e in log.read(0))


def test_it_counts_each_ring() -> None:
    log = ev.EventLog(10)
    for n in range(3):
        log.publish(ev.VGPU_CREATED, vgpu=f"vg-{n}", name=None, gpus=["GPU-0"])
        log.publish(ev.PROCESS_STARTED, vgpu=f"vg-{n}", pid=n)
        log.publish(ev.SLOT_RECLAIMED, vgpu=f"vg-{n}", slot=0, message="slot.reclaimed")
    assert ring_fill(rendered(log)) == (3, 6)


def test_full_rings_and_the_lost_notice() -> None:
    log = ev.EventLog(10)
    for n in range(25):
        log.publish(ev.SLOT_RECLAIMED, vgpu="vg-1", slot=n)
        log.publish(ev.SLOT_STUCK, vgpu="vg-1", slot=n)
        log.publish(ev.VGPU_DELETED, vgpu=f"vg-{n}", forced=False)
    body = rendered(log)
    assert b'"type": "events.lost"' in body
    assert ring_fill(body) == (10, 10)
