"""vgpuctl doctor: is everything a vGPU needs in place?

Checks the daemon (answers? NVML? driver version?), and compares the CUDA
driver's exported entry points with the hook's: a cu* function the driver
has and the hook does not intercept is a road around the limits when it
allocates memory or launches work, so those are flagged, except the ones
reviewed one by one against driver 580 (docs/gpu/driver-facts.md), which
pass through by design and are listed with the reason.
"""

from __future__ import annotations

import ctypes.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vgpud.ctl.client import ApiFailure, Client, DaemonUnreachable
from vgpud.ctl.elf import ElfError, exported_functions
from vgpud.libpaths import LibraryNotFound, find_library

# Names that look like a way to get device memory or to start work on the GPU,
# and (checked second) the words of queries, host memory and teardown. The
# generic node adder (cuGraphAddNode*) adds memory nodes too, and context
# limits (cuCtxSetLimit) reserve device memory for stacks, FIFO and heap.
RISKY = re.compile(
    r"Alloc|MemCreate|MemMap|PoolCreate|Import|Array\w*Create|Ipc\w*Open|"
    r"Launch|GraphInstantiate|GraphAdd(Kernel|Mem\w*)?Node|CtxSetLimit"
)
HARMLESS = re.compile(r"Host|Get|Query|Destroy|Free|Release|Attribute|Granularity")

# Teardown the hook must see as well: memory it charged lives on after
# cuMemRelease while mapped, and graphs, contexts and pools give memory back
# when destroyed. Missing, they would not open a road around the limits but
# would keep bytes charged (a false out-of-memory): flagged all the same.
ACCOUNTED_TEARDOWN = frozenset(
    {
        "cuMemRelease",
        "cuMemUnmap",
        "cuMemAddressFree",
        "cuCtxDestroy",
        "cuCtxDestroy_v2",
        "cuGraphDestroy",
        "cuMemPoolDestroy",
    }
)


# Names RISKY matches that the hook leaves alone on purpose, and why
# (reviewed against driver 580's exports: docs/gpu/driver-facts.md).
REVIEWED: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), why)
    for pattern, why in (
        (
            r"^cuGraphAdd(Kernel|Memcpy|Memset)Node",
            "a graph node runs when its graph is launched, and cuGraphLaunch is paced",
        ),
        (
            r"^cu(ImportExternal(Memory|Semaphore)|MemImportFromShareableHandle|"
            r"MemPoolImport(FromShareableHandle|Pointer)|IpcOpen(Mem|Event)Handle)",
            "memory or an event another process or API made: counted to its owner",
        ),
    )
)


def risky(name: str) -> bool:
    return name in ACCOUNTED_TEARDOWN or (bool(RISKY.search(name)) and not HARMLESS.search(name))


def reviewed(name: str) -> str | None:
    """Why a risky-looking entry point may pass through, if it was reviewed."""
    return next((why for pattern, why in REVIEWED if pattern.search(name)), None)


SIM_DRIVER = "sim/libcuda.so.1"  # under the library directory (build/ in a checkout)
DRIVER_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/libcuda.so.1",
)


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    problems: int = 0

    def ok(self, text: str) -> None:
        self.lines.append(f"ok    {text}")

    def bad(self, text: str) -> None:
        self.lines.append(f"FAIL  {text}")
        self.problems += 1

    def note(self, text: str) -> None:
        self.lines.append(f"      {text}")


def find_driver(explicit: str | None, simulated: bool, environ: Mapping[str, str]) -> Path | None:
    """The libcuda.so.1 a vGPU's process gets: the one named; on a daemon
    that runs the simulated GPU, the simulator (its recipe puts it first on
    the library path); otherwise the loader's order: LD_LIBRARY_PATH, the
    distributions' places, ldconfig's cache."""
    if explicit:
        return Path(explicit)
    if simulated:
        try:
            return find_library(SIM_DRIVER)
        except LibraryNotFound:
            return None
    searched = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    for candidate in [str(Path(d) / "libcuda.so.1") for d in searched] + list(DRIVER_PATHS):
        if Path(candidate).is_file():
            return Path(candidate)
    name = ctypes.util.find_library("cuda")
    return Path(name) if name and Path(name).is_absolute() else None


@dataclass
class Unhooked:
    """cu* functions of the driver the hook lacks."""

    risky: list[str]  # look like allocating or launching, not reviewed: a problem
    by_design: list[tuple[str, str]]  # look so, reviewed: (name, why it is safe)
    others: list[str]


def unhooked(driver: set[str], hook: set[str]) -> Unhooked:
    missing = sorted(n for n in driver - hook if n.startswith("cu"))
    result = Unhooked([], [], [])
    for name in missing:
        if not risky(name):
            result.others.append(name)
        elif (why := reviewed(name)) is None:
            result.risky.append(name)
        else:
            result.by_design.append((name, why))
    return result


def doctor(client: Client, driver_path: str | None, hook_path: str | None, verbose: bool) -> Report:
    report = Report()
    simulated = False
    try:
        health = client.get("/v1/health")
        simulated = bool(health.get("simulated"))
        report.ok(
            f"vgpud answers on {client.socket_path} (version {health['version']}"
            + (", on the SIMULATED GPU)" if simulated else ")")
        )
        if health["nvml"]:
            report.ok(f"NVML reachable: driver {health['driver_version']}, {health['gpus']} GPU(s)")
        else:
            report.bad("the daemon has no NVML: no driver found by vgpud")
        if health["gpus_unhealthy"]:
            report.bad(f"{health['gpus_unhealthy']} GPU(s) unhealthy (see vgpuctl list / devices)")
    except (DaemonUnreachable, ApiFailure) as exc:
        report.bad(str(exc))

    driver = find_driver(driver_path, simulated, os.environ)
    try:
        hook = Path(hook_path) if hook_path else find_library("libvgpu.so")
    except LibraryNotFound as exc:
        report.bad(str(exc))
        return report
    if driver is None:
        report.bad("no libcuda.so.1 found (give --libcuda PATH)")
        return report
    try:
        driver_syms, hook_syms = exported_functions(driver), exported_functions(hook)
    except (OSError, ElfError) as exc:
        report.bad(f"cannot read the symbol tables: {exc}")
        return report
    gaps = unhooked(driver_syms, hook_syms)
    hooked = sum(1 for n in hook_syms if n.startswith("cu"))
    report.ok(f"driver {driver}: {sum(1 for n in driver_syms if n.startswith('cu'))} cu* exports")
    report.ok(f"hook {hook}: {hooked} cu* entry points intercepted")
    if gaps.risky:
        report.bad(
            f"{len(gaps.risky)} driver entry points that may allocate or launch are not "
            "intercepted (a newer driver than the hook knows? see docs/gpu/driver-facts.md):"
        )
        for name in gaps.risky:
            report.note(name)
    else:
        report.ok("every driver entry point that allocates or launches is intercepted")
    report.note(
        f"{len(gaps.by_design)} that look like it pass through by design"
        + ("" if verbose else " (--verbose: which and why)")
    )
    if verbose:
        for name, why in gaps.by_design:
            report.note(f"  {name}: {why}")
    report.note(f"{len(gaps.others)} other cu* entry points pass through untouched")
    if verbose:
        for name in gaps.others:
            report.note(f"  {name}")
    return report
