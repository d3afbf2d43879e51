"""The event log: numbered, bounded, resumable, followed without polling."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator

from vgpud.surface.events import Event, EventLog


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
