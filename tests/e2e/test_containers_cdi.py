"""A vGPU reaches a podman container through its CDI spec, and holds there:
the recipe arrives, the memory limit holds, the daemon sees the container's
processes (host and container PID, cgroup), and a killed container's memory
comes back within a scan."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tests.e2e.harness import Vgpud, burn_past_one_gib
from tests.e2e.podman import Podman
from tests.integration.daemon_harness import wait_for

MakeVgpu = Callable[..., dict[str, Any]]


def cdi_device(name: str) -> str:
    return f"vgpud.io/vgpu={name}"


# What a container sees of its vGPU: env, vgpud's files, their mounts.
LOOK_INSIDE = [
    "sh",
    "-c",
    "env; echo ---; find /run/vgpud; echo ---; grep vgpud /proc/self/mountinfo",
]


def inside_view(output: str) -> tuple[dict[str, str], list[str], dict[str, str]]:
    env_text, files, mounts = output.split("---\n")
    env = dict(line.split("=", 1) for line in env_text.splitlines() if "=" in line)
    # mountinfo: field 5 is the mount point, field 6 its options.
    options = {line.split()[4]: line.split()[5].split(",")[0] for line in mounts.splitlines()}
    return env, sorted(files.split()), options


def test_the_cdi_device_brings_the_recipe_and_only_it(
    vgpud: Vgpud, podman: Podman, make_vgpu: MakeVgpu
) -> None:
    vgpu = make_vgpu(name="recipe", memory="1g", share=20)

    done = podman.run(LOOK_INSIDE, devices=[cdi_device("recipe")])

    assert done.returncode == 0, done.stderr
    env, files, options = inside_view(done.stdout)
    for key, value in vgpu["recipe"]["env"].items():
        assert env.get(key) == value, key
    # Its own two blocks, nothing else of vgpud's run directory.
    assert files == [
        "/run/vgpud",
        "/run/vgpud/vgpu",
        "/run/vgpud/vgpu/control",
        "/run/vgpud/vgpu/usage",
    ]
    assert options == {
        "/run/vgpud/vgpu/control": "ro",
        "/run/vgpud/vgpu/usage": "rw",
        "/usr/lib/vgpud/libvgpu.so": "ro",
    }


def test_vgpuctl_env_gives_a_runtime_without_cdi_the_same(
    vgpud: Vgpud, podman: Podman, make_vgpu: MakeVgpu
) -> None:
    make_vgpu(name="flags", memory="1g", share=20)
    vgpuctl = [sys.executable, "-m", "vgpud.ctl.main", "--socket", str(vgpud.socket)]
    printed = subprocess.run(
        [*vgpuctl, "env", "--podman", "flags"], capture_output=True, text=True, check=True
    )

    with_flags = podman.run(LOOK_INSIDE, extra=shlex.split(printed.stdout))
    with_cdi = podman.run(LOOK_INSIDE, devices=[cdi_device("flags")])

    assert with_flags.returncode == 0, with_flags.stderr
    flags_env, flags_files, flags_options = inside_view(with_flags.stdout)
    cdi_env, cdi_files, cdi_options = inside_view(with_cdi.stdout)
    assert {k: flags_env.get(k) for k in cdi_env if k != "HOSTNAME"} == {
        k: v for k, v in cdi_env.items() if k != "HOSTNAME"
    }
    assert (flags_files, flags_options) == (cdi_files, cdi_options)


def test_the_id_names_the_device_too_and_a_deleted_vgpu_is_gone(
    vgpud: Vgpud, podman: Podman
) -> None:
    vgpu = vgpud.create(memory="512m", share=10)
    try:
        assert podman.run(["true"], devices=[cdi_device(vgpu["id"])]).returncode == 0
    finally:
        vgpud.delete(vgpu["id"])

    done = podman.run(["true"], devices=[cdi_device(vgpu["id"])])
    assert done.returncode != 0
    assert "unresolvable CDI devices" in done.stderr


def test_the_memory_limit_holds_inside_the_container(
    vgpud: Vgpud,
    podman: Podman,
    make_vgpu: MakeVgpu,
    sim_state: dict[str, str],
    sim_volumes: list[str],
) -> None:
    make_vgpu(name="memory", memory="1g", share=50)

    burn_past_one_gib(vgpud, podman, cdi_device("memory"), sim_state, sim_volumes)


def _process_of(vgpud: Vgpud, vgpu_id: str) -> dict[str, Any] | None:
    return next((p for p in vgpud.get("/v1/processes") if p["vgpu"] == vgpu_id), None)


def test_the_daemon_maps_the_container_and_reclaims_it_when_killed(
    vgpud: Vgpud,
    podman: Podman,
    make_vgpu: MakeVgpu,
    sim_state: dict[str, str],
    sim_volumes: list[str],
) -> None:
    vgpu = make_vgpu(name="tracked", memory="1g", share=30)
    podman.start(
        "tracked",
        ["vgpu-burn", "--alloc", "256m", "--hold", "--seconds", "120"],
        devices=[cdi_device("tracked")],
        env=sim_state,
        volumes=sim_volumes,
    )
    host_pid = podman.host_pid("tracked")
    container_id = podman.container_id("tracked")

    process = wait_for(lambda: _process_of(vgpud, vgpu["id"]), what="the process in /v1/processes")
    assert process["host_pid"] == host_pid
    assert process["container_pid"] == 1  # the burn is the container's init
    # ... and the container, from the cgroup podman put it in.
    assert process["container"]["runtime"] == "podman"
    assert process["container"]["id"] == container_id
    metrics = vgpud.get("/metrics")
    assert re.search(
        rf'vgpud_vgpu_processes\{{[^}}]*vgpu="{vgpu["id"]}"[^}}]*\}} 1(\.0)?$', metrics, re.M
    ), metrics

    def used() -> int:
        return int(vgpud.get(f"/v1/vgpus/{vgpu['id']}")["gpus"][0]["memory_used"])

    wait_for(lambda: used() >= 256 * 2**20, what="the burn's allocation in the vGPU's usage")
    podman.kill("tracked")
    killed = time.monotonic()
    wait_for(
        lambda: used() == 0 and _process_of(vgpud, vgpu["id"]) is None,
        what="the killed container's memory to be reclaimed",
        timeout=15,
    )
    print(f"reclaimed {time.monotonic() - killed:.2f} s after podman kill (scan 0.5 s)")
