"""cgroups.classify: every runtime, both cgroup drivers, v1/v2/hybrid files."""

from __future__ import annotations

import pytest

from vgpud.observe.cgroups import (
    ContainerRef,
    QosClass,
    Runtime,
    classify,
    classify_path,
    parse_cgroup_file,
)

ID = "3f1c2b7a9d8e4f6a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a"
ID2 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
UID = "5f3b2c1d-8e9a-4b7c-9d6e-1a2b3c4d5e6f"
UID_ = UID.replace("-", "_")

# (case name, cgroup path, runtime, container id, pod uid, qos, unit)
PATHS: list[tuple[str, str, Runtime, str | None, str | None, QosClass | None, str | None]] = [
    ("host root", "/", Runtime.HOST, None, None, None, None),
    ("host user slice", "/user.slice/user-0.slice", Runtime.HOST, None, None, None, None),
    ("custom cgroup", "/vgpud-test/job1", Runtime.HOST, None, None, None, None),
    ("docker cgroupfs", f"/docker/{ID}", Runtime.DOCKER, ID, None, None, None),
    ("docker systemd", f"/system.slice/docker-{ID}.scope", Runtime.DOCKER, ID, None, None, None),
    ("docker in docker", f"/docker/{ID2}/docker/{ID}", Runtime.DOCKER, ID, None, None, None),
    ("containerd default ns", f"/default/{ID}", Runtime.CONTAINERD, ID, None, None, None),
    ("containerd k8s.io ns", f"/k8s.io/{ID}", Runtime.CONTAINERD, ID, None, None, None),
    (
        "nerdctl systemd",
        f"/system.slice/nerdctl-{ID}.scope",
        Runtime.CONTAINERD,
        ID,
        None,
        None,
        None,
    ),
    ("podman cgroupfs", f"/libpod_parent/libpod-{ID}", Runtime.PODMAN, ID, None, None, None),
    (
        "podman rootful systemd",
        f"/machine.slice/libpod-{ID}.scope",
        Runtime.PODMAN,
        ID,
        None,
        None,
        None,
    ),
    (
        "podman systemd container leaf",
        f"/machine.slice/libpod-{ID}.scope/container",
        Runtime.PODMAN,
        ID,
        None,
        None,
        None,
    ),
    (
        "podman rootless",
        f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope",
        Runtime.PODMAN,
        ID,
        None,
        None,
        None,
    ),
    (
        "podman conmon is a unit",
        f"/machine.slice/libpod-conmon-{ID}.scope",
        Runtime.SYSTEMD,
        None,
        None,
        None,
        f"libpod-conmon-{ID}.scope",
    ),
    # Kubernetes, cgroupfs driver: the runtime is not in the path.
    (
        "k8s cgroupfs burstable",
        f"/kubepods/burstable/pod{UID}/{ID}",
        Runtime.CRI,
        ID,
        UID,
        QosClass.BURSTABLE,
        None,
    ),
    (
        "k8s cgroupfs besteffort",
        f"/kubepods/besteffort/pod{UID}/{ID}",
        Runtime.CRI,
        ID,
        UID,
        QosClass.BESTEFFORT,
        None,
    ),
    (
        "k8s cgroupfs guaranteed",
        f"/kubepods/pod{UID}/{ID}",
        Runtime.CRI,
        ID,
        UID,
        QosClass.GUARANTEED,
        None,
    ),
    (
        "k8s cgroupfs cri-o",
        f"/kubepods/burstable/pod{UID}/crio-{ID}",
        Runtime.CRIO,
        ID,
        UID,
        QosClass.BURSTABLE,
        None,
    ),
    (
        "k8s pod level, no container",
        f"/kubepods/besteffort/pod{UID}",
        Runtime.HOST,
        None,
        UID,
        QosClass.BESTEFFORT,
        None,
    ),
    # Kubernetes, systemd driver.
    (
        "k8s systemd burstable containerd",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"cri-containerd-{ID}.scope",
        Runtime.CONTAINERD,
        ID,
        UID,
        QosClass.BURSTABLE,
        None,
    ),
    (
        "k8s systemd besteffort cri-o",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
        f"crio-{ID}.scope",
        Runtime.CRIO,
        ID,
        UID,
        QosClass.BESTEFFORT,
        None,
    ),
    (
        "k8s systemd guaranteed docker",
        f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{ID}.scope",
        Runtime.DOCKER,
        ID,
        UID,
        QosClass.GUARANTEED,
        None,
    ),
    (
        "k8s systemd cri-o conmon",
        f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{ID}.scope",
        Runtime.SYSTEMD,
        None,
        None,
        None,
        f"crio-conmon-{ID}.scope",
    ),
    (
        "k8s systemd under a kubelet cgroup root",
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope",
        Runtime.CONTAINERD,
        ID,
        UID,
        QosClass.BURSTABLE,
        None,
    ),
    # systemd units that are not containers.
    (
        "transient run scope",
        "/system.slice/run-u123.scope",
        Runtime.SYSTEMD,
        None,
        None,
        None,
        "run-u123.scope",
    ),
    (
        "login session",
        "/user.slice/user-1000.slice/session-3.scope",
        Runtime.SYSTEMD,
        None,
        None,
        None,
        "session-3.scope",
    ),
    (
        "vgpud itself",
        "/system.slice/vgpud.service",
        Runtime.SYSTEMD,
        None,
        None,
        None,
        "vgpud.service",
    ),
    # Not containers even though a 64-hex name appears.
    ("hex under a slice", f"/system.slice/{ID}", Runtime.HOST, None, None, None, None),
    ("hex at the root", f"/{ID}", Runtime.HOST, None, None, None, None),
]


