"""Containers are untrusted: each sees only its own vGPU's blocks, cannot
change its own limits, and whatever it writes into its usage block harms
neither the daemon nor another vGPU."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.harness import Vgpud
from tests.e2e.podman import Podman
from tests.integration.daemon_harness import wait_for
from vgpud.vgpus.abi import ProcSlotC, UsageC, UsageDeviceC
from vgpud.vgpus.blocks import ControlBlock

MakeVgpu = Callable[..., dict[str, Any]]
MIB = 2**20
CONTROL = "/run/vgpud/vgpu/control"
USAGE = "/run/vgpud/vgpu/usage"


def cdi_device(name: str) -> str:
    return f"vgpud.io/vgpu={name}"


def limits_in_block(vgpu: dict[str, Any]) -> list[tuple[int, int]]:
    """(memory limit, share) per device as the hooks read them."""
    control = ControlBlock.open(Path(vgpu["recipe"]["mounts"][0]["host_path"]))
    try:
        return [(d.mem_limit, d.share_ppm) for d in control.devices()]
    finally:
        control.close()


def test_a_container_reaches_only_its_own_blocks(
    vgpud: Vgpud, podman: Podman, make_vgpu: MakeVgpu
) -> None:
    make_vgpu(name="iso-a", memory="1g", share=20)
    other = make_vgpu(name="iso-b", memory="1g", share=20)
    podman.start("iso-b", ["sleep", "60"], devices=[cdi_device("iso-b")])
    other_pid = podman.host_pid("iso-b")
    other_usage = next(m["host_path"] for m in other["recipe"]["mounts"] if not m["read_only"])

    script = f"""
        find /run/vgpud
        echo ---
        vgpu-probe open {other_usage} r
        vgpu-probe open /run/vgpud/{other["id"]}/usage r
        vgpu-probe open /proc/{other_pid}/root{USAGE} r
        vgpu-probe open {USAGE} w
    """
    done = podman.run(["sh", "-c", script], devices=[cdi_device("iso-a")])

    files, probes = done.stdout.split("---\n")
    # Its own blocks only: nothing of the GPU's is shared with the other
    # vGPU (the turn between them comes in the read-only control block).
    assert sorted(files.split()) == [
        "/run/vgpud",
        "/run/vgpud/vgpu",
        CONTROL,
        USAGE,
    ]
    # The other vGPU's block is nowhere: not at its host path, not beside
    # ours, not through the other container's /proc (another PID namespace).
    assert probes.splitlines() == [
        "DENIED open-read: ENOENT",
        "DENIED open-read: ENOENT",
        "DENIED open-read: ENOENT",
        "OK open-write",  # its own usage block is its to write
    ]


def test_a_container_cannot_raise_its_own_limits(
    vgpud: Vgpud, podman: Podman, make_vgpu: MakeVgpu
) -> None:
    vgpu = make_vgpu(name="ro", memory="1g", share=20)
    before = limits_in_block(vgpu)

    script = f"""
        vgpu-probe open {CONTROL} r
        vgpu-probe open {CONTROL} w
        vgpu-probe map {CONTROL}
        mount -o remount,rw,bind {CONTROL} 2>/dev/null && echo REMOUNTED || echo NO-REMOUNT
        umount {CONTROL} 2>/dev/null && echo UNMOUNTED || echo NO-UMOUNT
    """
    done = podman.run(["sh", "-c", script], devices=[cdi_device("ro")])

    assert done.stdout.splitlines() == [
        "OK open-read",
        "DENIED open-write: EROFS",
        "OK open-read",
        "DENIED mmap-write: EACCES",
        "DENIED mprotect-write: EACCES",
        "NO-REMOUNT",  # no CAP_SYS_ADMIN in a container
        "NO-UMOUNT",
    ], done.stderr
    assert limits_in_block(vgpu) == before


def _offset_of_device_used(device: int) -> int:
    return UsageC.devices.offset + device * ctypes.sizeof(UsageDeviceC) + UsageDeviceC.used.offset


def _poke(offset: int, value: int) -> str:
    return f"vgpu-probe poke {USAGE} {offset} {value:016x}"


def test_scribbling_on_a_usage_block_harms_neither_the_daemon_nor_another_vgpu(
    vgpud: Vgpud,
    podman: Podman,
    make_vgpu: MakeVgpu,
    sim_state: dict[str, str],
    sim_volumes: list[str],
) -> None:
    scribbler = make_vgpu(name="scribbler", memory="1g", share=20)
    victim = make_vgpu(name="bystander", memory="1g", share=20)
    podman.start(
        "bystander",
        ["vgpu-burn", "--alloc", "256m", "--hold", "--seconds", "5"],
        devices=[cdi_device("bystander")],
        env=sim_state,
        volumes=sim_volumes,
    )

    def bystander_used() -> int:
        return int(vgpud.get(f"/v1/vgpus/{victim['id']}")["gpus"][0]["memory_used"])

    wait_for(lambda: bystander_used() >= 256 * MIB, what="the bystander's allocation")

    slot0 = UsageC.slots.offset
    garbage = [
        _poke(_offset_of_device_used(0), 1 << 62),  # absurd usage
        _poke(_offset_of_device_used(0) + 8, (1 << 64) - 1),  # absurd peak
        _poke(slot0 + ProcSlotC.state.offset, 0x0000_0007_0000_0002),  # live slot, absurd pid
        _poke(slot0 + ProcSlotC.dev.offset, 1 << 63),  # its usage
    ]
    done = podman.run(["sh", "-c", "\n".join(garbage)], devices=[cdi_device("scribbler")])
    assert done.returncode == 0, done.stdout + done.stderr  # all of it was allowed
    # Clamped, not believed, and reported.
    wait_for(
        lambda: any(e["type"] == "counter.absurd" for e in vgpud.events(scribbler["id"])),
        what="the absurd counters to be reported",
    )
    assert vgpud.get("/v1/vgpus/scribbler")["gpus"][0]["memory_used"] <= 2**50

    # Then it wrecks the header and cuts the block short under the daemon's mapping.
    wreck = [_poke(0, 0x4141414141414141), f"vgpu-probe truncate {USAGE} 100"]
    done = podman.run(["sh", "-c", "\n".join(wreck)], devices=[cdi_device("scribbler")])
    assert done.returncode == 0, done.stdout + done.stderr

    # The bystander's burn runs on for several scans and ends normally; the
    # daemon answered all along and its figures are the bystander's own.
    assert podman.wait("bystander", timeout=60) == 0, podman.logs("bystander")
    assert vgpud.alive(), vgpud.log_text()
    assert vgpud.healthy()
    wait_for(lambda: bystander_used() == 0, what="the bystander's memory to be reclaimed")
    # The daemon noticed the cut-short block and made its vGPU a new one.
    wait_for(
        lambda: any(e["type"] == "block.repaired" for e in vgpud.events(scribbler["id"])),
        what="the scribbler's usage block to be recreated",
    )
    again = podman.run(
        ["vgpu-burn", "--alloc", "128m", "--seconds", "0"],
        devices=[cdi_device("scribbler")],
        env=sim_state,
        volumes=sim_volumes,
    )
    assert again.returncode == 0, again.stdout + again.stderr
