"""vgpuctl: list, devices, show, create, update, delete, top, env, run, doctor.

Talks to vgpud over its unix socket (--socket, $VGPUD_SOCKET, default
/run/vgpud.sock). Exit status: 0 ok, 1 the daemon refused or is unreachable
(the message says which), 2 bad usage; `run` exits with its command's status.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from vgpud.ctl.client import ApiFailure, Client, DaemonUnreachable, default_socket
from vgpud.ctl.doctor import doctor
from vgpud.ctl.table import (
    DEVICE_HEADERS,
    VGPU_HEADERS,
    device_rows,
    render,
    show,
    vgpu_rows,
)
from vgpud.ctl.top import run_top
from vgpud.terminal import shown

EXIT_FAILED = 1
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    client = Client(args.socket)
    try:
        return int(args.func(client, args))
    except (DaemonUnreachable, ApiFailure) as exc:
        print(f"vgpuctl: {shown(str(exc))}", file=sys.stderr)
        return EXIT_FAILED


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vgpuctl", description="Manage vGPUs through vgpud.")
    p.add_argument("--socket", default=default_socket(), help="vgpud's socket (env VGPUD_SOCKET)")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("list", help="list vGPUs")
    c.add_argument("--gpu", help="only vGPUs on this GPU (index or UUID)")
    c.add_argument("--label", help="only vGPUs with this label (key=value)")
    c.add_argument("--owner-pod", help="only vGPUs of this pod UID")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_list)

    c = sub.add_parser("devices", help="the node's GPUs and the vGPUs on each")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_devices)

    c = sub.add_parser("show", help="one vGPU in detail, with its processes")
    c.add_argument("id", help="vGPU id or name")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_show)

    c = sub.add_parser("create", help="create a vGPU")
    add_limits(c, creating=True)
    c.add_argument("--json", action="store_true", help="print the whole answer (with the recipe)")
    c.set_defaults(func=cmd_create)

    c = sub.add_parser("update", help="change a vGPU's limits live")
    c.add_argument("id")
    add_limits(c, creating=False)
    c.set_defaults(func=cmd_update)

    c = sub.add_parser("delete", help="delete a vGPU")
    c.add_argument("id")
    c.add_argument("--force", action="store_true", help="even while processes use it")
    c.set_defaults(func=cmd_delete)

    c = sub.add_parser("top", help="live per-vGPU use (q quits)")
    c.add_argument("--once", action="store_true", help="print one table and exit")
    c.add_argument("--interval", type=float, default=1.0)
    c.set_defaults(func=lambda client, a: run_top(client, a.interval, a.once))

    c = sub.add_parser("env", help="how to run something in a vGPU")
    c.add_argument("id")
    form = c.add_mutually_exclusive_group()
    form.add_argument("--docker", action="store_true", help="-e/-v flags for docker run")
    form.add_argument("--podman", action="store_true", help="-e/-v flags for podman run")
    form.add_argument("--cdi", action="store_true", help="the --device flag (CDI runtimes)")
    form.add_argument(
        "--shell", action="store_true", help="export lines for a plain process (default)"
    )
    c.set_defaults(func=cmd_env)

    c = sub.add_parser("run", help="run a command in a new vGPU, deleted when it exits")
    add_limits(c, creating=True)
    c.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    c.set_defaults(func=cmd_run)

    c = sub.add_parser(
        "doctor", help="check the daemon, NVML and the hook's coverage of the driver"
    )
    c.add_argument("--libcuda", help="the driver library to compare (default: the system's)")
    c.add_argument("--hook", help="libvgpu.so to compare (default: installed or build/)")
    c.add_argument("--verbose", action="store_true", help="list every untouched entry point")
    c.set_defaults(func=cmd_doctor)
    return p


def add_limits(c: argparse.ArgumentParser, *, creating: bool) -> None:
    c.add_argument("--memory", help="bytes, 8g, 512m or 25%%")
    c.add_argument("--share", type=int, help="percent of GPU time, 1-100")
    c.add_argument("--mode", choices=["hard", "soft"])
    c.add_argument("--weight", type=int, help="1-1000: how soft vGPUs divide spare time")
    if creating:
        c.add_argument("--name")
        c.add_argument("--gpus", default="any", help="any, or indices/UUIDs: 0,1")
        c.add_argument("--count", type=int, help="how many GPUs with --gpus any")
        c.add_argument("--oversubscribe", action="store_true")
        c.add_argument("--exclusive", action="store_true", help="whole GPUs")
        c.add_argument("--label", action="append", default=[], help="key=value (repeatable)")
        c.add_argument(
            "--user",
            type=user_arg,
            help="UID[:GID]: the host user whose processes use it (default: yours; "
            "another needs root)",
        )


def user_arg(text: str) -> dict[str, int]:
    """--user 1000 or 1000:1000, as the API's user object."""
    uid, sep, gid = text.partition(":")
    if not (uid.isascii() and uid.isdigit()) or (sep and not (gid.isascii() and gid.isdigit())):
        raise argparse.ArgumentTypeError(f"UID or UID:GID in digits, not {text!r}")
    return {"uid": int(uid), "gid": int(gid)} if sep else {"uid": int(uid)}


def _number_or_text(text: str) -> int | str:
    """An ASCII number as an int, anything else as given for the daemon to
    judge (int() would read Arabic-Indic digits, which the daemon refuses)."""
    return int(text) if text.isascii() and text.isdigit() else text


