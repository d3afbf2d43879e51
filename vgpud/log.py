"""Logging setup: structlog, readable on a terminal, JSON under systemd.

Called once by the entry points (a library never configures logging).
Standard-library loggers (aiohttp's, grpc's) go through the same renderer;
vgpud's own modules log through structlog, with fields (docs/daemon.md, "Logs").
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

import structlog

from vgpud.terminal import shown_values

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def wants_json(fmt: str, env: Mapping[str, str]) -> bool:
    """auto: JSON when systemd runs us (it sets JOURNAL_STREAM or INVOCATION_ID)."""
    if fmt != "auto":
        return fmt == "json"
    return bool(env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"))


def configure(level: str, fmt: str, env: Mapping[str, str]) -> None:
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor
    if wants_json(fmt, env):
        renderer = structlog.processors.JSONRenderer()
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        shared.append(shown_values)  # JSON escapes them itself
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    set_level(level)


def set_level(level: str) -> None:
    logging.getLogger().setLevel(LEVELS[level])
    # aiohttp's access log is one line per request: too much at info.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
