"""sd_notify: readiness, status, watchdog and stopping, for Type=notify.

``notifier(env)`` gives a real notifier when systemd set NOTIFY_SOCKET and
a null one otherwise, so the daemon never asks "am I under systemd?".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

import sdnotify


class Notifier(Protocol):
    def ready(self) -> None: ...
    def status(self, text: str) -> None: ...
    def watchdog(self) -> None: ...
    def stopping(self) -> None: ...

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None."""


class NullNotifier:
    watchdog_interval: float | None = None

    def ready(self) -> None:
        pass

    def status(self, text: str) -> None:
        pass

    def watchdog(self) -> None:
        pass

    def stopping(self) -> None:
        pass


class SdNotifier:
    def __init__(self, watchdog_usec: int | None) -> None:
        self._sd = sdnotify.SystemdNotifier()
        self.watchdog_interval = watchdog_usec / 2e6 if watchdog_usec else None

    def ready(self) -> None:
        self._sd.notify("READY=1")

    def status(self, text: str) -> None:
        self._sd.notify(f"STATUS={text}")

    def watchdog(self) -> None:
        self._sd.notify("WATCHDOG=1")

    def stopping(self) -> None:
        self._sd.notify("STOPPING=1")


def notifier(env: Mapping[str, str]) -> Notifier:
    if not env.get("NOTIFY_SOCKET"):
        return NullNotifier()
    return SdNotifier(_watchdog_usec(env))


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    """WATCHDOG_USEC, if it is meant for this process (WATCHDOG_PID unset or ours)."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid is not None and pid != str(os.getpid()):
        return None
    return int(usec)
