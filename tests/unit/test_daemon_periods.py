"""The loops' periods: NVML is sampled at its own period while anything
needs its figures, and at the scan's while nothing does; the controller
ticks at its quiet period after a tick that computed nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tests.unit.apiclient import running_api
from vgpud.config import Config
from vgpud.daemon import Daemon, Node
from vgpud.loops.control import QUIET_PERIOD_S, Steering
from vgpud.loops.scan import Watch
from vgpud.observe.nvml import GpuSample, NvmlSample
from vgpud.observe.tracker import Tracker
from vgpud.surface.metrics import Metrics
from vgpud.vgpus.atomics import Atomics


async def test_nvml_is_sampled_slowly_only_while_nothing_needs_it(tmp_path: Path) -> None:
    config = Config(run_dir=str(tmp_path / "run"), state_dir=str(tmp_path / "state"))
    async with running_api(tmp_path, config) as api:
        daemon = Daemon(config, lambda: config)
        tracker = Tracker(tmp_path / "no-proc", sees_all_pids=True)
        service = api.service
        daemon.node = Node(
            service,
            Metrics(service),
            tracker,
            Watch(service, api.service.events, tracker),
            Steering(Atomics.load()),
        )

        def period() -> float:
            return daemon._interval("sample")

        steering = daemon.node.steering
        steering.tick([], {}, None, None, 1)
        assert not steering.reused  # the first tick computes
        assert daemon._interval("control") == config.control_interval
        steering.tick([], {}, None, None, 2)
        assert steering.reused  # nothing new
        assert daemon._interval("control") == QUIET_PERIOD_S > config.control_interval
        daemon.config = replace(config, control_interval=0.5)
        assert daemon._interval("control") == 0.5  # never faster than configured
        daemon.config = config

        assert period() == config.scan_interval  # idle: nothing to steer or watch
        created = await api.client.post("/v1/vgpus", json={"memory": "1g"})
        vgpu = (await created.json())["id"]
        assert period() == config.sample_interval  # a vGPU to steer
        await api.client.delete(f"/v1/vgpus/{vgpu}")
        assert period() == config.scan_interval
        gpu = GpuSample("GPU-0", 0, 10, 1 << 30, 80 << 30, {4242: 1 << 30}, {})
        service.sample = NvmlSample(monotonic=0.0, gpus={"GPU-0": gpu})
        assert period() == config.sample_interval  # a process on a GPU
        tracker.close()
