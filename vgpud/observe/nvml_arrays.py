"""NVML's array queries read in place: the C function fills a reusable
buffer and its records are unpacked in one pass, with no Python object per
entry but the tuple of the fields the daemon uses.

pynvml builds an object per entry of every answer (a ctypes struct, then a
"friendly" object with an attribute per field): with 1000 processes on the
GPUs, sampled five times a second, that was about 1 % of a core. Only
``nvml.py`` calls this (it holds the function pointers and maps the return
codes to pynvml's errors); nothing here imports pynvml.

The layouts are NVML's public header's, naturally aligned (x86-64, aarch64),
written with explicit padding and native byte order:

``nvmlProcessInfo_t`` (what the ``_v2`` and ``_v3`` running-process
queries fill), 24 bytes: ``unsigned int pid``; 4 bytes of padding;
``unsigned long long usedGpuMemory``; ``unsigned int gpuInstanceId``;
``unsigned int computeInstanceId``. Read: (pid, usedGpuMemory).

``nvmlProcessUtilizationSample_t``, 32 bytes: ``unsigned int pid``; 4 bytes
of padding; ``unsigned long long timeStamp``; ``unsigned int smUtil``,
``memUtil``, ``encUtil``, ``decUtil``. Read: (pid, timeStamp, smUtil).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Iterator
from typing import Any

PROCESS_INFO = struct.Struct("=I4xQ8x")
PROCESS_UTILIZATION_SAMPLE = struct.Struct("=I4xQI12x")

SUCCESS = 0  # NVML_SUCCESS
INSUFFICIENT_SIZE = 7  # NVML_ERROR_INSUFFICIENT_SIZE
# usedGpuMemory when the driver cannot say (Windows WDDM): (unsigned long long)-1
VALUE_NOT_AVAILABLE = (1 << 64) - 1

# ``call(count, buffer)``: the query with its other arguments bound; count is
# a pointer to the buffer's capacity in records, set by NVML to how many
# records it wrote, or (with INSUFFICIENT_SIZE) how many it has.
ArrayCall = Callable[[Any, Any], int]


class ArrayReader:
    """One query's reusable buffer, grown when NVML says it is too small.

    The records a ``read`` returns are unpacked from the buffer as they are
    iterated: consume them before the next ``read`` (the gateway calls NVML
    on one thread, one query at a time)."""

    def __init__(self, layout: struct.Struct, capacity: int = 64) -> None:
        self.layout = layout
        self._count = ctypes.c_uint()
        self._buffer = ctypes.create_string_buffer(capacity * layout.size)

    @property
    def capacity(self) -> int:
        return len(self._buffer) // self.layout.size

    def read(self, call: ArrayCall, attempts: int) -> tuple[int, Iterator[tuple[Any, ...]]]:
        """NVML's return code and, on success, the records written.

        An entry may appear between NVML's answer "too small" and the next
        call: each retry sizes the buffer from that answer with room to
        spare; after ``attempts`` calls the code is INSUFFICIENT_SIZE."""
        for _ in range(attempts):
            self._count.value = self.capacity
            code = call(ctypes.byref(self._count), self._buffer)
            if code == SUCCESS:
                used = memoryview(self._buffer)[: self._count.value * self.layout.size]
                return code, self.layout.iter_unpack(used)
            if code != INSUFFICIENT_SIZE:
                break
            needed = self._count.value
            room = max(needed + needed // 4 + 16, self.capacity)
            self._buffer = ctypes.create_string_buffer(room * self.layout.size)
        return code, iter(())
