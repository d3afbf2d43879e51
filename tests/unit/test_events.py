"""The event log: numbered, bounded, resumable, followed without polling."""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

from tests.fixtures.hook import FakeHook
from tests.unit.apiclient import running_api
from vgpud.config import Config
from vgpud.loops.scan import Watch
from vgpud.observe.tracker import Tracker
from vgpud.surface.events import Event, EventLog
from vgpud.vgpus.abi import SLOT_ACTIVE, SLOT_RECLAIMING


async def test_since_resumes_and_the_buffer_is_bounded() -> None:
    log = EventLog(capacity=3)
    for i in range(5):
        log.publish("vgpu.created", vgpu=f"v{i}")
    assert [e.seq for e in log.since(0)] == [3, 4, 5]  # the oldest are gone
    assert [e.vgpu for e in log.since(4)] == ["v4"]
    assert log.since(5) == []


async def test_since_is_right_at_every_edge_of_the_buffer() -> None:
    log = EventLog(capacity=4)
    assert log.since(0) == [] and log.since(7) == []
    for i in range(10):
        log.publish("e", pid=i)
    assert [e.seq for e in log.since(-5)] == [7, 8, 9, 10]  # before the buffer: all kept
    assert [e.seq for e in log.since(6)] == [7, 8, 9, 10]
    assert [e.seq for e in log.since(8)] == [9, 10]
    assert log.since(10) == [] and log.since(99) == []


async def test_follow_yields_backlog_then_new_events_and_ends_on_close() -> None:
    log = EventLog(capacity=10)
    log.publish("a")
    got: list[str] = []

    async def reader() -> None:
        async for event in log.follow(0):
            got.append(event.type)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)
    log.publish("b")
    log.publish("c")
    await asyncio.sleep(0)
    log.close()
    await asyncio.wait_for(task, 5)
    assert got == ["a", "b", "c"]


async def test_event_json_has_every_field() -> None:
    log = EventLog(capacity=10)
    e = log.publish("oom", vgpu="v", gpu="g", pid=None, refused=2)
    assert e.to_json() == {
        "seq": 1,
        "time": e.time,
        "type": "oom",
        "vgpu": "v",
        "gpu": "g",
        "pid": None,
        "detail": {"refused": 2},
    }


class CountingBuffer(deque[Event]):
    """The log's ring, counting the events a read walks over."""

    walked = 0

    def __iter__(self) -> Iterator[Event]:
        for event in super().__iter__():
            self.walked += 1
            yield event

    def __reversed__(self) -> Iterator[Event]:
        for event in super().__reversed__():
            self.walked += 1
            yield event


async def test_a_follower_pays_for_new_events_not_for_the_buffer() -> None:
    log = EventLog(capacity=10_000)
    for i in range(10_000):
        log.publish("e", pid=i)
    ring = CountingBuffer(log._events, maxlen=10_000)
    log._events = ring
    last = log.last_seq
    log.publish("new", pid=1)
    log.publish("new", pid=2)
    assert [e.pid for e in log.since(last)] == [1, 2]
    assert ring.walked <= 2  # the 9,998 older events are not looked at
    assert len(log.since(0)) == 10_000  # since=0: everything still kept


async def test_process_churn_does_not_push_other_vgpus_events_out_of_the_buffer() -> None:
    """Any process on the GPU makes a process.started and a process.exited
    event, so a tenant that starts and ends processes in a loop (1000 of
    them per scan, one scan a second: two events each) used to push every
    other event out of the ring in five seconds: a victim's OOM or a
    backstop kill was gone before a follower resuming with ?since= read it.
    Process events now fill a ring of their own."""
    log = EventLog(capacity=100)
    before = log.last_seq
    oom = log.publish("oom", vgpu="victim", gpu="g", refused=1)
    for pid in range(1000):
        log.publish("process.started", vgpu="attacker", pid=pid)
        log.publish("process.exited", vgpu="attacker", pid=pid)
    kill = log.publish("backstop", vgpu="victim", action="killed")
    log.publish("process.started", vgpu="attacker", pid=1000)
    got = log.since(before)
    assert [e.seq for e in got if e.type != "process.started" and e.type != "process.exited"] == [
        oom.seq,
        kill.seq,
    ]
    assert len(got) == 2 + 100  # each ring keeps its capacity
    assert [e.seq for e in got] == sorted(e.seq for e in got)  # in order, as published
    assert [e.seq for e in log.since(kill.seq)] == [kill.seq + 1]
    assert log.since(log.last_seq) == []


