"""NVML's sample is read on its thread and taken at the clock's next
wake-up (vgpud/loops/sample.py): the event loop is not woken to take it,
a read in progress is not asked for twice, and a read that fails is
logged and asked for again."""

from __future__ import annotations

from concurrent.futures import Future

import structlog.testing

from vgpud.loops.sample import Sampling
from vgpud.observe.nvml import NvmlSample


class Gateway:
    """Reads that end when the test says so."""

    def __init__(self) -> None:
        self.asked: list[Future[tuple[NvmlSample, float]]] = []

    def sample_soon(self) -> Future[tuple[NvmlSample, float]]:
        self.asked.append(Future())
        return self.asked[-1]


class Service:
    sample: NvmlSample | None = None


def sampling() -> tuple[Sampling, Gateway, Service, list[float]]:
    gpus, service, times = Gateway(), Service(), list[float]()
    s = Sampling(gpus, service, times.append)  # type: ignore[arg-type]
    return s, gpus, service, times


def test_a_sample_is_taken_once_read_and_not_asked_for_twice() -> None:
    s, gpus, service, times = sampling()
    s.start()
    assert len(gpus.asked) == 1
    s.start()  # still being read: not asked again
    s.take()
    assert len(gpus.asked) == 1 and service.sample is None
    first = NvmlSample(monotonic=1.0)
    gpus.asked[0].set_result((first, 0.004))
    assert service.sample is None  # nothing wakes for it
    s.take()
    assert service.sample is first and times == [0.004]
    s.take()  # taken once
    assert times == [0.004]
    s.start()
    assert len(gpus.asked) == 2


def test_the_next_start_takes_a_read_sample_before_asking_again() -> None:
    s, gpus, service, times = sampling()
    s.start()
    second = NvmlSample(monotonic=2.0)
    gpus.asked[0].set_result((second, 0.002))
    s.start()
    assert service.sample is second and times == [0.002] and len(gpus.asked) == 2


def test_a_failed_read_is_logged_and_asked_for_again() -> None:
    s, gpus, service, times = sampling()
    s.start()
    gpus.asked[0].set_exception(RuntimeError("NVML went away"))
    with structlog.testing.capture_logs() as logs:
        s.take()
    assert service.sample is None and times == []
    failed = [e for e in logs if e["event"] == "loop iteration failed"]
    assert failed and failed[0]["loop"] == "sample"
    s.start()
    assert len(gpus.asked) == 2
