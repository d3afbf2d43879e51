"""Plain-text tables and the vGPU rows vgpuctl shows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vgpud.units import format_bytes


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


VGPU_HEADERS = ("ID", "NAME", "GPU", "MEMORY", "USED", "SHARE", "MODE", "UTIL%", "QUOTA%", "PROCS")


def vgpu_rows(vgpus: Sequence[dict[str, Any]]) -> list[list[object]]:
    """One row per (vGPU, GPU)."""
    rows: list[list[object]] = []
    for v in vgpus:
        for g in v["gpus"]:
            util = g.get("utilization")
            rows.append(
                [
                    v["id"],
                    v["name"],
                    g["index"],
                    _bytes(g["memory_limit"]),  # None: a standalone vGPU without a limit
                    format_bytes(g["memory_used"]),
                    f"{v['share']:g}%",
                    v["mode"],
                    None if util is None else f"{util:.0f}",
                    f"{g['quota_ppm'] / 10_000:.0f}",
                    v["processes"],
                ]
            )
    return rows


GPU_HEADERS = ("GPU", "UUID", "USED", "PEAK", "OOMS", "GPU-TIME", "THROTTLED", "PROCS")


def gpu_rows(v: dict[str, Any]) -> list[list[object]]:
    """One row per GPU of a vGPU: what its slice on that GPU holds and did
    (PROCS: its processes NVML lists on that GPU)."""
    return [
        [
            g["index"],
            g["uuid"],
            format_bytes(g["memory_used"]),
            format_bytes(g["memory_peak"]),
            g["oom_count"],
            f"{g['gpu_time_ns'] / 1e9:.1f}s",
            f"{g['throttled_ns'] / 1e9:.1f}s",
            g["processes"],
        ]
        for g in v["gpus"]
    ]


def _memory(value: int | str) -> str:
    return format_bytes(value) if isinstance(value, int) else value


def _bytes(value: int | None) -> str | None:
    return None if value is None else format_bytes(value)


def show(v: dict[str, Any]) -> str:
    if v.get("kind") == "standalone":
        return _show_standalone(v)
    lines = [
        f"vGPU {v['id']}" + (f" ({v['name']})" if v["name"] else ""),
        f"  memory {_memory(v['memory'])}  share {v['share']}% {v['mode']}  weight {v['weight']}"
        + ("  oversubscribe" if v["oversubscribe"] else "")
        + ("  exclusive" if v["exclusive"] else ""),
        f"  processes {v['processes']}",
    ]
    if v["labels"]:
        lines.append("  labels " + ", ".join(f"{k}={val}" for k, val in v["labels"].items()))
    if v["owner"]:
        lines.append("  owner " + ", ".join(f"{k}={val}" for k, val in v["owner"].items()))
    user = v["user"]
    lines.append(
        f"  user uid {user['uid']}" + (f" gid {user['gid']}" if user["gid"] is not None else "")
    )
    lines.append("")
    lines.append(render(VGPU_HEADERS, vgpu_rows([v])))
    lines.append("")
    lines.append(render(GPU_HEADERS, gpu_rows(v)))
    lines.append("")
    lines.append("environment for a plain process (vgpuctl env --shell):")
    lines += [f"  {k}={val}" for k, val in v["host_env"].items()]
    lines.append(f"CDI device: {v['recipe']['cdi_device']}")
    return "\n".join(lines)


def _show_standalone(v: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"vGPU {v['id']} (standalone: limits from the container's environment, read-only)",
            f"  share {v['share']:g}%  processes {v['processes']}  pids "
            + " ".join(str(p) for p in v["pids"]),
            "",
            render(VGPU_HEADERS, vgpu_rows([v])),
            "",
            render(GPU_HEADERS, gpu_rows(v)),
        ]
    )