async def test_a_tenant_forging_dead_slots_does_not_push_other_vgpus_events_out(
    tmp_path: Path,
) -> None:
    """A tenant may write any identity into its own usage block's 256 slots
    (or end hooked processes in a loop): a dead one is a slot.reclaimed
    event at the next scan (16 new identities a scan and vGPU: the evidence
    budget), and one left RECLAIMING a slot.stuck event three scans on
    (all 256 of them). In the ring of the other vGPUs' events they pushed
    a neighbour's OOM out within a few scans, before a follower resuming
    with ?since= read it."""
    config = Config(
        run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"), event_buffer=300
    )
    async with running_api(tmp_path, config) as api:
        service = api.service
        tracker = Tracker(sees_all_pids=True)
        watch = Watch(service, service.events, tracker)
        made = [await api.client.post("/v1/vgpus", json={"memory": "64m"}) for _ in range(2)]
        victim, attacker = [(await r.json())["id"] for r in made]
        victim_hook = FakeHook(service.registry.get(victim).paths.usage)
        attacker_hook = FakeHook(service.registry.get(attacker).paths.usage)
        gone = await asyncio.create_subprocess_exec("true")
        await gone.wait()
        dead_pid = gone.pid  # a pid of this namespace that no process holds now
        try:
            await watch.scan()
            before = service.events.last_seq
            victim_hook.block.devices[0].oom_count += 1
            await watch.scan()
            pidns = os.stat("/proc/self/ns/pid").st_ino
            for n in range(6):
                for i in range(256):
                    # Odd slots keep one RECLAIMING identity for three scans
                    # (stuck), even ones a new dead ACTIVE one every scan.
                    state = SLOT_RECLAIMING if i % 2 else SLOT_ACTIVE
                    start = 1000 * (n // 3 if i % 2 else n) + i
                    attacker_hook.claim(i, pid=dead_pid, pidns=pidns, start_time=start, state=state)
                await watch.scan()
            kept = service.events.since(before)
            assert sum(e.type in ("slot.reclaimed", "slot.stuck") for e in kept) >= 300
            assert [(e.type, e.vgpu) for e in kept if e.vgpu == victim] == [("oom", victim)]
        finally:
            victim_hook.close()
            attacker_hook.close()
            tracker.close()


async def sent(log: EventLog, since: int) -> list[tuple[int, str, dict[str, object]]]:
    """(seq, type, detail) of what a follower resuming after ``since`` is
    sent before it waits for new events."""
    got: list[tuple[int, str, dict[str, object]]] = []

    async def reader() -> None:
        async for e in log.follow(since):
            got.append((e.seq, e.type, dict(e.detail)))

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)  # the reader runs until it waits for a publish
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task
    return got


async def test_a_follower_resuming_after_events_that_fell_out_is_told_how_many() -> None:
    """The ring keeps the last events only: a follower that resumes after
    one it no longer holds got the kept ones as if nothing had come
    between. A notice takes the place of the newest lost event."""
    log = EventLog(capacity=3)
    for i in range(5):
        log.publish("oom", vgpu=f"v{i}")
    assert await sent(log, 0) == [
        (2, "events.lost", {"lost": 2, "after": 0}),
        (3, "oom", {}),
        (4, "oom", {}),
        (5, "oom", {}),
    ]
    assert [s[:2] for s in await sent(log, 1)][:2] == [(2, "events.lost"), (3, "oom")]
    assert (await sent(log, 1))[0][2] == {"lost": 1, "after": 1}
    assert [s[0] for s in await sent(log, 2)] == [3, 4, 5]  # nothing lost after 2
    assert await sent(log, 5) == []


