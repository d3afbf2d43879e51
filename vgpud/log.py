"""Logging setup: structlog, readable on a terminal, JSON under systemd;
and the bound on lines a tenant decides the frequency of (``tenant_said``).

``configure`` is called once by the entry points (a library never
configures logging). Standard-library loggers (aiohttp's, grpc's) go
through the same renderer; vgpud's own modules log through structlog, with
fields (docs/daemon.md, "Logs").
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

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


# ---- lines a tenant decides the frequency of ----------------------------------

SUMMARY_INTERVAL_S = 60.0

Level = Literal["info", "warning", "error"]


@dataclass
class _Kind:
    logger: Any
    level: Level
    event: str
    opened: float  # when the current interval began
    fields: dict[str, object]  # the latest suppressed line's, for the summary
    suppressed: int = 0


class TenantLines:
    """Bounds the log lines a tenant can make the daemon write as often as
    it likes (a usage block regrown, dead identities forged into slots,
    before every scan): on a fleet each one is journal disk and log
    shipping spent by the tenant, and real warnings drowned among them.
    Per tenant and kind of line: the first is logged as it comes, so an
    operator still learns of it; the others within ``interval_s`` are
    counted, and one summary line (the line's event and latest fields,
    ``suppressed=N``) says how many when the interval has passed. A kind
    quiet for a whole interval is forgotten, and its next line logged as
    a first. Events (/v1/events) are not this: their rings bound them."""

    def __init__(
        self,
        interval_s: float = SUMMARY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._kinds: dict[tuple[str, str, str], _Kind] = {}
        self._lock = threading.Lock()  # the scan's thread says lines, and the loop

    def say(
        self,
        logger: Any,
        level: Level,
        event: str,
        *,
        tenant: str,
        kind: str = "",
        **fields: object,
    ) -> None:
        key = (tenant, event, kind)
        with self._lock:
            now = self.clock()
            seen = self._kinds.get(key)
            if seen is not None and now - seen.opened >= self.interval_s:
                self._close(key, seen, now)
                seen = self._kinds.get(key)
            if seen is None:
                getattr(logger, level)(event, **fields)
                self._kinds[key] = _Kind(logger, level, event, now, fields)
            else:
                seen.suppressed += 1
                seen.fields = fields

    def flush(self) -> None:
        """The summaries of the intervals that have passed (each scan calls
        it: a tenant that stops still has its last count said)."""
        with self._lock:
            now = self.clock()
            for key, seen in list(self._kinds.items()):
                if now - seen.opened >= self.interval_s:
                    self._close(key, seen, now)

    def _close(self, key: tuple[str, str, str], seen: _Kind, now: float) -> None:
        if not seen.suppressed:
            del self._kinds[key]
            return
        getattr(seen.logger, seen.level)(
            seen.event, **seen.fields, suppressed=seen.suppressed, over_s=self.interval_s
        )
        seen.opened, seen.suppressed = now, 0


# The daemon's one instance (looked up at each call, so a test may put its
# own in its place).
TENANT_LINES = TenantLines()


def tenant_said(
    logger: Any, level: Level, event: str, *, tenant: str, kind: str = "", **fields: object
) -> None:
    """``logger.<level>(event, **fields)``, bounded per ``tenant`` and kind
    (``event`` and ``kind``) by ``TENANT_LINES``: for every line whose
    frequency a tenant decides."""
    TENANT_LINES.say(logger, level, event, tenant=tenant, kind=kind, **fields)


def flush_tenant_lines() -> None:
    TENANT_LINES.flush()
