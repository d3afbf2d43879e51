"""Text as it may reach a terminal.

Some of what vgpud shows is a tenant's own: a process's comm (the name of
the file it ran), what a standalone block names. A control sequence in it
would be the terminal's to obey: clear the screen, retitle the window,
write the clipboard (OSC 52). vgpuctl's output and the daemon's console log
show every character that is not printable as its Python escape; JSON
output escapes them already.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any


def shown(text: str) -> str:
    """``text`` with every character that is not printable (controls,
    format characters such as a right-to-left override, line breaks)
    written as its Python escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def shown_values(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: every text value of a log line, shown."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = shown(value)
    return event
