"""SM counts from the CUDA driver API, for GPUs whose NVML does not say.

On a GPU outside MIG mode ``nvmlDeviceGetAttributes`` may answer Not
Supported (an H200 on driver 580 does), while the CUDA driver's
``CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`` always answers. The calls made
here (``cuInit``, ``cuDeviceGetCount``, ``cuDeviceGet``,
``cuDeviceGetUuid_v2``, ``cuDeviceGetAttribute``) create no context: no GPU
memory is taken and the daemon never shows as a GPU process.

``sm_counts(library="libcuda.so.1") -> dict[str, int]``
    NVML-style UUID ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx") -> SM count
    of every device the driver shows. Keyed by UUID because CUDA's device
    order (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES) may differ from NVML's.
    Empty, with the reason logged, on any failure: the SM count is a figure
    to show, never a reason to stop.

Blocking (the driver's ``cuInit`` can take a while): call it off the event
loop, as the NVML gateway does on its worker thread.
"""

from __future__ import annotations

import ctypes

import structlog

log = structlog.get_logger(__name__)

DEFAULT_LIBRARY = "libcuda.so.1"
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
_CUDA_SUCCESS = 0
_UUID_BYTES = 16


class CudaCallFailed(Exception):
    """A CUDA driver call answered an error code."""


def sm_counts(library: str = DEFAULT_LIBRARY) -> dict[str, int]:
    try:
        counts = _read(ctypes.CDLL(library))
    except (OSError, AttributeError, CudaCallFailed) as err:
        # OSError: no such library; AttributeError: it lacks an entry point.
        log.info("no SM counts from the CUDA driver", library=library, error=str(err))
        return {}
    log.info("SM counts from the CUDA driver", library=library, sms=counts)
    return counts


def _read(cuda: ctypes.CDLL) -> dict[str, int]:
    _call(cuda, "cuInit", ctypes.c_uint(0))
    count = ctypes.c_int()
    _call(cuda, "cuDeviceGetCount", ctypes.byref(count))
    counts: dict[str, int] = {}
    for ordinal in range(count.value):
        device = ctypes.c_int()
        _call(cuda, "cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal))
        uuid = (ctypes.c_ubyte * _UUID_BYTES)()
        _call(cuda, "cuDeviceGetUuid_v2", ctypes.byref(uuid), device)
        sms = ctypes.c_int()
        attribute = ctypes.c_int(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        _call(cuda, "cuDeviceGetAttribute", ctypes.byref(sms), attribute, device)
        counts[uuid_text(bytes(uuid))] = sms.value
    return counts


def _call(cuda: ctypes.CDLL, name: str, *args: object) -> None:
    fn = getattr(cuda, name)
    fn.restype = ctypes.c_int  # CUresult
    result = fn(*args)
    if result != _CUDA_SUCCESS:
        raise CudaCallFailed(f"{name} answered CUresult {result}")


def uuid_text(raw: bytes) -> str:
    """The 16 bytes of a CUuuid as NVML writes them: GPU-8-4-4-4-12 hex digits."""
    if len(raw) != _UUID_BYTES:
        raise ValueError(f"a CUDA UUID has {_UUID_BYTES} bytes, not {len(raw)}")
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
