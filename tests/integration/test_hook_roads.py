"""Every road to the driver reaches the hook (simulated GPU).

Linked programs, dlopen + dlsym (library handle, RTLD_DEFAULT, RTLD_NEXT),
and cuGetProcAddress / cuGetProcAddress_v2 for every requested version and
flag: a caller gets our wrapper of exactly the variant the driver would have
given it, unknown and unhooked names pass through untouched.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import vgpud
from tests.conftest import BUILD, ROOT
from tests.helpers.memprobe import LIBVGPU, MEMPROBE, MiB, hooked, probe

EXPORT_PREFIXES = ("cu", "nvml")


def limited(sim_env: dict[str, str]) -> dict[str, str]:
    """Standalone at 64 MiB, on a block of the test's own (beside its
    simulated GPU's state), never the machine's /tmp/vgpud-<uid>.usage."""
    usage = Path(sim_env["VGPU_SIM_STATE"]).with_suffix(".usage")
    return hooked(sim_env, CUDA_MEM_LIMIT="64m", VGPU_SIM_CTX_OVERHEAD="0", VGPU_USAGE=str(usage))


def exported_names() -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(LIBVGPU)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_only_the_intercepted_api_is_exported() -> None:
    names = exported_names()
    assert "dlsym" in names and "vgpu_version" in names and "cuMemAlloc_v2" in names
    stray = {
        n for n in names if not n.startswith(EXPORT_PREFIXES) and n not in ("dlsym", "vgpu_version")
    }
    assert stray == set()


def test_library_reports_its_version() -> None:
    code = (
        f"import ctypes; lib = ctypes.CDLL({str(LIBVGPU)!r});"
        " lib.vgpu_version.restype = ctypes.c_char_p; print(lib.vgpu_version().decode())"
    )
    out = subprocess.run(["python3", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == vgpud.__version__  # one version: the package's


def roads(env: dict[str, str]) -> list[dict[str, Any]]:
    out = subprocess.run(
        [str(MEMPROBE), "roads"], env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


def test_proc_address_and_dlsym_give_our_wrapper_of_the_same_variant(
    sim_env: dict[str, str],
) -> None:
    native = roads(sim_env)
    through_hook = roads(hooked(sim_env))
    hooked_names = {n for n in exported_names() if n.startswith(EXPORT_PREFIXES)}
    assert len(native) == len(through_hook) > 300
    seen_ptsz = seen_self = False
    for plain, ours in zip(native, through_hook, strict=True):
        where = f"{ours['api']} {ours['symbol']} v{ours['version']} ptsz={ours['ptsz']}"
        if ours["api"] in ("dlsym-default", "dlsym-next") and not plain["name"] and ours["name"]:
            # The preloaded library exports its wrappers: a global lookup
            # (or the program's RTLD_NEXT) of a name it never loaded finds
            # ours, which forwards.
            assert (ours["lib"], ours["name"]) == ("libvgpu.so", ours["symbol"]), where
            continue
        # The driver's answer is untouched: same code, status, and ABI variant.
        assert (ours["rc"], ours["status"], ours["name"]) == (
            plain["rc"],
            plain["status"],
            plain["name"],
        ), where
        if not plain["name"]:
            continue  # not found: nothing to substitute
        expected_lib = "libvgpu.so" if plain["name"] in hooked_names else plain["lib"]
        assert ours["lib"] == expected_lib, where
        seen_ptsz |= ours["name"].endswith("_ptsz") and ours["lib"] == "libvgpu.so"
        seen_self |= ours["symbol"] == "cuGetProcAddress" and ours["lib"] == "libvgpu.so"
    assert seen_ptsz and seen_self


# What each requested version gets for cuCtxCreate (docs/gpu/driver-facts.md;
# the simulator's thresholds are in docs/simulator.md).
CTX_CREATE_BY_VERSION = {
    3000: "cuCtxCreate",
    11040: "cuCtxCreate_v3",
    12000: "cuCtxCreate_v3",
    12080: "cuCtxCreate_v4",
    13000: "cuCtxCreate_v4",
}


def test_every_context_creation_variant_reaches_our_wrapper(sim_env: dict[str, str]) -> None:
    """CUDA 11.4+ runtimes create contexts through cuCtxCreate_v3, 12.5+
    through _v4: both roads lead to our wrapper of that variant."""
    rows = [r for r in roads(hooked(sim_env)) if r["symbol"] == "cuCtxCreate"]
    assert len(rows) == 2 * 2 * len(CTX_CREATE_BY_VERSION)  # v1/v2 x ptsz x versions
    for row in rows:
        expected = ("libvgpu.so", CTX_CREATE_BY_VERSION[row["version"]])
        assert (row["lib"], row["name"]) == expected, row


def test_unknown_and_unhooked_symbols_pass_through(sim_env: dict[str, str]) -> None:
    rows = roads(hooked(sim_env))
    unknown = [r for r in rows if r["symbol"] == "cuNoSuchFunction"]
    assert unknown and all(r["rc"] == 500 and r["name"] == "" for r in unknown)
    for name in ("cuGetExportTable", "cuStreamCreate"):
        found = [r for r in rows if r["symbol"] == name and r["name"]]
        assert found and all(r["lib"] == "libcuda.so.1" for r in found), name


@pytest.mark.parametrize("version", [11040, 12000, 12080, 13000])
@pytest.mark.parametrize("ptsz", [False, True])
def test_runtime_style_resolution_is_limited(
    sim_env: dict[str, str], version: int, ptsz: bool
) -> None:
    """A program that resolves everything through cuGetProcAddress_v2, as
    the CUDA runtime of that version does, is held to its limit."""
    args = ["--resolve", "procaddr", "--cuda-version", str(version)] + (["--ptsz"] if ptsz else [])
    for path in ("alloc", "async"):
        run = probe(
            limited(sim_env),
            f"alloc:{path}:48m",
            f"alloc:{path}:48m",
            "meminfo",
            args=args,
        )
        first, second = run.ops("alloc")
        assert first["result"] == "CUDA_SUCCESS"
        assert second["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
        assert run.ops("meminfo")[0]["total"] == 64 * MiB


def test_dlsym_resolution_is_limited(sim_env: dict[str, str]) -> None:
    run = probe(
        limited(sim_env),
        "alloc:alloc:48m",
        "alloc:alloc:48m",
        args=["--resolve", "dlsym"],
    )
    assert [a["result"] for a in run.ops("alloc")] == ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"]


LINKED_PROGRAM = r"""
#include <stdio.h>
#include "cuda_api.h"
int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr a, b;
    size_t free_b, total;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev))
        return 1;
    CUresult first = cuMemAlloc_v2(&a, 48 << 20);
    CUresult second = cuMemAlloc_v2(&b, 48 << 20);
    cuMemGetInfo_v2(&free_b, &total);
    printf("%d %d %zu\n", first, second, total);
    return 0;
}
"""


def test_program_linked_to_libcuda(sim_env: dict[str, str], tmp_path: Path) -> None:
    source = tmp_path / "linked.c"
    source.write_text(LINKED_PROGRAM)
    binary = tmp_path / "linked"
    subprocess.run(
        [
            "gcc",
            "-o",
            str(binary),
            str(source),
            f"-I{ROOT / 'libhook/include'}",
            f"-L{BUILD / 'sim'}",
            "-lcuda",
        ],
        check=True,
    )
    env = limited(sim_env)
    out = subprocess.run([str(binary)], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "2", str(64 * MiB)]
