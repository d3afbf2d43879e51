"""The allocation roads of docs/security.md (attacks 5, 6, 9) on a real GPU.

Each test drives one road with build/vgpu-memprobe (the driver API only)
under a slice and checks from outside, with NVML, that the process and its
children never held more than the slice - the real driver's word on what a
road costs, where tests/integration/test_hook_alloc_roads.py has the
simulator's. Context overhead counts against the slice (the hook measures
it), so every slice here leaves room for it.
"""

from __future__ import annotations

import json

import pytest

from .conftest import BUILD, GiB, Hooked, MiB, Result

MEMPROBE = BUILD / "vgpu-memprobe"
SLICE = 2 * GiB
OK = "CUDA_SUCCESS"
OOM = "CUDA_ERROR_OUT_OF_MEMORY"


def memprobe(
    hooked: Hooked, *commands: str, limit: int = SLICE, args: tuple[str, ...] = ()
) -> tuple[Result, list[dict[str, object]]]:
    """Run the probe in a child of the measured process; its JSON lines."""
    code = (
        "import json, subprocess, sys\n"
        f"r = subprocess.run({[str(MEMPROBE), *args, *commands]!r}, capture_output=True, "
        "text=True)\n"
        "print(json.dumps({'rc': r.returncode, 'lines': r.stdout.splitlines(), "
        "'err': r.stderr}))\n"
    )
    res = hooked.run(code, limit)
    assert res.rc == 0, res.err
    out = res.json()
    lines = [json.loads(line) for line in out["lines"] if line.startswith("{")]  # type: ignore[union-attr]
    return res, lines


def results(lines: list[dict[str, object]], op: str) -> list[object]:
    return [line["result"] for line in lines if line.get("op") == op]


def test_released_vmm_handles_that_stay_mapped_stay_inside_the_slice(hooked: Hooked) -> None:
    res, lines = memprobe(hooked, *["alloc:vmmmap:256m"] * 10)
    got = results(lines, "alloc")
    assert OOM in got and got.index(OOM) <= 7
    assert res.nvml_peak <= SLICE, f"NVML saw {res.nvml_peak / MiB:.0f} MiB"


def test_a_retained_vmm_handle_stays_inside_the_slice(hooked: Hooked) -> None:
    res, lines = memprobe(hooked, *["vmm-retain:256m"] * 10)
    assert OOM in results(lines, "vmm-retain")
    assert res.nvml_peak <= SLICE


@pytest.mark.parametrize(
    "commands",
    [
        ("limit:stack:16384",),  # ~4.1 GiB on an H200: refused
        ("limit:stack:2048", "alloc:alloc:1g", "alloc:alloc:1g"),
        ("limit:heap:3g",),
        ("limit:fifo:3g",),
    ],
    ids=["stack-over", "stack-then-allocations", "heap", "fifo"],
)
def test_context_limits_stay_inside_the_slice(hooked: Hooked, commands: tuple[str, ...]) -> None:
    res, lines = memprobe(hooked, *commands, "sync")
    assert OOM in results(lines, "limit") + results(lines, "alloc")
    assert res.nvml_peak <= SLICE, f"NVML saw {res.nvml_peak / MiB:.0f} MiB"


@pytest.mark.parametrize("path", ["graph", "graphnode", "graphnode2"])
def test_graph_memory_nodes_by_every_road_stay_inside_the_slice(hooked: Hooked, path: str) -> None:
    res, lines = memprobe(hooked, *[f"alloc:{path}:256m"] * 10)
    assert OOM in results(lines, "alloc")
    assert res.nvml_peak <= SLICE


def test_captured_stream_ordered_memory_stays_inside_the_slice(hooked: Hooked) -> None:
    """What a captured graph frees stays in the graph pool until a trim."""
    res, lines = memprobe(hooked, *["capture:512m", "alloc:alloc:512m"] * 4)
    assert OOM in results(lines, "alloc")
    assert res.nvml_peak <= SLICE


def test_what_the_driver_frees_is_given_back(hooked: Hooked) -> None:
    """A destroyed context, a pool destroyed with nothing outstanding, a
    graph destroyed before it ran: the memory is gone on the GPU, so the
    slice can be used again."""
    res, lines = memprobe(
        hooked,
        "ctx-leak:512m",
        "ctx-leak:512m",
        "ctx-leak:512m",
        "alloc:pool:512m",
        "free",
        "pool-destroy",
        "graph-drop:512m",
        "graph-drop:512m",
        "graph-drop:512m",
        "alloc:alloc:1g",
    )
    assert set(results(lines, "ctx-leak")) == {OK}
    assert set(results(lines, "graph-drop")) == {OK}
    assert results(lines, "alloc")[-1] == OK
    assert res.nvml_peak <= SLICE


def test_what_is_freed_into_a_destroyed_pool_stays_charged(hooked: Hooked) -> None:
    """The driver keeps it on the GPU (driver 580: past later allocations)."""
    res, lines = memprobe(
        hooked, "alloc:pool:512m", "pool-destroy", "free", "sync", *["alloc:alloc:512m"] * 3
    )
    assert results(lines, "pool-destroy") == [OK]
    assert OOM in results(lines, "alloc")
    assert res.nvml_peak <= SLICE


def test_a_graph_that_ran_keeps_its_memory_charged(hooked: Hooked) -> None:
    res, lines = memprobe(hooked, *["graph-keep:256m"] * 10)
    assert OOM in results(lines, "graph-keep")
    assert res.nvml_peak <= SLICE


def test_every_mipmap_level_and_layer_is_charged(hooked: Hooked) -> None:
    res, lines = memprobe(hooked, *["alloc:mipmaplayered:1m"] * 64)
    assert OOM in results(lines, "alloc")
    assert res.nvml_peak <= SLICE


def test_stream_ordered_memory_on_another_device_is_held_to_that_device(hooked: Hooked) -> None:
    import pynvml

    pynvml.nvmlInit()
    if pynvml.nvmlDeviceGetCount() < 2:
        pytest.skip("needs two GPUs")
    # The slice is 2 GiB on every device; 3 GiB on device 1 must not fit.
    _, lines = memprobe(hooked, "async-on:1:3g", "pool-on:1:3g")
    assert results(lines, "async-on") == [OOM] and results(lines, "pool-on") == [OOM]
