"""The sample tick: one NVML sample of every GPU (memory, utilization, each
process's share of it), kept on the service for the controller, the
tracker's next scan and the answers. The gateway does the NVML calls on its
own thread; this runs on the event loop and only hands the result over.
"""

from __future__ import annotations

from vgpud.observe.nvml import GpuGateway
from vgpud.surface.service import GpuFigures, Service


async def sample(gpus: GpuGateway, service: Service) -> None:
    taken = await gpus.sample()
    service.sample = taken
    service.figures = {
        uuid: GpuFigures(
            memory_used=g.memory_used,
            utilization=None if g.utilization_gpu is None else float(g.utilization_gpu),
            process_util=dict(g.process_util),
        )
        for uuid, g in taken.gpus.items()
    }
