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
from pathlib import Path
from typing import Any

import structlog
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from vgpud import log as logging_setup
from vgpud.ctl.client import default_socket
from vgpud.ctl.main import user_arg
from vgpud.dirs import PARENT_MODE, make_dirs
from vgpud.k8s.allocate import DEVICE_PLUGIN_OWNER, Allocator, Settings
from vgpud.k8s.checkpoint import Checkpoint
from vgpud.k8s.daemon import Daemon
from vgpud.k8s.deviceplugin import DevicePlugin
from vgpud.k8s.dra import ApiClaims, Driver, grpc_server
from vgpud.k8s.drahealth import Health
from vgpud.k8s.inventory import Inventory
from vgpud.k8s.pluginwatcher import (
    DEFAULT_REGISTRY,
    Registrar,
    registration_socket,
    remove_stale,
    serve,
)
from vgpud.k8s.podresources import DEFAULT_SOCKET as POD_RESOURCES_SOCKET
from vgpud.k8s.podresources import PodResources
from vgpud.k8s.reconcile import Reconciler
from vgpud.k8s.registration import DEFAULT_DIR, Plugins
from vgpud.k8s.resources import RESOURCES, Units
from vgpud.k8s.slices import DEFAULT_MAX_VGPUS, DRIVER, Publisher
from vgpud.units import parse_bytes

log = structlog.get_logger(__name__)
DRA_DIR = f"/var/lib/kubelet/plugins/{DRIVER}"


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

    r = sub.add_parser("dra", help="the DRA kubelet plugin of driver vgpud.io")
    r.add_argument("--node-name", default=os.environ.get("NODE_NAME"), help="env NODE_NAME")
    r.add_argument("--plugin-dir", default=DRA_DIR, help="its sockets and checkpoint")
    r.add_argument("--registry", default=DEFAULT_REGISTRY, help="the kubelet's plugin watcher dir")
    r.add_argument("--kubeconfig", help="default: the pod's service account")
    r.add_argument("--shares", type=int, default=4, help="default request: 1/N of a GPU")
    r.add_argument("--memory-unit", type=parse_bytes, default="256m", help="memory request step")
    r.add_argument(
        "--no-consumable-capacity",
        action="store_true",
        help="publish whole GPUs (API servers before 1.34, or the DRAConsumableCapacity gate off)",
    )
    r.add_argument(
        "--max-vgpus-per-gpu",
        type=int,
        default=DEFAULT_MAX_VGPUS,
        help="vgpud's max_vgpus_per_gpu: claims the scheduler may place on one GPU",
    )
    r.add_argument("--user", type=user_arg, help="UID[:GID] the vGPUs' processes run as")
    r.add_argument("--health-interval", type=float, default=5.0, help="seconds between reads")
    r.set_defaults(func=dra_driver)
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


def dra_driver(args: argparse.Namespace) -> Coroutine[Any, Any, None]:
    if not args.node_name:
        raise ValueError("dra needs --node-name (or NODE_NAME)")
    units = Units(shares=args.shares, memory_unit=args.memory_unit)
    daemon = Daemon(args.socket)
    api = k8s.ResourceV1Api(_api_client(args.kubeconfig))
    plugin_dir = Path(args.plugin_dir)
    make_dirs(plugin_dir, PARENT_MODE)
    driver = Driver(daemon, ApiClaims(api), Checkpoint(plugin_dir / "checkpoint.json"), args.user)
    inventory = Inventory(daemon, units, args.health_interval)
    publisher = Publisher(
        api, args.node_name, units, not args.no_consumable_capacity, args.max_vgpus_per_gpu
    )
    dra_socket = plugin_dir / "dra.sock"
    reg_socket = registration_socket(args.registry, DRIVER)

    async def publish() -> None:
        while True:
            try:
                await publisher.publish(inventory.gpus)
            except (k8s.ApiException, OSError) as exc:
                log.warning("ResourceSlice not published; retrying", reason=str(exc)[:200])
            await asyncio.sleep(args.health_interval)

    async def run() -> None:
        await inventory.refresh()
        remove_stale(dra_socket)
        server = grpc_server(driver, Health(inventory, args.node_name), str(dra_socket))
        await server.start()
        registration = await serve(Registrar(DRIVER, str(dra_socket)), reg_socket)
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(inventory.run())
                tasks.create_task(publish())
        finally:
            await registration.stop(grace=1)
            await server.stop(grace=1)
            remove_stale(reg_socket)
            remove_stale(dra_socket)

    return run()


def _api_client(kubeconfig: str | None) -> k8s.ApiClient:
    if kubeconfig is None:
        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
        return k8s.ApiClient()
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, client_configuration=configuration
    )
    return k8s.ApiClient(configuration)


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
