"""vgpud: the node daemon's entry point and lifecycle.

Start: config (flags > env > file; the effective config is logged), the
atomics library, NVML (the simulator with --sim), adoption of the recorded
vGPUs, the API on the unix socket (a stale socket from a crash is replaced;
a live one means another vgpud runs: refused), READY=1 once the socket
answers. A failed start exits with EXIT_START_FAILED (3).

Running: three periodic jobs on one clock (vgpud/loops/clock.py: they share
the event loop's wake-ups), each timed into a histogram:
  control (control_interval): quotas and heartbeats into the control blocks;
          the watchdog ping rides on it;
  sample  (sample_interval):  NVML figures, read on NVML's thread and taken at
          the next tick (vgpud/loops/sample.py);
  scan    (scan_interval):    host processes, reaping, the backstop, events.
Each hands the service what it found (quotas, a sample, a scan), which
folds the node's snapshot that the API and /metrics render from.

Stop (SIGTERM/SIGINT), in this order: STOPPING=1; stop accepting; end event
streams; wait for running requests up to shutdown_timeout, then cancel the
stragglers with a log line; stop the loops; unmap blocks and close NVML;
remove the socket. A second SIGTERM/SIGINT exits at once. SIGHUP reloads the
config: what changed is logged, keys that need a restart are said so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import gc
import grp
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from vgpud import __version__, systemd
from vgpud import log as logsetup
from vgpud.config import RESTART_KEYS, Config, ConfigError, changed_keys, load_config
from vgpud.dirs import PARENT_MODE, make_dirs
from vgpud.errors import ApiError
from vgpud.libpaths import LibraryNotFound, find_library
from vgpud.loops.clock import Clock, Job
from vgpud.loops.control import QUIET_PERIOD_S, Steering
from vgpud.loops.sample import Sampling
from vgpud.loops.scan import Watch
from vgpud.observe import nvml
from vgpud.observe.tracker import Tracker
from vgpud.policy import controller
from vgpud.surface import events as ev
from vgpud.surface.api.app import make_app, make_metrics_app
from vgpud.surface.events import EventLog
from vgpud.surface.metrics import Metrics
from vgpud.surface.service import Service
from vgpud.vgpus import cdi
from vgpud.vgpus.abi import BlockError
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.recipe import sim_driver_env
from vgpud.vgpus.registry import Registry
from vgpud.vgpus.state import STATE_DIR_MODE, StateStore

EXIT_START_FAILED = 3
LOCK_FILE = "vgpud.lock"  # in state_dir
log = structlog.get_logger(__name__)


class StartError(Exception):
    """vgpud cannot start; the message says why."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vgpud", description="GPU sharing daemon (vGPUs on one node)")
    p.add_argument("--config", type=Path, help="config file (default /etc/vgpud/vgpud.toml)")
    p.add_argument("--socket", help="API unix socket path")
    p.add_argument("--run-dir", help="directory of the vGPU blocks")
    p.add_argument("--state-dir", help="directory of the durable state")
    p.add_argument(
        "--sim", action="store_true", default=None, help="use the simulated GPU (build/sim)"
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--version", action="version", version=f"vgpud {__version__}")
    return p.parse_args(argv)


def flags_of(args: argparse.Namespace) -> dict[str, Any]:
    def absolute(value: str | None) -> str | None:
        return os.path.abspath(value) if value else None

    return {
        "socket": absolute(args.socket),
        "run_dir": absolute(args.run_dir),
        "state_dir": absolute(args.state_dir),
        "sim": args.sim,
        "log_level": args.log_level,
    }


# How long a thread running Python keeps the GIL from one that waits for
# it (Python's default: 5 ms). The scan's tracking, the NVML calls and the
# saves run Python in worker threads; at each of its system calls the
# loop's thread gives the GIL up, and waited that long to get it back: a
# 1-client bench_api run saw the loop take 5.5-6.4 ms to read its
# self-pipe. At 1 ms, in three alternated pairs on the simulator with 100
# vGPUs and 1000 processes, closed-loop creates and deletes answered with a
# p99 of 8.85-9.37 / 7.55-7.89 ms (5 ms: 9.84-12.55 / 8.40-10.41) and 6-22 %
# more of them a second (docs/benchmarks/api-sim.md).
GIL_SWITCH_INTERVAL_S = 0.001


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    flags = flags_of(args)
    try:
        config = load_config(args.config, os.environ, flags)
    except ConfigError as exc:
        print(f"vgpud: {exc}", file=sys.stderr)
        return EXIT_START_FAILED
    logsetup.configure(config.log_level, config.log_format, os.environ)
    daemon = Daemon(config, lambda: load_config(args.config, os.environ, flags))
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    return asyncio.run(daemon.run())


@dataclass
class Node:
    """What a started daemon runs: built by Daemon._start, used by the loops."""

    service: Service
    metrics: Metrics
    tracker: Tracker
    watch: Watch
    steering: Steering


class Daemon:
    def __init__(self, config: Config, reload: Callable[[], Config]) -> None:
        self.config = config
        self.reload_config = reload
        self.notifier = systemd.notifier(os.environ)
        self.stop_event = asyncio.Event()
        self.events = EventLog(config.event_buffer)
        self.inflight: set[asyncio.Task[Any]] = set()
        self.loops: list[asyncio.Task[None]] = []
        self.runner: web.AppRunner | None = None
        self.metrics_runner: web.AppRunner | None = None
        self.registry: Registry | None = None
        self.gpus: nvml.GpuGateway | None = None
        self.node: Node | None = None
        self.sampling: Sampling | None = None
        self.socket_inode: int | None = None
        self.last_watchdog = 0.0
        self.state_lock: int | None = None  # held for the process's life

    async def run(self) -> int:
        self._install_signals()
        try:
            node = await self._start()
        except (StartError, ApiError, BlockError, OSError) as exc:
            log.error("vgpud failed to start", reason=str(exc))
            await self._release()
            return EXIT_START_FAILED
        _freeze_heap()
        self.notifier.ready()
        self.notifier.status(self._summary(node.service))
        log.info("vgpud ready", socket=self.config.socket, vgpus=len(node.service.registry.entries))
        await self.stop_event.wait()
        await self._stop()
        return 0

    # --- start ----------------------------------------------------------------

    async def _start(self) -> Node:
        c = self.config
        log.info("starting vgpud", version=__version__, config=c.as_dict())
        atomics = Atomics.load(Path(c.lib_dir))
        library = self._hook_library()
        self.gpus, driver_env = await self._open_nvml()
        store = StateStore(Path(c.state_dir))
        self.state_lock = _lock_state_dir(store.dir)
        self.registry = Registry(
            Path(c.run_dir), store, library, atomics, cdi=cdi.publisher(c.cdi_spec_dir)
        )
        ev.publish_adoption(self.events, self.registry.adopt())
        _warn_absent_gpus(self.registry, self.gpus.devices())
        service = Service(c, self.registry, self.gpus, self.events, driver_env=driver_env)
        _raise_fd_limit()
        tracker = Tracker(c.proc_root)
        node = Node(
            service,
            Metrics(service),
            tracker,
            Watch(service, self.events, tracker),
            Steering(atomics, _tuning(c)),
        )
        self.node = node
        # Each save's time, told on the loop (the histogram takes no lock).
        self.registry.on_saved = node.metrics.save_seconds.labels().observe
        await self._serve(service, node.metrics)
        # Each loop's histogram series, looked up once.
        observe = {
            name: node.metrics.loop_seconds.labels(name).observe
            for name in ("control", "sample", "scan")
        }
        self.sampling = Sampling(self.gpus, service, observe["sample"])
        clock = Clock(
            [
                Job("control", partial(self._interval, "control"), partial(self._control, node)),
                # Timed on NVML's thread, and told when taken.
                Job("sample", partial(self._interval, "sample"), self._sample, timed=False),
                Job("scan", partial(self._interval, "scan"), partial(self._scan, node), waits=True),
            ],
            lambda name, seconds: observe[name](seconds),
        )
        self.loops = [asyncio.get_running_loop().create_task(clock.run(), name="vgpud-clock")]
        return node

    def _hook_library(self) -> Path:
        try:
            return find_library("libvgpu.so", Path(self.config.lib_dir))
        except LibraryNotFound:
            path = Path(self.config.lib_dir) / "libvgpu.so"
            log.warning("libvgpu.so not found: recipes name it where it should be", path=str(path))
            return path

    async def _open_nvml(self) -> tuple[nvml.GpuGateway, dict[str, str]]:
        """NVML, and what host processes need to reach the same driver (only
        the simulated one needs anything: recipe.sim_driver_env)."""
        if not self.config.sim:
            return await nvml.open_nvml(on_health=self._on_health), {}
        try:
            path = find_library("sim/libnvidia-ml.so.1", Path(self.config.lib_dir))
            cuda = find_library("sim/libcuda.so.1", Path(self.config.lib_dir))
        except LibraryNotFound as exc:
            raise StartError(f"--sim: {exc}") from exc
        log.info("GPU: SIMULATED (build/sim), not a real driver", library=str(path))
        gateway = nvml.NvmlGateway(str(path), on_health=self._on_health, cuda_library=str(cuda))
        try:
            await gateway.start()
        except nvml.NvmlUnavailable as exc:
            raise StartError(f"the simulated NVML does not start: {exc}") from exc
        return gateway, sim_driver_env(cuda.parent, os.environ)

    def _on_health(self, event: nvml.HealthEvent) -> None:
        self.events.publish(
            ev.GPU_HEALTH,
            gpu=event.uuid,
            kind=event.kind,
            xid=event.xid,
            critical=event.critical,
            message=event.message,
        )

    async def _serve(self, service: Service, metrics: Metrics) -> None:
        app = make_app(service, metrics)
        app.middlewares.insert(0, self._track_inflight)
        # shutdown_timeout is ours to handle (see _stop): aiohttp's must not wait again.
        # aiohttp's keep-alive timer runs from a connection's start and from each
        # answer until a whole request head has arrived: our header timeout. After
        # an answer to a request whose body never came whole (408), aiohttp
        # lingers, reading, so the client can read the answer: bounded alike.
        self.runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=0.1,
            keepalive_timeout=self.config.request_header_timeout,
            lingering_time=self.config.request_body_timeout,
        )
        await self.runner.setup()
        path = self.config.socket
        _claim_socket_path(path)
        old_umask = os.umask(0o117)  # never a moment with a world-writable socket
        try:
            await web.UnixSite(self.runner, path).start()
        finally:
            os.umask(old_umask)
        self.socket_inode = os.stat(path).st_ino
        os.chmod(path, 0o660)
        self._set_socket_group(path)
        if self.config.metrics_listen:
            host, _, port = self.config.metrics_listen.rpartition(":")
            self.metrics_runner = web.AppRunner(
                make_metrics_app(metrics),
                access_log=None,
                keepalive_timeout=self.config.request_header_timeout,
            )
            await self.metrics_runner.setup()
            await web.TCPSite(self.metrics_runner, host.strip("[]"), int(port)).start()
            log.info("metrics on TCP", address=self.config.metrics_listen)
        await _check_answers(path)

    def _set_socket_group(self, path: str) -> None:
        name = self.config.socket_group
        if not name:
            return
        try:
            gid = grp.getgrnam(name).gr_gid
        except KeyError:
            log.warning("socket group does not exist: socket is root-only", group=name)
            return
        try:
            os.chown(path, -1, gid)
        except PermissionError:
            log.warning("cannot give the socket to its group (not root?)", group=name)

    @web.middleware
    async def _track_inflight(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        task = asyncio.current_task()
        assert task is not None
        self.inflight.add(task)
        try:
            return await handler(request)
        finally:
            self.inflight.discard(task)

    # --- loops ----------------------------------------------------------------

    def _interval(self, name: str) -> float:
        """A loop's period now (a reload may have changed it). NVML is sampled
        at the scan's pace while nothing needs its figures sooner: no vGPU
        to steer, no process on a GPU (one that appears is in the next
        sample, as it would be in the next scan). The controller ticks at
        QUIET_PERIOD_S while its last tick computed nothing new."""
        period = float(getattr(self.config, f"{name}_interval"))
        if self.node is None:
            return period
        if name == "sample" and _idle(self.node.service):
            return max(period, self.config.scan_interval)
        if name == "control" and self.node.steering.reused:
            return max(period, QUIET_PERIOD_S)
        return period

    async def _control(self, node: Node) -> None:
        if self.sampling is not None:
            self.sampling.take()  # a sample read since the last tick
        service = node.service
        track = service.track
        # Standalone blocks belong to the tracker, which may unmap one while
        # its scan runs: steer them only between scans.
        standalone = track.standalone if track and not service.blocks_lock.locked() else {}
        quotas = node.steering.tick(
            service.registry.all(), standalone, track, service.sample, time.monotonic_ns()
        )
        service.ticked(quotas)  # new quotas and counters: a new snapshot once the last is old
        interval = self.notifier.watchdog_interval
        if interval is not None and time.monotonic() - self.last_watchdog >= interval:
            self.notifier.watchdog()
            self.last_watchdog = time.monotonic()

    async def _sample(self) -> None:
        assert self.sampling is not None
        self.sampling.start()

    async def _scan(self, node: Node) -> None:
        await node.watch.scan()
        self.notifier.status(self._summary(node.service))

    def _summary(self, service: Service) -> str:
        return (
            f"{len(service.registry.entries)} vGPUs, "
            f"{len(service.track.processes) if service.track else 0} processes, "
            f"{len(service.devices())} GPUs"
        )

    # --- signals and stop -----------------------------------------------------

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal, sig)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload)

    def _on_stop_signal(self, sig: signal.Signals) -> None:
        if self.stop_event.is_set():
            log.warning("second stop signal: exiting now", signal=sig.name)
            self._remove_socket()
            os._exit(128 + sig.value)
        log.info("stopping", signal=sig.name)
        self.stop_event.set()

    def _on_reload(self) -> None:
        try:
            new = self.reload_config()
        except ConfigError as exc:
            log.error("reload refused: config kept as it was", reason=str(exc))
            return
        diff = changed_keys(self.config, new)
        later = {k: v for k, v in diff.items() if k in RESTART_KEYS}
        now = {k: v for k, v in diff.items() if k not in RESTART_KEYS}
        # Keys read once at start keep their running value until a restart.
        effective = replace(new, **{k: old for k, (old, _) in later.items()})
        self.config = effective
        if self.node is not None:
            self.node.service.config = effective
            self.node.steering.tuning = _tuning(effective)
        logsetup.set_level(effective.log_level)
        for key, (old, value) in now.items():
            log.info("config changed", key=key, old=old, new=value)
        for key, (old, value) in later.items():
            log.warning("config change needs a restart", key=key, running=old, configured=value)
        if not diff:
            log.info("config reloaded: nothing changed")

    async def _stop(self) -> None:
        self.notifier.stopping()
        if self.runner is not None:
            for site in list(self.runner.sites):
                await site.stop()  # stop accepting
        self.events.close()  # event streams end rather than hold the drain
        await self._drain()
        await self._release()
        log.info("vgpud stopped")

    async def _drain(self) -> None:
        pending = {t for t in self.inflight if not t.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=self.config.shutdown_timeout)
        if pending:
            log.warning(
                "cancelling requests still running at the shutdown timeout",
                count=len(pending),
                timeout_s=self.config.shutdown_timeout,
            )
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _release(self) -> None:
        for task in self.loops:
            task.cancel()
        await asyncio.gather(*self.loops, return_exceptions=True)
        for runner in (self.runner, self.metrics_runner):
            if runner is not None:
                await runner.cleanup()
        if self.node is not None:
            async with self.node.service.blocks_lock:  # a scan's thread may still read them
                self.node.tracker.close()
        if self.registry is not None:
            self.registry.close()
        if self.gpus is not None:
            await self.gpus.close()
        self._remove_socket()

    def _remove_socket(self) -> None:
        """Remove our socket, and only ours (a successor may own the path)."""
        with contextlib.suppress(OSError):
            if (
                self.socket_inode is not None
                and os.stat(self.config.socket).st_ino == self.socket_inode
            ):
                os.unlink(self.config.socket)


