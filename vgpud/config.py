"""vgpud's configuration: one frozen dataclass and a pure parser.

etc/vgpud.toml documents every key with its default and is the single source
of those defaults; ``Config``'s field defaults repeat them and a unit test
checks the two agree. Precedence: flags > environment (VGPUD_<KEY>) > file.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from vgpud.units import parse_bytes, parse_memory

DEFAULT_CONFIG_PATH = Path("/etc/vgpud/vgpud.toml")
ENV_PREFIX = "VGPUD_"
NODE_RUN_DIR = "/run/vgpud"
NODE_CDI_DIR = "/var/run/cdi"


class ConfigError(Exception):
    """A configuration that vgpud cannot run with; the message says why."""


@dataclass(frozen=True)
class Config:
    socket: str = "/run/vgpud.sock"
    socket_group: str = "vgpud"
    run_dir: str = NODE_RUN_DIR
    state_dir: str = "/var/lib/vgpud"
    lib_dir: str = "/usr/lib/vgpud"
    cdi_dir: str = "auto"
    sim: bool = False
    log_level: str = "info"
    log_format: str = "auto"
    metrics_listen: str = ""
    placement_policy: str = "binpack"
    allow_oversubscribe: bool = False
    memory_scaling: float = 1.0
    max_vgpus_per_gpu: int = 16
    default_memory: str = "25%"
    default_share: int = 25
    default_mode: str = "hard"
    default_weight: int = 100
    control_interval: float = 0.1
    sample_interval: float = 0.2
    scan_interval: float = 1.0
    shutdown_timeout: float = 5.0
    max_request_bytes: int = 65536
    request_header_timeout: float = 10.0
    request_body_timeout: float = 10.0
    event_buffer: int = 10000
    proc_root: str = "/proc"
    cgroup_root: str = "/sys/fs/cgroup"
    calibrate_alone: bool = True
    backstop: str = "report"
    backstop_tolerance: str = "64m"

    @property
    def cdi_spec_dir(self) -> str:
        """Where CDI specs go ("" = nowhere). "auto": the runtimes' directory
        for the node's daemon, none for one with a run_dir of its own (a
        test, the demo, the README's unprivileged run): its specs would name
        blocks no container should get, and its start-up clean-up would
        remove the node daemon's specs."""
        if self.cdi_dir != "auto":
            return self.cdi_dir
        return NODE_CDI_DIR if self.run_dir == NODE_RUN_DIR else ""

    @property
    def backstop_tolerance_bytes(self) -> int:
        return parse_bytes(self.backstop_tolerance)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Keys read once at start: a reload that changes them is told so.
RESTART_KEYS = frozenset(
    {
        "socket",
        "socket_group",
        "run_dir",
        "state_dir",
        "lib_dir",
        "cdi_dir",
        "sim",
        "metrics_listen",
        "max_request_bytes",
        "request_header_timeout",
        "request_body_timeout",
        "event_buffer",
        "proc_root",
        "cgroup_root",
    }
)

_CHOICES: dict[str, tuple[str, ...]] = {
    "log_level": ("debug", "info", "warning", "error"),
    "log_format": ("auto", "console", "json"),
    "placement_policy": ("binpack", "spread"),
    "default_mode": ("hard", "soft"),
    "backstop": ("report", "kill"),
}
# What max_vgpus_per_gpu may be (vgpud-k8s checks its own flag against it).
MAX_VGPUS_PER_GPU_RANGE = (1, 256)
_RANGES: dict[str, tuple[float, float]] = {
    "memory_scaling": (1.0, 16.0),
    "max_vgpus_per_gpu": MAX_VGPUS_PER_GPU_RANGE,
    "default_share": (1, 100),
    "default_weight": (1, 1000),
    "control_interval": (0.01, 10.0),
    "sample_interval": (0.05, 60.0),
    "scan_interval": (0.05, 600.0),
    "shutdown_timeout": (0.0, 600.0),
    "max_request_bytes": (1024, 1 << 26),
    "request_header_timeout": (0.1, 3600.0),
    "request_body_timeout": (0.1, 3600.0),
    "event_buffer": (10, 10_000_000),
}
_TYPES = {f.name: f.type for f in fields(Config)}


def parse_config(
    file_values: Mapping[str, Any],
    env: Mapping[str, str],
    flags: Mapping[str, Any],
) -> Config:
    """Merge the three sources (flags > env > file) into a checked Config."""
    merged: dict[str, Any] = {}
    for key, value in file_values.items():
        _known(key, "in the config file")
        merged[key] = _typed(key, value, "config file")
    for name, text in env.items():
        if name.startswith(ENV_PREFIX):
            key = name[len(ENV_PREFIX) :].lower()
            if key in _TYPES:
                merged[key] = _from_text(key, text, f"${name}")
    for key, value in flags.items():
        if value is not None:
            _known(key, "as a flag")
            merged[key] = _typed(key, value, "flag")
    config = Config(**merged)
    _validate(config)
    return config


def load_config(
    path: Path | None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Read the file (``path``, else /etc/vgpud/vgpud.toml when it exists)
    and merge. An explicitly named file must exist."""
    env = os.environ if env is None else env
    file_values: dict[str, Any] = {}
    target = path or (DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None)
    if target is not None:
        try:
            file_values = tomllib.loads(Path(target).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config {target}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"config {target} is not UTF-8 text (byte {exc.start}: {exc.reason})"
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {target} is not valid TOML: {exc}") from exc
    return parse_config(file_values, env, flags or {})


def changed_keys(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """Keys whose value differs, with (old, new)."""
    a, b = old.as_dict(), new.as_dict()
    return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


def _known(key: str, where: str) -> None:
    if key not in _TYPES:
        raise ConfigError(f"unknown key {key!r} {where}")


def _typed(key: str, value: Any, where: str) -> Any:
    kind = _TYPES[key]
    ok = {
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
    }[str(kind)]
    if not ok:
        raise ConfigError(f"{key} in the {where} must be a {kind}, not {value!r}")
    return float(value) if kind == "float" else value


def _from_text(key: str, text: str, where: str) -> Any:
    kind = str(_TYPES[key])
    try:
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError
            return lowered in ("1", "true", "yes", "on")
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
    except ValueError:
        raise ConfigError(f"{where} must be a {kind}, not {text!r}") from None
    return text


def _validate(config: Config) -> None:
    for key, choices in _CHOICES.items():
        value = getattr(config, key)
        if value not in choices:
            raise ConfigError(f"{key} = {value!r}: choose one of {', '.join(choices)}")
    for key, (low, high) in _RANGES.items():
        value = getattr(config, key)
        if not low <= value <= high:
            raise ConfigError(f"{key} = {value!r} is outside {low:g}..{high:g}")
    try:
        parse_memory(config.default_memory)
        parse_bytes(config.backstop_tolerance)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if config.metrics_listen:
        host, sep, port = config.metrics_listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"metrics_listen = {config.metrics_listen!r}: use HOST:PORT, e.g. 127.0.0.1:9400"
            )
    for key in ("socket", "run_dir", "state_dir", "lib_dir", "proc_root", "cgroup_root"):
        if not os.path.isabs(getattr(config, key)):
            raise ConfigError(f"{key} = {getattr(config, key)!r} must be an absolute path")
    if config.cdi_dir not in ("", "auto") and not os.path.isabs(config.cdi_dir):
        raise ConfigError(
            f'cdi_dir = {config.cdi_dir!r} must be an absolute path, "auto" or "" (none)'
        )
