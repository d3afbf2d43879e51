"""The sample tick: one NVML sample of every GPU (memory, utilization, each
process's share of it), handed to the service for the controller, the
tracker's next scan and the snapshot the answers show. The gateway does the
NVML calls on its own thread; this runs on the event loop and only hands
the result over.
"""

from __future__ import annotations

from vgpud.observe.nvml import GpuGateway
from vgpud.surface.service import Service


async def sample(gpus: GpuGateway, service: Service) -> None:
    service.sample = await gpus.sample()
