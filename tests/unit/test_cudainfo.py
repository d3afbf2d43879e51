"""cudainfo without a driver: UUID text, and no library is no SM counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from vgpud.observe.cudainfo import sm_counts, uuid_text


def test_uuid_text_is_nvml_form() -> None:
    raw = bytes.fromhex("5117a00000004000800000000000000b")
    assert uuid_text(raw) == "GPU-5117a000-0000-4000-8000-00000000000b"


@pytest.mark.parametrize("raw", [b"", bytes(15), bytes(17)])
def test_uuid_text_refuses_a_wrong_length(raw: bytes) -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        uuid_text(raw)


def test_a_missing_library_gives_no_counts(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        assert sm_counts(str(tmp_path / "libcuda.so.1")) == {}
    said = [e for e in logs if e["event"] == "no SM counts from the CUDA driver"]
    assert [e["library"] for e in said] == [str(tmp_path / "libcuda.so.1")]
