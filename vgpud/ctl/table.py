"""Plain-text tables and the vGPU rows vgpuctl shows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vgpud.terminal import shown
from vgpud.units import format_bytes, ppm_to_percent


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[_cell(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def _cell(value: object) -> str:
    return "-" if value is None else shown(str(value))


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
                    f"{ppm_to_percent(g['quota_ppm']):.0f}",
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


DEVICE_HEADERS = (
    "GPU",
    "UUID",
    "NAME",
    "MEMORY",
    "USED",
    "SMS",
    "CC",
    "UTIL%",
    "MIG",
    "HEALTH",
    "VGPUS",
)


def device_rows(devices: Sequence[dict[str, Any]]) -> list[list[object]]:
    return [
        [
            d["index"],
            d["uuid"],
            d["name"],
            format_bytes(d["memory_total"]),
            _bytes(d["memory_used"]),
            d["sms"],
            d["compute_capability"],
            None if d["utilization"] is None else f"{d['utilization']:.0f}",
            "on" if d["mig_mode"] else "off",
            "ok" if d["healthy"] else f"unhealthy: {d['health_reason'] or 'unknown'}",
            ",".join(d["vgpus"]),
        ]
        for d in devices
    ]


PROCESS_HEADERS = ("PID", "CONTAINER PID", "KIND", "COMMAND", "MEMORY", "UTIL%")


def process_rows(processes: Sequence[dict[str, Any]]) -> list[list[object]]:
    """One row per process: memory by the hook's word (NVML's where the hook
    holds none), summed over its GPUs."""
    rows: list[list[object]] = []
    for p in sorted(processes, key=lambda p: p["host_pid"]):
        memory = sum((p["hooked"] or p["memory"]).values())
        util = p["utilization"]
        rows.append(
            [
                p["host_pid"],
                p["container_pid"],
                p["kind"],
                p["comm"],
                format_bytes(memory),
                f"{sum(util.values()):.0f}" if util else None,
            ]
        )
    return rows


def show(v: dict[str, Any], processes: Sequence[dict[str, Any]]) -> str:
    """A vGPU in detail, with the processes the daemon's last scan found in it."""
    mine = [p for p in processes if p["vgpu"] == v["id"]]
    table = render(PROCESS_HEADERS, process_rows(mine)) if mine else "  none found by the last scan"
    if v.get("kind") == "standalone":
        return _show_standalone(v) + "\n\nprocesses:\n" + table
    lines = [
        f"vGPU {shown(v['id'])}" + (f" ({shown(v['name'])})" if v["name"] else ""),
        f"  memory {_memory(v['memory'])}  share {v['share']}% {v['mode']}  weight {v['weight']}"
        + ("  oversubscribe" if v["oversubscribe"] else "")
        + ("  exclusive" if v["exclusive"] else ""),
        f"  processes {v['processes']}",
    ]
    if v["labels"]:
        lines.append("  labels " + _pairs(v["labels"]))
    if v["owner"]:
        lines.append("  owner " + _pairs(v["owner"]))
    user = v["user"]
    lines.append(
        f"  user uid {user['uid']}" + (f" gid {user['gid']}" if user["gid"] is not None else "")
    )
    lines.append("")
    lines.append(render(VGPU_HEADERS, vgpu_rows([v])))
    lines.append("")
    lines.append(render(GPU_HEADERS, gpu_rows(v)))
    lines.append("")
    lines.append("processes:")
    lines.append(table)
    lines.append("")
    lines.append("environment for a plain process (vgpuctl env --shell):")
    lines += [f"  {shown(k)}={shown(val)}" for k, val in v["host_env"].items()]
    lines.append(f"CDI device: {shown(v['recipe']['cdi_device'])}")
    return "\n".join(lines)


def _pairs(mapping: dict[str, str]) -> str:
    return ", ".join(f"{shown(k)}={shown(val)}" for k, val in mapping.items())


def _show_standalone(v: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"vGPU {shown(v['id'])}"
            " (standalone: limits from the container's environment, read-only)",
            f"  share {v['share']:g}%  processes {v['processes']}  pids "
            + " ".join(str(p) for p in v["pids"]),
            "",
            render(VGPU_HEADERS, vgpu_rows([v])),
            "",
            render(GPU_HEADERS, gpu_rows(v)),
        ]
    )
