"""An asyncio loop on a thread of its own, for the stand-ins: the tests stay
synchronous and may block while the plugin under test calls back in."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, work: Awaitable[T], timeout: float = 60) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(_awaited(work), self.loop)
        return future.result(timeout=timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


async def _awaited(work: Awaitable[T]) -> T:
    """gRPC calls are awaitables, not coroutines: make them one."""
    return await work