@pytest.mark.parametrize(
    ("path", "runtime", "container_id", "pod_uid", "qos", "unit"),
    [case[1:] for case in PATHS],
    ids=[case[0] for case in PATHS],
)
def test_classify_path(
    path: str,
    runtime: Runtime,
    container_id: str | None,
    pod_uid: str | None,
    qos: QosClass | None,
    unit: str | None,
) -> None:
    ref = classify_path(path)
    assert ref == ContainerRef(
        runtime=runtime,
        cgroup_path=path,
        container_id=container_id,
        pod_uid=pod_uid,
        qos_class=qos,
        unit=unit,
    )


V1_DOCKER = f"""12:pids:/docker/{ID}
11:memory:/docker/{ID}
10:cpu,cpuacct:/docker/{ID}
1:name=systemd:/docker/{ID}
"""
V2_K8S_SYSTEMD = (
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
    f"cri-containerd-{ID}.scope\n"
)
# Hybrid with systemd: the unified line names a plain scope; v1 has the container.
HYBRID_CGROUPFS = f"""9:name=systemd:/
4:memory:/kubepods/burstable/pod{UID}/{ID}
1:cpu:/kubepods/burstable/pod{UID}/{ID}
0::/
"""
HYBRID_SYSTEMD = f"""11:memory:/system.slice/docker-{ID}.scope
1:name=systemd:/system.slice/docker-{ID}.scope
0::/system.slice/docker-{ID}.scope
"""
# Hybrid, no systemd: a plain cgroup made in both hierarchies, and one in v1 only.
HYBRID_PLAIN = """4:memory:/batch/job7
1:cpu:/
0::/batch/job7
"""
HYBRID_V1_ONLY = """4:memory:/batch/job7
0::/
"""
HOST_HYBRID = """9:name=systemd:/user.slice/user-0.slice/session-3.scope
4:memory:/user.slice
0::/user.slice/user-0.slice/session-3.scope
"""


@pytest.mark.parametrize(
    ("text", "runtime", "container_id", "path"),
    [
        (V1_DOCKER, Runtime.DOCKER, ID, f"/docker/{ID}"),
        (
            V2_K8S_SYSTEMD,
            Runtime.CONTAINERD,
            ID,
            V2_K8S_SYSTEMD[3:].strip(),
        ),
        (HYBRID_CGROUPFS, Runtime.CRI, ID, f"/kubepods/burstable/pod{UID}/{ID}"),
        (HYBRID_SYSTEMD, Runtime.DOCKER, ID, f"/system.slice/docker-{ID}.scope"),
        (HOST_HYBRID, Runtime.SYSTEMD, None, "/user.slice/user-0.slice/session-3.scope"),
        ("0::/\n", Runtime.HOST, None, "/"),
        (HYBRID_PLAIN, Runtime.HOST, None, "/batch/job7"),
        (HYBRID_V1_ONLY, Runtime.HOST, None, "/batch/job7"),
    ],
    ids=[
        "v1 docker",
        "v2 k8s systemd",
        "hybrid cgroupfs pod",
        "hybrid docker systemd",
        "hybrid host session",
        "v2 host root",
        "hybrid plain cgroup",
        "hybrid plain cgroup in v1 only",
    ],
)
def test_classify_whole_file(
    text: str, runtime: Runtime, container_id: str | None, path: str
) -> None:
    ref = classify(parse_cgroup_file(text))
    assert (ref.runtime, ref.container_id, ref.cgroup_path) == (runtime, container_id, path)


def test_parse_skips_malformed_lines() -> None:
    text = "garbage\n0::/ok\nx:memory:/bad-id\n4:memory:relative\n3:cpu,cpuacct:/a\n"
    lines = parse_cgroup_file(text)
    assert [(line.hierarchy, line.controllers, line.path) for line in lines] == [
        (0, (), "/ok"),
        (3, ("cpu", "cpuacct"), "/a"),
    ]


def test_empty_file_is_host() -> None:
    assert classify(parse_cgroup_file("")).runtime is Runtime.HOST


def test_key_groups_processes_of_one_container() -> None:
    systemd_leaf = classify_path(f"/machine.slice/libpod-{ID}.scope/container")
    scope = classify_path(f"/machine.slice/libpod-{ID}.scope")
    assert systemd_leaf.key == scope.key == f"podman:/machine.slice/libpod-{ID}.scope"
    assert classify_path("/a/b").key == "cgroup:/a/b"
    assert classify_path("/a/b").key != classify_path("/a/c").key


# Every line boundary of str.splitlines but "\n", which a cgroup's name cannot hold.
LINE_BREAKS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("brk", LINE_BREAKS, ids=[f"U+{ord(c):04X}" for c in LINE_BREAKS])
def test_a_cgroup_name_holding_another_line_break_is_one_path(brk: str) -> None:
    """The kernel prints a cgroup's path as it is, a name of a delegated
    subtree with "\\r" or U+2028 included: read as two lines, the second was
    a cgroup line of the namer's choosing (tests/redteam/test_hostile_names.py)."""
    path = f"/user.slice/user@1000.service/x{brk}5:x:/docker/{ID}"
    ref = classify(parse_cgroup_file(f"0::{path}\n"))
    assert (ref.runtime, ref.cgroup_path, ref.container_cgroup) == (Runtime.DOCKER, path, path)
    assert ref.key != classify(parse_cgroup_file(f"0::/docker/{ID}\n")).key
