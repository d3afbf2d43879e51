"""What holds vgpud's event loop: every callback over 2 ms, and every
garbage collection over 1 ms, in a running daemon.

Put this directory first on PYTHONPATH of the process that starts the
daemon (bench_api.py passes its environment on), e.g.

    PYTHONPATH=benchmarks/loop_probe .venv/bin/python benchmarks/bench_api.py --clients 1

In a process whose command line names vgpud, each slow callback is
recorded as (monotonic end, ms, what was about to run, where it stopped):
a task by its name and the chain of coroutines it was suspended in
(``vgpud-control: Daemon._loop.<locals>.run > sleep``), else the
callback's name; and each slow collection as (monotonic end, ms,
generation, objects collected). They are written to
/tmp/loopprobe-<pid>.json and /tmp/loopprobe-gc-<pid>.json as they come.
Other processes run untouched. A diagnostic, not part of the daemon.
"""

from __future__ import annotations

import asyncio.events
import gc
import json
import os
import sys
import time
from typing import Any

SLOW_CALLBACK_S = 0.002
SLOW_GC_S = 0.001

_run = asyncio.events.Handle._run
_callbacks: list[tuple[float, float, str, str]] = []
_collections: list[tuple[float, float, Any, Any]] = []
_gc_began = [0.0]
_written = [time.monotonic()]


def _in_daemon() -> bool:
    return "vgpud" in " ".join(sys.argv)


def _where(coro: Any) -> str:
    """The chain of coroutines `coro` is suspended in, outermost first."""
    names: list[str] = []
    while coro is not None and len(names) < 8:
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        if code is None:
            names.append(type(coro).__name__)
            break
        names.append(code.co_qualname)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " > ".join(names)


def _what(handle: asyncio.events.Handle) -> str:
    callback = handle._callback  # type: ignore[attr-defined]
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        return f"{task.get_name()}: {_where(task.get_coro())}"
    return str(getattr(callback, "__qualname__", callback))


def _timed_run(self: asyncio.events.Handle) -> None:
    if not _in_daemon():
        asyncio.events.Handle._run = _run  # type: ignore[method-assign]
        _run(self)
        return
    began, before = time.perf_counter(), _what(self)
    try:
        _run(self)
    finally:
        took = time.perf_counter() - began
        if took > SLOW_CALLBACK_S:
            _callbacks.append((time.monotonic(), round(took * 1000, 2), before, _what(self)))
        if _callbacks and time.monotonic() - _written[0] > 5:
            _written[0] = time.monotonic()
            _dump(f"/tmp/loopprobe-{os.getpid()}.json", _callbacks)


def _gc_timed(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_began[0] = time.perf_counter()
        return
    took = time.perf_counter() - _gc_began[0]
    if took > SLOW_GC_S and _in_daemon():
        _collections.append(
            (time.monotonic(), round(took * 1000, 2), info.get("generation"), info.get("collected"))
        )
        _dump(f"/tmp/loopprobe-gc-{os.getpid()}.json", _collections)


def _dump(path: str, rows: list[Any]) -> None:
    with open(path, "w") as f:
        json.dump(rows, f)


asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]
gc.callbacks.append(_gc_timed)
