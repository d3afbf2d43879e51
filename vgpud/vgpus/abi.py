"""The shared-memory ABI: a ctypes mirror of libhook/include/vgpu_abi.h.

Constants and structs field by field, nothing else: what the bytes of a
control or usage block mean is blocks.py's, how they are read and written
concurrently is atomics.py's. tests/unit/test_abi_layout.py has the C
compiler check every offset, size and constant here against the header.
"""

from __future__ import annotations

import ctypes
from typing import ClassVar

# --- constants of vgpu_abi.h --------------------------------------------

CONTROL_MAGIC = 0x544E4F4355504756  # "VGPUCONT" little-endian
USAGE_MAGIC = 0x4741535555504756  # "VGPUUSAG" little-endian
ABI_VERSION = 2
MAX_DEVICES = 16
MAX_PROCS = 256
UUID_LEN = 96
ID_LEN = 64
FLAG_OVERSUBSCRIBE = 0x1
DEV_SOFT = 0x1
DEV_CALIBRATED = 0x2
TURN_WANT = 1  # vgpu_turn.request: wants the GPU, holds no grant

SLOT_FREE = 0
SLOT_CLAIMING = 1
SLOT_ACTIVE = 2
SLOT_RECLAIMING = 3
SLOT_STATE_NAMES = {
    SLOT_FREE: "free",
    SLOT_CLAIMING: "claiming",
    SLOT_ACTIVE: "active",
    SLOT_RECLAIMING: "reclaiming",
}


u32 = ctypes.c_uint32
i32 = ctypes.c_int32
u64 = ctypes.c_uint64
i64 = ctypes.c_int64


class AbiStruct(ctypes.Structure):
    """A ctypes mirror of one C struct; ``c_name`` is its name in vgpu_abi.h."""

    c_name: ClassVar[str] = ""


class BlockHeader(AbiStruct):
    c_name = "vgpu_block_header"
    _fields_ = (("magic", u64), ("version", u32), ("size", u32))


class ThrottleC(AbiStruct):
    c_name = "vgpu_throttle"
    _fields_ = (("seq", u32), ("quota_ppm", u32), ("window_ns", u64), ("epoch", u64))


class ControlDeviceC(AbiStruct):
    c_name = "vgpu_control_device"
    _fields_ = (
        ("uuid", ctypes.c_char * UUID_LEN),
        ("mem_limit", u64),
        ("share_ppm", u32),
        ("flags", u32),
        ("weight", u32),
        ("reserved0", u32),
        ("throttle", ThrottleC),
        ("turn_grant", u32),
        ("reserved1", u32),
        ("turn_until_ns", u64),
        ("paced_until_ns", u64),
    )


class ControlC(AbiStruct):
    c_name = "vgpu_control"
    _fields_ = (
        ("hdr", BlockHeader),
        ("vgpu_id", ctypes.c_char * ID_LEN),
        ("device_count", u32),
        ("flags", u32),
        ("heartbeat_ns", u64),
        ("turn_beat_ns", u64),
        ("reserved", u64 * 5),
        ("devices", ControlDeviceC * MAX_DEVICES),
        ("slot_host_pid", i32 * MAX_PROCS),
    )


class ProcDeviceC(AbiStruct):
    c_name = "vgpu_proc_device"
    _fields_ = (
        ("used", u64),
        ("overhead", u64),
        ("gpu_time_ns", u64),
        ("launches", u64),
        ("throttled_ns", u64),
    )


class ProcSlotC(AbiStruct):
    c_name = "vgpu_proc_slot"
    _fields_ = (
        ("state", u32),
        ("pid", i32),
        ("pidns", u64),
        ("start_time", u64),
        ("heartbeat_ns", u64),
        ("dev", ProcDeviceC * MAX_DEVICES),
    )


class SteerC(AbiStruct):
    c_name = "vgpu_steer"
    _fields_ = (
        ("throttle", ThrottleC * MAX_DEVICES),
        ("heartbeat_ns", u64),
        ("reserved", u64 * 3),
    )


class TurnC(AbiStruct):
    c_name = "vgpu_turn"
    _fields_ = (
        ("next", u32),
        ("serving", u32),
        ("lease_ns", u64),
        ("paced_until_ns", u64),
        ("request", u32),
        ("overrun_ms", u32),
    )


class UsageDeviceC(AbiStruct):
    c_name = "vgpu_usage_device"
    _fields_ = (
        ("used", u64),
        ("peak", u64),
        ("oom_count", u64),
        ("gpu_time_ns", u64),
        ("launches", u64),
        ("throttled_ns", u64),
        ("mem_limit", u64),
        ("share_ppm", u32),
        ("reserved0", u32),
        ("pacer_balance_ns", i64),
        ("pacer_stamp_ns", u64),
        ("turn", TurnC),
    )


class UsageC(AbiStruct):
    c_name = "vgpu_usage"
    _fields_ = (
        ("hdr", BlockHeader),
        ("device_count", u32),
        ("flags", u32),
        ("uuids", (ctypes.c_char * UUID_LEN) * MAX_DEVICES),
        ("steer", SteerC),
        ("devices", UsageDeviceC * MAX_DEVICES),
        ("slots", ProcSlotC * MAX_PROCS),
    )


ABI_STRUCTS: tuple[type[AbiStruct], ...] = (
    BlockHeader,
    ThrottleC,
    ControlDeviceC,
    ControlC,
    ProcDeviceC,
    ProcSlotC,
    SteerC,
    TurnC,
    UsageDeviceC,
    UsageC,
)


class BlockError(Exception):
    """A shared-memory block that cannot be used, with the reason why."""
