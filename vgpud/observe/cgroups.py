"""Which container a process runs in, from its cgroup paths.

Pure parsing: this module never touches the file system. It reads the text
of ``/proc/<pid>/cgroup`` (procfs.py supplies it) and names the container.

Public interface
----------------
``parse_cgroup_file(text) -> list[CgroupLine]``
    Split a cgroup file (v1, v2 or hybrid) into its lines; malformed lines
    are skipped (a process file is never a reason to fail a scan).
``classify(lines) -> ContainerRef``
    The container (or systemd unit, or host) a process belongs to. Every
    hierarchy's path is classified and the most specific answer wins: on a
    hybrid host a container may sit in ``memory:/docker/<id>`` while the
    unified ``0::/`` line says nothing.
``classify_path(path) -> ContainerRef``
    The same for one cgroup path.
``ContainerRef``
    Frozen: ``runtime`` (a ``Runtime``), ``container_id`` (64 hex, or the
    podman/containerd id as written), ``pod_uid`` (Kubernetes, dashed form),
    ``qos_class`` (a ``QosClass``, pods only), ``unit`` (systemd unit for
    scopes and services), ``cgroup_path`` (the path it was read from), and
    ``key``: what two processes share when they are in the same container.

Recognised layouts (both cgroup drivers, cgroup v1/v2/hybrid)
-------------------------------------------------------------
docker: ``/docker/<id>``, ``/system.slice/docker-<id>.scope``;
containerd: ``/<namespace>/<id>`` (e.g. ``/default/<id>``),
``nerdctl-<id>.scope``, ``cri-containerd-<id>.scope``;
CRI-O: ``crio-<id>.scope``, ``crio-<id>`` (cgroupfs);
podman: ``libpod-<id>.scope`` (also with a ``/container`` leaf),
``/libpod_parent/libpod-<id>``, ``machine.slice`` and rootless
``user@UID.service`` trees;
Kubernetes pods: ``/kubepods[/burstable|/besteffort]/pod<uid>/<id>`` and
``/kubepods.slice/kubepods[-qos].slice/kubepods[-qos]-pod<uid_>.slice/
<runtime>-<id>.scope``; a 64-hex leaf under a cgroupfs pod does not say
which CRI runtime made it: ``Runtime.CRI``;
systemd: any ``*.scope`` / ``*.service`` leaf (``run-u123.scope``,
``session-3.scope``, ``vgpud.service``); everything else: ``Runtime.HOST``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum


class Runtime(StrEnum):
    DOCKER = "docker"
    CONTAINERD = "containerd"
    CRIO = "cri-o"
    PODMAN = "podman"
    CRI = "cri"  # a Kubernetes container whose runtime the path does not name
    SYSTEMD = "systemd"  # a systemd scope or service, not a container
    HOST = "host"


class QosClass(StrEnum):
    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"


@dataclass(frozen=True)
class CgroupLine:
    hierarchy: int  # 0 for the unified (v2) hierarchy
    controllers: tuple[str, ...]  # empty for v2; "name=systemd" kept as is
    path: str


@dataclass(frozen=True)
class ContainerRef:
    runtime: Runtime
    cgroup_path: str
    container_id: str | None = None
    pod_uid: str | None = None
    qos_class: QosClass | None = None
    unit: str | None = None
    # The cgroup that names the container (``cgroup_path`` up to the
    # component with its id): the runtime's, where a process's own
    # sub-cgroups below it are the tenant's choice. Derived from
    # ``cgroup_path``, so not compared.
    container_cgroup: str | None = field(default=None, compare=False)

    @property
    def is_container(self) -> bool:
        return self.container_id is not None

    @property
    def key(self) -> str:
        """Shared by every process of one container (or unit, or cgroup).

        A container is its cgroup, not its id: a local user's delegated
        subtree (``user@1000.service``), or a container's own under cgroup
        v2 delegation, may hold a sub-cgroup named after any other
        container's id (docs/security.md, the attacks' table)."""
        if self.container_id is not None:
            return f"{self.runtime}:{self.container_cgroup or self.cgroup_path}"
        return f"cgroup:{self.cgroup_path}"


HOST_ROOT = ContainerRef(runtime=Runtime.HOST, cgroup_path="/")

_HEX64 = r"[0-9a-f]{64}"
# Leaf names that carry a container id, innermost component first.
_SCOPE_RUNTIMES: tuple[tuple[re.Pattern[str], Runtime], ...] = (
    (re.compile(rf"^docker-({_HEX64})\.scope$"), Runtime.DOCKER),
    (re.compile(rf"^cri-containerd-({_HEX64})\.scope$"), Runtime.CONTAINERD),
    (re.compile(rf"^nerdctl-({_HEX64})\.scope$"), Runtime.CONTAINERD),
    (re.compile(rf"^crio-({_HEX64})(?:\.scope)?$"), Runtime.CRIO),
    (re.compile(rf"^libpod-({_HEX64})(?:\.scope)?$"), Runtime.PODMAN),
)
_BARE_ID = re.compile(rf"^({_HEX64})$")
# Kubernetes pod components: cgroupfs "pod<uid>", systemd "...-pod<uid_>.slice".
_POD_CGROUPFS = re.compile(r"^pod([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")
_POD_SYSTEMD = re.compile(
    r"^(?:[\w.]+-)?kubepods(?:-(burstable|besteffort))?-pod"
    r"([0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12})\.slice$"
)
_QOS = {"burstable": QosClass.BURSTABLE, "besteffort": QosClass.BESTEFFORT}
# cgroupfs "burstable", systemd "kubepods-burstable.slice" (maybe prefixed
# by a kubelet cgroup root, e.g. "kubelet-kubepods-burstable.slice").
_QOS_COMPONENT = re.compile(r"^(?:(?:[\w.]+-)?kubepods-)?(burstable|besteffort)(?:\.slice)?$")
_KUBEPODS = re.compile(r"^(?:[\w.]+-)?kubepods(?:\.slice)?$")
# Parents under which a bare 64-hex leaf is not a containerd namespace.
_NOT_CONTAINERD_NAMESPACES = {"docker", "kubepods", "libpod_parent"}
_UNIT = re.compile(r"^[^/]+\.(?:scope|service)$")


def parse_cgroup_file(text: str) -> list[CgroupLine]:
    lines: list[CgroupLine] = []
    # At "\n" only, the one character a cgroup's name cannot hold: a name may
    # hold "\r", "\v", U+2028..., where str.splitlines would break it into a
    # second line of the namer's choosing (a user's delegated subtree naming
    # another container's cgroup; docs/security.md, the attacks' table).
    for raw in text.split("\n"):
        parts = raw.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            continue
        controllers = tuple(c for c in parts[1].split(",") if c)
        lines.append(CgroupLine(int(parts[0]), controllers, parts[2]))
    return lines


def classify(lines: list[CgroupLine]) -> ContainerRef:
    """Most specific answer over every hierarchy: container > unit > host."""
    # The unified line first: on a pure v2 or systemd-managed hybrid host it
    # is the authoritative one; v1 lines only fill in what it leaves out
    # (max keeps the first of equals).
    ordered = sorted(lines, key=lambda line: line.hierarchy != 0)
    refs = [classify_path(line.path) for line in ordered]
    return max(refs, key=_rank, default=HOST_ROOT)


def classify_path(path: str) -> ContainerRef:
    components = [c for c in path.split("/") if c]
    pod_uid, qos = _pod_of(components)
    for depth in range(len(components) - 1, -1, -1):
        container = _container_at(components, depth, in_pod=pod_uid is not None)
        if container is not None:
            runtime, container_id = container
            return ContainerRef(
                runtime=runtime,
                cgroup_path=path,
                container_id=container_id,
                pod_uid=pod_uid,
                qos_class=qos,
                container_cgroup="/" + "/".join(components[: depth + 1]),
            )
    if components and _UNIT.match(components[-1]):
        return ContainerRef(runtime=Runtime.SYSTEMD, cgroup_path=path, unit=components[-1])
    return ContainerRef(runtime=Runtime.HOST, cgroup_path=path, pod_uid=pod_uid, qos_class=qos)


def _container_at(components: list[str], depth: int, *, in_pod: bool) -> tuple[Runtime, str] | None:
    name = components[depth]
    for pattern, runtime in _SCOPE_RUNTIMES:
        match = pattern.match(name)
        if match:
            return runtime, match.group(1)
    bare = _BARE_ID.match(name)
    if bare is None or depth == 0:
        return None
    parent = components[depth - 1]
    if in_pod:
        return Runtime.CRI, bare.group(1)
    if parent == "docker":
        return Runtime.DOCKER, bare.group(1)
    if depth == 1 and parent not in _NOT_CONTAINERD_NAMESPACES and not parent.endswith(".slice"):
        return Runtime.CONTAINERD, bare.group(1)  # /<containerd namespace>/<id>
    return None


def _pod_of(components: list[str]) -> tuple[str | None, QosClass | None]:
    in_kubepods = False
    qos: QosClass | None = None
    for name in components:
        if _KUBEPODS.match(name):
            in_kubepods = True
            continue
        if not in_kubepods:
            continue
        qos_match = _QOS_COMPONENT.match(name)
        if qos_match:
            qos = _QOS[qos_match.group(1)]
            continue
        match = _POD_CGROUPFS.match(name)
        if match:
            return match.group(1), qos or QosClass.GUARANTEED
        systemd = _POD_SYSTEMD.match(name)
        if systemd:
            qos = _QOS[systemd.group(1)] if systemd.group(1) else qos
            return systemd.group(2).replace("_", "-"), qos or QosClass.GUARANTEED
    return None, None


def _rank(ref: ContainerRef) -> int:
    """How much a path says: container > pod > unit > some cgroup > root."""
    if ref.container_id is not None:
        return 4
    if ref.pod_uid is not None:
        return 3
    if ref.unit is not None:
        return 2
    return 0 if ref.cgroup_path == "/" else 1