async def test_the_loss_notice_is_right_when_one_ring_lost_events_the_other_still_holds() -> None:
    """Process events have a ring of their own: the ring of the other events
    may still hold events older than those the process ring lost. Every
    event sent before the notice is kept, every one after it too, and what
    the follower does not get between ``after`` and the notice's seq is
    lost: as many as it says."""
    log = EventLog(capacity=3)
    log.publish("oom", vgpu="victim")  # 1: kept in the main ring
    for pid in range(5):  # 2..6: the process ring keeps 4, 5, 6
        log.publish("process.started", vgpu="attacker", pid=pid)
    log.publish("backstop", vgpu="victim")  # 7
    assert [(s[0], s[1]) for s in await sent(log, 0)] == [
        (1, "oom"),
        (3, "events.lost"),
        (4, "process.started"),
        (5, "process.started"),
        (6, "process.started"),
        (7, "backstop"),
    ]
    assert (await sent(log, 0))[1][2] == {"lost": 2, "after": 0}
    assert (await sent(log, 3))[0][:2] == (4, "process.started")  # resumed at the notice
    for _ in range(5):  # 8..12: the main ring now loses 1 and 7 and keeps 10, 11, 12
        log.publish("oom", vgpu="victim")
    for pid in range(2):  # 13, 14: the process ring keeps 6, 13, 14
        log.publish("process.exited", vgpu="attacker", pid=pid)
    got = await sent(log, 0)
    assert [(s[0], s[1]) for s in got] == [
        (6, "process.started"),
        (9, "events.lost"),
        (10, "oom"),
        (11, "oom"),
        (12, "oom"),
        (13, "process.exited"),
        (14, "process.exited"),
    ]
    assert got[1][2] == {"lost": 8, "after": 0}  # 1-5 and 7-9: all but 6 below 10


async def test_a_follower_too_slow_for_the_ring_is_told_what_it_missed() -> None:
    """Events that fall out while a follower is still being sent older ones
    are lost to it as well: the notice comes in the stream, after what it
    was sent (the batch it was given before they fell out) and before
    what is kept."""
    log = EventLog(capacity=3)
    for _ in range(3):
        log.publish("oom", vgpu="a")
    got: list[tuple[int, str, dict[str, object]]] = []
    stream = log.follow(0)
    for n in range(7):
        e = await asyncio.wait_for(anext(stream), 5)
        got.append((e.seq, e.type, dict(e.detail)))
        for _ in range(5 if n == 0 else 0):  # 4..8 while it is busy: 1-5 fall out
            log.publish("oom", vgpu="b")
    log.close()
    assert [e async for e in stream] == []  # nothing more: the rest was kept
    assert got == [
        (1, "oom", {}),
        (2, "oom", {}),
        (3, "oom", {}),
        (5, "events.lost", {"lost": 2, "after": 3}),
        (6, "oom", {}),
        (7, "oom", {}),
        (8, "oom", {}),
    ]


async def test_a_reader_resuming_across_a_restart_is_told_so_and_sent_every_kept_event() -> None:
    """Each daemon numbers its events from 1: a ?since= from before a
    restart is past every event the new daemon has, and its reader waited,
    told nothing, until the new daemon's numbers passed it."""
    log = EventLog(capacity=10)
    log.publish("vgpu.adopted", vgpu="v1")
    log.publish("oom", vgpu="v1")
    assert await sent(log, 9000) == [
        (0, "events.lost", {"lost": None, "after": 9000}),
        (1, "vgpu.adopted", {}),
        (2, "oom", {}),
    ]
    assert await sent(log, 2) == []  # this daemon's own numbers: nothing new, nothing said
