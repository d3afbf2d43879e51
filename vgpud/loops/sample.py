"""The sample tick: one NVML sample of every GPU (memory, utilization, each
process's share of it), handed to the service for the controller, the
tracker's next scan and the snapshot the answers show.

The gateway reads NVML on its own thread. Its answer is taken at the
clock's next wake-up (``take``, before the control tick), not by waking
the event loop when the thread is done: the controller and the scan read
the sample only at their next ticks anyway, and on a shared VM each
wake-up of the loop costs more than what it hands over
(docs/benchmarks/daemon.md). A sample still being read when the next is
due is not asked for again.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

import structlog

from vgpud.observe.nvml import GpuGateway, NvmlSample
from vgpud.surface.service import Service

log = structlog.get_logger(__name__)


class Sampling:
    def __init__(self, gpus: GpuGateway, service: Service, timed: Callable[[float], None]) -> None:
        self.gpus = gpus
        self.service = service
        self.timed = timed  # told how long each read took on NVML's thread
        self._reading: Future[tuple[NvmlSample, float]] | None = None

    def start(self) -> None:
        """Take the last sample if it is read, and ask for the next unless
        it is still being read."""
        self.take()
        if self._reading is None:
            self._reading = self.gpus.sample_soon()

    def take(self) -> None:
        """Hand the service the sample asked for last, once it is read."""
        reading = self._reading
        if reading is None or not reading.done():
            return
        self._reading = None
        try:
            sample, seconds = reading.result()
        except Exception:
            log.exception("loop iteration failed", loop="sample")
            return
        self.service.sample = sample
        self.timed(seconds)
