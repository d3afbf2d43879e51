"""vgpud-k8s: vgpud's Kubernetes node agent, a client of vgpud's socket.

    vgpud-k8s device-plugin   # the kubelet device plugin (API v1beta1)
    vgpud-k8s dra             # the DRA kubelet plugin (resource.k8s.io/v1)

Exit status: 0 on SIGTERM/SIGINT, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import Coroutine, Sequence
from typing import Any

import structlog

from vgpud import log as logging_setup
from vgpud.ctl.client import default_socket
from vgpud.ctl.main import user_arg
from vgpud.k8s.allocate import DEVICE_PLUGIN_OWNER, Allocator, Settings
from vgpud.k8s.daemon import Daemon
from vgpud.k8s.deviceplugin import DevicePlugin
from vgpud.k8s.inventory import Inventory
from vgpud.k8s.podresources import DEFAULT_SOCKET as POD_RESOURCES_SOCKET
from vgpud.k8s.podresources import PodResources
from vgpud.k8s.reconcile import Reconciler
from vgpud.k8s.registration import DEFAULT_DIR, Plugins
from vgpud.k8s.resources import RESOURCES, Units
from vgpud.units import parse_bytes

log = structlog.get_logger("vgpud.k8s")


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging_setup.configure(args.log_level, args.log_format, os.environ)
    try:
        work = args.func(args)
    except ValueError as exc:
        parser().error(str(exc))
    log.info("vgpud-k8s starting", mode=args.command, config=_shown(args))
    asyncio.run(_until_signalled(work))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vgpud-k8s", description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", default=default_socket(), help="vgpud's socket (env VGPUD_SOCKET)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="auto", choices=["auto", "console", "json"])
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("device-plugin", help="serve vgpud.io/vgpu, -memory and -cores")
    d.add_argument("--plugin-dir", default=DEFAULT_DIR, help="the kubelet's device plugin dir")
    d.add_argument("--pod-resources", default=POD_RESOURCES_SOCKET, help="the kubelet's socket")
    d.add_argument("--shares", type=int, default=4, help="vgpud.io/vgpu slots per GPU")
    d.add_argument(
        "--memory-unit", type=parse_bytes, default="256m", help="bytes per vgpud.io/vgpu-memory"
    )
    d.add_argument("--mode", choices=["hard", "soft"], default="hard", help="compute share mode")
    d.add_argument("--user", type=user_arg, help="UID[:GID] the vGPUs' processes run as")
    d.add_argument(
        "--inject", choices=["both", "cdi", "env"], default="both", help="what Allocate answers"
    )
    d.add_argument("--health-interval", type=float, default=5.0, help="seconds between reads")
    d.add_argument("--reconcile-interval", type=float, default=10.0)
    d.add_argument("--grace", type=float, default=60.0, help="seconds before a vGPU can be orphan")
    d.set_defaults(func=device_plugin)
    return p


def device_plugin(args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    units = Units(shares=args.shares, memory_unit=args.memory_unit)
    daemon = Daemon(args.socket)
    pods = PodResources(args.pod_resources)
    inventory = Inventory(daemon, units, args.health_interval)
    allocator = Allocator(daemon, pods, Settings(units=units, mode=args.mode, user=args.user))
    plugins = Plugins(
        args.plugin_dir,
        {r: DevicePlugin(r, inventory, allocator, args.inject) for r in RESOURCES},
    )
    reconciler = Reconciler(daemon, pods, DEVICE_PLUGIN_OWNER, args.reconcile_interval, args.grace)

    async def run() -> None:
        await inventory.refresh()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(inventory.run())
            tasks.create_task(plugins.run())
            tasks.create_task(reconciler.run())

    return run()


async def _until_signalled(work: Coroutine[Any, Any, None]) -> None:
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    log.info("vgpud-k8s stopped")


def _shown(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k != "func"}


if __name__ == "__main__":
    raise SystemExit(main())
