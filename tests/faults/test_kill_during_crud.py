"""kill -9 of the daemon at random points of create, update and delete;
after each restart: nothing acknowledged is lost, nothing is half-made, and
no limit is lifted (the control blocks say what the state file says).
Again with vGPUs of 33 kB of labels, so that a kill lands in saves of many
pages (a pwrite that SIGKILL may cut short after any page) and in the
growth of the state file past its slots (eight such vGPUs fill one)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.daemon_harness import Daemon
from vgpud.ctl.client import ApiFailure
from vgpud.units import percent_to_ppm
from vgpud.vgpus.blocks import ControlBlock, UsageBlock

ROUNDS = 12
MIB = 1 << 20
# 64 labels of the longest keys and values the API takes: a 33 kB record.
MANY_PAGES = {f"{i:02d}".ljust(253, "k"): "v" * 253 for i in range(64)}
SEED = 20261123  # the operations are reproducible; where the kill lands is not


@dataclass
class Ledger:
    """What the client knows happened: acknowledged answers, and at most one
    operation whose answer the kill cut off (it may or may not have happened)."""

    limits: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (bytes, share)
    unsure: dict[str, tuple[str, tuple[int, int] | None]] = field(default_factory=dict)


def churn(
    daemon: Daemon,
    ledger: Ledger,
    rng: random.Random,
    stop: threading.Event,
    labels: dict[str, str],
) -> None:
    """Create, update and delete as fast as the daemon answers, until it dies."""
    while not stop.is_set():
        ids = sorted(ledger.limits)
        op = rng.choice(["create", "create", "update", "delete"] if ids else ["create"])
        vid = rng.choice(ids) if ids and op != "create" else None
        limits = (rng.randint(2, 64) * MIB, rng.randint(1, 12))  # 2 MiB: the smallest vGPU
        try:
            if op == "create":
                answer = daemon.client.post(
                    "/v1/vgpus",
                    {"memory": limits[0], "share": limits[1], "mode": "hard", "labels": labels},
                )
                ledger.limits[answer["id"]] = limits
            elif op == "update":
                assert vid is not None
                ledger.unsure[vid] = ("update", limits)
                daemon.client.patch(f"/v1/vgpus/{vid}", {"memory": limits[0], "share": limits[1]})
                ledger.limits[vid] = limits
                del ledger.unsure[vid]
            else:
                assert vid is not None
                ledger.unsure[vid] = ("delete", None)
                daemon.client.delete(f"/v1/vgpus/{vid}")
                del ledger.limits[vid], ledger.unsure[vid]
        except ApiFailure as exc:
            assert exc.status == 409, exc  # full GPU: a refusal, nothing changed
            ledger.unsure.pop(vid or "", None)
        except Exception:  # the kill: this operation's outcome is unknown
            return


@pytest.fixture
def daemon(tmp_path: Path, sim_env: dict[str, str]) -> Iterator[Daemon]:
    d = Daemon(tmp_path, sim_env)
    yield d
    d.cleanup()


def check_whole(daemon: Daemon, ledger: Ledger, labels: dict[str, str]) -> None:
    listed = {v["id"]: v for v in daemon.client.get("/v1/vgpus")}
    recorded = daemon.recorded()
    assert sorted(listed) == sorted(v.id for v in recorded)
    assert all(v.labels == labels for v in recorded)
    # Nothing lost: every acknowledged vGPU is there with its acknowledged
    # limits, but for the one operation the kill may have cut.
    for vid, limits in ledger.limits.items():
        doubt = ledger.unsure.get(vid)
        if doubt is not None and doubt[0] == "delete" and vid not in listed:
            continue
        got = (listed[vid]["gpus"][0]["memory_limit"], listed[vid]["share"])
        assert got == limits or (doubt is not None and got == doubt[1]), (vid, got, limits, doubt)
    # Only an unacknowledged create may have left more (it was recorded).
    extra = set(listed) - set(ledger.limits)
    assert len(extra) <= 1, extra
    # Nothing half-made: exactly the recorded vGPUs' directories, whole
    # blocks that were adopted as they were, no temporary file anywhere.
    # The one create the kill cut may have been saved with its blocks half
    # made (they are made beside the save): only its may be repaired.
    assert sorted(p.name for p in daemon.run_dir.glob("vg-*")) == sorted(listed)
    assert not [p for p in daemon.run_dir.rglob(".*") if p.is_file()]
    assert sorted(p.name for p in daemon.state_dir.iterdir()) == ["vgpud.lock", "vgpus.state"]
    events = daemon.client.raw("GET", "/v1/events?follow=false")[1].splitlines()
    repaired = {e["vgpu"] for e in map(json.loads, events) if e["type"] == "block.repaired"}
    assert repaired <= extra, repaired
    # No limit lifted: each control block enforces what is recorded.
    for v in recorded:
        with ControlBlock.open(daemon.run_dir / v.id / "control") as control:
            assert isinstance(control, ControlBlock)
            device = control.devices()[0]
        assert device.mem_limit == v.slices[0].memory
        assert device.share_ppm == percent_to_ppm(v.limits.share)
        UsageBlock.open(daemon.run_dir / v.id / "usage", device_count=1).close()
    for vid in extra:
        ledger.limits[vid] = (listed[vid]["gpus"][0]["memory_limit"], listed[vid]["share"])
    for vid in list(ledger.limits):
        if vid not in listed:
            del ledger.limits[vid]
        else:  # what is there now is what the next round starts from
            ledger.limits[vid] = (listed[vid]["gpus"][0]["memory_limit"], listed[vid]["share"])
    ledger.unsure.clear()


@pytest.mark.parametrize("labels", [{}, MANY_PAGES], ids=["small", "saves of many pages"])
def test_kill_9_at_random_points_of_crud_loses_nothing_and_lifts_no_limit(
    daemon: Daemon, labels: dict[str, str]
) -> None:
    rng = random.Random(SEED)
    ledger = Ledger()
    for _ in range(ROUNDS):
        daemon.start()
        stop = threading.Event()
        worker = threading.Thread(target=churn, args=(daemon, ledger, rng, stop, labels))
        worker.start()
        # Let some operations through, then kill wherever the daemon is: the
        # delay is the random kill point, not a wait for anything.
        time.sleep(rng.uniform(0.05, 0.6))
        daemon.kill9()
        stop.set()
        worker.join()
        daemon.start()
        assert "Traceback" not in daemon.log()
        check_whole(daemon, ledger, labels)
        daemon.kill9()
