from __future__ import annotations

import pytest

from vgpud.units import (
    PPM_FULL,
    MemoryAmount,
    format_bytes,
    parse_bytes,
    parse_memory,
    percent_to_ppm,
    ppm_to_fraction,
    ppm_to_percent,
)


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1024", 1024),
        ("8g", 8 << 30),
        ("8G", 8 << 30),
        ("8Gi", 8 << 30),
        ("8GiB", 8 << 30),
        ("512m", 512 << 20),
        ("2t", 2 << 40),
        ("4k", 4096),
        (" 3 g ", 3 << 30),
    ],
)
def test_sizes(text: str, nbytes: int) -> None:
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize("text", ["", "g", "1.5g", "8x", "-1", "8 gigs", "1e9"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_memory_amounts_round_trip_and_resolve() -> None:
    assert parse_memory("25%").resolve(80 << 30) == 20 << 30
    assert parse_memory(4096).resolve(1) == 4096
    for value in (4096, "12.5%"):
        assert parse_memory(parse_memory(value).to_json()) == parse_memory(value)
    assert MemoryAmount(percent=50).to_json() == "50%"


@pytest.mark.parametrize("value", [0, -1, True, 1.5, None, "0%", "101%", "abc", [1]])
def test_bad_memory(value: object) -> None:
    with pytest.raises(ValueError):
        parse_memory(value)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512B"
    assert format_bytes(8 << 30) == "8.0GiB"


def test_shares_in_percent_ppm_and_fractions_agree() -> None:
    assert percent_to_ppm(30) == 300_000 and percent_to_ppm(100) == PPM_FULL
    assert ppm_to_percent(300_000) == 30.0 and ppm_to_percent(12_345) == 1.2345
    assert ppm_to_fraction(PPM_FULL) == 1.0 and ppm_to_fraction(250_000) == 0.25
    for percent in range(1, 101):
        assert ppm_to_percent(percent_to_ppm(percent)) == percent
