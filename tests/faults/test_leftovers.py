"""What a crash leaves in the run dir and the state dir is removed at the
next start, by name pattern only, never through a symlink, and logged."""

from __future__ import annotations

from pathlib import Path

import structlog

from tests.integration.daemon_harness import Daemon, base_env
from tests.unit.fakes import create, gpus
from vgpud.daemon import EXIT_START_FAILED
from vgpud.policy.placement import Rules
from vgpud.units import parse_memory
from vgpud.vgpus.atomics import Atomics
from vgpud.vgpus.model import CreateRequest, Limits
from vgpud.vgpus.registry import Registry
from vgpud.vgpus.state import StateStore


def registry(tmp: Path) -> Registry:
    return Registry(
        tmp / "run",
        StateStore(tmp / "state"),
        tmp / "lib.so",
        Atomics.load(),
    )


def test_orphan_blocks_and_temp_files_are_removed_at_start_and_nothing_else(
    tmp_path: Path,
) -> None:
    reg = registry(tmp_path)
    reg.adopt()
    kept = create(reg, CreateRequest(), Limits(parse_memory("1g"), 10, "hard", 1), gpus(1), Rules())
    reg.close()
    run, state = tmp_path / "run", tmp_path / "state"
    vdir = kept.paths.control.parent
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    # A crash between making a vGPU's blocks and recording it, and temp files
    # of writes that never reached their rename.
    (run / "vg-0badc0de").mkdir()
    (run / "vg-0badc0de" / "control").write_bytes(b"\0" * 64)
    (run / "vg-0badc0de" / "usage").write_bytes(b"\0" * 64)
    temps = [
        vdir / ".control.abc_1234",
        state / ".vgpus.state.k2j3h4g5",
        state / ".vgpus.json.k2j3h4g5",  # of a vgpud before vgpus.state
    ]
    for t in temps:
        t.write_bytes(b"half")
    # A crash between the first save in vgpus.state and removing vgpus.json.
    (state / "vgpus.json").write_bytes(b'{"version": 1, "vgpus": []}')
    # Things that are not ours by name, or are links: all stay, targets untouched.
    stays = [run / "notes.txt", run / "vg-nothex1", vdir / ".hidden", state / "vgpus.json.bak"]
    for s in stays:
        s.write_text("mine")
    (run / "vg-0000feed").symlink_to(outside)
    (vdir / ".usage.lnk12345").symlink_to(outside / "precious")
    again = registry(tmp_path)
    with structlog.testing.capture_logs() as logs:
        again.adopt()
    try:
        assert not (run / "vg-0badc0de").exists()
        assert not [t for t in temps if t.exists()]
        assert not (state / "vgpus.json").exists()
        assert all(s.exists() for s in stays)
        assert (run / "vg-0000feed").is_symlink() and (vdir / ".usage.lnk12345").is_symlink()
        assert (outside / "precious").read_text() == "x"
        assert again.get(kept.vgpu.id).usage.devices()[0].used == 0  # the recorded vGPU is whole
        removed = sorted(e["path"] for e in logs if e["event"].startswith("removed"))
        assert removed == sorted(
            str(p) for p in [run / "vg-0badc0de", *temps, state / "vgpus.json"]
        )
    finally:
        again.close()


def test_a_second_daemon_on_the_same_state_dir_is_refused_before_touching_it(
    tmp_path: Path,
) -> None:
    first = Daemon(tmp_path, base_env(), sim=False)
    second = Daemon(tmp_path, base_env(), sim=False)
    try:
        first.start()
        leftover = first.state_dir / ".vgpus.state.abcd1234"
        leftover.write_text("the first daemon's write in flight")
        second.start(wait=False)
        assert second.wait() == EXIT_START_FAILED
        assert leftover.exists()
        assert "another vgpud uses" in second.log()
    finally:
        second.cleanup()
        first.cleanup()