def _lock_state_dir(state_dir: Path) -> int:
    """One vgpud per state dir, taken before anything in it or in the run
    dir is adopted or cleaned: a second daemon started by mistake would
    otherwise take the first one's blocks still being made for leftovers.
    The lock goes with the process (even at SIGKILL)."""
    make_dirs(state_dir, STATE_DIR_MODE)
    fd = os.open(
        state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StartError(f"another vgpud uses {state_dir}") from None
    return fd


def _tuning(c: Config) -> controller.Tuning:
    """The controller's constants, with what the config decides of them."""
    return replace(controller.DEFAULT_TUNING, calibrate_alone=c.calibrate_alone)


def _warn_absent_gpus(registry: Registry, present: Sequence[Any]) -> None:
    """A recorded vGPU on a GPU that is not here now is kept as it is: the
    GPU may come back (a driver reload, a reset), and its processes are
    still bound by the blocks' limits. Nothing runs on it meanwhile; an
    update is refused (409) until it returns, and nothing new is placed
    on a GPU that is absent. Said once at start, per vGPU."""
    uuids = {g.uuid for g in present}
    for entry in registry.all():
        absent = [u for u in entry.vgpu.uuids if u not in uuids]
        if absent:
            log.warning("vGPU kept on GPUs not present now", vgpu=entry.vgpu.id, gpus=absent)


def _idle(service: Service) -> bool:
    track, sample = service.track, service.sample
    return (
        not service.registry.entries
        and (track is None or not track.processes)
        and (sample is None or not sample.pids())
    )


def _freeze_heap() -> None:
    """What start-up made lives as long as the daemon (the modules, the
    adopted vGPUs, the app): collected once, then left out of every later
    collection, so that a full collection, which holds the loop, walks only
    what came after (the imports alone are 5-8 ms of each on the 2-core
    VM). A frozen object that later dies in a reference cycle (a vGPU
    adopted at start, then deleted) is never freed: at most once, what
    start-up made, not a growing leak."""
    gc.collect()
    gc.freeze()


def _raise_fd_limit() -> None:
    """The tracker holds a pidfd per tracked process (exitwatch.py): take the
    whole hard limit of open files, not the usual soft 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("open files limit raised", soft=soft, now=hard)


def _claim_socket_path(path: str) -> None:
    """Replace a stale socket left by a crash; refuse when one answers."""
    if not os.path.lexists(path):
        make_dirs(Path(path).parent, PARENT_MODE)
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        log.info("replacing a stale socket", path=path)
        os.unlink(path)
        return
    except OSError as exc:
        raise StartError(f"{path} exists and is not a usable socket: {exc.strerror}") from exc
    finally:
        probe.close()
    raise StartError(f"another vgpud answers on {path}")


async def _check_answers(path: str) -> None:
    """READY=1 means the socket answers: ask it once."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(b"GET /v1/health HTTP/1.1\r\nHost: vgpud\r\nConnection: close\r\n\r\n")
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), timeout=5)
    finally:
        writer.close()
    if b" 200 " not in status:
        raise StartError(f"the API does not answer on {path}: {status!r}")


if __name__ == "__main__":
    sys.exit(main())