def limits_body(a: argparse.Namespace, *, creating: bool) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if a.memory is not None:
        body["memory"] = _number_or_text(a.memory)
    for key in ("share", "mode", "weight"):
        if getattr(a, key) is not None:
            body[key] = getattr(a, key)
    if creating:
        body["gpus"] = [_number_or_text(g) for g in a.gpus.split(",") if g]
        for key in ("name", "count"):
            if getattr(a, key) is not None:
                body[key] = getattr(a, key)
        if a.oversubscribe:
            body["oversubscribe"] = True
        if a.exclusive:
            body["exclusive"] = True
        if a.label:
            body["labels"] = dict(label.split("=", 1) for label in a.label if "=" in label)
        if a.user is not None:
            body["user"] = a.user
    return body


def vgpu_path(key: str) -> str:
    return f"/v1/vgpus/{quote(key, safe='')}"


# --- commands -------------------------------------------------------------------


def cmd_list(client: Client, a: argparse.Namespace) -> int:
    query = {k: v for k, v in (("gpu", a.gpu), ("label", a.label), ("owner_pod", a.owner_pod)) if v}
    vgpus = client.get("/v1/vgpus" + (f"?{urlencode(query)}" if query else ""))
    return _listing(vgpus, a.json, "no vGPUs", VGPU_HEADERS, vgpu_rows)


def cmd_devices(client: Client, a: argparse.Namespace) -> int:
    return _listing(client.get("/v1/devices"), a.json, "no GPUs", DEVICE_HEADERS, device_rows)


def _listing(
    items: list[dict[str, Any]],
    as_json: bool,
    none: str,
    headers: Sequence[str],
    rows: Callable[[Sequence[dict[str, Any]]], list[list[object]]],
) -> int:
    """A list answer as JSON, a table, or the line that says it is empty."""
    if as_json:
        print(json.dumps(items, indent=2))
    else:
        print(render(headers, rows(items)) if items else none)
    return 0


def cmd_show(client: Client, a: argparse.Namespace) -> int:
    v = client.get(vgpu_path(a.id))
    print(json.dumps(v, indent=2) if a.json else show(v, client.get("/v1/processes")))
    return 0


def cmd_create(client: Client, a: argparse.Namespace) -> int:
    v = client.post("/v1/vgpus", limits_body(a, creating=True))
    print(json.dumps(v, indent=2) if a.json else v["id"])
    return 0


def cmd_update(client: Client, a: argparse.Namespace) -> int:
    body = limits_body(a, creating=False)
    if not body:
        print(
            "vgpuctl: nothing to change: give --memory, --share, --mode or --weight",
            file=sys.stderr,
        )
        return 2
    v = client.patch(vgpu_path(a.id), body)
    for warning in v["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"updated {v['id']}")
    return 0


def cmd_delete(client: Client, a: argparse.Namespace) -> int:
    try:
        v = client.delete(vgpu_path(a.id) + ("?force=true" if a.force else ""))
    except ApiFailure as exc:
        if exc.error != "in_use":
            raise
        print(f"vgpuctl: {shown(exc.detail)}; add --force to delete it anyway", file=sys.stderr)
        return EXIT_FAILED
    print(f"deleted {v['deleted']}")
    return 0


def cmd_env(client: Client, a: argparse.Namespace) -> int:
    v = client.get(vgpu_path(a.id))
    recipe = v["recipe"]
    if a.docker or a.podman:
        flags = [f"-e {shlex.quote(f'{k}={val}')}" for k, val in recipe["env"].items()]
        for m in recipe["mounts"]:
            spec = f"{m['host_path']}:{m['container_path']}" + (":ro" if m["read_only"] else "")
            flags.append(f"-v {shlex.quote(spec)}")
        print(" ".join(flags))
    elif a.cdi:
        print(f"--device {recipe['cdi_device']}")
    else:
        for key, val in v["host_env"].items():
            print(f"export {key}={shlex.quote(val)}")
    return 0


def cmd_run(client: Client, a: argparse.Namespace) -> int:
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        print("vgpuctl run: give a command: vgpuctl run [limits] -- COMMAND", file=sys.stderr)
        return 2
    v = client.post("/v1/vgpus", limits_body(a, creating=True))
    try:
        return _run_in(v, cmd)
    finally:
        # The command has exited, so whatever still holds a slot is dead.
        client.delete(vgpu_path(v["id"]) + "?force=true")


# Lists the vGPU's recipe puts first, keeping what the caller had after it.
PATH_LISTS = ("LD_PRELOAD", "LD_LIBRARY_PATH")


def command_env(environ: Mapping[str, str], host_env: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment with the vGPU's host recipe on top."""
    env = {**environ, **host_env}
    for key in PATH_LISTS:
        if key in host_env and environ.get(key):
            env[key] = f"{host_env[key]}:{environ[key]}"
    return env


def _run_in(v: dict[str, Any], cmd: list[str]) -> int:
    env = command_env(os.environ, v["host_env"])
    try:
        child = subprocess.Popen(cmd, env=env)
    except OSError as exc:
        print(f"vgpuctl run: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    # Ctrl-C reaches the command from the terminal (same process group); we
    # only wait for it. Signals sent to vgpuctl alone are passed on.
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, *FORWARDED_SIGNALS)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def cmd_doctor(client: Client, a: argparse.Namespace) -> int:
    report = doctor(client, a.libcuda, a.hook, a.verbose)
    print("\n".join(report.lines))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
